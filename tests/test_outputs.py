"""User-named output files and folders (``harness/outputs.py``): what the path is stays what it was.

Red-team finding (issue 11): ``harness export --out PATH`` replaced a symlink, a FIFO and, as
root, a character device with a regular file, reporting success. These tests never point the
code at the system's own ``/dev/stdout`` or ``/dev/null`` (a regression would replace them for
the whole machine when run as root): they use a private symlink to the process's stdout, the
descriptor path ``/dev/fd/1`` (where nothing can be created), and a private character device.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading

import pytest

from tests.helpers import IDEAL, REPO, assert_one_sentence_error, cli, finished_ledger, run_replay


def _export(ledger, out, **kwargs):
    """``harness export --out OUT`` in a subprocess; returns the completed process."""
    return subprocess.run([sys.executable, "-m", "harness", "export", "--ledger", str(ledger), "--out", str(out)],
                          cwd=REPO, timeout=120, **kwargs)  # fmt: skip


def _records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_export_through_a_symlink_writes_its_target_and_keeps_the_link(tmp_path, scenario, capsys):
    ledger = finished_ledger(tmp_path, scenario)
    target = tmp_path / "real.jsonl"
    target.write_text("old\n", encoding="utf-8")
    target.chmod(0o640)
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    rc, _, err = cli(capsys, "export", "--ledger", ledger, "--out", link)
    assert rc == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)
    rows = _records(target.read_text(encoding="utf-8"))
    assert len(rows) == 3 and {r["outcome"] for r in rows} == {"pass"}
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the file's permissions survive the replacement
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []


def test_export_through_a_dangling_symlink_creates_its_target(tmp_path, scenario, capsys):
    ledger = finished_ledger(tmp_path, scenario)
    link = tmp_path / "link.jsonl"
    link.symlink_to(tmp_path / "made.jsonl")
    rc, _, err = cli(capsys, "export", "--ledger", ledger, "--out", link)
    assert rc == 0, err
    assert link.is_symlink() and len(_records((tmp_path / "made.jsonl").read_text(encoding="utf-8"))) == 3


def test_export_to_a_fifo_writes_to_its_reader(tmp_path, scenario, capsys):
    ledger = finished_ledger(tmp_path, scenario)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []

    def reader():
        with open(fifo, "rb") as handle:  # blocks until the export opens the FIFO for writing
            received.append(handle.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        rc, _, err = cli(capsys, "export", "--ledger", ledger, "--out", fifo)
    finally:
        if thread.is_alive() and not received:  # the export never opened the FIFO: release the reader
            with open(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), "wb"):
                pass
        thread.join(60)
    assert rc == 0, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert len(received) == 1 and len(_records(received[0].decode("utf-8"))) == 3


def test_export_to_a_symlink_to_stdout_writes_to_the_pipe(tmp_path, scenario):
    # like `--out /dev/stdout` (a symlink to /proc/self/fd/1), but a private link: a regression
    # replaces this link, never the system's /dev/stdout
    ledger = finished_ledger(tmp_path, scenario)
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    done = _export(ledger, link, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert len(_records(done.stdout)) == 3
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"


def test_export_to_a_descriptor_path_appends_to_what_the_shell_opened(tmp_path, scenario):
    # `harness export --out /dev/fd/1 >> all.jsonl` (the same for /dev/stdout) must append, as the
    # shell promised, not replace all.jsonl
    ledger = finished_ledger(tmp_path, scenario)
    collected = tmp_path / "all.jsonl"
    collected.write_text('{"earlier": true}\n', encoding="utf-8")
    with open(collected, "ab") as sink:
        done = _export(ledger, "/dev/fd/1", stdout=sink, stderr=subprocess.PIPE, text=True)
    assert done.returncode == 0, done.stderr
    rows = _records(collected.read_text(encoding="utf-8"))
    assert rows[0] == {"earlier": True} and len(rows) == 4


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a character device needs root")
@pytest.mark.parametrize(("name", "minor"), [("null", 3), ("full", 7)])
def test_export_to_a_character_device_writes_to_it_and_keeps_it(tmp_path, scenario, capsys, name, minor):
    ledger = finished_ledger(tmp_path, scenario)
    device = tmp_path / name
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, minor))  # a private /dev/null or /dev/full
    except OSError as exc:  # e.g. a container without CAP_MKNOD
        pytest.skip(f"cannot create a character device here: {exc}")
    rc, _, err = cli(capsys, "export", "--ledger", ledger, "--out", device)
    if name == "null":
        assert rc == 0, err
    else:  # a write to /dev/full fails with ENOSPC: said in one sentence, not reported as success
        assert_one_sentence_error(rc, err)
        assert "No space left on device" in err
    assert stat.S_ISCHR(os.lstat(device).st_mode) and os.stat(device).st_rdev == os.makedev(1, minor)


def test_export_to_a_socket_is_refused_in_one_sentence(tmp_path, scenario, capsys):
    import socket

    ledger = finished_ledger(tmp_path, scenario)
    path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    try:
        rc, _, err = cli(capsys, "export", "--ledger", ledger, "--out", path)
    finally:
        server.close()
    assert_one_sentence_error(rc, err)
    assert "socket" in err and stat.S_ISSOCK(os.lstat(path).st_mode)


@pytest.mark.parametrize("kind", ["file", "fifo", "dangling-symlink"])
@pytest.mark.parametrize("command", ["report", "run"])
def test_a_folder_option_naming_something_else_is_refused(tmp_path, scenario, capsys, command, kind):
    ledger = finished_ledger(tmp_path, scenario)
    path = tmp_path / "not-a-folder"
    if kind == "file":
        path.write_text("keep", encoding="utf-8")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(tmp_path / "nowhere")
    before = ledger.read_bytes()
    if command == "report":
        argv = ["report", "--ledger", ledger, "--out", path, "--format", "md"]
    else:
        cassette = tmp_path / "c.jsonl"
        cassette.write_text('{"content": "done", "finish_reason": "stop"}\n', encoding="utf-8")
        argv = ["run", str(REPO / "scenarios" / "list_and_report.toml"), "--ledger", ledger,
                "--model", f"replay:{cassette}", "--repeats", "1", "--temperature", "0", "--record", path]  # fmt: skip
    rc, _, err = cli(capsys, *argv)
    assert_one_sentence_error(rc, err)
    assert "is not a folder" in err
    assert ledger.read_bytes() == before
    if kind == "file":
        assert path.read_text(encoding="utf-8") == "keep"
    assert os.path.lexists(path) and not path.is_dir()


def test_a_new_export_file_gets_the_usual_permissions(tmp_path, scenario, capsys):
    ledger = finished_ledger(tmp_path, scenario)
    old = os.umask(0o022)
    try:
        rc, _, err = cli(capsys, "export", "--ledger", ledger, "--out", tmp_path / "new.jsonl")
    finally:
        os.umask(old)
    assert rc == 0, err
    assert stat.S_IMODE((tmp_path / "new.jsonl").stat().st_mode) == 0o644  # not mkstemp's 0600


def test_export_to_a_symlink_loop_is_one_sentence(tmp_path, scenario, capsys):
    # red-team finding: Path.resolve() raised RuntimeError ("Symlink loop") before anything was checked
    run_replay(tmp_path, scenario, IDEAL)
    (tmp_path / "loopA").symlink_to(tmp_path / "loopB")
    (tmp_path / "loopB").symlink_to(tmp_path / "loopA")
    rc, _out, err = cli(capsys, "export", "--ledger", tmp_path / "ledger.sqlite", "--out", tmp_path / "loopA")
    assert_one_sentence_error(rc, err)
    assert "symbolic links" in err and (tmp_path / "loopA").is_symlink()
