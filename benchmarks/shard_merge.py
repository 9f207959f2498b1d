"""A replay matrix run whole and in shards, the shards merged: the merge's time and whether the reports agree.

Usage::

    python benchmarks/shard_merge.py [--runs 10000] [--shards 4] [--sequential] [--merges 3] [--work DIR] [--merge-only]

The matrix: ``scenarios/no_tool_needed.toml`` on its ideal and broken replay cassettes (two models, so runs pass and
fail), temperatures 0 and 0.5, parsers strict and lenient, ``--runs / 8`` repetitions. It runs once into one ledger
(``harness run``), then as ``--shards`` jobs (``harness run --shard I/N``, each into its own ledger, side by side as
child processes like the jobs of a cluster array, or one after another with ``--sequential``), then the shards are
merged ``--merges`` times into fresh files (``merge_ledgers`` in this process; the median is printed, together with
one timed ``harness ledger merge`` command). Last, ``harness report --format csv`` on the whole ledger and on the
merged one, compared table by table with the timing columns and run ids left out (rows sorted: a merged ledger holds
its runs input by input). Exits 1 when the reports differ. ``--merge-only`` reuses the ledgers an earlier run left
in ``--work``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.ledger import Ledger  # noqa: E402
from harness.ledger.merge import merge_ledgers  # noqa: E402
from tests.helpers import report_csv_rows  # noqa: E402

SCENARIO = REPO / "scenarios" / "no_tool_needed.toml"
CASSETTES = REPO / "tests" / "cassettes" / "no_tool_needed"
TABLES = ("summary.csv", "failure_modes.csv", "checks.csv", "runs.csv")


def _harness(*argv: str) -> list[str]:
    return [sys.executable, "-m", "harness", *argv]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's code, whatever is installed


def _run_args(runs: int, ledger: Path) -> list[str]:
    models = [a for kind in ("ideal", "broken") for a in ("--model", f"replay:{CASSETTES / kind}.jsonl")]
    axes = ["--temperature", "0", "--temperature", "0.5", "--parser", "strict", "--parser", "lenient", "--tool-mode", "prompt"]
    return ["run", str(SCENARIO), *models, *axes, "--repeats", str(max(1, runs // 8)), "--ledger", str(ledger)]


def _run_whole(runs: int, work: Path) -> tuple[Path, float]:
    ledger = work / "whole.sqlite"
    started = time.perf_counter()
    subprocess.run(
        _harness(*_run_args(runs, ledger)), check=True, cwd=work, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return ledger, time.perf_counter() - started


def _run_shards(runs: int, shards: int, work: Path, *, sequential: bool) -> tuple[list[Path], float]:
    ledgers = [work / f"shard-{i}.sqlite" for i in range(shards)]
    started = time.perf_counter()
    procs = []
    for i, ledger in enumerate(ledgers):
        cmd = _harness(*_run_args(runs, ledger), "--shard", f"{i}/{shards}")
        proc = subprocess.Popen(cmd, cwd=work, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if sequential:
            proc.wait()
        procs.append(proc)
    if any(proc.wait() != 0 for proc in procs):
        raise SystemExit("a shard failed")
    return ledgers, time.perf_counter() - started


def _merge(shards: list[Path], work: Path, merges: int) -> tuple[Path, list[tuple[float, float]], float]:
    """Merge ``merges`` times in this process (wall and CPU seconds each), then once with the command."""
    times = []
    for n in range(merges):
        out = work / f"merged-{n}.sqlite"
        for stale in work.glob(f"{out.name}*"):
            stale.unlink()
        started, cpu = time.perf_counter(), time.process_time()
        merge_ledgers(out, shards)
        times.append((time.perf_counter() - started, time.process_time() - cpu))
    cli_out = work / "merged-cli.sqlite"
    for stale in work.glob(f"{cli_out.name}*"):
        stale.unlink()
    started = time.perf_counter()
    subprocess.run(_harness("ledger", "merge", str(cli_out), *map(str, shards)), check=True, cwd=work, env=_env(),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return cli_out, times, time.perf_counter() - started


def _reports_equal(whole: Path, merged: Path, work: Path) -> list[str]:
    """Tables whose rows differ (timing columns and run ids left out)."""
    for name, ledger in (("whole", whole), ("merged", merged)):
        cmd = _harness("report", "--ledger", str(ledger), "--out", str(work / f"report-{name}"), "--format", "csv")
        subprocess.run(cmd, check=True, cwd=work, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return [t for t in TABLES if report_csv_rows(work / "report-whole" / t) != report_csv_rows(work / "report-merged" / t)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000, help="planned runs (a multiple of 8; default 10000)")
    parser.add_argument("--shards", type=int, default=4, help="shards (default 4)")
    parser.add_argument("--sequential", action="store_true", help="run the shards one after another, not side by side")
    parser.add_argument("--merges", type=int, default=3, help="timed merges (default 3; the median is printed)")
    parser.add_argument("--merge-only", action="store_true", help="merge and compare the ledgers an earlier run left in --work")
    parser.add_argument("--work", type=Path, default=None, help="folder for the ledgers (default: a new temporary folder)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="harness_shard_merge_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.merge_only:  # the ledgers of an earlier run in --work
        whole, whole_s = work / "whole.sqlite", float("nan")
        shards, shards_s = sorted(work.glob("shard-*.sqlite"), key=lambda p: int(p.stem.split("-")[1])), float("nan")
    else:
        whole, whole_s = _run_whole(args.runs, work)
        shards, shards_s = _run_shards(args.runs, args.shards, work, sequential=args.sequential)
    merged, times, cli_s = _merge(shards, work, args.merges)
    with Ledger(merged, readonly=True) as ledger:
        counts, verified = ledger.row_counts(), ledger.verify()
    shares = []
    for path in shards:
        with Ledger(path, readonly=True) as ledger:
            shares.append(ledger.row_counts()["runs"])
    differ = _reports_equal(whole, merged, work)
    print(f"matrix: {sum(shares)} runs ({counts['turns']} turns); whole in {whole_s:.1f} s; {args.shards} shards "
          f"{'one after another' if args.sequential else 'side by side'} in {shards_s:.1f} s, runs per shard {shares}")  # fmt: skip
    walls, cpus = [w for w, _ in times], [c for _, c in times]
    print(f"merge: median {statistics.median(walls):.2f} s wall, {statistics.median(cpus):.2f} s CPU of {args.merges} "
          f"({', '.join(f'{w:.2f}' for w in walls)}); "
          f"`harness ledger merge` command {cli_s:.2f} s; merged ledger {counts['runs']} runs, verifies: {verified.ok}")  # fmt: skip
    print(
        f"merged report equals the unsharded one (timing columns and run ids left out): {'yes' if not differ else 'NO: ' + ', '.join(differ)}"
    )
    print(f"load average {os.getloadavg()[0]:.1f}; work folder {work}")
    return 0 if not differ and verified.ok else 1


if __name__ == "__main__":
    sys.exit(main())
