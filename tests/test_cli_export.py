"""`harness export`'s output: `--out -`, a terminal, and the names the ledger owns beside it.

Red-team regression tests: the model's words reach a terminal escaped and a file or a pipe byte-exact; an --out that
would take a name the ledger keeps for itself is one sentence, and a run then names what is in its way.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import subprocess
import sys

import pytest

from harness.ledger import Ledger
from tests.helpers import IDEAL, REPO, RUN_FLAGS, SCENARIO_FILE, assert_one_sentence_error, cli, write_cassette
from tests.ledger_builders import add_run

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
HOSTILE = "\x1b[2J\x1b]0;pwned\x07\u202eevil\x9b31m"
"""Clears the screen, sets the window title, reverses the line, then turns it red (a C1 CSI, which JSON does not
escape): what a model's final answer may hold."""
FORMATS = [["--format", "jsonl"], ["--format", "csv"], ["--format", "jsonl", "--runs"], ["--format", "csv", "--runs"]]
FORMAT_IDS = ["jsonl", "csv", "jsonl-runs", "csv-runs"]


def _hostile_ledger(tmp_path):
    """A ledger whose model name (every turn's record) and final answer (the run's record) hold control sequences."""
    path = tmp_path / "l.sqlite"
    with Ledger(path) as ledger:
        add_run(ledger, "r1", model=f"openai:m{HOSTILE}@http://h:1/v1", turns=[([], "a"), ([], f"done {HOSTILE}")])
    return path


def _raw(text: str, fmt: list[str]) -> str:
    """``text`` as a file or a pipe holds it: as is in CSV; in JSONL with JSON's own escapes of control characters
    only (``\\u001b``), every other character as it is (U+202E unescaped)."""
    return json.dumps(text, ensure_ascii=False)[1:-1] if "jsonl" in fmt else text


def _harness(argv, cwd, **streams) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "harness", *map(str, argv)], cwd=cwd, env=ENV, stdin=subprocess.DEVNULL,
                          timeout=120, check=False, **streams)  # fmt: skip


def _on_a_terminal(argv, cwd) -> tuple[int, bytes, bytes]:
    """Run ``harness ARGV`` with its standard output on a real pseudo-terminal: its exit code, every byte the terminal
    received (newlines as the terminal shows them, ``\\r\\n``) and its stderr."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "harness", *map(str, argv)], cwd=cwd, env=ENV,
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE)  # fmt: skip
    os.close(slave)
    received = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        received += chunk
    os.close(master)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, bytes(received), err


# red-team finding: `--out -` wrote a file named "-" ("Wrote 3 turns to -.")
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_export_out_dash_writes_standard_output_and_no_file(tmp_path, capsys, fmt):
    ledger = _hostile_ledger(tmp_path)
    rc, expected, _ = cli(capsys, "export", "--ledger", ledger, *fmt)
    rc_dash, out, err = cli(capsys, "export", "--ledger", ledger, *fmt, "--out", "-")
    assert (rc, rc_dash, err) == (0, 0, "") and out == expected and _raw(HOSTILE, fmt) in out  # capsys: no terminal
    assert not (tmp_path / "-").exists()
    assert cli(capsys, "export", "--ledger", ledger, *fmt, "--out", "./-")[0] == 0  # a file named "-" is still possible
    assert (tmp_path / "-").read_bytes() == expected.encode("utf-8")


def test_export_help_says_out_dash_is_standard_output(capsys):
    with pytest.raises(SystemExit):
        cli(capsys, "export", "--help")
    assert '"-" for standard output' in " ".join(capsys.readouterr().out.split())


# red-team finding: export wrote a model's control sequences raw to a terminal (cleared it, set its title)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("out", [[], ["--out", "-"], ["--out", "/dev/stdout"]], ids=["default", "dash", "dev-stdout"])
def test_export_to_a_terminal_escapes_the_models_words_and_a_pipe_gets_them_exactly(tmp_path, fmt, out):
    ledger = _hostile_ledger(tmp_path)
    piped = _harness(["export", "--ledger", ledger, *fmt, *out], tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert piped.returncode == 0 and _raw(HOSTILE, fmt).encode("utf-8") in piped.stdout, piped.stderr
    assert _harness(["export", "--ledger", ledger, *fmt, "--out", "file"], tmp_path).returncode == 0
    assert piped.stdout == (tmp_path / "file").read_bytes()  # a pipe gets a file's bytes
    rc, shown, err = _on_a_terminal(["export", "--ledger", ledger, *fmt, *out], tmp_path)
    assert rc == 0 and b"Traceback" not in err, err
    assert not any(seq in shown for seq in (b"\x1b", b"\x07", b"\xe2\x80\xae", b"\xc2\x9b")), shown  # U+202E, U+009B
    assert b"\r\r\n" not in shown  # red team 2: CSV's \r\n line ends became \r\r\n on the terminal
    text = shown.decode("utf-8").replace("\r\n", "\n")
    if "jsonl" in fmt:  # JSON's own escapes: the same values as the pipe's
        assert [json.loads(line) for line in text.splitlines()] == [json.loads(line) for line in piped.stdout.splitlines()]
    else:  # each field as harness.vocab.printable shows it; the CSV's shape unchanged
        assert "\\x1b[2J\\x1b]0;pwned\\x07\\u202eevil\\x9b31m" in text
        rows = list(csv.reader(io.StringIO(text)))
        assert [len(row) for row in rows] == [len(row) for row in csv.reader(io.StringIO(piped.stdout.decode("utf-8")))]


# red-team finding: `export --out ledger.sqlite.locks` made the lock folder's name a file; `harness run` then blamed
# the ledger's folder ("check that the ledger's folder is writable")
@pytest.mark.parametrize("name", ["l.sqlite.locks", "l.sqlite.locks/runs.lock"])
def test_export_out_onto_the_ledgers_lock_folder_or_into_it_is_refused(tmp_path, capsys, name):
    ledger = _hostile_ledger(tmp_path)
    if "/" in name:
        (tmp_path / "l.sqlite.locks").mkdir()  # as after a first `harness run`
    rc, out, err = cli(capsys, "export", "--ledger", ledger, "--out", tmp_path / name)
    assert_one_sentence_error(rc, err)
    assert "lock folder" in err and out == "" and not (tmp_path / name).is_file()


def test_run_names_a_lock_folder_that_is_a_file_and_says_to_move_it(tmp_path, capsys):
    ledger = tmp_path / "l.sqlite"
    cassette = write_cassette(tmp_path / "c.jsonl", IDEAL)
    argv = ["run", SCENARIO_FILE, "--model", f"replay:{cassette}", *RUN_FLAGS, "--repeats", "1", "--ledger", ledger]
    locks = tmp_path / "l.sqlite.locks"
    locks.write_text("an export put here\n", encoding="utf-8")
    rc, _out, err = cli(capsys, *argv)  # stderr: the planning lines, then the refusal
    said = [line for line in err.splitlines() if line.startswith("harness:")]
    assert rc == 1 and "Traceback" not in err, err
    assert said == [
        f"harness: {locks} is not a folder, but the ledger keeps its run locks there; move or remove it and run again."
    ]
    locks.unlink()
    assert cli(capsys, *argv)[0] == 0
