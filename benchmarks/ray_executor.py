"""Ray executor benchmarks (issue 16): throughput against 16 slow servers, and the executor's cost per turn.

Run: ``python benchmarks/ray_executor.py`` (both parts, a few minutes on 2 cores); ``--part throughput`` or
``--part overhead`` for one. Needs Ray (``pip install 'agent-loop-harness[ray]'``); without it the script says so and
exits 0. Ray stays local: one cluster on this machine (``ray.init(num_cpus=--ray-cpus)``, default 2, started once
before anything is timed; its start-up time is printed), nothing listens beyond 127.0.0.1 but Ray's own local ports.

1. Throughput. ``--servers`` (16) scripted OpenAI-compatible servers (tests/fake_agent_server.py), all in one child
   process on 127.0.0.1, each answering after ``--latency-ms`` (200) with ``--slots`` (4) requests at once, playing
   ``list_and_report`` as an ideal agent (3 turns a run). The matrix names each server as its own model
   (``--model openai:ideal@URL_i``, 16 specs: replicas of one model only run with threads), ``--jobs`` (4) per model,
   ``--runs-per-slot`` (4) runs per slot, so ``servers x jobs`` = 64 requests can be in flight and the ideal is
   ``64 / latency`` turns/s. Each executor of ``--executor`` (default ``threads,ray``) runs the same matrix into a
   fresh ledger; printed: wall time, turns/s and the fraction of ideal, the driver's CPU per turn. ``--ray-cpu`` sets
   each actor's CPU share (``--ray-resources SPEC=CPU:X`` for every model; default: the executor's own default),
   ``--workers`` the actors per model (default: the executor's, 2).
2. Per-turn overhead. ``list_and_report`` replayed from its ideal cassette (zero latency, 3 turns a run), ``--runs``
   (200) runs at ``--jobs``, by each executor of ``--overhead-executor`` (default ``threads,processes,ray``) in turn,
   ``--rounds`` (3) rounds alternating them in this one process; printed per executor: the median over rounds of
   whole-run wall time / turns (the executor's start, e.g. Ray's actors, included; the cluster's start not).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TURNS_PER_RUN = 3
SCENARIO = REPO / "scenarios" / "list_and_report.toml"
CASSETTE = REPO / "tests" / "cassettes" / "list_and_report" / "ideal.jsonl"


def _serve(count: int, latency_ms: float, slots: int) -> None:
    """The child process: ``count`` scripted servers; prints their base URLs, one a line, then serves until stdin ends."""
    from tests.fake_agent_server import FakeAgentServer

    servers = [FakeAgentServer(delay_s=latency_ms / 1000, slots=slots) for _ in range(count)]
    for server in servers:
        server.__enter__()
    print("\n".join(s.base_url for s in servers), flush=True)
    sys.stdin.read()
    for server in servers:
        server.close()


class ServerProcess:
    """The scripted servers in a child process; a context manager with ``urls``."""

    def __init__(self, count: int, latency_ms: float, slots: int) -> None:
        argv = [sys.executable, __file__, "--serve", str(count), "--latency-ms", str(latency_ms), "--slots", str(slots)]
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.urls = [self.process.stdout.readline().strip() for _ in range(count)]

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        self.process.wait(10)
        self.process.stdout.close()


def _matrix(models: list[str], repeats: int, folder: Path, options: dict[str, object]) -> dict[str, float]:
    """Run ``list_and_report`` for ``models`` x ``repeats`` into a fresh ledger; wall and CPU seconds, turns, outcomes."""
    from harness.ledger import Ledger
    from harness.loop import RunOptions
    from harness.runner import MatrixOverrides, expand_matrix, run_matrix
    from harness.scenarios import load_scenario

    plans = expand_matrix([load_scenario(SCENARIO)], MatrixOverrides(models, [0.0], repeats, None, ["native"], ["lenient"]))
    with Ledger(folder / "ledger.sqlite") as ledger:
        cpu, start = time.process_time(), time.perf_counter()
        result = run_matrix(plans, ledger, RunOptions(runs_dir=folder / "runs", **options))  # type: ignore[arg-type]
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        rows = ledger.row_counts()
    outcomes = sorted({s.outcome for s in result.summaries})
    turns = sum(s.turns for s in result.summaries)
    runs = len(plans)
    assert outcomes == ["pass"] and len(result.summaries) == runs and rows["runs"] == runs, (outcomes, rows, runs)
    assert turns == runs * TURNS_PER_RUN == rows["turns"], (turns, rows)
    return {"runs": runs, "turns": turns, "wall_s": wall, "cpu_s": cpu}


def _options(executor: str, models: list[str], args: argparse.Namespace) -> dict[str, object]:
    options: dict[str, object] = {"executor": executor, "jobs": args.jobs}
    if executor == "ray" and args.ray_cpu is not None:
        options["ray_resources"] = {model: {"CPU": args.ray_cpu} for model in models}
    if executor == "ray" and args.workers is not None:
        options["workers"] = args.workers
    return options


def throughput(tmp: Path, args: argparse.Namespace) -> list[dict[str, float]]:
    """Part 1: the same matrix against ``args.servers`` slow servers by each executor; the figures, one dict each."""
    latency_s, in_flight = args.latency_ms / 1000, args.servers * min(args.jobs, args.slots)
    ideal = in_flight / latency_s
    print(f"1. Throughput: {args.servers} servers answering after {args.latency_ms:g} ms with {args.slots} slots each, "
          f"{args.servers} models, --jobs {args.jobs}: ideal {in_flight} in flight = {ideal:.0f} turns/s", flush=True)  # fmt: skip
    figures = []
    with ServerProcess(args.servers, args.latency_ms, args.slots) as servers:
        models = [f"openai:ideal@{url}" for url in servers.urls]
        for executor in args.executor.split(","):
            folder = tmp / f"throughput-{executor}-{time.monotonic_ns()}"
            f = _matrix(models, args.jobs * args.runs_per_slot, folder, _options(executor, models, args))
            f["turns_per_s"] = f["turns"] / f["wall_s"]
            f["ideal"] = f["turns_per_s"] / ideal
            print(f"   {executor:9} {f['runs']:.0f} runs, {f['turns']:.0f} turns in {f['wall_s']:6.2f} s: "
                  f"{f['turns_per_s']:6.1f} turns/s = {f['ideal']:.2f} x ideal; driver CPU "
                  f"{f['cpu_s'] / f['turns'] * 1000:.2f} ms/turn; load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
            figures.append({"executor": executor, **f})  # type: ignore[dict-item]
    return figures


def overhead(tmp: Path, args: argparse.Namespace) -> dict[str, list[float]]:
    """Part 2: ms per turn (whole-run wall time / turns) of each executor on the replay backend, by executor."""
    executors = args.overhead_executor.split(",")
    print(f"2. Per-turn overhead: list_and_report replayed (zero latency), {args.runs} runs at --jobs {args.jobs}, "
          f"{args.rounds} rounds alternating {', '.join(executors)}", flush=True)  # fmt: skip
    models = [f"replay:{CASSETTE}"]
    per_turn: dict[str, list[float]] = {e: [] for e in executors}
    for round_ in range(args.rounds):
        order = executors if round_ % 2 == 0 else executors[::-1]
        for executor in order:
            folder = tmp / f"overhead-{executor}-{round_}"
            f = _matrix(models, args.runs, folder, _options(executor, models, args))
            per_turn[executor].append(f["wall_s"] / f["turns"] * 1000)
            print(f"   round {round_ + 1} {executor:9} {f['turns']:.0f} turns in {f['wall_s']:6.2f} s: "
                  f"{per_turn[executor][-1]:.2f} ms/turn (driver CPU {f['cpu_s'] / f['turns'] * 1000:.2f} ms/turn); "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    base = statistics.median(per_turn[executors[0]])
    for executor, values in per_turn.items():
        median = statistics.median(values)
        print(f"   median {executor:9} {median:.2f} ms/turn ({median / base:.2f} x {executors[0]}; "
              f"range {min(values):.2f}-{max(values):.2f})", flush=True)  # fmt: skip
    return per_turn


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("both", "throughput", "overhead"), default="both")
    parser.add_argument("--servers", type=int, default=16, help="scripted servers, one model each (default 16)")
    parser.add_argument("--latency-ms", type=float, default=200.0, help="each server's delay per reply (default 200)")
    parser.add_argument("--slots", type=int, default=4, help="requests each server answers at once (default 4)")
    parser.add_argument("--jobs", type=int, default=4, help="--jobs: runs in flight per model (default 4)")
    parser.add_argument("--runs-per-slot", type=int, default=4, help="throughput: runs per model and job (default 4)")
    parser.add_argument("--executor", default="threads,ray", help="throughput: executors, comma-separated")
    parser.add_argument("--overhead-executor", default="threads,processes,ray", help="overhead: executors, comma-separated")
    parser.add_argument("--runs", type=int, default=200, help="overhead: runs per executor and round (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="overhead: rounds (default 3)")
    parser.add_argument("--ray-cpus", type=float, default=2, help="CPUs of the local Ray cluster (default 2)")
    parser.add_argument("--ray-cpu", type=float, help="each actor's CPU share (default: the executor's default)")
    parser.add_argument("--workers", type=int, help="ray: actors per model (default: the executor's default, 2)")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = _parser().parse_args()
    if args.serve:
        _serve(args.serve, args.latency_ms, args.slots)
        return
    if importlib.util.find_spec("ray") is None:
        print("Ray is not installed (pip install 'agent-loop-harness[ray]'): nothing to measure.")
        return
    import ray

    load = os.getloadavg()
    print(f"Ray executor, {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}", flush=True)
    start = time.perf_counter()
    ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
    print(f"   local Ray cluster ({args.ray_cpus:g} CPUs) started in {time.perf_counter() - start:.1f} s", flush=True)
    try:
        with tempfile.TemporaryDirectory() as folder:
            if args.part in ("both", "throughput"):
                throughput(Path(folder), args)
            if args.part in ("both", "overhead"):
                overhead(Path(folder), args)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
