"""Native tool mode on the embedded SmolLM2 file with the harness's shipped template (``smollm2-135m-tools``).

SmolLM2's own template renders no tools, so ``--tool-mode native`` on ``smollm2-135m`` sends tools the model never
sees. ``smollm2-135m-tools`` is the same GGUF file with ``harness/backends/templates/chatml_tools.jinja``: it renders
the tool schemas into the system turn and asks for ``<tool_call>{...}</tool_call>`` blocks, so the bundled llama.cpp
picks its Hermes tool-call parser and returns the model's call as structured ``tool_calls``. The run below is one
``harness run``; the 135M model needs a one-shot example in the system prompt to answer with a call at all, and
then goes on after it (observed with xllamacpp 2026.10.11549 at temperature 0, seed 0: a structured ``list_files``
call with ``{}`` arguments, then more text until ``max_tokens`` 40, so ``finish_reason`` is ``length``; no seed tried
at 0.7 ended on the call itself, so the test pins what llama.cpp's parser made of the text, not the stop).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import tomllib

import httpx
import pytest

from harness.backends import EmbeddedBackend, models
from harness.backends.embedded import shipped_template
from harness.ledger import Ledger
from harness.loop import RunPlan
from harness.scenarios import load_scenario
from tests.helpers import REPO, cli, scenario_toml

TEMPLATE_FILE = REPO / "harness" / "backends" / "templates" / "chatml_tools.jinja"
EXAMPLE = 'Example. User: List the files in folder1.\\nAssistant: <tool_call>\\n{\\"name\\": \\"list_files\\", \\"arguments\\": {\\"path\\": \\"folder1\\"}}\\n</tool_call>'
SYSTEM = "You are an expert in composing function calls. When a function fits the request, you MUST answer only with one <tool_call> block.\\n\\n"


def one_shot_scenario(tmp_path):
    """list_and_report with a one-shot system prompt, a one-step task, one turn of at most 40 tokens, 2048 context."""
    text = (REPO / "scenarios" / "list_and_report.toml").read_text(encoding="utf-8")
    system_start, task_start = text.index("system_prompt = "), text.index("task = ")
    old_system, old_task = text[system_start:task_start], text[task_start : text.index("tools = ")]
    return scenario_toml(tmp_path, head_replace=[
        (old_system, f'system_prompt = "{SYSTEM}{EXAMPLE}"\n\n'),
        (old_task, 'task = "List the files in the current working directory."\n\n'),
        ("turn_limit = 8", "turn_limit = 1"), ("max_tokens = 256", "max_tokens = 40"), ("num_ctx = 4096", "num_ctx = 2048"),
    ])  # fmt: skip


def test_the_tools_alias_is_the_same_file_with_the_shipped_template_and_its_own_identity(tmp_path):
    plain, tools = models.KNOWN_MODELS["smollm2-135m"], models.KNOWN_MODELS["smollm2-135m-tools"]
    assert (tools.package, tools.version, tools.member, tools.sha256, tools.size, tools.filename) == (
        plain.package, plain.version, plain.member, plain.sha256, plain.size, plain.filename)  # fmt: skip
    assert (plain.chat_template, tools.chat_template) == (None, "chatml_tools.jinja")
    assert shipped_template("smollm2-135m-tools") == TEMPLATE_FILE.read_text(encoding="utf-8")
    assert shipped_template("smollm2-135m") is None and shipped_template(str(TEMPLATE_FILE)) is None
    scenario = load_scenario(one_shot_scenario(tmp_path))
    digest = "sha256:" + plain.sha256  # the same file, so the same digest: the spec alone tells the runs apart
    ids = {RunPlan(scenario, f"embedded:{name}", 0.0, tool_mode="native").identity(digest) for name in (plain.name, tools.name)}
    assert len(ids) == 2


def test_the_shipped_template_is_package_data_of_the_wheel():
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["harness"]
    assert any(fnmatch.fnmatch("backends/templates/chatml_tools.jinja", pattern) for pattern in patterns)
    assert "<tool_call>" in TEMPLATE_FILE.read_text(encoding="utf-8")  # what makes llama.cpp pick its Hermes parser
    assert not TEMPLATE_FILE.read_bytes().endswith(b"\n")  # the server trims a final newline: the recorded hash is the file's


@pytest.mark.slow
def test_the_shipped_template_renders_tools_calls_and_results_through_the_real_server():
    schema = {"type": "function", "function": {"name": "list_files", "description": "List files",
              "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": []}}}  # fmt: skip
    call = {"id": "c1", "type": "function", "function": {"name": "list_files", "arguments": '{"path": "."}'}}
    history = [{"role": "system", "content": "Call tools."}, {"role": "user", "content": "List the files."},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": '["a.txt"]'}]  # fmt: skip
    with EmbeddedBackend("smollm2-135m-tools", num_ctx=512, timeout_s=120) as backend:
        root = backend.start().removesuffix("/v1")
        props = httpx.get(f"{root}/props", timeout=30).json()
        prompt = httpx.post(f"{root}/apply-template", json={"messages": history, "tools": [schema]}, timeout=30).json()["prompt"]
    assert props["chat_template"] == TEMPLATE_FILE.read_text(encoding="utf-8")  # byte for byte: no trailing newline to trim
    assert props["chat_template_caps"]["supports_tools"] is True and props["chat_template_caps"]["supports_tool_calls"] is True
    assert prompt == (
        "<|im_start|>system\nCall tools.\n\nYou have these tools, each given as a JSON schema:\n<tools>\n"
        + json.dumps(schema["function"])
        + "\n</tools>\n\nTo call a tool, reply with one block per call and nothing else, for example:\n<tool_call>\n"
        '{"name": "list_files", "arguments": {}}\n</tool_call>\nwith the arguments the tool\'s parameters ask for. '
        "When no tool is needed, answer in plain text.<|im_end|>\n"
        "<|im_start|>user\nList the files.<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "list_files", "arguments": {"path": "."}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n["a.txt"]\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )


@pytest.mark.slow
def test_native_tool_mode_on_the_embedded_model_gets_a_structured_call_from_llama_cpp_s_parser(tmp_path, capsys):
    ledger = tmp_path / "ledger.sqlite"
    rc, out, err = cli(capsys, "run", one_shot_scenario(tmp_path), "--model", "embedded:smollm2-135m-tools",
                       "--tool-mode", "native", "--parser", "strict", "--temperature", "0", "--seed", "0",
                       "--repeats", "1", "--jobs", "1", "--request-timeout", "600", "--ledger", ledger)  # fmt: skip
    assert rc == 0, err
    with Ledger(ledger, readonly=True) as db:
        [run] = db.runs()
        [turn] = db.turns(run.run_id)
        [model_run] = db.model_runs()
        assert db.verify().ok
    assert (run.start.model, run.start.tool_mode, run.start.model_digest) == (
        "embedded:smollm2-135m-tools", "native", "sha256:" + models.KNOWN_MODELS["smollm2-135m"].sha256)  # fmt: skip
    message = turn.record.raw_reply["choices"][0]["message"]
    # llama.cpp's parser turned the model's <tool_call> text into a structured call: no text content is left
    assert message["content"] in ("", None) and message["tool_calls"][0]["function"]["name"] == "list_files"
    assert turn.record.tool_calls[0]["function"]["name"] == "list_files"
    [executed] = turn.record.executed_calls
    assert (executed["name"], executed["arguments"], executed["source"]) == ("list_files", {}, "structured")
    assert executed["output"] == '["config.json", "hello.txt", "memo.md"]'
    assert turn.record.recovered_by is None  # structured by the server, not recovered from text by the harness
    # the model goes on writing after its call until max_tokens (40) cuts it: llama.cpp keeps the finished call
    assert (turn.record.finish_reason, turn.record.completion_tokens) == ("length", 40)
    assert turn.record.failure_modes == ["truncated_by_length"] and run.outcome == "turn_limit"
    provenance = run.start.config["provenance"]
    shipped = hashlib.sha256(TEMPLATE_FILE.read_bytes()).hexdigest()
    assert (provenance["template_sha256"], provenance["template_tools"]) == (shipped, True)
    assert model_run["template"] == TEMPLATE_FILE.read_text(encoding="utf-8")
