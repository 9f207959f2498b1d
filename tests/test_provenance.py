"""Issue 12, sections 3 and 4: provenance (what shaped the output), bounded requests, and the warm-up.

Every server is a real HTTP server on 127.0.0.1 (:class:`tests.backend_fakes.FakeServer`) answering as the fakes of
:mod:`tests.server_fakes` do: llama.cpp's ``/props`` and ``/v1/models`` as the bundled server answers them, Ollama's
``/api/show`` as ``GetModelInfo`` in ``server/routes.go`` writes it.
"""

from __future__ import annotations

import hashlib
import time

import pytest

from harness.backends import GenerateOptions, OllamaBackend, OpenAICompatBackend, open_backend
from harness.backends.openai_compat import WARM_UP_MESSAGES
from harness.backends.server_facts import default_request_timeout_s, parse_ollama_parameters
from harness.errors import BackendTimeout
from harness.ledger import Ledger
from harness.loop import RetryPolicy, RunOptions, RunPlan
from harness.report import load_frames, write_report
from harness.report.models import model_warnings
from harness.runner import run_matrix
from tests.backend_fakes import FakeServer, json_reply, trickle
from tests.helpers import RUN_FLAGS, SCENARIO_FILE, assert_one_sentence_error, cli
from tests.server_fakes import (
    LLAMACPP_TOOL_TEMPLATE,
    llamacpp_chat,
    llamacpp_models,
    llamacpp_props,
    ollama_chat,
    ollama_show,
    ollama_tags,
)

MODEL = "qwen3:0.6b"
QWEN_TEMPLATE = (
    "{{- if .Tools }}<|im_start|>system\n# Tools\n{{- range .Tools }}{{ . }}{{ end }}<|im_end|>\n{{ end }}"
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
)
FAST = RetryPolicy(max_attempts=1, base_delay_s=0.01, max_delay_s=0.02)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def llamacpp_routes(template: str | None, *, supports_tools: bool) -> dict:
    return {
        ("GET", "/props"): llamacpp_props(template, supports_tools=supports_tools),
        ("GET", "/v1/models"): llamacpp_models(494032768),
        ("POST", "/v1/chat/completions"): llamacpp_chat("I cannot list files."),
    }


def ollama_routes(show, digest="a80c4f17acd5" + "0" * 52) -> dict:
    return {
        ("GET", "/api/version"): json_reply(200, {"version": "0.33.0-rc2"}),
        ("GET", "/api/tags"): ollama_tags({MODEL: digest}),
        ("POST", "/api/show"): show,
        ("POST", "/api/chat"): ollama_chat([{"content": "I cannot list files."}] * 8, model=MODEL),
    }


def run_plans(tmp_path, plans, **factory_options):
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        result = run_matrix(
            plans,
            ledger,
            RunOptions(runs_dir=tmp_path / "runs", retry=FAST),
            backend_factory=lambda spec, **kw: open_backend(spec, **{**kw, "timeout_s": 10, **factory_options}),
        )
        assert ledger.verify().ok
        return result, ledger.runs(), ledger.turns(), ledger.model_runs()


# -- what each server reports --------------------------------------------------------------------------------------
def test_llamacpp_props_give_the_template_its_tool_support_sampling_defaults_quantisation_and_parameters():
    with FakeServer(llamacpp_routes(LLAMACPP_TOOL_TEMPLATE, supports_tools=True)) as server:
        with OpenAICompatBackend("m", f"{server.url}/v1") as backend:
            facts = backend.provenance()
    assert facts == {
        "source": "llama.cpp /props",
        "chat_template": LLAMACPP_TOOL_TEMPLATE,
        "template_tools": True,
        "sampling_defaults": {"temperature": 0.800000011920929, "top_k": 40, "top_p": 0.949999988079071,
                              "min_p": 0.05000000074505806, "typical_p": 1.0, "repeat_penalty": 1.0, "repeat_last_n": 64,
                              "presence_penalty": 0.0, "frequency_penalty": 0.0, "mirostat": 0, "seed": 4294967295,
                              "n_predict": -1},
        "quantization": "Q4_K_M",
        "parameters": "494032768",
        "template_fallback": False,
        "slots": 1,
    }  # fmt: skip


