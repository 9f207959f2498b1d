"""``harness report``: the markdown report, its CSV tables and plots, written from the ledger.

Deterministic: the same ledger always gives byte-identical files (stable sort orders, no
wall-clock time: the header states the newest run end recorded in the ledger; PNGs without
dates). Every stored string that reaches the markdown goes through :func:`cell_text`, so no
model output or model name can break a table or inject markup. The data comes from
:mod:`harness.report.frames` and :mod:`harness.report.tables`; plots from :mod:`harness.report.plots`.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from tabulate import tabulate

from harness.errors import UsageError
from harness.report.child import fork_is_safe
from harness.report.frames import LedgerFrames, load_frames
from harness.report.models import model_header_lines
from harness.report.plot_data import plot_data
from harness.report.plot_worker import PlotWorker
from harness.report.sections import check_lines, failure_lines, kind_lines, latency_lines, shown_axes
from harness.report.tables import (
    CELL_AXES,
    check_failure_table,
    failure_mode_table,
    lenient_rescue,
    parse_axes,
    shortest_examples,
    summary_table,
)
from harness.vocab import plural

__all__ = ["MAX_PASS_K_COLUMNS", "ReportFiles", "cell_text", "write_csv", "write_report"]

MAX_PASS_K_COLUMNS = 10
"""The summary table shows pass^k for k = 1 .. min(repeats, this); the CSV and plot show all k."""


def _pct(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def _interval(rate: float, low: float, high: float) -> str:
    if math.isnan(rate):
        return "n/a (no scored run)"
    return f"{_pct(rate)} [{100 * low:.1f}, {100 * high:.1f}]"


def _num(x: float, fmt: str = "{:g}") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def cell_text(text: str, *, code: bool = False) -> str:
    """Any stored string made safe for one markdown table cell or line: no pipes, newlines, backticks or HTML.

    With ``code=True`` the text goes inside a code span, where ``<`` is shown as is (entities would not be decoded).
    """
    text = str(text).replace("\\", "\\\\").replace("|", "\\|").replace("`", "'")
    if not code:
        text = text.replace("<", "&lt;")
    return text.replace("\r\n", " ⏎ ").replace("\n", " ⏎ ").replace("\r", " ⏎ ")


def write_csv(table: pd.DataFrame, path: Path) -> None:
    """Write ``table`` as CSV, byte for byte what ``table.to_csv(path, index=False, lineterminator="\\n",
    float_format="%.10g")`` writes (floats to 10 significant digits, missing values empty), in a fraction of its time.

    Each column becomes its cells' text first (what :mod:`csv` writes for each value: ``repr`` of a float object,
    ``str`` of anything else); a column whose text holds no character the writer would quote is joined as it is, the
    others' cells go through the writer one by one. Then rows are joined with ``","`` and ``"\\n"``, a block of rows at a
    time: on the 1,000,000-turn benchmark's ``runs.csv`` (125,000 rows) 0.5 s of CPU instead of 0.95 s through
    ``csv.writer``, and no more memory.

    Raises:
        OSError: the file cannot be written.
    """
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow([str(c) for c in table.columns])
        if len(table.columns) < 2:  # with one field per row the writer quotes an empty one: it writes every cell
            columns = [_csv_cells(table[name], quoted=False) for name in table.columns]
            writer.writerows(zip(*columns, strict=True))
            return
        for start in range(0, len(table), _CSV_BLOCK_ROWS):  # a block at a time: the text of every cell at once took 0.1 GB
            block = table.iloc[start : start + _CSV_BLOCK_ROWS]
            columns = [_csv_cells(block[name], quoted=True) for name in block.columns]
            handle.write("\n".join(map(",".join, zip(*columns, strict=True))))
            handle.write("\n")


_CSV_BLOCK_ROWS = 16384


_CSV_SPECIAL = (",", '"', "\n", "\r")
"""Characters that may make :mod:`csv` quote a field (``\\r`` only in newer Pythons): such cells are formatted by it."""


def _csv_cells(column: pd.Series, *, quoted: bool) -> list[str]:
    """The text :func:`write_csv` writes for each cell of ``column``; ``quoted``: as :mod:`csv` writes it in a row of
    several fields (quoted where it must)."""
    if pd.api.types.is_float_dtype(column.dtype):
        return [f"{v:.10g}" if v == v else "" for v in column.to_numpy(dtype=float).tolist()]
    missing = column.isna().to_numpy()
    if pd.api.types.is_bool_dtype(column.dtype):
        cells = np.array(["False", "True"], dtype=object)[column.to_numpy(dtype=np.int64)].tolist()
    elif pd.api.types.is_integer_dtype(column.dtype) and not missing.any():
        cells = list(map(str, column.tolist()))
    else:
        cells = column.tolist()
        if missing.any() or not isinstance(column.dtype, pd.StringDtype):  # a StringDtype holds str (or NA) only
            cells = [
                "" if gone else (v if type(v) is str else repr(v) if isinstance(v, float) else str(v))
                for v, gone in zip(cells, missing, strict=True)
            ]
    text = "".join(cells) if quoted else ""
    if any(c in text for c in _CSV_SPECIAL):
        cells = [_csv_field(c) if any(ch in c for ch in _CSV_SPECIAL) else c for c in cells]
    return cells


def _csv_field(text: str) -> str:
    """``text`` as :mod:`csv` writes it in a row of several fields (quoted, quotes doubled, where it must)."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow([text, ""])
    return buffer.getvalue()[: -len(",\n")]


