"""Matrix benchmark: harness overhead per turn, and throughput scaling with --jobs.

Run: ``python benchmarks/matrix_scale.py`` (about a minute on 2 cores). Prints:

1. Overhead per turn (classify + execute tools + write the ledger) against a zero-latency
   replay backend: turns per second and the median per-turn overhead in ms (target < 2 ms).
2. Scaling: a scripted OpenAI-compatible server on 127.0.0.1 (tests/fake_agent_server.py) answering
   every request after a fixed delay with 16 slots; runs per second for jobs = 1, 2, 4, 8, 16
   and the ratio to jobs x single-job throughput (target >= 0.85 up to 16 jobs).
3. The ledger under concurrency: 16 concurrent runs; rows counted and the chain verified.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

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

    def record_turn(self, record):
        super().record_turn(record)
        _OVERHEAD_MS.append((time.perf_counter() - _STAMP[threading.get_ident()]) * 1000)


_STAMP: dict[int, float] = {}
_OVERHEAD_MS: list[float] = []


def overhead(tmp: Path, runs: int = 200) -> None:
    cassette = tmp / "ideal.jsonl"
    cassette.write_text("\n".join([
        _line([("list_files", {"path": "."})]),
        _line([("read_file", {"path": "memo.md"})]),
        _line([("write_file", {"path": "report.txt", "content": REPORT})]),
        _line(content="I wrote report.txt."),
    ]) + "\n")  # fmt: skip
    plans = expand_matrix([SCENARIO], MatrixOverrides([f"replay:{cassette}"], [0.0], runs, None, ["native"], None))
    with _TimedLedger(tmp / "overhead.sqlite") as ledger:
        start = time.perf_counter()
        result = run_matrix(
            plans, ledger, RunOptions(runs_dir=tmp / "runs"), backend_factory=lambda spec, **kw: _TimedReplay(cassette)
        )
        elapsed = time.perf_counter() - start
    total_turns = sum(s.turns for s in result.summaries)
    ordered = sorted(_OVERHEAD_MS)
    print("1. Harness overhead per turn (zero-latency replay backend, jobs=1)")
    print(f"   {len(result.summaries)} runs, {total_turns} turns in {elapsed:.2f} s = {total_turns / elapsed:.0f} turns/s "
          f"(wall time incl. sandbox setup and run rows: {elapsed / total_turns * 1000:.2f} ms per turn)")  # fmt: skip
    print(f"   per-turn overhead (classify + tools + ledger write): median {statistics.median(ordered):.2f} ms, "
          f"p99 {ordered[int(len(ordered) * 0.99)]:.2f} ms")  # fmt: skip


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


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        overhead(Path(folder))
        scaling(Path(folder))
        ledger_concurrency(Path(folder))