def test_a_server_without_props_reports_no_provenance():
    with FakeServer({("POST", "/v1/chat/completions"): llamacpp_chat("hi")}) as server:  # vLLM, a hosted API
        with OpenAICompatBackend("m", f"{server.url}/v1") as backend:
            assert backend.provenance() == {}


def test_ollama_show_gives_the_template_the_tools_capability_parameters_quantisation_and_size():
    show = ollama_show(["completion", "tools"], template=QWEN_TEMPLATE,
                       parameters={"temperature": 0.7, "top_k": 20, "stop": ["<|im_start|>", "<|im_end|>"]})  # fmt: skip
    with FakeServer({("POST", "/api/show"): show}) as server:
        with OllamaBackend(MODEL, server.url) as backend:
            facts = backend.provenance()
    assert facts == {
        "source": "ollama /api/show", "chat_template": QWEN_TEMPLATE, "template_tools": True,
        "sampling_defaults": {"temperature": 0.7, "top_k": 20, "stop": ["<|im_start|>", "<|im_end|>"]},
        "quantization": "Q4_K_M", "parameters": "751.63M", "template_fallback": False,
    }  # fmt: skip


def test_ollama_parameters_lines_parse_as_go_writes_them():
    text = 'num_ctx                        8192\nstop                           "<|im_end|>"\nmirostat_eta                   0.1'
    assert parse_ollama_parameters(text) == {"num_ctx": 8192, "stop": "<|im_end|>", "mirostat_eta": 0.1}
    assert parse_ollama_parameters("") is None


# -- recorded with each run, the template once ---------------------------------------------------------------------
def test_runs_record_the_template_once_its_hash_and_tool_support_and_the_warm_up_apart_from_the_turns(tmp_path, scenario):
    with FakeServer(llamacpp_routes(LLAMACPP_TOOL_TEMPLATE, supports_tools=True)) as server:
        spec = f"openai:qwen@{server.url}/v1"
        plans = [RunPlan(scenario, spec, 0.0, repetition=r) for r in range(2)]
        result, runs, turns, model_runs = run_plans(tmp_path, plans)
    chats = server.posts("/v1/chat/completions")
    assert chats[0]["messages"] == list(WARM_UP_MESSAGES) and chats[0]["max_tokens"] == 1
    assert len(chats) == 1 + len(turns) == 3 and [t.record.turn for t in turns] == [1, 1]  # the warm-up is no turn
    for row in runs:
        provenance = row.start.config["provenance"]
        assert provenance["template_sha256"] == sha(LLAMACPP_TOOL_TEMPLATE)
        assert (provenance["template_tools"], provenance["quantization"], provenance["parameters"]) == (
            True,
            "Q4_K_M",
            "494032768",
        )
        assert provenance["sampling_defaults"]["top_k"] == 40 and "chat_template" not in provenance
        assert 0 < row.start.config["warmup_ms"] < 5000
    assert [r["template"] for r in model_runs] == [LLAMACPP_TOOL_TEMPLATE] * 2
    with Ledger(tmp_path / "ledger.sqlite", readonly=True) as ledger:
        assert ledger.row_counts()["runs"] == 2
    assert {r.start.identity for r in runs} == {p.identity(None) for p in plans}  # provenance is not identity
    frames = load_frames(tmp_path / "ledger.sqlite")
    assert frames.turns["latency_ms"].count() == 2  # the warm-up's time is in no turn
    (report,) = write_report(tmp_path / "ledger.sqlite", tmp_path / "out", formats=("md",))
    text = report.read_text()
    assert (
        f"chat template sha256 {sha(LLAMACPP_TOOL_TEMPLATE)[:12]}, declares tool support; quantisation Q4_K_M; parameters "
        "494032768; server sampling defaults temperature=0.8, top_k=40, top_p=0.95, min_p=0.05" in text
    )
    assert "; warm-up " in text and "(not a turn, in no latency figure)" in text
    assert "**Warning:**" not in text


