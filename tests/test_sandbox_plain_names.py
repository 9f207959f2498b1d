"""A plain name (no ``/``) is opened in the sandbox root at once, with ``O_NOFOLLOW`` and no ``lstat`` first: whatever
is put at that name, mid-run too (a symlink out or in, a folder, a FIFO), the tools and the checks answer as they do
for a resolved path, and nothing outside the sandbox is read or written."""

from __future__ import annotations

import os
import threading

import pytest

from harness.checks import CheckContext, evaluate_checks
from harness.tools import BUILTIN_TOOLS, Sandbox, plain_name, read_at_most


@pytest.fixture
def box(tmp_path):
    sandbox = Sandbox(tmp_path / "box")
    sandbox.seed({"hello.txt": "Hello\n", "sub/inner.txt": "inner"})
    return sandbox


@pytest.fixture
def outside(tmp_path):
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("secret")
    return folder


def write(box, path, content="x"):
    return BUILTIN_TOOLS["write_file"].call(box, {"path": path, "content": content})


def contains(box, path, text):
    [result] = evaluate_checks([{"type": "file_contains", "path": path, "text": text}], CheckContext(box.root, (), (), None, 0))
    return result


@pytest.mark.parametrize(
    ("path", "plain"),
    [("a.txt", True), (" a.txt", True), ("...", True), ("~", True), (".", False), ("..", False), ("a/b", False),
     ("/a", False), ("", False), ("  ", False), ("a\x00b", False)],
)  # fmt: skip
def test_plain_name_is_an_entry_of_the_folder_itself(path, plain):
    assert plain_name(path) is plain


def test_a_symlink_planted_mid_run_at_a_written_name_is_refused_and_nothing_outside_changes(box, outside):
    assert write(box, "report.txt", "first").output == "wrote 5 bytes to report.txt"
    os.unlink(box.root / "report.txt")
    os.symlink(outside / "secret.txt", box.root / "report.txt")
    result = write(box, "report.txt", "pwned")
    assert result.error and result.escape_attempt
    assert (outside / "secret.txt").read_text() == "secret"
    assert box.escape_attempts == ["report.txt"]


def test_a_dangling_symlink_out_is_refused_and_creates_nothing_outside(box, outside):
    os.symlink(outside / "new.txt", box.root / "new.txt")
    result = write(box, "new.txt", "pwned")
    assert result.error and result.escape_attempt
    assert not (outside / "new.txt").exists()


def test_a_symlink_inside_is_followed_as_the_resolved_path_is(box):
    os.symlink(box.root / "sub" / "inner.txt", box.root / "alias.txt")
    result = write(box, "alias.txt", "changed")
    assert not result.error and result.output == "wrote 7 bytes to sub/inner.txt"
    assert (box.root / "sub" / "inner.txt").read_text() == "changed"
    assert box.written == ["sub/inner.txt"]
    assert contains(box, "alias.txt", "CHANGED").passed


@pytest.mark.parametrize("link", [False, True])
def test_a_file_replaced_by_a_folder_is_a_folder(box, link):
    assert not write(box, "a.txt").error
    os.unlink(box.root / "a.txt")
    if link:
        os.symlink(box.root / "sub", box.root / "a.txt")
    else:
        os.mkdir(box.root / "a.txt")
    result = write(box, "a.txt")
    assert result.error and not result.escape_attempt
    assert result.output == "ERROR: 'a.txt' is a directory"
    assert write(box, "sub").output == "ERROR: 'sub' is a directory"


def test_checks_do_not_read_through_a_symlink_out(box, outside):
    os.symlink(outside / "secret.txt", box.root / "leak.txt")
    result = contains(box, "leak.txt", "secret")
    assert not result.passed and result.detail == "leak.txt does not exist"


def test_checks_do_not_wait_on_a_fifo_at_a_plain_name(box):
    os.mkfifo(box.root / "pipe.txt")
    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(contains(box, "pipe.txt", "x")), daemon=True)
    worker.start()
    worker.join(10)
    assert done and not done[0].passed and done[0].detail == "pipe.txt does not exist"


def test_checks_read_a_folder_name_as_missing(box):
    result = contains(box, "sub", "inner")
    assert not result.passed and result.detail == "sub does not exist"


@pytest.mark.parametrize(("size", "limit", "expected"), [(3, 100, 10), (10, 100, 10), (50, 100, 10), (3, 6, 6), (10, 4, 4)])
def test_read_at_most_with_a_size_reads_what_is_there(tmp_path, size, limit, expected):
    """``size`` is the size ``fstat`` gave: the file may have grown or shrunk since; the bytes read are the file's."""
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_at_most(fd, limit, size) == b"0123456789"[:expected]
    finally:
        os.close(fd)
