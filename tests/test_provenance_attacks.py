"""Red-team findings on issue 12, sections 3 and 4: hostile ``/props`` bodies and a ledger whose templates were altered.

Real servers on 127.0.0.1 (:class:`tests.backend_fakes.FakeServer`) and real SQLite ledgers.
"""

from __future__ import annotations

import time

from harness.backends import OpenAICompatBackend
from harness.backends.server_facts import FACT_CHARS, MAX_FACTS, parse_ollama_parameters
from harness.ledger import Ledger
from harness.loop import RunPlan
from harness.startup import start_model
from tests.backend_fakes import FakeServer, json_reply, raw_reply, trickle
from tests.ledger_tamper import tamper
from tests.server_fakes import LLAMACPP_TOOL_TEMPLATE, llamacpp_chat, llamacpp_models
from tests.test_provenance import llamacpp_routes, run_plans


def _llamacpp(props) -> dict:
    return {("GET", "/props"): props, ("GET", "/v1/models"): llamacpp_models(1),
            ("POST", "/v1/chat/completions"): llamacpp_chat("hi")}  # fmt: skip


def test_a_props_body_trickled_a_byte_at_a_time_cannot_hold_the_facts_read_past_its_deadline():
    with FakeServer() as server:
        server.routes.update(_llamacpp(trickle(b'{"chat_template": "t"}' + b" " * 200, 0.5, server.release)))
        started = time.monotonic()
        with OpenAICompatBackend("m", f"{server.url}/v1", timeout_s=2) as backend:
            facts = backend.provenance()
        elapsed = time.monotonic() - started
    assert facts == {} and elapsed < 4.5  # was 100 s: each byte came within the per-read timeout


def test_a_template_with_a_lone_surrogate_is_stored_escaped_and_the_ledger_verifies(tmp_path):
    with FakeServer(_llamacpp(raw_reply(200, b'{"chat_template": "a\\ud800b\\u0000c"}'))) as server:
        with Ledger(tmp_path / "l.sqlite") as ledger, OpenAICompatBackend("m", f"{server.url}/v1", timeout_s=5) as backend:
            out = start_model(backend, ledger)  # was UnicodeEncodeError from SQLite
            assert ledger.verify().ok
    import sqlite3

    with sqlite3.connect(tmp_path / "l.sqlite") as db:
        ((key, text),) = db.execute("SELECT sha256, text FROM templates").fetchall()
    assert text == "a\\ud800b\x00c" and out["provenance"]["template_sha256"] == key


def test_megabyte_fact_strings_and_thousands_of_ollama_options_are_cut_to_size(tmp_path):
    props = {"chat_template": "t", "model_ftype": "Q" * 1_000_000,
             "default_generation_settings": {"params": {"temperature": "x" * 5_000_000, "top_k": [[1]] * 10_000}}}  # fmt: skip
    with FakeServer(_llamacpp(json_reply(200, props))) as server:
        with OpenAICompatBackend("m", f"{server.url}/v1", timeout_s=5) as backend:
            facts = backend.provenance()
    assert len(facts["quantization"]) == FACT_CHARS
    assert {k: len(v) for k, v in facts["sampling_defaults"].items()} == {"temperature": FACT_CHARS, "top_k": FACT_CHARS}
    options = parse_ollama_parameters("\n".join(f"opt{i} {i}" for i in range(5000)) + "\nstop x\n" * 500)
    assert options is not None and len(options) == MAX_FACTS


def test_a_deleted_template_row_still_named_by_a_run_fails_verify(tmp_path, scenario):
    with FakeServer(llamacpp_routes(LLAMACPP_TOOL_TEMPLATE, supports_tools=True)) as server:
        run_plans(tmp_path, [RunPlan(scenario, f"openai:qwen@{server.url}/v1", 0.0)])
    tamper(tmp_path / "ledger.sqlite", "DELETE FROM templates")
    with Ledger(tmp_path / "ledger.sqlite", readonly=True) as ledger:
        result = ledger.verify()
    assert not result.ok and result.problem is not None
    assert result.problem.endswith("which is not stored (it was deleted)")


def test_hostile_server_facts_cannot_break_or_inject_into_the_models_section(tmp_path, scenario):
    from harness.report import write_report
    from tests.test_provenance import ollama_routes

    hostile = "Q4|`<script>alert(1)</script>\n# heading ![x](http://evil.example/p.png) [click](javascript:alert(1))"
    show = json_reply(200, {"template": "{{ .Prompt }}|`\n<b>", "capabilities": "tools", "details": {"quantization_level": hostile,
                            "parameter_size": "7B|\r\n| x |"}, "parameters": 'stop "<|im_end|>"\n[a](b) `1`'})  # fmt: skip
    with FakeServer(ollama_routes(show, digest="ab|`<x>\n[y](z)")) as server:
        run_plans(tmp_path, [RunPlan(scenario, f"ollama:qwen3:0.6b@{server.url}", 0.0)])
    (report,) = write_report(tmp_path / "ledger.sqlite", tmp_path / "out", formats=("md",))
    text = report.read_text()
    section = text[text.index("## Models") : text.index("\n## ", text.index("## Models"))]
    lines = [line for line in section.splitlines() if line]
    assert lines[0] == "## Models" and lines[1].startswith("- ollama:qwen3:0.6b@") and len(lines) == 2  # one bullet, whole
    for line in lines[1:]:
        assert "<script" not in line and "<b>" not in line and "](" not in line.replace("\\](", "")
        assert "|" not in line.replace("\\|", "") and "`" not in line
