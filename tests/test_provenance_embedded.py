"""Provenance and the warm-up on the real embedded server (the bundled llama.cpp, ``xllamacpp`` 2026.10.11549).

Observed from this server's ``GET /props``: ``chat_template`` (the GGUF's ``tokenizer.chat_template``, or the
``--chat-template`` override), ``chat_template_caps`` (``supports_tools``, ``supports_tool_calls``, ...),
``default_generation_settings.params`` (``temperature`` 0.8, ``top_k`` 40, ``top_p`` 0.95, ``min_p`` 0.05, ...),
``model_ftype`` (``Q4_1`` for SmolLM2-135M-Instruct), ``build_info``; ``GET /v1/models`` ``data[0].meta.n_params``
(134515008). :func:`tests.server_fakes.llamacpp_props` follows this shape.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest

from harness.backends import EmbeddedBackend
from harness.ledger import Ledger
from harness.loop import RunOptions, RunPlan
from harness.runner import run_matrix

pytestmark = pytest.mark.slow
TEMPLATE = (Path(__file__).resolve().parent / "data" / "qwen_tool_template.jinja").read_text(encoding="utf-8")


def test_the_embedded_server_reports_its_props_as_the_fakes_have_them():
    with EmbeddedBackend("smollm2-135m", num_ctx=512) as backend:
        props = httpx.get(backend.start().removesuffix("/v1") + "/props", timeout=10).json()
        facts = backend.provenance()
    assert {"chat_template", "chat_template_caps", "default_generation_settings", "model_ftype", "build_info"} <= set(props)
    assert props["chat_template_caps"]["supports_tools"] is False
    assert "You are a helpful AI assistant named SmolLM" in facts["chat_template"]
    assert (facts["template_tools"], facts["quantization"], facts["parameters"]) == (False, "Q4_1", "134515008")
    assert facts["sampling_defaults"]["top_k"] == 40 and round(facts["sampling_defaults"]["temperature"], 3) == 0.8


def test_a_tool_template_given_to_the_server_is_the_one_recorded_with_its_tool_support():
    with EmbeddedBackend("smollm2-135m", num_ctx=512, chat_template=TEMPLATE) as backend:
        facts = backend.provenance()
    assert (facts["chat_template"], facts["template_tools"]) == (TEMPLATE.rstrip("\n"), True)  # the server trims the end


def test_an_embedded_run_records_the_warm_up_with_the_run_and_not_as_a_turn(tmp_path, scenario):
    plan = RunPlan(scenario, "embedded:smollm2-135m", 0.0)
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        (summary,) = run_matrix([plan], ledger, RunOptions(runs_dir=tmp_path / "runs")).summaries
        (row,) = ledger.runs()
        turns = ledger.turns(summary.run_id)
        (model_run,) = ledger.model_runs()
    config = row.start.config
    assert config["warmup_ms"] > 0 and "warmup_error" not in config
    assert [t.record.turn for t in turns] == list(range(1, summary.turns + 1))  # turns numbered from 1: no warm-up turn
    provenance = config["provenance"]
    assert model_run["template"] is not None
    assert provenance["template_sha256"] == hashlib.sha256(model_run["template"].encode()).hexdigest()
    assert (provenance["template_tools"], provenance["quantization"]) == (False, "Q4_1")
