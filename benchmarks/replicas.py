"""Replicas benchmark: runs per second spread over 1, 2 and 4 replicas, and a matrix outliving a replica.

Run: ``python benchmarks/replicas.py [--jobs 4] [--latency-ms 200] [--runs-per-slot 6]`` (about half a minute on 2
cores). Each replica is a scripted OpenAI-compatible server on 127.0.0.1 (tests/fake_agent_server.py) answering every
request after ``--latency-ms`` with ``--jobs`` slots, playing ``list_and_report`` as an ideal agent (3 turns a run).
The harness side is :func:`run_matrix` as ``harness run ... --model "openai:ideal@URL1,URL2,..." --jobs J`` runs it.

Prints, per replica count R: runs, wall time, runs/s, the speed-up over one replica and the fraction of ideal,
``runs/s / (R x jobs / (3 x latency))`` (each of the ``R x jobs`` runs in flight completes one turn per latency at best;
start-up, the warm-up and the last runs' tail count against it). Then the same matrix on
2 replicas where one stops answering (connection dropped, socket closed) after a third of the runs: every run must
still pass; prints the wall time and the failed attempts recorded.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.ledger import Ledger  # noqa: E402
from harness.loop import RetryPolicy, RunOptions  # noqa: E402
from harness.runner import MatrixOverrides, expand_matrix, run_matrix  # noqa: E402
from harness.scenarios import load_scenario  # noqa: E402
from tests.fake_agent_server import FakeAgentServer  # noqa: E402

SCENARIO = load_scenario(REPO / "scenarios" / "list_and_report.toml")
TURNS_PER_RUN = 3


def _matrix(tmp: Path, name: str, urls: list[str], runs: int, jobs: int) -> tuple[float, list[str], int]:
    spec = "openai:ideal@" + ",".join(urls)
    plans = expand_matrix([SCENARIO], MatrixOverrides([spec], [0.0], runs, None, ["native"], ["lenient"]))
    with Ledger(tmp / f"{name}.sqlite") as ledger:
        start = time.perf_counter()
        result = run_matrix(plans, ledger, RunOptions(runs_dir=tmp / "runs", jobs=jobs, retry=RetryPolicy(base_delay_s=0.05)))
        elapsed = time.perf_counter() - start
        attempts = len(ledger.attempts())
    return elapsed, [s.outcome for s in result.summaries], attempts


def scaling(tmp: Path, jobs: int, latency_s: float, runs_per_slot: int) -> None:
    print(f"1. Runs spread over replicas, each answering after {latency_s * 1000:.0f} ms with {jobs} slots, --jobs {jobs}")
    single = None
    for replicas in (1, 2, 4):
        servers = [FakeAgentServer(delay_s=latency_s, slots=jobs) for _ in range(replicas)]
        for server in servers:
            server.__enter__()
        try:
            runs = replicas * jobs * runs_per_slot
            elapsed, outcomes, _ = _matrix(tmp, f"r{replicas}", [s.base_url for s in servers], runs, jobs)
        finally:
            for server in servers:
                server.close()
        assert outcomes == ["pass"] * runs, outcomes
        ideal, rate = replicas * jobs / (TURNS_PER_RUN * latency_s), runs / elapsed
        single = single or rate
        print(f"   {replicas} replica{'s' if replicas > 1 else ' '}: {runs:3d} runs in {elapsed:5.2f} s = {rate:5.2f} runs/s, "
              f"{rate / single:.2f} x one replica; {rate / ideal:.2f} x ideal")  # fmt: skip


def failover(tmp: Path, jobs: int, latency_s: float, runs_per_slot: int) -> None:
    runs = 2 * jobs * runs_per_slot
    dead = threading.Event()

    def dies(number: int) -> str | None:
        if number > runs and not dead.is_set():  # about a third of the matrix's requests came in
            dead.set()
            threading.Thread(target=dying.close).start()
        return "drop" if dead.is_set() else None

    with (
        FakeAgentServer(delay_s=latency_s, slots=jobs) as alive,
        FakeAgentServer(delay_s=latency_s, slots=jobs, faults=dies) as dying,
    ):
        elapsed, outcomes, attempts = _matrix(tmp, "failover", [alive.base_url, dying.base_url], runs, jobs)
    assert outcomes == ["pass"] * runs, outcomes
    print(f"2. The same on 2 replicas, one dying after {runs} requests: {runs} runs in {elapsed:5.2f} s, all pass; "
          f"{attempts} failed attempts recorded, each retried on the other replica, which held at most "
          f"{alive.max_in_flight} requests at once (--jobs {jobs}; a run moved mid-way counts past it)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--runs-per-slot", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="harness-replicas-") as tmp:
        scaling(Path(tmp), args.jobs, args.latency_ms / 1000, args.runs_per_slot)
        failover(Path(tmp), args.jobs, args.latency_ms / 1000, args.runs_per_slot)


if __name__ == "__main__":
    main()
