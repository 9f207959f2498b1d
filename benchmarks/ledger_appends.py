"""Ledger benchmark: the cost of the appends alone (start row, turns, end row) per turn, and of each SQL statement.

Run: ``python benchmarks/ledger_appends.py [--runs 3000] [--baseline DIR --rounds 7]``. Each measurement is a fresh
child process that first runs the peer task of ``benchmarks/peer_inspect.py`` (``list_and_report`` replayed, 3
turns a run, jobs 1) ``--runs`` times on a scratch ledger, keeping every ``start_run`` (with the runner's claim
policy), ``record_turn`` and ``end_run`` call, then replays those calls into a fresh ledger back to back: the time
printed is that replay's alone (no loop, no tools, no files), per turn, wall and CPU (CPU counts every thread of the
process: the checkpoint thread's too). With ``--baseline DIR`` (another checkout, e.g. ``git worktree add --detach
DIR <commit>``) the children alternate between this code and that code for ``--rounds`` rounds; medians and their
ratio are printed (a shared machine moves single figures more than ratios). Every replayed ledger must verify.

``--statements`` times each SQL statement of one replay (a wrapper around the connection's ``execute``): median and
mean per statement, its total per run, and the share of ``COMMIT`` time spent in the slowest 1 % of commits (WAL
checkpoints run inside a commit unless a thread runs them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(os.environ.get("HARNESS_BENCH_CODE") or REPO)))  # the code measured (--baseline's child)
sys.path.insert(1, str(REPO / "benchmarks"))

METHODS = ("start_run", "record_turn", "end_run")


def _captured(runs: int, folder: Path) -> list[tuple[str, Any, bool]]:
    """The ledger calls of ``runs`` peer-task runs, in order: ``(method, record, whether a claim policy was passed)``."""
    import peer_inspect

    from harness.ledger import Ledger

    calls: list[tuple[str, Any, bool]] = []
    originals = {name: getattr(Ledger, name) for name in METHODS}

    def keeping(name: str):  # noqa: ANN202 - a wrapper of a Ledger method
        def method(self, record, **kwargs):  # noqa: ANN001, ANN202
            calls.append((name, record, kwargs.get("claim") is not None))
            return originals[name](self, record, **kwargs)

        return method

    for name in METHODS:
        setattr(Ledger, name, keeping(name))
    try:
        peer_inspect._harness_runs(runs, folder)
    finally:
        for name, original in originals.items():
            setattr(Ledger, name, original)
    return calls


class _TimedConnection:
    """The ledger's connection with each ``execute`` timed, keyed by the statement's first words."""

    def __init__(self, db: Any, times: dict[str, list[float]]) -> None:
        self.db, self.times = db, times

    def execute(self, sql: str, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.db.execute(sql, *args)
        finally:
            self.times.setdefault(" ".join(sql.split()[:4])[:48], []).append(time.perf_counter() - start)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def child(runs: int, statements: bool) -> dict[str, Any]:
    """One measurement (see the module docstring); the figures as a dict."""
    from harness.ledger import Ledger
    from harness.runner import identity_free

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "scratch").mkdir()
        calls = _captured(runs, Path(folder) / "scratch")
        times: dict[str, list[float]] = {}
        with Ledger(Path(folder) / "replay.sqlite") as ledger:
            if statements:
                ledger._db = _TimedConnection(ledger._db, times)  # type: ignore[assignment]
            bound = {name: getattr(ledger, name) for name in METHODS}
            wall, cpu = time.perf_counter(), time.process_time()
            for name, record, claimed in calls:
                if claimed:
                    bound[name](record, claim=identity_free)
                else:
                    bound[name](record)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if statements:
                ledger._db = ledger._db.db  # type: ignore[attr-defined]
            ok = ledger.verify().ok
    turns = sum(1 for name, _, _ in calls if name == "record_turn")
    return {"wall_ms_per_turn": wall / turns * 1000, "cpu_ms_per_turn": cpu / turns * 1000, "verifies": ok,
            "runs": runs, "statements": times}  # fmt: skip


def _print_statements(figures: dict[str, Any]) -> None:
    runs = figures["runs"]
    print(f"   per statement ({runs} runs): median, mean (us), total per run (ms)")
    for key, values in sorted(figures["statements"].items(), key=lambda kv: -sum(kv[1])):
        print(f"   {key:48s} {statistics.median(values) * 1e6:7.1f} {statistics.fmean(values) * 1e6:7.1f} "
              f"{sum(values) / runs * 1000:7.3f}  x{len(values) / runs:.1f}")  # fmt: skip
    commits = sorted(figures["statements"].get("COMMIT", []))
    if commits:
        top = sum(commits[int(len(commits) * 0.99) :]) / sum(commits)
        print(f"   COMMIT: p99 {commits[int(len(commits) * 0.99)] * 1e6:.0f} us, max {commits[-1] * 1e6:.0f} us; "
              f"the slowest 1 % hold {top:.0%} of commit time")  # fmt: skip


def _measure(code: Path, runs: int, statements: bool) -> dict[str, Any]:
    env = {**os.environ, "HARNESS_BENCH_CODE": str(code)}
    argv = [sys.executable, __file__, "--child", "--runs", str(runs)] + (["--statements"] if statements else [])
    done = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3000, help="peer-task runs recorded, then replayed (default 3000)")
    parser.add_argument("--baseline", type=Path, help="another checkout: alternate with it, print the ratio")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--statements", action="store_true", help="time each SQL statement of the replay")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.runs, args.statements)))
        return
    codes = {"this code": REPO} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    got: dict[str, list[dict[str, Any]]] = {name: [] for name in codes}
    for index in range(args.rounds if args.baseline else 1):
        for name, code in list(codes.items())[:: 1 if index % 2 == 0 else -1]:  # neither side always goes first
            got[name].append(_measure(code, args.runs, args.statements))
    print(f"Ledger appends alone, {args.runs} peer-task runs replayed per measurement (medians of {len(got['this code'])})")
    medians = {}
    for name, rows in got.items():
        medians[name] = {k: statistics.median(r[k] for r in rows) for k in ("wall_ms_per_turn", "cpu_ms_per_turn")}
        print(f"   {name:9s} ({codes[name]}): {medians[name]['wall_ms_per_turn']:.3f} ms per turn wall, "
              f"{medians[name]['cpu_ms_per_turn']:.3f} CPU; every ledger verifies: {all(r['verifies'] for r in rows)}")  # fmt: skip
        if args.statements:
            _print_statements(rows[-1])
    if args.baseline:
        mine, base = medians["this code"], medians["baseline"]
        print(f"   ratio this code / baseline: wall {mine['wall_ms_per_turn'] / base['wall_ms_per_turn']:.2f}, "
              f"CPU {mine['cpu_ms_per_turn'] / base['cpu_ms_per_turn']:.2f}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    if not all(r["verifies"] for rows in got.values() for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
