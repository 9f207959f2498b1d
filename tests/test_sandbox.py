"""The sandbox: tools touch nothing outside the run's folder, whatever the model sends.

Also holds a red-team regression test: path escapes sent through a whole run write nothing outside.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from harness.tools import BUILTIN_TOOLS, MAX_WRITE_BYTES, Sandbox, real_path_within
from tests.helpers import assert_recorded, call_line, run_replay, text_line


@pytest.fixture
def box(tmp_path):
    sandbox = Sandbox(tmp_path / "box")
    sandbox.seed({"hello.txt": "Hello\n", "sub/inner.txt": "inner"})
    return sandbox


def call(box, name, **arguments):
    return BUILTIN_TOOLS[name].call(box, arguments)


def test_list_read_write_inside_sandbox(box):
    assert json.loads(call(box, "list_files").output) == ["hello.txt", "sub"]
    assert json.loads(call(box, "list_files", path="sub").output) == ["inner.txt"]
    assert call(box, "read_file", path="hello.txt").output == "Hello\n"
    result = call(box, "write_file", path="out/report.txt", content="3 files")
    assert not result.error and result.output == "wrote 7 bytes to out/report.txt"
    assert (box.root / "out" / "report.txt").read_text() == "3 files"
    assert box.written == ["out/report.txt"]


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "sub/../../x", "~/x/../../../etc/passwd"])
def test_escapes_are_refused_and_recorded(box, tmp_path, path):
    before = sorted(p.name for p in tmp_path.iterdir())
    write = call(box, "write_file", path=path, content="pwned")
    read = call(box, "read_file", path=path)
    assert write.error and write.escape_attempt and write.output.startswith("ERROR: path ")
    assert read.error and read.escape_attempt
    assert box.escape_attempts == [path, path]
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not (tmp_path / "x").exists()


def test_tilde_is_a_plain_folder_name(box):
    result = call(box, "write_file", path="~/notes.txt", content="x")
    assert not result.error and (box.root / "~" / "notes.txt").read_text() == "x"


def test_symlink_pointing_out_is_refused(box, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    os.symlink(outside, box.root / "link")
    os.symlink(outside / "secret.txt", box.root / "secret_link.txt")
    assert call(box, "read_file", path="link/secret.txt").escape_attempt
    assert call(box, "read_file", path="secret_link.txt").escape_attempt
    result = call(box, "write_file", path="link/new.txt", content="x")
    assert result.escape_attempt and not (outside / "new.txt").exists()
    result = call(box, "write_file", path="secret_link.txt", content="overwritten")
    assert result.escape_attempt and (outside / "secret.txt").read_text() == "secret"
    assert call(box, "list_files", path="link").escape_attempt


def test_write_size_cap(box):
    ok = call(box, "write_file", path="big.txt", content="x" * MAX_WRITE_BYTES)
    assert not ok.error
    too_big = call(box, "write_file", path="bigger.txt", content="x" * (MAX_WRITE_BYTES + 1))
    assert too_big.error and "1 MiB" in too_big.output and not (box.root / "bigger.txt").exists()


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("read_file", {}, "ERROR: missing required argument(s) path"),
        ("read_file", {"path": "nope.txt"}, "ERROR: no such file: 'nope.txt'"),
        ("read_file", {"path": 3}, "ERROR: path must be a non-empty string, got 3"),
        ("write_file", {"path": "a.txt", "content": ["x"]}, "ERROR: content must be a string, got list"),
        (
            "write_file",
            {"path": "a.txt", "content": "x", "mode": "w"},
            "ERROR: unexpected argument(s) mode; write_file takes content, path",
        ),
        ("list_files", {"path": "hello.txt"}, "ERROR: 'hello.txt' is not a directory"),
        ("write_file", {"path": "sub", "content": "x"}, "ERROR: 'sub' is a directory"),
        ("read_file", {"path": "a\x00b"}, "ERROR: path must not contain NUL bytes"),
    ],
)
def test_tool_errors_are_messages_not_exceptions(box, name, arguments, message):
    result = BUILTIN_TOOLS[name].call(box, arguments)
    assert result.error and result.output == message


def test_non_dict_arguments(box):
    result = BUILTIN_TOOLS["list_files"].call(box, ["."])
    assert result.output == "ERROR: arguments must be a JSON object, got list"


# -- red-team: path escapes through a whole run ----------------------------------------------------------
def test_guard_path_escapes_are_refused_and_nothing_is_written_outside(tmp_path, scenario):
    outside = tmp_path / "outside.txt"
    lines = [
        call_line("write_file", {"path": "../../outside.txt", "content": "x"}),
        call_line("write_file", {"path": str(outside), "content": "x"}),
        call_line("read_file", {"path": "~/.bashrc"}),
        call_line("list_files", {"path": "/"}),
        call_line("read_file", {"path": "/dev/zero"}),
        call_line("write_file", {"path": "a\x00b", "content": "x"}),
        call_line("write_file", {"path": "big.txt", "content": "x" * (1024 * 1024 + 1)}),
        text_line("done"),
    ]
    summary, facts = run_replay(tmp_path, scenario, lines)
    assert_recorded(summary, facts)
    assert not outside.exists()
    assert "sandbox_escape_attempt" in summary.failure_modes
    assert not (summary.sandbox / "big.txt").exists()
    outputs = [c["output"] for t in facts["turn_rows"][:-1] for c in t.record.executed_calls]
    assert all(o.startswith("ERROR: ") for o in outputs)


def test_a_path_resolves_below_the_root_exactly_as_realpath_resolves_it(tmp_path):
    """real_path_within looks only below the root; every path of up to 4 parts (links in and out, '..', '.', empty
    parts, missing names, a file used as a folder, an absolute path) resolves as os.path.realpath resolves it."""
    (tmp_path / "outside").mkdir()
    box = Sandbox(tmp_path / "a" / "box")
    box.seed({"f.txt": "x", "d/g.txt": "y"})
    os.symlink(tmp_path / "outside", box.root / "out")
    os.symlink("d", box.root / "in")
    os.symlink("in/../..", box.root / "up")
    os.symlink("loop", box.root / "loop")
    parts = ["d", "f.txt", "in", "out", "up", "loop", "..", ".", "", "nope", "g.txt"]
    checked = 0
    for n in range(1, 5):
        for combo in itertools.product(parts, repeat=n):
            path = "/".join(combo)
            assert real_path_within(box.root, path) == Path(os.path.realpath(box.root / path)), path
            checked += 1
    for path in ("/etc/passwd", "//x", "/" + str(box.root) + "/d"):
        assert real_path_within(box.root, path) == Path(os.path.realpath(box.root / path)), path
    assert checked == sum(len(parts) ** n for n in range(1, 5))
