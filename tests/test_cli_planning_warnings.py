"""`harness run` says its planning warnings (here: --jobs above an Ollama server's OLLAMA_NUM_PARALLEL) and why a
model's runs are skipped (its server is not running) once, on standard error, before its first run: they were said
after the summary only (the warnings never when `| head` stopped the matrix).

Real parts: ``python -m harness`` children (without PYTHONUNBUFFERED, as users run it), a scripted Ollama server on
127.0.0.1 (tests/backend_fakes.py), real pipes, real ledger files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.ledger import Ledger, parse_anchor
from tests.backend_fakes import FakeServer, closed_port, json_reply
from tests.fake_agent_server import FakeAgentServer
from tests.helpers import REPO, RUN_FLAGS, SCENARIO_FILE, assert_one_sentence_error, cli
from tests.ledger_builders import SMALL, add_run
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


def _down(model: str, port: int) -> str:
    return (f"harness: skipped 2 runs of ollama:{model}@http://127.0.0.1:{port}: Ollama is not running at "
            f"http://127.0.0.1:{port}; start it with `ollama serve` or correct the URL in the model spec.")  # fmt: skip


# finding: with Ollama not running, `harness run` said "4 cannot be planned", then "0 runs in 0.1 s", and only then why
def test_a_skipped_models_reason_is_said_once_right_after_the_planned_line(tmp_path):
    port = closed_port()
    with _ollama() as server:
        argv = _argv(server, tmp_path / "l.sqlite", "threads")
        argv[argv.index("--jobs") + 1] = "1"  # no planning warning: the skip comes right after the planned line
        argv[4:4] = ["--model", f"ollama:down@http://127.0.0.1:{port}"]
        proc = subprocess.run(argv, capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=120)
    err = proc.stderr.splitlines()
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    planned = next(i for i, line in enumerate(err) if " runs planned, " in line)
    assert err[planned].startswith("4 runs planned, 0 already done, 2 skipped, 2 to run"), proc.stderr
    assert err[planned + 1] == _down("down", port), proc.stderr
    assert sum("Ollama is not running" in line for line in err + proc.stdout.splitlines()) == 1, proc.stderr
    assert "[2/2]" in proc.stdout  # the other model's runs ran after it
    assert err[-1] == "harness: skipped 2 runs of 1 model, for the reason said above.", proc.stderr


def test_when_every_model_is_skipped_the_reasons_come_before_the_summary(tmp_path):
    ports = closed_port(), closed_port()
    argv = [sys.executable, "-m", "harness", "run", str(SCENARIO_FILE), *RUN_FLAGS, "--repeats", "2",
            "--ledger", str(tmp_path / "l.sqlite")]  # fmt: skip
    for name, port in zip(("a", "b"), ports, strict=True):
        argv += ["--model", f"ollama:{name}@http://127.0.0.1:{port}"]
    env = {**ENV, "PYTHONUNBUFFERED": "1"}  # both streams in one pipe in the order they were written
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
                          timeout=120)  # fmt: skip
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1, proc.stdout
    assert lines[0].startswith("4 runs planned, 0 already done, 4 skipped, 0 to run"), proc.stdout
    assert lines[1:3] == [_down("a", ports[0]), _down("b", ports[1])], proc.stdout
    assert sum("Ollama is not running" in line for line in lines) == 2, proc.stdout
    assert "harness: skipped 4 runs of 2 models, for the reasons said above." in lines[3:], proc.stdout


def _down_openai(tmp_path: Path, port: int, *extra: str) -> list[str]:
    """``harness run`` of 2 runs on an OpenAI-compatible server that is not running (nothing listens at ``port``)."""
    return ["run", str(SCENARIO_FILE), "--model", f"openai:x@http://127.0.0.1:{port}/v1", *RUN_FLAGS, "--repeats", "2",
            "--ledger", str(tmp_path / "d" / "l.sqlite"), *extra]  # fmt: skip


# finding: with every model skipped (a wrong URL), `harness run` made an empty ledger and printed its head line
def test_a_run_whose_every_model_is_skipped_makes_no_ledger(tmp_path, capsys):
    port = closed_port()
    rc, out, err = cli(capsys, *_down_openai(tmp_path, port))
    assert rc == 1 and "Traceback" not in err, (out, err)
    assert f"harness: skipped 2 runs of openai:x@http://127.0.0.1:{port}/v1: The server at " in err, err
    assert "Ledger head" not in out and "no ledger written (nothing could run)" in out, out
    assert "(not created: nothing can run)" in err, err  # the opening line names the path it did not create
    assert list(tmp_path.iterdir()) == [], "a ledger (or its folder) was made though nothing could run"
    # helper (this stop): with --record, it also said "every planned run is already in the ledger", which was not so
    rc, _, err = cli(capsys, *_down_openai(tmp_path, port), "--record", str(tmp_path / "cassettes"))
    assert rc == 1 and "skipped 2 runs" in err and "already in the ledger" not in err, err


def test_a_run_whose_every_model_is_skipped_leaves_an_existing_ledger_as_it_was(tmp_path, capsys):
    """The ledger is read as before (for resume) and its head line still ends the output; nothing in it is lost."""
    path = tmp_path / "d" / "l.sqlite"
    with Ledger(path) as ledger:
        add_run(ledger, "a", model=SMALL)
        anchor = ledger.head().anchor
    before = path.read_bytes()
    rc, out, err = cli(capsys, *_down_openai(tmp_path, closed_port()))
    assert rc == 1 and "skipped 2 runs of openai:x@" in err, (out, err)
    assert out.strip().splitlines()[-1].endswith(f": {anchor}"), out
    assert path.read_bytes() == before
    with Ledger(path, readonly=True) as ledger:
        assert ledger.verify(parse_anchor(anchor)).ok and [run.run_id for run in ledger.runs()] == ["a"]


# finding: for one server down, --dry-run said "2 runs of M cannot be planned: ..." where the run said "skipped 2 runs of M: ..."
def test_the_dry_run_explains_a_skipped_model_in_the_run_s_own_sentence(tmp_path, capsys):
    argv = _down_openai(tmp_path, closed_port())
    dry_rc, dry_out, dry_err = cli(capsys, *argv, "--dry-run")
    rc, out, err = cli(capsys, *argv)
    assert dry_rc == rc == 1, (dry_err, err)
    said = [line for line in err.splitlines() if line.startswith("harness: skipped 2 runs of openai:x@")]
    assert len(said) == 1 and said[0] in dry_err.splitlines(), (dry_err, err)
    assert "cannot be planned:" not in dry_err, dry_err
    counts = next(line for line in err.splitlines() if " runs planned, " in line)  # the counts were the same already
    assert counts.startswith(dry_out.strip().splitlines()[-1].rstrip(".")), (dry_out, err)


def test_every_shard_writes_its_ledger_even_one_holding_no_run(tmp_path, capsys):
    """red team (this stop): before 89d80c3 a shard holding no planned run wrote an empty ledger (and its head line); then it wrote none, and
    `harness ledger merge OUT s0 s1` of every shard's ledger fails ("no ledger at ...")."""
    paths = [tmp_path / f"s{i}.sqlite" for i in range(2)]
    with FakeAgentServer() as server:
        for i, path in enumerate(paths):
            rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"openai:ideal@{server.base_url}", *RUN_FLAGS,
                             "--repeats", "1", "--ledger", path, "--shard", f"{i}/2")  # fmt: skip
            assert rc == 0, err
    rc, _, err = cli(capsys, "ledger", "merge", tmp_path / "merged.sqlite", *paths)
    assert rc == 0, err
    # red team 2 (this stop): a shard whose every run was skipped (its server down) writes none; merge says why
    down = tmp_path / "down.sqlite"
    rc, _, _ = cli(capsys, *_down_openai(tmp_path, closed_port())[:-2], "--ledger", down)
    assert rc == 1 and not down.exists()
    rc, _, err = cli(capsys, "ledger", "merge", tmp_path / "merged2.sqlite", paths[0], down)
    assert_one_sentence_error(rc, err)
    assert "a shard whose every run was skipped, its server down, writes none" in err, err
