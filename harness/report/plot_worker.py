"""Draw the report's PNGs in a child process while the parent reads the ledger and writes the CSV and markdown.

On the 1,000,000-turn benchmark the plots cost about 4 s of CPU (matplotlib's import 0.65 s, then the drawing) on top
of the ledger's reads and the tables; on a machine with two cores, :class:`PlotWorker` moves them off the report's
critical path: the child is started before the ledger is read (it imports matplotlib meanwhile), receives the small
tables of :class:`harness.report.plot_data.PlotData` once they are computed, draws, and answers with the captions.
The files are the same bytes as when drawn in-process (``benchmarks/report_same_bytes.py``, tests/test_report_processes.py).
"""

from __future__ import annotations

from multiprocessing.connection import Connection
from pathlib import Path

from harness.report.child import ForkedChild, child_started
from harness.report.plot_data import PlotData

__all__ = ["PlotWorker"]


class PlotWorker(ForkedChild):
    """One child process that draws one report's plots (:func:`harness.report.plots.draw_all`).

    Started by the constructor (forked: made only where :func:`harness.report.child.fork_is_safe`); :meth:`draw` hands it the tables,
    :meth:`result` waits for the captions, :meth:`close` ends it without drawing (idempotent; the parent must call
    :meth:`result` or :meth:`close`, e.g. in ``finally``).
    """

    _task = "drawing the plots"

    def __init__(self) -> None:
        self._sent = False  # tables handed over (or told to stop)
        self._start(_serve, (), duplex=True, name="harness-report-plots")

    def draw(self, data: PlotData, out: Path) -> None:
        """Hand the child the tables to draw into ``out`` (once); a child already gone is reported by :meth:`result`."""
        self._sent = True
        try:
            self._conn.send((data, out))
        except OSError:  # BrokenPipeError: the child died (the CLI would take that for its own stdout closed)
            pass

    def result(self) -> dict[str, tuple[str, str]]:
        """The plots drawn, as :func:`harness.report.plots.draw_all` returns them; waits for the child.

        Raises:
            OSError: a file could not be written.
            ReportError: the child died before it answered (its exit code or signal in the message).
            Exception: whatever drawing raised in the child, re-raised here.
        """
        return dict(self._answer())

    def _told_to_stop(self) -> bool:
        """A child given nothing to draw is told to stop (it then ends by itself); one drawing is stopped."""
        if self._sent:
            return False
        try:
            self._conn.send(None)
        except OSError:  # the child is gone already
            pass
        self._sent = True
        return True


def _serve(conn: Connection, parents: Connection) -> None:
    """The child: import the plotting code (matplotlib) first, then draw what the parent sends, once."""
    child_started(parents)
    from harness.report import plots

    try:
        job = conn.recv()
    except EOFError:  # the parent is gone
        return
    if job is None:
        return
    data, out = job
    try:
        conn.send((True, plots.draw_all(data, out)))
    except Exception as exc:  # noqa: BLE001 - re-raised in the parent
        try:
            conn.send((False, exc))
        except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
            conn.send((False, OSError(f"drawing the plots failed: {exc!r}")))