def test_native_mode_with_a_template_without_tool_support_is_warned_in_the_report(tmp_path, scenario):
    template = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    with FakeServer(llamacpp_routes(template, supports_tools=False)) as server:
        spec = f"openai:smol@{server.url}/v1"
        run_plans(tmp_path, [RunPlan(scenario, spec, 0.0), RunPlan(scenario, spec, 0.0, tool_mode="prompt")])
    text = write_report(tmp_path / "ledger.sqlite", tmp_path / "out", formats=("md",))[0].read_text()
    assert "declares no tool support" in text
    assert (
        f"**Warning:** {spec} ran in native tool mode with a chat template that declares no tool support; "
        "compare it with --tool-mode prompt." in text.replace("\\", "")
    )


def test_a_model_without_a_chat_template_is_warned_llamacpp_and_ollama_fallback(tmp_path, scenario):
    with (
        FakeServer(llamacpp_routes(None, supports_tools=False)) as llama,
        FakeServer(ollama_routes(ollama_show(["completion"]))) as ollama,  # Ollama's stand-in: {{ .Prompt }}
    ):
        specs = [f"openai:base@{llama.url}/v1", f"ollama:{MODEL}@{ollama.url}"]
        _result, runs, _turns, model_runs = run_plans(tmp_path, [RunPlan(scenario, s, 0.0, tool_mode="prompt") for s in specs])
    by_backend = {run.start.backend: run.start.config["provenance"] for run in runs}  # the two models run concurrently
    assert by_backend["openai"]["template_sha256"] is None
    assert by_backend["ollama"]["template_sha256"] == sha("{{ .Prompt }}")
    assert by_backend["ollama"]["template_fallback"] is True
    assert ollama.posts("/api/chat")[0] == {"model": MODEL, "messages": [], "stream": False}  # Ollama's load request
    assert model_warnings(model_runs) == [
        f"{s} has no chat template of its own (a base model, or the server's fallback template), so its replies were "
        "not shaped by a chat format."
        for s in sorted(specs)
    ]


def test_two_model_specs_sharing_one_digest_are_warned(tmp_path, scenario):
    digest = "b1" * 32
    show = ollama_show(["completion", "tools"], template=QWEN_TEMPLATE)
    with FakeServer(ollama_routes(show, digest)) as first, FakeServer(ollama_routes(show, digest)) as second:
        specs = [f"ollama:{MODEL}@{first.url}", f"ollama:{MODEL}@{second.url}"]
        run_plans(tmp_path, [RunPlan(scenario, s, 0.0) for s in specs])
    text = write_report(tmp_path / "ledger.sqlite", tmp_path / "out", formats=("md",))[0].read_text()
    a, b = sorted(specs)
    assert f"**Warning:** {a} and {b} share one digest (sha256:{digest}) and chat template: one model under 2 names" in (
        text.replace("\\", "")
    )


def test_the_same_weights_with_another_chat_template_are_not_warned_as_one_model(tmp_path, scenario):
    """As embedded:smollm2-135m and embedded:smollm2-135m-tools: one file, two templates, two model setups."""
    digest = "b1" * 32
    plain = ollama_show(["completion", "tools"], template=QWEN_TEMPLATE)
    other = ollama_show(["completion", "tools"], template=QWEN_TEMPLATE + "{# renders tools #}")
    with FakeServer(ollama_routes(plain, digest)) as first, FakeServer(ollama_routes(other, digest)) as second:
        specs = [f"ollama:{MODEL}@{first.url}", f"ollama:{MODEL}@{second.url}"]
        _result, _runs, _turns, model_runs = run_plans(tmp_path, [RunPlan(scenario, s, 0.0) for s in specs])
    assert {row["digest"] for row in model_runs} == {f"sha256:{digest}"}  # the ledger holds both, one digest
    assert len({row["provenance"]["template_sha256"] for row in model_runs}) == 2
    assert model_warnings(model_runs) == []
    text = write_report(tmp_path / "ledger.sqlite", tmp_path / "out", formats=("md",))[0].read_text()
    assert "share one digest" not in text