def _md_table(rows: list[dict[str, object]]) -> str:
    return tabulate(rows, headers="keys", tablefmt="github", disable_numparse=True)


def _summary_markdown(table: pd.DataFrame, by: list[str]) -> str:
    ks = [c for c in table.columns if c.startswith("pass^")][:MAX_PASS_K_COLUMNS]
    rows = []
    for r in table.to_dict("records"):
        row: dict[str, object] = {axis: cell_text(_num(r[axis]) if axis == "temperature" else str(r[axis])) for axis in by}
        row["runs"] = r["runs"]
        row["scored"] = r["scored"]
        row["pass rate [95% Wilson]"] = _interval(r["pass_rate"], r["pass_low"], r["pass_high"])
        for k in ks:
            row[k] = _num(r[k], "{:.3f}")
        row["infra_error"] = r["infra_error"]
        row["interrupted"] = r["interrupted"]
        row["context_overflow"] = r["context_overflow"]
        row["median turns"] = _num(r["median_turns"])
        row["median tokens"] = _num(r["median_tokens"])
        rows.append(row)
    return _md_table(rows)


class ReportFiles(list[Path]):
    """The files :func:`write_report` wrote, in writing order (a list), and ``ledger_head``: the ledger's head anchor
    read after every row the report used (:meth:`harness.ledger.Ledger.head`), which its header carries."""

    def __init__(self, paths: list[Path], ledger_head: str) -> None:
        super().__init__(paths)
        self.ledger_head = ledger_head


def write_report(
    ledger_path: str | Path,
    out_dir: str | Path,
    *,
    by: Sequence[str] = CELL_AXES,
    formats: Sequence[str] = ("md", "png"),
) -> ReportFiles:
    """Write the comparison report for a ledger into ``out_dir``.

    Files: ``report.md`` (format ``md``); ``pass_rate.png``, ``failure_modes.png``,
    ``outcomes.png``, ``pass_k.png`` (format ``png``, embedded in the markdown by relative
    path); ``summary.csv``, ``failure_modes.csv``, ``checks.csv``, ``runs.csv`` (format ``csv``). Every table and plot
    follows ``by`` (its axes that vary). The default formats are ``md`` and ``png``. The same ledger always gives
    byte-identical files.

    Args:
        ledger_path: the ledger, opened read-only.
        out_dir: created if missing; files of the same names are overwritten.
        by: grouping axes of every table and plot, a subset of :data:`CELL_AXES`.
        formats: any of ``md``, ``png``, ``csv``.

    Returns:
        Paths written, in writing order (:class:`ReportFiles`, with the ledger head the header carries).

    Raises:
        LedgerError: the ledger cannot be read.
        UsageError: an unknown format or axis.
    """
    unknown = sorted(set(formats) - {"md", "png", "csv"})
    if unknown or not formats:
        raise UsageError(f"--format: unknown format '{unknown[0] if unknown else ''}'; choose from md, png, csv.")
    by = list(parse_axes(",".join(by)))
    large = _large(ledger_path) and fork_is_safe()  # with other threads running, a forked child could hang
    worker = PlotWorker() if large and "png" in formats else None
    try:
        return _write_files(load_frames(ledger_path, processes=large), Path(out_dir), by, formats, worker)
    finally:
        if worker is not None:
            worker.close()


_PROCESS_BYTES = 16 * 2**20
"""From this ledger size (bytes; about 15,000 turns) a report works in three processes on a machine that forks, when
the process runs no other thread (:func:`harness.report.child.fork_is_safe`): the
plots are drawn in a child (:mod:`harness.report.plot_worker`), started before the ledger is read, and the turns are
read in another (:func:`harness.report.frames.load_frames`); a smaller report does it all itself, faster than a
second process would start."""


def _large(ledger_path: str | Path) -> bool:
    try:
        return Path(ledger_path).stat().st_size >= _PROCESS_BYTES
    except OSError:  # missing: load_frames says so in one sentence
        return False


