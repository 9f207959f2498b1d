"""Issue 14, reproducibility: the server's parallel slots are recorded with every run, and the embedded server's slot
count (``--embedded-slots``, default 1) enters a run's identity when it is not 1, so runs recorded before keep theirs.

Servers are real HTTP servers on 127.0.0.1 answering as :mod:`tests.server_fakes` has llama.cpp and Ollama answer;
the embedded backends below are opened on a small fake ``.gguf`` file and never started (their identity only hashes
the file), except in the ``slow`` test at the end, which runs the real embedded model in two processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.backends import BackendIdentity, EmbeddedBackend, open_backend
from harness.canonical import sha256_of
from harness.ledger import Ledger
from harness.loop import IDENTITY_VERSION, RetryPolicy, RunOptions, RunPlan
from harness.runner import plan_matrix, run_matrix
from tests.backend_fakes import FakeServer, json_reply
from tests.helpers import REPO, RUN_FLAGS, SCENARIO_FILE, assert_one_sentence_error, cli, scenario_toml
from tests.server_fakes import llamacpp_chat, llamacpp_models, llamacpp_props, ollama_chat, ollama_show, ollama_tags

FAST = RetryPolicy(max_attempts=1, base_delay_s=0.01, max_delay_s=0.02)


@pytest.fixture
def gguf(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF-fake-weights")
    return path


# -- identity ---------------------------------------------------------------------------------------------------------
def test_two_runs_differing_only_in_slots_are_distinct_identities_and_one_slot_is_the_identity_from_before(scenario):
    plan = RunPlan(scenario, "embedded:smollm2-135m", 0.0, seed=3, tool_mode="prompt", parser="strict", repetition=1)
    before = {  # the identity payload as the harness computed it before slots were counted (commit 46366ea)
        "v": IDENTITY_VERSION, "scenario": scenario.content_hash, "tools": scenario.tool_schemas(),
        "system": scenario.system_message("prompt"), "model": plan.model, "digest": "sha256:ab",
        "options": {"temperature": 0.0, "seed": 4, "max_tokens": scenario.max_tokens, "num_ctx": scenario.num_ctx},
        "tool_mode": "prompt", "parser": "strict", "repetition": 1,
    }  # fmt: skip
    assert plan.identity("sha256:ab") == plan.identity("sha256:ab", 1) == plan.identity("sha256:ab", None)
    assert plan.identity("sha256:ab", 1) == sha256_of(before)
    assert plan.identity("sha256:ab", 2) == sha256_of({**before, "slots": 2})
    assert len({plan.identity("sha256:ab", slots) for slots in (1, 2, 4)}) == 3


def test_only_the_embedded_backend_puts_its_slots_into_the_identity(gguf):
    for parallel, expected in ((1, None), (2, 2), (8, 8)):
        ident = EmbeddedBackend(str(gguf), parallel=parallel, num_ctx=256).identity()
        assert (ident.slots, ident.identity_slots) == (parallel, expected)
    assert BackendIdentity(backend="openai", model="m").identity_slots is None  # a server the harness does not start


def test_the_planned_identity_is_the_recorded_one_and_differs_with_the_embedded_slots(tmp_path, gguf, scenario):
    plan = RunPlan(scenario, f"embedded:{gguf}", 0.0)
    digest = EmbeddedBackend(str(gguf), num_ctx=256).identity().identity_digest
    planned = {
        slots: [p.identity for p in plan_matrix([plan], None, jobs=slots, embedded_slots=slots).planned] for slots in (1, 2)
    }
    assert planned == {1: [plan.identity(digest)], 2: [plan.identity(digest, 2)]}
    assert plan_matrix([plan], None, jobs=4).planned[0].identity == plan.identity(digest)  # --jobs alone: one slot


def test_more_jobs_than_embedded_slots_queue_and_are_warned_about(gguf, scenario):
    plan = RunPlan(scenario, f"embedded:{gguf}", 0.0)
    assert plan_matrix([plan], None, jobs=2, embedded_slots=2).warnings == []
    assert plan_matrix([plan], None, jobs=4, embedded_slots=2).warnings == [
        f"--jobs 4 for embedded:{gguf}: its embedded server has 2 slots (--embedded-slots), so requests queue at it "
        "in an order that varies from run to run; more slots answer them at once, with other replies than one slot gives."
    ]


# -- recorded with every run ------------------------------------------------------------------------------------------
def _routes_with_slots(slots):
    return {
        ("GET", "/props"): llamacpp_props("{{ messages }}", supports_tools=True, slots=slots),
        ("GET", "/v1/models"): llamacpp_models(494032768),
        ("POST", "/v1/chat/completions"): llamacpp_chat("I cannot list files."),
    }


def _run(tmp_path, plans, jobs=1):
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs", retry=FAST, jobs=jobs),
                   backend_factory=lambda spec, **kw: open_backend(spec, **{**kw, "timeout_s": 10}))  # fmt: skip
        return ledger.runs()


def test_every_run_records_the_slots_its_server_reports_or_null(tmp_path, scenario):
    model = "qwen3:0.6b"
    ollama = {
        ("GET", "/api/version"): json_reply(200, {"version": "0.33.0-rc2"}),
        ("GET", "/api/tags"): ollama_tags({model: "a8" * 32}),
        ("POST", "/api/show"): ollama_show(["completion", "tools"]),
        ("POST", "/api/chat"): ollama_chat([{"content": "I cannot list files."}] * 8, model=model),
    }
    bare = {("POST", "/v1/chat/completions"): llamacpp_chat("I cannot list files.")}  # vLLM, a hosted API: no /props
    with FakeServer(_routes_with_slots(4)) as llama, FakeServer(ollama) as oll, FakeServer(bare) as vllm:
        specs = {f"openai:q@{llama.url}/v1": 4, f"ollama:{model}@{oll.url}": None, f"openai:v@{vllm.url}/v1": None}
        plans = [RunPlan(scenario, spec, 0.0, repetition=r) for spec in specs for r in range(2)]
        runs = _run(tmp_path, plans, jobs=2)
    assert len(runs) == 6
    assert {run.start.model: run.start.config["server_slots"] for run in runs} == specs
    assert all("slots" not in run.start.config["provenance"] for run in runs)
    openai = [p for p in plans if p.model.startswith("openai:")]  # no digest: the identity is the plan's alone
    assert {r.start.identity for r in runs if r.start.backend == "openai"} == {p.identity(None) for p in openai}


def test_a_server_reporting_nonsense_slots_records_null(tmp_path, scenario):
    for junk in ("4", 0, -1, True, 2**40, None):
        with FakeServer(_routes_with_slots(junk)) as server:
            (run,) = _run(tmp_path / str(junk), [RunPlan(scenario, f"openai:q@{server.url}/v1", 0.0)])
        assert run.start.config["server_slots"] is None, junk


@pytest.mark.parametrize("value", ["0", "257"])
def test_embedded_slots_out_of_range_is_one_sentence(tmp_path, capsys, value):
    rc, out, err = cli(capsys, "run", SCENARIO_FILE, *RUN_FLAGS, "--embedded-slots", value, "--dry-run",
                       "--ledger", tmp_path / "l.sqlite")  # fmt: skip
    assert_one_sentence_error(rc, err)
    assert "--embedded-slots" in err and not (tmp_path / "l.sqlite").exists()


# -- byte for byte, on the real embedded model ------------------------------------------------------------------------
@pytest.mark.slow
def test_jobs_1_on_the_embedded_model_reproduces_the_replies_byte_for_byte_across_two_processes(tmp_path):
    """One slot, the same seed, the same order: two separate processes get the same replies, byte for byte."""
    scenario = scenario_toml(
        tmp_path, head_replace=[("max_tokens = 256", "max_tokens = 24"), ("turn_limit = 8", "turn_limit = 3")]
    )
    replies = []
    for name in ("first", "second"):
        ledger = tmp_path / f"{name}.sqlite"
        done = subprocess.run(
            [sys.executable, "-m", "harness", "run", str(scenario), "--model", "embedded:smollm2-135m", "--repeats", "2",
             "--temperature", "0", "--temperature", "0.8", "--seed", "7", "--jobs", "1", "--request-timeout", "600",
             "--ledger", str(ledger)],
            cwd=tmp_path, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        with Ledger(ledger, readonly=True) as db:
            runs = sorted(db.runs(), key=lambda r: (r.start.temperature, r.start.repetition))
            assert [r.start.config["server_slots"] for r in runs] == [1] * 4
            replies.append([
                (run.start.identity, [json.dumps(t.record.raw_reply["choices"], sort_keys=True).encode()
                                      + json.dumps(t.record.raw_reply.get("usage"), sort_keys=True).encode()
                                      for t in db.turns(run.run_id)])
                for run in runs
            ])  # fmt: skip
    assert replies[0] == replies[1]
    assert sum(len(turns) for _, turns in replies[0]) >= 4
