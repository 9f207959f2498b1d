"""End to end on the real embedded model (SmolLM2-135M via xllamacpp): the README's first command, short."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.ledger import Ledger
from harness.vocab import OUTCOMES
from tests.helpers import REPO

pytestmark = pytest.mark.slow


def harness(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True, timeout=900,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})  # fmt: skip


def test_harness_run_on_the_embedded_model_records_every_turn(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    # a generous deadline: on a busy 2-core machine the default (60 s + 0.2 s per token) can pass mid-reply
    done = harness("run", str(REPO / "scenarios" / "list_and_report.toml"), "--repeats", "1", "--temperature", "0",
                   "--ledger", str(ledger), "--record", str(tmp_path / "cassettes"), "--request-timeout", "600",
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "[1/1] list_and_report embedded:smollm2-135m T=0 seed=0 prompt/lenient rep=0 -> " in done.stdout
    assert "| list_and_report | embedded:smollm2-135m |" in done.stdout
    with Ledger(ledger, readonly=True) as db:
        [run] = db.runs()
        turns = db.turns(run.run_id)
        assert db.verify().ok
    assert run.outcome in OUTCOMES and run.outcome != "infra_error"
    assert run.start.backend == "embedded" and run.start.model_digest.startswith("sha256:b179c952")
    assert run.start.server_version and run.start.tool_mode == "prompt"
    assert len(turns) == run.end.turns >= 1
    for turn in turns:
        raw = turn.record.raw_reply
        assert raw["choices"][0]["message"]["role"] == "assistant"
        assert turn.record.prompt_tokens > 0 and turn.record.completion_tokens >= 0 and turn.record.latency_ms > 0
    [cassette] = (tmp_path / "cassettes").glob("*.jsonl")
    assert len(cassette.read_text().splitlines()) == len(turns)

    # the recorded cassette replays the same replies and is scored the same way
    replayed_ledger = tmp_path / "replayed.sqlite"
    done = harness("run", str(REPO / "scenarios" / "list_and_report.toml"), "--repeats", "1", "--temperature", "0",
                   "--model", f"replay:{cassette}", "--ledger", str(replayed_ledger), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Ledger(replayed_ledger, readonly=True) as db:
        [replayed] = db.runs()
        replayed_turns = db.turns(replayed.run_id)
    assert replayed.outcome == run.outcome
    assert [t.record.content for t in replayed_turns] == [t.record.content for t in turns]
    assert [t.record.failure_modes for t in replayed_turns] == [t.record.failure_modes for t in turns]

    exported = harness("export", "--ledger", str(ledger), "--format", "csv", cwd=tmp_path)
    assert exported.returncode == 0
    header = exported.stdout.splitlines()[0]
    assert header.startswith("run_id,scenario,model,temperature,seed,tool_mode,parser,think,repetition,turn,failure_modes")
    assert len(exported.stdout.splitlines()) == 1 + len(turns)
