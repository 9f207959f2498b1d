"""A plan's identity is assembled from the scenario's tools and system prompt encoded once per scenario: it stays
``sha256_of`` the whole payload, as written before (the reference below), for any plan."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.canonical import sha256_of
from harness.loop import IDENTITY_VERSION, RunPlan
from harness.scenarios import load_scenario
from tests.helpers import SCENARIO_FILE

SCENARIO = load_scenario(SCENARIO_FILE)


def reference_identity(plan: RunPlan, model_digest: str | None, slots: int | None) -> str:
    """The identity as :meth:`RunPlan.identity` documents it: SHA-256 of the canonical JSON of this payload."""
    payload = {
        "v": IDENTITY_VERSION,
        "scenario": plan.scenario.content_hash,
        "tools": plan.scenario.tool_schemas(),
        "system": plan.scenario.system_message(plan.tool_mode),
        "model": plan.named_model,
        "digest": model_digest,
        "options": plan.options().as_dict(),
        "tool_mode": plan.tool_mode,
        "parser": plan.parser,
        "repetition": plan.repetition,
    }
    if slots is not None and slots != 1:
        payload["slots"] = slots
    return sha256_of(payload)


texts = st.text(st.characters(codec="utf-8") | st.sampled_from(["\ud800", "é", '"', "\\", "\n", "\x00"]), max_size=30)


@settings(max_examples=150, deadline=None)
@given(
    prompt=texts,
    model=st.sampled_from(["replay:/x.jsonl", "openai:m@http://a/v1,http://b/v1", "ollama:qwen:1.5b", "embedded:é"]),
    temperature=st.floats(0, 2, allow_nan=False),
    seed=st.integers(0, 2**40),
    repetition=st.integers(0, 50),
    tool_mode=st.sampled_from(["native", "prompt"]),
    parser=st.sampled_from(["strict", "lenient"]),
    think=st.sampled_from(["default", "on", "off"]),
    stream=st.booleans(),
    digest=st.none() | st.text(max_size=20),
    slots=st.none() | st.integers(1, 64),
)
def test_the_identity_is_sha256_of_the_whole_payload(prompt, model, temperature, seed, repetition, tool_mode, parser, think,
                                                      stream, digest, slots):  # fmt: skip
    scenario = dataclasses.replace(SCENARIO, system_prompt=prompt or "p")
    plan = RunPlan(scenario, model, temperature, seed, tool_mode, parser, repetition, think, stream)
    assert plan.identity(digest, slots) == reference_identity(plan, digest, slots)
    again = RunPlan(scenario, model, temperature, seed, tool_mode, parser, repetition, think, stream)
    assert again.identity(digest, slots) == plan.identity(digest, slots)  # the second from the scenario's memo


def test_a_changed_scenario_is_encoded_anew():
    plan = RunPlan(SCENARIO, "replay:/x.jsonl", 0.0)
    changed = RunPlan(dataclasses.replace(SCENARIO, tools=SCENARIO.tools[:1]), "replay:/x.jsonl", 0.0)
    assert plan.identity() != changed.identity() == reference_identity(changed, None, None)
