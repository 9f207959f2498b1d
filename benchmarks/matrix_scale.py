"""Matrix benchmark: harness overhead per turn, and throughput scaling with --jobs.

Run: ``python benchmarks/matrix_scale.py`` (about a minute on 2 cores). Prints:

1. Cost per turn against a zero-latency replay backend (``list_and_report``, a cassette of three tool calls and a
   final answer): the whole run's wall time divided by its turns (sandbox, lock, start row, turns, checks, end row),
   turns per second, and the median of the part from reply to committed turn (classify + execute tools + write the
   ledger).
2. Scaling: a scripted OpenAI-compatible server on 127.0.0.1 (tests/fake_agent_server.py) answering
   every request after a fixed delay with 16 slots; runs per second for jobs = 1, 2, 4, 8, 16
   and the ratio to jobs x single-job throughput (target >= 0.85 up to 16 jobs).
3. The ledger under concurrency: 16 concurrent runs; rows counted and the chain verified.

``--baseline DIR`` (a checkout of other code, e.g. ``git worktree add /tmp/old HEAD~1``) measures only part 1,
alternating this code and that code in fresh child processes (``--rounds`` each, ``--runs`` runs per measurement),
and prints each one's median and their ratio: a shared, noisy machine distorts a ratio measured in one run less than
absolute figures. ``--profile`` prints part 1's top cProfile entries (the run worker's thread); with ``--cpu`` the
profiler counts that thread's CPU time instead of wall time (on a shared, loaded machine the wall clock mostly
measures waiting for a core).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(os.environ.get("HARNESS_BENCH_CODE") or REPO)))  # the code measured (--baseline's child)
sys.path.insert(1, str(REPO))

from harness.backends.replay import ReplayBackend  # noqa: E402
from harness.ledger import Ledger  # noqa: E402
from harness.loop import RunOptions  # noqa: E402
from harness.runner import MatrixOverrides, expand_matrix, run_matrix  # noqa: E402
from harness.scenarios import load_scenario  # noqa: E402
from tests.fake_agent_server import FakeAgentServer  # noqa: E402

SCENARIO = load_scenario(REPO / "scenarios" / "list_and_report.toml")
REPORT = "There are 3 files:\nconfig.json\nhello.txt\nmemo.md\n"


def _line(calls=None, content=None):
    tool_calls = [{"function": {"name": n, "arguments": a}} for n, a in calls or []] or None
    return json.dumps({"content": content, "tool_calls": tool_calls, "finish_reason": "stop",
                       "usage": {"prompt_tokens": 100, "completion_tokens": 20}})  # fmt: skip


class _TimedReplay(ReplayBackend):
    """Replay backend that stamps the moment each reply is handed to the loop."""

    def generate(self, messages, tools, options):
        reply = super().generate(messages, tools, options)
        _STAMP[threading.get_ident()] = time.perf_counter()
        return reply


class _TimedLedger(Ledger):
    """Ledger that measures reply-received -> turn-committed (classify, tools, ledger write)."""

    def record_turn(self, record, *, defer=False):  # committed at once: the ledger write timed too
        super().record_turn(record)
        _OVERHEAD_MS.append((time.perf_counter() - _STAMP[threading.get_ident()]) * 1000)


_STAMP: dict[int, float] = {}
_OVERHEAD_MS: list[float] = []


def overhead(tmp: Path, runs: int = 200, *, quiet: bool = False, profile: bool = False, cpu: bool = False) -> dict[str, float]:
    """Part 1; returns ``{"ms_per_turn": whole-run wall time / turns, "overhead_ms": median reply-to-commit}``."""
    _OVERHEAD_MS.clear()
    cassette = tmp / "ideal.jsonl"
    cassette.write_text("\n".join([
        _line([("list_files", {"path": "."})]),
        _line([("read_file", {"path": "memo.md"})]),
        _line([("write_file", {"path": "report.txt", "content": REPORT})]),
        _line(content="I wrote report.txt."),
    ]) + "\n")  # fmt: skip
    plans = expand_matrix([SCENARIO], MatrixOverrides([f"replay:{cassette}"], [0.0], runs, None, ["native"], None))
    profiler = (cProfile.Profile(time.thread_time) if cpu else cProfile.Profile()) if profile else None
    with _TimedLedger(tmp / f"overhead{time.monotonic_ns()}.sqlite") as ledger:
        if profiler is not None:
            _profiled(profiler)
        start, cpu = time.perf_counter(), time.process_time()
        result = run_matrix(
            plans, ledger, RunOptions(runs_dir=tmp / "runs"), backend_factory=lambda spec, **kw: _TimedReplay(cassette)
        )
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    total_turns = sum(s.turns for s in result.summaries)
    assert all(s.outcome == "pass" for s in result.summaries), {s.outcome for s in result.summaries}
    ordered = sorted(_OVERHEAD_MS)
    figures = {"ms_per_turn": elapsed / total_turns * 1000, "overhead_ms": statistics.median(ordered),
               "cpu_ms_per_turn": cpu / total_turns * 1000}  # fmt: skip
    if not quiet:
        print("1. Harness cost per turn (zero-latency replay backend, jobs=1)")
        print(f"   {len(result.summaries)} runs, {total_turns} turns in {elapsed:.2f} s = {total_turns / elapsed:.0f} turns/s "
              f"(whole runs: sandbox, lock, run rows, turns, checks: {figures['ms_per_turn']:.2f} ms per turn, "
              f"CPU {figures['cpu_ms_per_turn']:.2f})")  # fmt: skip
        print(f"   reply to committed turn (classify + tools + ledger write): median {figures['overhead_ms']:.2f} ms, "
              f"p99 {ordered[int(len(ordered) * 0.99)]:.2f} ms")  # fmt: skip
    if profiler is not None:
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(20)
        stats.sort_stats("cumulative").print_stats(30)
    return figures


def _profiled(profiler: cProfile.Profile) -> None:
    """Turn ``profiler`` on around each run in the worker thread that executes it (cProfile sees one thread)."""
    from harness import runner

    execute = runner._MatrixRun.execute

    def profiled(self, planned, endpoint):  # noqa: ANN001, ANN202 - the wrapped method's shape
        profiler.enable()
        try:
            return execute(self, planned, endpoint)
        finally:
            profiler.disable()

    runner._MatrixRun.execute = profiled  # type: ignore[method-assign]


def compare(baseline: Path, rounds: int, runs: int) -> None:
    """Part 1 for this code and ``baseline``, alternating in child processes; medians and their ratio."""
    codes = {"this code": REPO, "baseline": baseline.resolve()}
    got: dict[str, list[dict[str, float]]] = {name: [] for name in codes}
    for _ in range(rounds):
        for name, code in codes.items():
            env = {**os.environ, "HARNESS_BENCH_CODE": str(code)}
            done = subprocess.run([sys.executable, __file__, "--child", "--runs", str(runs)], env=env, check=True,
                                  capture_output=True, text=True)  # fmt: skip
            got[name].append(json.loads(done.stdout.splitlines()[-1]))
    print(f"1. Cost per turn, {rounds} alternating rounds of {runs} runs each (medians)")
    medians = {name: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for name, rows in got.items()}
    for name, m in medians.items():
        print(f"   {name:9s} ({codes[name]}): {m['ms_per_turn']:.3f} ms per turn (whole runs; CPU {m['cpu_ms_per_turn']:.3f}), "
              f"{m['overhead_ms']:.3f} ms reply to commit")  # fmt: skip
    mine, base = medians["this code"], medians["baseline"]
    print(f"   ratio this code / baseline: whole runs {mine['ms_per_turn'] / base['ms_per_turn']:.2f} "
          f"(CPU {mine['cpu_ms_per_turn'] / base['cpu_ms_per_turn']:.2f}), "
          f"reply to commit {mine['overhead_ms'] / base['overhead_ms']:.2f}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip


def scaling(tmp: Path, delay_s: float = 0.2) -> None:
    print(f"2. Scaling against a local server answering after {delay_s * 1000:.0f} ms (16 slots)")
    base = None
    with FakeAgentServer(delay_s=delay_s, slots=16) as server:
        for jobs in (1, 2, 4, 8, 16):
            runs = max(4, jobs * 2)
            plans = expand_matrix(
                [SCENARIO], MatrixOverrides([f"openai:ideal@{server.base_url}"], [0.0], runs, None, ["native"], None)
            )
            with Ledger(tmp / f"scale{jobs}.sqlite") as ledger:
                start = time.perf_counter()
                result = run_matrix(plans, ledger, RunOptions(runs_dir=tmp / "runs", jobs=jobs))
                elapsed = time.perf_counter() - start
            assert all(s.outcome == "pass" for s in result.summaries), [s.outcome for s in result.summaries]
            throughput = len(result.summaries) / elapsed
            base = base or throughput
            print(f"   jobs={jobs:2d}: {len(result.summaries):2d} runs in {elapsed:5.2f} s = {throughput:5.2f} runs/s; "
                  f"{throughput / (jobs * base):.2f} x ideal")  # fmt: skip


def ledger_concurrency(tmp: Path) -> None:
    with FakeAgentServer(slots=16) as server:
        plans = expand_matrix([SCENARIO], MatrixOverrides([f"openai:ideal@{server.base_url}"], [0.0], 16, None, ["native"], None))
        with Ledger(tmp / "concurrent.sqlite") as ledger:
            result = run_matrix(plans, ledger, RunOptions(runs_dir=tmp / "runs", jobs=16))
            counts = ledger.row_counts()
            check = ledger.verify()
    print("3. Ledger under 16 concurrent runs")
    print(
        f"   {len(result.summaries)} runs; rows: {counts}; expected turns {16 * 3}; chain verifies: {check.ok} ({check.rows} rows)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a checkout of other code: part 1 only, alternating with it")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds with --baseline (default 5)")
    parser.add_argument("--runs", type=int, default=200, help="runs per part-1 measurement (default 200)")
    parser.add_argument("--profile", action="store_true", help="part 1 only, under cProfile; print its top entries")
    parser.add_argument("--cpu", action="store_true", help="with --profile: count the worker thread's CPU time, not wall time")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.child:
            print(json.dumps(overhead(Path(folder), args.runs, quiet=True)))
        elif args.baseline is not None:
            compare(args.baseline, args.rounds, args.runs)
        elif args.profile:
            overhead(Path(folder), args.runs, profile=True, cpu=args.cpu)
        else:
            overhead(Path(folder), args.runs)
            scaling(Path(folder))
            ledger_concurrency(Path(folder))


if __name__ == "__main__":
    main()
