"""A large ledger's report works in three processes (the turns read in one child, the plots drawn in another): the
files and frames are the same as when one process does everything, and errors still read as one sentence."""

from __future__ import annotations

import filecmp
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.errors import LedgerError, ReportError
from harness.report import failure_mode_table, load_frames, write_report
from harness.report import markdown as report_markdown
from harness.report.child import ChildCall, can_fork
from harness.report.plot_data import plot_data
from harness.report.plot_worker import PlotWorker
from tests.helpers import running
from tests.test_report_aggregates import _varied_ledger

pytestmark = pytest.mark.skipif(not can_fork(), reason="the child processes are used where the platform forks")


@pytest.fixture(scope="module")
def varied(tmp_path_factory) -> Path:
    return _varied_ledger(tmp_path_factory.mktemp("processes") / "ledger.sqlite")


def test_a_report_drawn_in_child_processes_writes_the_same_bytes(varied, tmp_path, monkeypatch):
    alone = write_report(varied, tmp_path / "alone", formats=["md", "png", "csv"])
    monkeypatch.setattr(report_markdown, "_PROCESS_BYTES", 0)  # this small ledger counts as large
    shared = write_report(varied, tmp_path / "shared", formats=["md", "png", "csv"])
    assert [p.name for p in shared] == [p.name for p in alone]
    assert {p.suffix for p in shared} == {".md", ".png", ".csv"}
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "alone", tmp_path / "shared", [p.name for p in alone], shallow=False)
    assert (mismatch, errors) == ([], [])


def test_frames_read_with_a_child_equal_frames_read_alone(varied):
    alone, shared = load_frames(varied), load_frames(varied, processes=True)
    for name in ("runs", "run_modes", "run_checks", "mode_examples"):
        pd.testing.assert_frame_equal(getattr(shared, name), getattr(alone, name), check_exact=True)
    for name in ("run_pos", "counts", "recorded", "values"):
        assert getattr(shared.latencies, name).tobytes() == getattr(alone.latencies, name).tobytes()
    assert (shared.turn_count, shared.ledger_head, shared.model_runs) == (
        alone.turn_count,
        alone.ledger_head,
        alone.model_runs,
    )


def test_a_file_that_is_not_a_ledger_still_fails_in_one_sentence_with_a_child(tmp_path, monkeypatch):
    bogus = tmp_path / "notes.sqlite"
    bogus.write_text("not a database\n" * 100)
    monkeypatch.setattr(report_markdown, "_PROCESS_BYTES", 0)
    with pytest.raises(LedgerError) as caught:
        write_report(bogus, tmp_path / "out", formats=["md", "png", "csv"])
    assert str(bogus) in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_a_childs_exception_is_raised_in_the_parent():
    with pytest.raises(ValueError, match="invalid literal"):
        ChildCall(int, "twelve").result()
    assert ChildCall(sum, [1, 2, 3]).result() == 6


def _killed_itself() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _killed_while_sending() -> bytes:
    """Dies 0.1 s after returning an answer too large for a pipe: killed part-way through sending it."""
    threading.Timer(0.1, _killed_itself).start()
    return b"x" * (64 * 2**20)


@pytest.mark.parametrize("function", [_killed_itself, _killed_while_sending])
def test_a_child_killed_before_or_while_it_answers_is_one_report_error(function):
    call = ChildCall(function)
    time.sleep(1.0)  # the child is dead by now, the second one with part of its answer in the pipe
    with pytest.raises(ReportError, match="killed by signal 9 before it answered") as caught:
        call.result()
    assert "\n" not in str(caught.value)
    assert not multiprocessing.active_children()


def test_a_plotting_process_killed_before_it_draws_is_one_report_error(varied, tmp_path):
    frames = load_frames(varied)
    data = plot_data(frames, ["model"], failure_mode_table(frames, ["model"]))
    worker = PlotWorker()
    (child,) = multiprocessing.active_children()
    os.kill(child.pid, signal.SIGKILL)  # e.g. the out-of-memory killer
    child.join()
    worker.draw(data, tmp_path)  # before: BrokenPipeError, which the CLI takes for its stdout closed (exit 0)
    with pytest.raises(ReportError, match="drawing the plots was killed by signal 9"):
        worker.result()
    assert not list(tmp_path.iterdir())
    assert not multiprocessing.active_children()


_FORKS: list[int] = []
os.register_at_fork(before=lambda: _FORKS.append(os.getpid()))  # every os.fork of this process (spawn does not count)


def test_a_report_in_a_process_running_other_threads_forks_nothing_and_writes_the_same_bytes(varied, tmp_path, monkeypatch):
    """A thread inside SQLite when the process forks leaves SQLite's memory mutex held in the child, which then hangs
    opening its connection (seen with a thread querying a ledger): with other threads running, no fork."""
    alone = write_report(varied, tmp_path / "alone", formats=["md", "png", "csv"])
    monkeypatch.setattr(report_markdown, "_PROCESS_BYTES", 0)  # counts as large: children wanted
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    before = len(_FORKS)
    try:
        shared = write_report(varied, tmp_path / "shared", formats=["md", "png", "csv"])
    finally:
        stop.set()
        other.join()
    assert len(_FORKS) == before  # before: two forks (the plotting process and the turns' reader)
    assert [p.name for p in shared] == [p.name for p in alone]
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "alone", tmp_path / "shared", [p.name for p in alone], shallow=False)
    assert (mismatch, errors) == ([], [])
    assert not multiprocessing.active_children()


