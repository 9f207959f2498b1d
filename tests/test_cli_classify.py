"""Tests for ``harness classify``.

Also holds the red-team regression tests for it: junk input and a document without a response
object are usage errors, never a traceback.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.classifier import CLASSIFIER_VERSION, FAILURE_MODES, GUIDE
from harness.cli import main
from tests.helpers import cli

ROOT = Path(__file__).resolve().parents[1]

DOC = {
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "list_files",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
            },
        }
    ],
    "messages": [{"role": "user", "content": "List the files."}],
    "response": {
        "content": '```json\n{"name": "lst_files", "arguments": {"path": "."}}\n```',
        "tool_calls": None,
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 10, "completion_tokens": 20},
    },
    "unknown_key": "ignored",
}


def test_classify_file(tmp_path, capsys):
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(DOC), encoding="utf-8")
    assert main(["classify", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {
        "failure_modes": ["code_fence", "unknown_tool"],
        "calls": [{"name": "lst_files", "arguments": {"path": "."}}],
        "recovered_by": "fenced",
        "classifier_version": CLASSIFIER_VERSION,
        "details": {
            "unknown_tool": {"lst_files": "list_files"},
            "evidence": {
                "code_fence": {
                    "rule": "a call inside a Markdown code fence",
                    "span": '{"name": "lst_files", "arguments": {"path": "."}}',
                },
                "unknown_tool": {"rule": "a call name that is not among the offered tools", "span": "lst_files"},
            },
        },
    }


def test_classify_stdin(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"response": {"content": ""}})))
    assert main(["classify", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["failure_modes"] == ["empty_response"]


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '"a string"', "null", "[" * 100_000, "", "\udcff"])
def test_unreadable_or_non_object_json_is_a_one_line_error(monkeypatch, capsys, text):
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    assert main(["classify", "-"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("harness: ") and captured.err.count("\n") == 1
    assert "Traceback" not in captured.err


def test_missing_and_binary_files(tmp_path, capsys):
    assert main(["classify", str(tmp_path / "absent.json")]) == 2
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00junk")
    assert main(["classify", str(binary)]) == 2
    assert main(["classify"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 3 and "Traceback" not in err


@pytest.mark.parametrize(
    "doc",
    [
        {"tools": "x", "messages": {"a": 1}, "response": {"content": 5, "tool_calls": "y"}},
        {"response": {"tool_calls": [None, 1, {"function": 2}], "usage": "lots"}},
    ],
)
def test_wrong_types_classify_without_traceback(tmp_path, capsys, doc):
    # wrong types inside the response are data; a missing response object is a usage error (below)
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert main(["classify", str(path)]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {
        "failure_modes",
        "calls",
        "recovered_by",
        "classifier_version",
        "details",
    }


def test_list_modes(capsys):
    assert main(["classify", "--list-modes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(FAILURE_MODES)
    assert all(FAILURE_MODES[line.split()[0]].replace("`", "") in line for line in lines)
    guide = (ROOT / GUIDE).read_text(encoding="utf-8")
    for line in lines:
        mode = line.split()[0]
        assert line.endswith(f"[{GUIDE}#{mode}]")
        assert f"\n### `{mode}`\n" in guide  # the link's anchor: the mode's own section


def _table(prefix: str) -> str:
    escaped = {mode: text.replace("|", "\\|") for mode, text in FAILURE_MODES.items()}
    rows = [f"| [`{mode}`]({prefix}#{mode}) | {text} |" for mode, text in escaped.items()]
    return "\n".join(["| mode | definition |", "|---|---|", *rows]) + "\n"


def test_readme_and_guide_tables_are_the_canonical_definitions():
    assert _table(GUIDE) in (ROOT / "README.md").read_text(encoding="utf-8")
    assert _table("") in (ROOT / GUIDE).read_text(encoding="utf-8")


def test_subprocess_stdin():
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "classify", "-"],
        input=json.dumps(DOC),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["failure_modes"] == ["code_fence", "unknown_tool"]
    bad = subprocess.run(
        [sys.executable, "-m", "harness", "classify", "-"],
        input="{",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


# -- red-team: junk input and documents without a response --------------------------------------------
# red-team finding: a document without a response object was classified as empty_response
@pytest.mark.parametrize(
    "doc",
    [{}, {"content": '{"name": "list_files", "arguments": {}}', "tool_calls": None}, {"response": "text"}],
    ids=["empty-object", "bare-cassette-line", "response-not-object"],
)
def test_classify_a_document_without_a_response_object_is_a_usage_error(tmp_path, capsys, doc):
    # exits 0 and reports "empty_response" for a reply it never saw: a bare cassette line holding
    # a raw JSON call is labelled empty_response instead of raw_json_in_content.
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    rc, _, err = cli(capsys, "classify", path)
    assert rc == 2 and "response" in err


@pytest.mark.parametrize("content", [b"\xff\xfe\x00binary", b"[1, 2]", b'"s"', b"[" * 100_000])
def test_guard_classify_junk_input(tmp_path, capsys, content):
    path = tmp_path / "junk"
    path.write_bytes(content)
    rc, _, err = cli(capsys, "classify", path)
    assert rc == 2 and "Traceback" not in err


def test_the_readme_classify_example_runs_as_written(tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    [block] = re.findall(r"```bash\n(harness classify - <<'JSON'\n.*?\nJSON\n)```", readme, flags=re.S)
    script = block.replace("harness classify", f"{sys.executable} -m harness classify", 1)
    proc = subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["failure_modes"] == ["code_fence", "mixed_prose"] and result["recovered_by"] == "fenced"


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ({"requires_tool": "yes"}, '"requires_tool" must be true or false'),
        ({"server_rejection": 500}, '"server_rejection" must be a string'),
        ({"stream_problems": "oops"}, '"stream_problems" must be a list of strings'),
        ({"stream_problems": ["ok", 3]}, '"stream_problems" must be a list of strings'),
    ],
)
def test_a_wrongly_typed_flag_is_one_sentence_not_silently_absent(tmp_path, capsys, flags, words):
    # a newcomer's "requires_tool": "yes" was read as "not judged" and exited 0
    path = tmp_path / "doc.json"
    path.write_text(json.dumps({"response": {"content": "The weather is sunny."}, **flags}), encoding="utf-8")
    assert main(["classify", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and words in captured.err and captured.err.count("\n") == 1


def test_null_flags_are_left_out(tmp_path, capsys):
    path = tmp_path / "doc.json"
    doc = {"response": {"content": "hi"}, "requires_tool": None, "server_rejection": None, "stream_problems": None}
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert main(["classify", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["failure_modes"] == []