# -- bounded requests ----------------------------------------------------------------------------------------------
def test_the_default_deadline_is_60_s_plus_a_fifth_of_a_second_per_token():
    assert (default_request_timeout_s(0), default_request_timeout_s(512), default_request_timeout_s(100)) == (60.0, 162.4, 80.0)


# a fresh-clone quick start: one SmolLM2 reply decoded at 2.4 tokens/s on a busy machine passed 60 s + 0.2 s per token
def test_the_embedded_model_gets_a_second_per_token_since_it_decodes_on_this_cpu():
    from harness.backends.server_facts import EMBEDDED_PER_TOKEN_S

    assert default_request_timeout_s(256, EMBEDDED_PER_TOKEN_S) == 316.0
    with OpenAICompatBackend("m", "http://127.0.0.1:9/v1", timeout_s=None, per_token_s=EMBEDDED_PER_TOKEN_S) as backend:
        assert backend.per_token_s == 1.0


def test_a_server_trickling_one_byte_a_second_cannot_hold_a_request_past_its_deadline():
    with FakeServer() as server:
        server.routes[("POST", "/v1/chat/completions")] = trickle(b'{"choices": []}' * 20, 1.0, server.release)
        started = time.monotonic()
        with OpenAICompatBackend("m", f"{server.url}/v1", timeout_s=2) as backend, pytest.raises(BackendTimeout) as caught:
            backend.generate([{"role": "user", "content": "hi"}], None, GenerateOptions(max_tokens=8))
        elapsed = time.monotonic() - started
    assert 2.0 <= elapsed < 4.5  # each byte came well within a per-read timeout of 2 s
    assert str(caught.value).endswith(
        "did not answer completely within 2 s; raise --request-timeout or use a smaller model or prompt."
    )


def test_request_timeout_ends_a_trickling_run_as_infra_error_naming_the_flag(tmp_path, capsys):
    with FakeServer() as server:
        server.routes[("POST", "/v1/chat/completions")] = trickle(b" " * 600, 1.0, server.release)
        started = time.monotonic()
        rc, out, _err = cli(capsys, "run", SCENARIO_FILE, "--model", f"openai:m@{server.url}/v1", "--repeats", "1", *RUN_FLAGS,
                            "--ledger", tmp_path / "l.sqlite", "--request-timeout", "2", "--max-attempts", "1")  # fmt: skip
        elapsed = time.monotonic() - started
    assert rc == 1 and "infra_error" in out and "raise --request-timeout" in out
    assert elapsed < 30  # warm-up (2 s) and one model call (2 s), not 600 s of trickle
    with Ledger(tmp_path / "l.sqlite", readonly=True) as ledger:
        (row,) = ledger.runs()
    assert row.start.config["warmup_ms"] is None and "--request-timeout" in row.start.config["warmup_error"]
    assert_one_sentence_error(*cli(capsys, "run", "--request-timeout", "nan", "--dry-run")[::2])


def test_a_stored_template_edited_behind_the_triggers_fails_verify(tmp_path, scenario):
    from tests.ledger_tamper import tamper

    with FakeServer(llamacpp_routes(LLAMACPP_TOOL_TEMPLATE, supports_tools=True)) as server:
        run_plans(tmp_path, [RunPlan(scenario, f"openai:qwen@{server.url}/v1", 0.0)])
    path = tmp_path / "ledger.sqlite"
    tamper(path, "UPDATE templates SET text = text || ' '")
    with Ledger(path, readonly=True) as ledger:
        result = ledger.verify()
    key = sha(LLAMACPP_TOOL_TEMPLATE)
    assert (result.ok, result.problem) == (
        False,
        f"the chat template stored under {key[:16]} does not hash to its key (it was altered)",
    )
