"""A real Ollama server, when you have one: set HARNESS_LIVE_OLLAMA to a pulled model name
(e.g. ``HARNESS_LIVE_OLLAMA=qwen2.5-coder:1.5b pytest -m live``). Skipped otherwise."""

from __future__ import annotations

import os

import pytest

from harness.ledger import Ledger
from harness.loop import RunOptions
from harness.matrix import MatrixOverrides
from harness.runner import expand_matrix, run_matrix
from harness.scenarios import load_scenario
from harness.vocab import OUTCOMES
from tests.helpers import REPO

MODEL = os.environ.get("HARNESS_LIVE_OLLAMA")
pytestmark = [pytest.mark.live, pytest.mark.skipif(not MODEL, reason="set HARNESS_LIVE_OLLAMA=<pulled model> to run")]


@pytest.mark.parametrize("tool_mode", ["native", "prompt"])
def test_one_run_on_a_real_ollama_model(tmp_path, tool_mode):
    scenario = load_scenario(REPO / "scenarios" / "list_and_report.toml")
    plans = expand_matrix([scenario], MatrixOverrides([f"ollama:{MODEL}"], [0.0], 1, None, [tool_mode], None))
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        result = run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs"))
        assert not result.skipped, f"HARNESS_LIVE_OLLAMA is set but the run was skipped: {result.skipped[0][1]}"
        [run] = ledger.runs()
        assert ledger.verify().ok
    assert run.outcome in OUTCOMES and run.outcome != "infra_error", run.end.error
    assert run.start.server_version and run.start.model_digest.startswith("sha256:")