def _write_files(
    frames: LedgerFrames, out: Path, by: list[str], formats: Sequence[str], worker: PlotWorker | None
) -> ReportFiles:
    """:func:`write_report`'s files from the frames read; the plots by ``worker`` when given (drawn meanwhile)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the report folder {out}: {exc.strerror or exc}.") from exc
    axes = shown_axes(frames, by) if not frames.runs.empty else by
    failures = failure_mode_table(frames, axes)
    grouped = summary_table(frames, axes) if not frames.runs.empty else None
    figures: dict[str, tuple[str, str]] = {}
    draw = "png" in formats and bool(frames.runs["scored"].any())
    if draw:  # first, so that a worker draws while the rest is written
        data = plot_data(frames, axes, failures, grouped)
        if worker is None:
            from harness.report import plots

            figures = plots.draw_all(data, out)
        else:
            worker.draw(data, out)
    summary = summary_table(frames, _summary_axes(frames, by))
    written: list[Path] = []
    if "csv" in formats:
        runs_csv = frames.runs.drop(columns=["scenario_path"]).assign(checks_failed=frames.runs["checks_failed"].map(";".join))
        for name, table in (("summary.csv", summary), ("failure_modes.csv", failures),
                            ("checks.csv", check_failure_table(frames, axes)), ("runs.csv", runs_csv)):  # fmt: skip
            write_csv(table, out / name)
            written.append(out / name)
    if worker is not None and draw:
        figures = worker.result()
    if "md" in formats:
        text = _markdown(frames, summary, by, figures, (grouped, failures))
        (out / "report.md").write_text(text, encoding="utf-8", newline="\n")
        written.append(out / "report.md")
    return ReportFiles([out / name for name in figures] + written, frames.ledger_head)


def _summary_axes(frames: LedgerFrames, by: list[str]) -> list[str]:
    """``by``, with the scenario kind first when the ledger holds both tool-using and restraint scenarios."""
    return ["task_kind", *by] if frames.groups.nunique("task_kind") > 1 else by


def _markdown(
    frames: LedgerFrames,
    summary: pd.DataFrame,
    by: list[str],
    figures: dict[str, tuple[str, str]],
    by_shown: tuple[pd.DataFrame | None, pd.DataFrame],
) -> str:
    """The markdown text; ``by_shown``: the summary and failure-mode tables by the shown axes, computed once."""
    grouped, failures = by_shown
    runs = frames.runs
    lines = _header_lines(frames)
    if runs.empty:
        lines += ["**The ledger holds no runs yet: nothing to compare.** Run `harness run`, then report again.", ""]
        return "\n".join(lines)
    lines += model_header_lines(frames.model_runs, cell_text)
    lines += kind_lines(frames, by, cell_text)
    lines += _summary_lines(summary, runs, _summary_axes(frames, by))
    lines += check_lines(frames, by, cell_text)
    lines += failure_lines(frames, by, cell_text, failures)
    lines += _example_lines(frames)
    lines += latency_lines(frames, by, cell_text, grouped)
    rescue = lenient_rescue(frames)
    lines += ["## Rescued by the lenient parser", ""]
    if rescue.empty:
        lines += ["Not measured: no model ran the same cells under both parser policies.", ""]
    else:
        for r in rescue.to_dict("records"):
            lines.append(f"- {cell_text(r['model'])}: {100 * r['rescued']:+.1f} points (lenient {r['lenient_passes']}/{r['lenient_scored']} = "
                         f"{_pct(r['lenient_rate'])} vs strict {r['strict_passes']}/{r['strict_scored']} = {_pct(r['strict_rate'])})")  # fmt: skip
        lines.append("")
    if figures:
        lines += ["## Plots", ""]
        for name, (alt, caption) in figures.items():
            lines += [f"![{alt}]({name})", "", f"*{caption}*", ""]
    return "\n".join(lines)


def _header_lines(frames: LedgerFrames) -> list[str]:
    """The title and the one line that identifies the ledger read: the runs counted (one per run identity) and their
    turns, and apart from them the other attempts at the same identities with their turns: earlier ones (a run
    interrupted and then resumed) or later ones (an interrupted re-run after a scored run, which stays counted)."""
    every = frames.runs[["counted", "outcome", "scored", "turns_recorded"]]
    runs = every[every["counted"]] if not every.empty else every
    outcome_counts = runs["outcome"].value_counts()
    n_scored = int(runs["scored"].sum())
    repeats = len(every) - len(runs)
    turns = int(runs["turns_recorded"].sum())
    attempt_turns = plural(int(every["turns_recorded"].sum()) - turns, "turn")
    again = (
        f" (and {plural(repeats, 'other attempt')} of the same run identities, with {attempt_turns}, not counted)"
        if repeats
        else ""
    )
    return [
        "# Comparison report",
        "",
        f"Ledger `{frames.ledger_path.name}`: {plural(len(runs), 'run')}{again} ({n_scored} scored, {int(outcome_counts.get('infra_error', 0))} infra_error, "
        f"{int(outcome_counts.get('interrupted', 0) + outcome_counts.get('unfinished', 0))} interrupted or unfinished, "
        f"{int(outcome_counts.get('context_overflow', 0))} context_overflow), {plural(turns, 'turn')}; "
        f"newest run end {frames.newest_end or 'none'}; ledger head `{frames.ledger_head}` (as `harness report` prints it last).",
        "",
    ]  # fmt: skip


def _summary_lines(summary: pd.DataFrame, runs: pd.DataFrame, by: list[str]) -> list[str]:
    """The notes on superseded and unscored runs, then the summary table and its edge notes."""
    lines: list[str] = []
    repeats = int((~runs["counted"]).sum())
    if repeats:
        lines += [f"{repeats} run(s) repeat a run identity recorded again (same scenario, model, options, seed and "
                  "repetition: a run interrupted and then resumed, or re-run with `--no-resume`); each identity counts once, "
                  "its scored run if it has one, else its newest: neither `runs` nor any rate counts the repeats.", ""]  # fmt: skip
    if int(runs["scored"].sum()) == 0:
        lines += ["**No scored run:** every run ended as infra_error, interrupted, context_overflow or unfinished, so there is no rate to "
                  "report. Fix the server and re-run; infrastructure errors are never counted as model failures.", ""]  # fmt: skip
    kind = " `task_kind`: `tool` (the scenario needs a tool) or `restraint` (it needs none)." if "task_kind" in by else ""
    lines += ["## Summary", "", f"One row per {' × '.join(by)}.{kind} `runs` counts each run identity once (a run interrupted and resumed is one run). Pass rate = passes / scored runs; infra_error, interrupted, "
              "unfinished and context_overflow runs (the conversation outgrew the scenario's num_ctx) are counted in their own columns and excluded from every denominator and median. "
              "pass^k = chance that k runs of a cell all pass (tau-bench); – where a cell has fewer than k scored runs.", ""]  # fmt: skip
    constant = [a for a in by if len(by) > 1 and summary[a].nunique(dropna=False) == 1]
    shown = [a for a in by if a not in constant] or by[:1]
    constant = [a for a in constant if a not in shown]
    if constant:
        values = ", ".join(
            f"{a} = `{cell_text(_num(summary[a].iloc[0]) if a == 'temperature' else summary[a].iloc[0])}`" for a in constant
        )
        lines += [f"Same in every row: {values}.", ""]
    lines += [_summary_markdown(summary, shown), ""]
    ks = [c for c in summary.columns if c.startswith("pass^")][:MAX_PASS_K_COLUMNS]
    if ks and summary[ks].isna().to_numpy().any():
        lines += ["“–” under pass^k: at least one cell of that row has fewer than k scored runs, so pass^k is not defined for the row.", ""]  # fmt: skip
    notes = _edge_notes(summary, runs)
    if notes:
        lines += [*(f"- {n}" for n in notes), ""]
    return lines


def _example_lines(frames: LedgerFrames) -> list[str]:
    """The shortest reply showing each mode; for a mode that came from a structured call, the call."""
    examples = shortest_examples(frames)
    if examples.empty:
        return []
    lines = ["### Shortest reply showing each mode", ""]
    for r in examples.to_dict("records"):
        excerpt = cell_text(r["excerpt"], code=True) if r["excerpt"] else "(empty reply)"
        what = f"({r['chars']} chars)" if r["kind"] == "reply" else "(empty text; its structured tool call)"
        lines.append(f"- `{cell_text(r['mode'], code=True)}` — {cell_text(r['model'])}, run `{cell_text(r['run_id'], code=True)}` "
                     f"turn {r['turn']} {what}: `{excerpt}`")  # fmt: skip
    return [*lines, ""]


def _edge_notes(summary: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    notes = []
    if (summary["scored"] == 0).any():
        notes.append(
            f"{int((summary['scored'] == 0).sum())} row(s) have no scored run (only infra_error or interrupted): no rate is given for them."
        )
    if (summary["scored"] == 1).any():
        notes.append("Rows with a single scored run have a Wilson interval spanning most of [0, 100]%: one run says little.")
    extreme = summary[(summary["scored"] > 0) & summary["pass_rate"].isin((0.0, 1.0))]
    if not extreme.empty:
        notes.append(
            f"{len(extreme)} row(s) pass 0% or 100% of their runs; their true rate need not be 0% or 100%: the Wilson "
            "interval gives how far from it the rate may lie."
        )
    per_model = runs[["scored", "model"]][runs["scored"]].groupby("model").size()
    for model, n in per_model.items():
        if n == 1:
            notes.append(f"{cell_text(str(model))} has a single scored run.")
    return notes
