"""Reports: read the ledger into DataFrames, compute tables, write markdown, plots and CSV, compare two models.

``frames`` loads the ledger (:func:`load_frames`, where notebooks start), ``tables`` computes
the summary, failure-mode, done-check, example and rescue tables, ``sections`` writes the report's sections that
follow ``--by`` (scenario kinds, why runs failed, failure modes, latency), ``markdown`` writes ``harness report``'s
files, ``plot_data`` reduces the runs to the tables the plots show, ``plots`` draws the PNGs (for a large ledger in a
child process: ``plot_worker``; ``child`` reads the turns in another) and ``compare`` pairs two models' runs
(``harness compare``).
Everything here only reads the ledger. Imports pandas and matplotlib.
"""

from harness.report.compare import PAIR_KEYS, Comparison, ModeComparison, compare_models, format_comparison, resolve_model
from harness.report.frames import LedgerFrames, load_frames
from harness.report.markdown import write_report
from harness.report.tables import (
    CELL_AXES,
    check_failure_table,
    failure_mode_table,
    lenient_rescue,
    parse_axes,
    shortest_examples,
    summary_table,
)

__all__ = [
    "CELL_AXES",
    "PAIR_KEYS",
    "Comparison",
    "LedgerFrames",
    "ModeComparison",
    "check_failure_table",
    "compare_models",
    "failure_mode_table",
    "format_comparison",
    "lenient_rescue",
    "load_frames",
    "parse_axes",
    "resolve_model",
    "shortest_examples",
    "summary_table",
    "write_report",
]
