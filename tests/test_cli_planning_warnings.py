"""`harness run` says its planning warnings (here: --jobs above an Ollama server's OLLAMA_NUM_PARALLEL) once, on
standard error, before its first run: they were said after the summary table only, and never when `| head` stopped
the matrix.

Real parts: ``python -m harness`` children (without PYTHONUNBUFFERED, as users run it), a scripted Ollama server on
127.0.0.1 (tests/backend_fakes.py), real pipes, real ledger files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backend_fakes import FakeServer, json_reply
from tests.helpers import REPO, RUN_FLAGS, SCENARIO_FILE
from tests.server_fakes import ollama_chat, ollama_show, ollama_tags

ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONUNBUFFERED", "OLLAMA_NUM_PARALLEL")}
ENV["PYTHONPATH"] = str(REPO)


def _ollama() -> FakeServer:
    """An Ollama server with model ``m`` that answers every chat request "Done." (the runs end as task_failed)."""
    replies = [{"content": "Done.", "prompt_eval_count": 10, "eval_count": 2}] * 20
    return FakeServer({("GET", "/api/version"): json_reply(200, {"version": "0.6.2"}),
                       ("POST", "/api/show"): ollama_show(["completion", "tools"]),
                       ("GET", "/api/tags"): ollama_tags({"m:latest": "abc123"}),
                       ("POST", "/api/chat"): ollama_chat(replies, model="m")})  # fmt: skip


def _argv(server: FakeServer, ledger: Path, executor: str) -> list[str]:
    argv = [sys.executable, "-m", "harness", "run", str(SCENARIO_FILE), "--model", f"ollama:m@{server.url}", *RUN_FLAGS,
            "--repeats", "2", "--jobs", "2", "--executor", executor, "--ledger", str(ledger)]  # fmt: skip
    return argv + (["--workers", "1"] if executor == "processes" else [])


def _warning(server: FakeServer) -> str:
    return (f"harness: warning: --jobs 2 for ollama:m@{server.url}: an Ollama server answers OLLAMA_NUM_PARALLEL "
            "requests at once (here 1; Ollama's default is 1) and queues the rest; set it on the server to match.")  # fmt: skip


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_planning_warnings_are_said_once_before_the_first_run(tmp_path, executor):
    with _ollama() as server:
        proc = subprocess.run(_argv(server, tmp_path / "l.sqlite", executor), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=ENV, cwd=tmp_path, timeout=120)  # fmt: skip
    lines = proc.stdout.splitlines()  # standard output and standard error in the order they were written
    assert proc.returncode == 0, proc.stdout
    assert [line for line in lines if line.startswith("harness: warning:")] == [_warning(server)], proc.stdout
    first_run = next(i for i, line in enumerate(lines) if line.startswith("[1/2]"))
    assert lines.index(_warning(server)) < first_run, proc.stdout


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_planning_warnings_are_said_when_the_output_reader_left(tmp_path, executor):
    """`harness run | head`: the reader is gone before the first run line; the matrix stops, and the warning was
    said all the same (the summary that said it is not written)."""
    with _ollama() as server:
        read, write = os.pipe()
        os.close(read)
        proc = subprocess.Popen(_argv(server, tmp_path / "l.sqlite", executor), stdout=write, stderr=subprocess.PIPE,
                                text=True, env=ENV, cwd=tmp_path)  # fmt: skip
        os.close(write)
        _, err = proc.communicate(timeout=120)
    lines = err.splitlines()
    assert proc.returncode == 0 and "stopped reading" in lines[-1], (proc.returncode, err)
    assert [line for line in lines if line.startswith("harness: warning:")] == [_warning(server)], err
