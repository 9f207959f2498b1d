"""Tool errors sent to the model name paths relative to the sandbox, never the host's absolute path.

Red-team finding (issue 11): ``write_file("a.txt/b.txt", ...)`` over an existing file answered
``ERROR: FileExistsError: [Errno 17] File exists: '/host/.../runs/<run_id>/a.txt'``, telling the
model where on the host its sandbox lives.
"""

from __future__ import annotations

import pytest

from harness.tools import BUILTIN_TOOLS, Sandbox


@pytest.fixture
def box(tmp_path):
    sandbox = Sandbox(tmp_path / "runs" / "abc123")
    sandbox.seed({"a.txt": "text\n", "docs/readme.md": "hi\n"})
    return sandbox


@pytest.mark.parametrize(
    ("path", "shown"),
    [("a.txt/b.txt", "'a.txt'"), ("a.txt/deeper/c.txt", "'a.txt/deeper'"), ("docs/readme.md/x", "'docs/readme.md'")],
)
def test_an_os_error_names_the_path_relative_to_the_sandbox(box, tmp_path, path, shown):
    result = BUILTIN_TOOLS["write_file"].call(box, {"path": path, "content": "x"})
    assert result.error and result.output.startswith("ERROR: ")
    assert str(tmp_path) not in result.output and "abc123" not in result.output
    assert shown in result.output


def test_the_sandbox_root_itself_is_shown_as_a_dot(box, tmp_path):
    assert box.hide_root(f"cannot use {box.root}: busy") == "cannot use .: busy"
    assert box.hide_root(f"'{box.root}/a/b.txt' and '{box.root}/c'") == "'a/b.txt' and 'c'"
    assert box.hide_root("nothing to hide") == "nothing to hide"


def test_a_refused_escape_still_names_what_the_model_sent(box):
    result = BUILTIN_TOOLS["read_file"].call(box, {"path": "../../etc/passwd"})
    assert result.escape_attempt and "'../../etc/passwd'" in result.output