def test_a_plot_that_cannot_be_written_raises_as_when_drawn_alone(varied, tmp_path, monkeypatch):
    raised = []
    for name, bytes_from in (("alone", None), ("shared", 0)):
        if bytes_from is not None:
            monkeypatch.setattr(report_markdown, "_PROCESS_BYTES", bytes_from)
        (tmp_path / name / "outcomes.png").mkdir(parents=True)  # a folder where the plot goes
        with pytest.raises(OSError) as caught:
            write_report(varied, tmp_path / name, formats=["md", "png", "csv"])
        raised.append((type(caught.value), caught.value.errno))
    assert raised[0] == raised[1]
    assert not (tmp_path / "shared" / "report.md").exists()


@pytest.mark.parametrize("block_rows", [16384, 3])
def test_write_csv_writes_what_pandas_to_csv_writes(tmp_path, monkeypatch, block_rows):
    """:func:`write_csv` promises the bytes of ``to_csv(index=False, lineterminator="\\n", float_format="%.10g")``,
    for cells the writer must quote too (commas, quotes, line breaks), for missing values of every kind, in one block of
    rows or several."""
    from harness.report.markdown import write_csv

    monkeypatch.setattr(report_markdown, "_CSV_BLOCK_ROWS", block_rows)  # 3: the rows written in several blocks
    tricky = ["plain", "a,b", 'say "hi"', "two\nlines", "cr\rhere", "", "ünïcode ⏎", None, "x" * 300, " lead"]
    n = len(tricky)
    table = pd.DataFrame({
        "text": pd.Series(tricky, dtype=object), "str": pd.Series(tricky, dtype="str"),
        "float": [0.1, 1 / 3, float("nan"), 1e20, -0.0, 2.5, 123456789.123, 7.0, float("inf"), 1e-7],
        "int": range(n), "bool": [i % 3 == 0 for i in range(n)],
        "mixed": pd.Series([1.5, "s", None, 3, True, (1, 2), float("nan"), "q,", 0.1, "z"], dtype=object),
        "clean": [f"run-{i}" for i in range(n)],
    })  # fmt: skip
    for frame in (table, table[["text"]], table[["float"]], table.iloc[:0], table[["int", "clean"]]):
        write_csv(frame, tmp_path / "ours.csv")
        frame.to_csv(tmp_path / "pandas.csv", index=False, lineterminator="\n", float_format="%.10g")
        assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes(), list(frame.columns)


_ORPHAN_PARENT = """
import sys, time
sys.path.insert(0, {repo!r})
from harness.report.child import ChildCall
from harness.report.plot_worker import PlotWorker
if sys.argv[1] == "plots":
    worker = PlotWorker()  # waits for tables that never come
    print(worker._process.pid, flush=True)
else:
    call = ChildCall(bytes, 8 << 20)  # an 8 MB answer nobody reads
    print(call._process.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("kind", ["plots", "call"])
def test_a_child_ends_when_its_parent_is_killed(tmp_path, kind):
    """Found in review: a forked child kept its copy of the parent's end of the pipe, so after the parent's SIGKILL
    the plot child waited for tables for ever and a child with a large answer blocked writing it, both under pid 1."""
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(_ORPHAN_PARENT.format(repo=str(Path(__file__).resolve().parents[1])))
    errors = tmp_path / "stderr.txt"  # the children's too: they inherit it
    with errors.open("w") as err, subprocess.Popen([sys.executable, str(script), kind], stdout=subprocess.PIPE, stderr=err,
                                                   text=True) as parent:  # fmt: skip
        child = int(parent.stdout.readline())  # type: ignore[union-attr]
        time.sleep(1.0 if kind == "call" else 0.2)  # the answer fills the pipe
        parent.kill()
    deadline = time.monotonic() + 60  # the plot child imports matplotlib before it reads
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    gone = not running(child)
    if not gone:
        os.kill(child, signal.SIGKILL)
    assert gone
    assert "Traceback" not in errors.read_text()  # review: the child's answer to a dead parent printed two tracebacks


def test_every_plot_s_texts_lie_inside_its_figure(varied, tmp_path, monkeypatch):
    """Found by a newcomer: the failure-mode heatmap's title ran past both edges of a 2-row figure and its colour bar's
    label past the bottom. Every text of every plot (titles, labels, ticks, colour bars) must lie inside its figure."""
    from harness.report import plots

    outside: list[tuple[str, str]] = []
    save = plots._save

    def checked(fig, path, footer):  # the real _save, after a look at where each text landed
        save(fig, path, footer)
        renderer = fig.canvas.get_renderer()
        box = fig.bbox
        for text in fig.findobj(match=lambda a: hasattr(a, "get_text") and a.get_visible() and a.get_text()):
            extent = text.get_window_extent(renderer)
            if extent.x0 < box.x0 - 1 or extent.x1 > box.x1 + 1 or extent.y0 < box.y0 - 1 or extent.y1 > box.y1 + 1:
                outside.append((path.name, text.get_text()))

    monkeypatch.setattr(plots, "_save", checked)
    frames = load_frames(varied)
    for axes, modes in ((["model"], None), (["temperature"], None), (["temperature"], 3)):  # 3 modes: a narrow figure
        failures = failure_mode_table(frames, axes)
        if modes:
            failures = failures[failures["mode"].isin(failures["mode"].unique()[:modes])]
        plots.draw_all(plot_data(frames, axes, failures), tmp_path)
    assert not outside, outside
