"""`harness run` command-line validation, and bad command lines of every command.

Red-team regression tests: a bad command line gets one sentence on stderr and a non-zero exit,
never a traceback, and loses nothing already on disk.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys

import pytest

from harness.ledger import Ledger
from harness.matrix import MAX_SEED
from tests.fake_agent_server import FakeAgentServer
from tests.helpers import REPO, RUN_FLAGS, SCENARIO_FILE, assert_one_sentence_error, cli, scenario_toml, text_line, write_cassette


# red-team finding: a seed beyond SQLite's INTEGER range was a traceback
@pytest.mark.parametrize("where", ["cli", "scenario"])
def test_seed_beyond_sqlite_integer_range_is_a_clean_error(tmp_path, capsys, where):
    # seed + repetition = 2**63 -> OverflowError traceback from the ledger insert.
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])
    model = f"replay:{tmp_path / 'done.jsonl'}"
    if where == "cli":
        argv = ["run", SCENARIO_FILE, "--model", model, "--seed", 2**63 - 1, "--repeats", 2]
    else:
        argv = ["run", scenario_toml(tmp_path, matrix="[matrix]\nseeds = [9223372036854775807]\nrepeats = 2\n"), "--model", model]
    rc, _, err = cli(capsys, *argv)
    assert_one_sentence_error(rc, err)


# red-team finding: --temperature nan blamed the ledger
def test_nan_temperature_on_the_command_line_is_a_usage_error(tmp_path, capsys):
    # `--temperature nan` passes the `t < 0` check and ends as a LedgerError
    # "NOT NULL constraint failed: runs.temperature" that blames the ledger, exit 1.
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"replay:{tmp_path / 'done.jsonl'}", "--temperature", "nan")
    assert rc == 2 and "--temperature" in err


# red-team finding: --temperature inf was accepted
def test_infinite_temperature_on_the_command_line_is_a_usage_error(tmp_path, capsys):
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"replay:{tmp_path / 'done.jsonl'}", "--temperature", "inf")
    assert rc == 2 and "--temperature" in err


# red-team finding: --record onto a file was a traceback
def test_record_dir_that_is_a_file_is_a_clean_error(tmp_path, capsys):
    # CassetteRecorder's mkdir raises FileExistsError in a worker thread -> traceback
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("keep me", encoding="utf-8")
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"replay:{tmp_path / 'done.jsonl'}", "--record", not_a_dir)
    assert_one_sentence_error(rc, err)
    assert not_a_dir.read_text(encoding="utf-8") == "keep me"


# red-team finding: absurd --repeats exhausted memory
def test_absurd_repeats_fail_fast_instead_of_exhausting_memory(tmp_path):
    # expand_matrix materialises every RunPlan up front: --repeats 10**12 (or repeats = 2**63-1
    # in a scenario) runs until MemoryError, printed as a traceback. Bounded here to 400 MB / 60 s.
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (400 << 20, 400 << 20))

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "harness", "run", str(SCENARIO_FILE), "--model", f"replay:{tmp_path / 'done.jsonl'}",
            "--repeats", str(10**12), "--dry-run"]  # fmt: skip
    try:
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, preexec_fn=limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail("harness run --repeats 10**12 --dry-run did not finish within 60 s")
    assert proc.returncode != 0
    assert proc.stderr.startswith("harness: "), proc.stderr[-400:]
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-400:]


@pytest.mark.parametrize(
    "argv",
    [
        ["run", SCENARIO_FILE, "--model", "foo:bar"],
        ["run", SCENARIO_FILE, "--model", "ollama:"],
        ["run", SCENARIO_FILE, "--model", "openai:m"],
        ["run", SCENARIO_FILE, "--model", "embedded:/nonexistent.gguf"],
        ["run", SCENARIO_FILE, "--model", "replay:/nonexistent"],
        ["run", SCENARIO_FILE, "--repeats", "0"],
        ["run", SCENARIO_FILE, "--jobs", "0"],
        ["run", SCENARIO_FILE, "--max-attempts", "0"],
        ["run", SCENARIO_FILE, "--temperature", "-1"],
        ["run", "/nonexistent.toml"],
        ["classify"],
        ["classify", "/nonexistent"],
        ["scenarios", "check", "/nonexistent"],
        ["models", "pull", "nosuch"],
    ],
)
def test_guard_bad_command_lines_are_one_sentence(capsys, argv):
    rc, _, err = cli(capsys, *argv)
    assert_one_sentence_error(rc, err)


def test_the_run_line_counts_failed_checks_of_one_type_instead_of_repeating_them(tmp_path, capsys):
    """A newcomer saw 'failed checks: file_json_field, file_json_field, file_json_field, ...' (extract_fields has five
    checks of that type): the run line names each type once with its count, as the viewer's run list does."""
    answer = {"content": "I cannot open files, but the invoice total is probably about 4,000 euros."}
    with FakeAgentServer(script=[answer]) as server:
        rc, out, err = cli(capsys, "run", REPO / "scenarios" / "extract_fields.toml", "--model", f"openai:m@{server.base_url}",
                           *RUN_FLAGS, "--ledger", tmp_path / "l.sqlite")  # fmt: skip
    assert rc == 0, err
    run_line = next(line for line in out.splitlines() if "-> task_failed" in line)
    assert "; failed checks: file_json_field ×5; failure modes: " in run_line, run_line


def test_weather_answer_without_a_call_shows_its_failure_modes_in_the_run_line_and_the_report(tmp_path, capsys):
    """The weather_probe case of issue 10: an answer that never calls the tool is not 'failure modes: none'."""
    invented = {"content": "The weather in Paris is quite pleasant right now, around 21°C with clear skies."}
    ledger = tmp_path / "l.sqlite"
    with FakeAgentServer(script=[invented]) as server:
        rc, out, err = cli(capsys, "run", REPO / "scenarios" / "weather_probe.toml", "--model", f"openai:m@{server.base_url}",
                           *RUN_FLAGS, "--ledger", ledger)  # fmt: skip
    assert rc == 0, err
    assert "task_failed" in out and "failure modes: fabricated_tool_result, skipped_required_tool" in out
    # why it failed: the done checks that failed are on the run line; the model's load is announced; what to try next
    run_line = next(line for line in out.splitlines() if "-> task_failed" in line)
    assert re.search(r"\); failed checks: [a-z_]+( ×\d+)?(, [a-z_]+( ×\d+)?)*; failure modes: ", run_line), run_line
    assert f"Warming up openai:m@{server.base_url} with one request..." in err
    assert f"Next: `harness report --ledger {ledger}`" in out
    rc, out, err = cli(capsys, "report", "--ledger", ledger, "--out", tmp_path / "rep", "--format", "md")
    assert rc == 0, err
    report = (tmp_path / "rep" / "report.md").read_text(encoding="utf-8")
    assert "skipped_required_tool" in report and "fabricated_tool_result" in report


# newcomer finding: the timeout message said "raise the timeout" but nothing could raise it
def test_timeout_flag_sets_how_long_one_reply_may_take(tmp_path, capsys):
    ledger = tmp_path / "l.sqlite"
    with FakeAgentServer(delay_s=2.5) as server:
        rc, out, err = cli(capsys, "run", "--model", f"openai:m@{server.base_url}", *RUN_FLAGS, "--ledger", ledger,
                           "--timeout", "1", "--max-attempts", "1", "--repeats", "1")  # fmt: skip
    assert rc == 1 and "infra_error" in out and "did not answer completely within 1 s; raise --request-timeout" in out
    assert_one_sentence_error(*cli(capsys, "run", "--timeout", "0", "--dry-run")[::2])
    rc, err = cli(capsys, "run", "--request-timeout", "0", "--dry-run")[::2]
    assert_one_sentence_error(rc, err)
    assert "--request-timeout must be from 1 to 86400 seconds." in err


def test_dry_run_stops_where_the_run_would_when_the_ledger_cannot_be_created(tmp_path, capsys):
    # newcomer finding: --dry-run said "1 to run" (exit 0) while the real run refused the ledger path
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    ledger = tmp_path / "afile" / "ledger.sqlite"
    cassette = tmp_path / "c.jsonl"
    cassette.write_text("", encoding="utf-8")
    argv = ["run", SCENARIO_FILE, "--model", f"replay:{cassette}", "--ledger", ledger]
    dry_rc, _, dry_err = cli(capsys, *argv, "--dry-run")
    run_rc, _, run_err = cli(capsys, *argv)
    assert dry_rc == run_rc == 1
    assert "cannot create the folder" in dry_err and "cannot create the folder" in run_err
    assert_one_sentence_error(dry_rc, dry_err)


@pytest.mark.parametrize(("seeds", "repeats"), [(["0", "1"], "2"), (["5", "5"], "1"), (["0", "3", "10"], "4")])
def test_base_seeds_whose_repetitions_overlap_are_refused(tmp_path, capsys, seeds, repeats):
    # two cells sending one seed are one sample counted twice; the matrix is refused before anything runs
    argv = [
        "run",
        SCENARIO_FILE,
        "--model",
        f"replay:{tmp_path / 'c.jsonl'}",
        "--repeats",
        repeats,
        "--ledger",
        tmp_path / "l.sqlite",
    ]
    for seed in seeds:
        argv += ["--seed", seed]
    rc, _, err = cli(capsys, *argv, "--dry-run")
    assert_one_sentence_error(rc, err)
    assert "both send seed" in err and not (tmp_path / "l.sqlite").exists()


# a helper's finding: the base seed is checked against MAX_SEED, but repetition r sends seed + r, past it
@pytest.mark.parametrize(("seed", "ok"), [(MAX_SEED - 2, True), (MAX_SEED - 1, False)], ids=["last-fits", "one-over"])
def test_no_repetition_sends_a_seed_above_the_largest(tmp_path, capsys, seed, ok):
    (tmp_path / "c.jsonl").write_text('{"content": "hi"}\n', encoding="utf-8")
    argv = ["run", SCENARIO_FILE, "--model", f"replay:{tmp_path / 'c.jsonl'}", "--repeats", "3", "--seed", str(seed),
            "--ledger", tmp_path / "l.sqlite", "--dry-run"]  # fmt: skip
    rc, out, err = cli(capsys, *argv)
    if ok:
        assert rc == 0 and f"seed={MAX_SEED} " in out, (out, err)
        return
    assert_one_sentence_error(rc, err)
    assert err == (f"harness: the base seed {seed} with 3 repeats sends seed {MAX_SEED + 1}, above {MAX_SEED} (repetition r "
                   f"sends seed + r); use a base seed of at most {MAX_SEED - 2}.\n")  # fmt: skip


# newcomer finding: a request that timed out twice showed only "Running 1 of 1 planned runs" for 11 minutes
def test_each_failed_attempt_that_will_be_retried_is_one_line_on_the_console(tmp_path, capsys):
    ledger = tmp_path / "l.sqlite"
    with FakeAgentServer(faults=lambda n: "slow" if n == 1 else None, slow_s=3, slots=2) as server:  # the first request stalls
        rc, out, err = cli(capsys, "run", "--model", f"openai:m@{server.base_url}", *RUN_FLAGS, "--ledger", ledger,
                           "--request-timeout", "1", "--repeats", "1")  # fmt: skip
    assert rc == 0 and "-> pass" in out, err
    assert "1 run planned, 0 already done, 1 to run;" in err  # not "1 runs" (the opening line says what --dry-run says)
    lines = [line for line in err.splitlines() if "retrying" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"harness: list_and_report openai:m@{server.base_url} T=0 seed=")
    assert ": turn 1, attempt 1 of 4 failed (BackendTimeout: The server at " in lines[0]
    assert (
        "did not answer completely within 1 s; raise --request-timeout or use a smaller model or prompt); retrying in "
        in lines[0]
    )
    with Ledger(ledger, readonly=True) as db:
        assert [a.error_type for a in db.attempts()] == ["BackendTimeout"]  # the line says what the ledger records


def test_request_timeout_help_gives_the_embedded_default(capsys):
    with pytest.raises(SystemExit):
        cli(capsys, "run", "--help")
    help_text = " ".join(capsys.readouterr().out.split())
    assert "default 60 plus 0.2 per token of max_tokens; 60 plus 1 per token for embedded models" in help_text


_HOSTILE = "\x1b[2J\x1b[31mPWNED\rOVERWRITE\nsecond line\x07\u202e" + "A" * 10_000


class _HostileServer(FakeAgentServer):
    """Answers its faulted requests HTTP 500 with terminal escapes, a CR, a newline and 10 KB in the error message."""

    def _answer(self, handler, body, fault, *, warm_up=False):  # type: ignore[no-untyped-def]
        if fault == "hostile":
            return self._send(handler, 500, json.dumps({"error": {"message": _HOSTILE}}).encode())
        return super()._answer(handler, body, fault, warm_up=warm_up)


# red-13 finding: a server's error message (and a model spec) reached the console raw: escapes, CR, newlines, 10 KB
@pytest.mark.parametrize("always", [False, True])
def test_a_hostile_server_error_cannot_hijack_the_console_and_each_attempt_stays_one_line(tmp_path, capsys, always):
    ledger = tmp_path / "l\x1b[31m.sqlite"  # red team (stop 29): the ledger's path reached the start and summary lines raw
    with _HostileServer(faults=lambda n: "hostile" if always or n == 1 else None) as server:
        rc, out, err = cli(capsys, "run", "--model", f"openai:m\x1b[31m@{server.base_url}", *RUN_FLAGS, "--ledger", ledger,
                           "--repeats", "1", "--max-attempts", "2")  # fmt: skip
    assert rc == (1 if always else 0), err
    for text in (out, err):
        assert not any(ch in text for ch in "\x1b\r\x07\u202e"), text[:500]
        assert max(len(line) for line in text.splitlines()) < 1200
    lines = [line for line in err.splitlines() if "retrying" in line]
    assert len(lines) == 1 and "attempt 1 of 2 failed" in lines[0], err
    assert "HTTP 500 (\\x1b[2J\\x1b[31mPWNED\\rOVERWRITE\\nsecond line\\x07\\u202eAAA" in lines[0]
    assert "more characters in the ledger" in lines[0] and "openai:m\\x1b[31m@" in lines[0]
    assert "ledger: " + str(ledger).replace("\x1b", "\\x1b") in out + err
    with Ledger(ledger, readonly=True) as db:
        assert _HOSTILE in db.attempts()[0].error  # the ledger keeps the server's words whole


def test_an_error_sentence_naming_a_hostile_file_name_stays_one_escaped_line(tmp_path, capsys):
    rc, out, err = cli(capsys, "run", tmp_path / "x\x1b[2J\rY\n.toml")
    assert rc == 1 and err.count("\n") == 1 and "\x1b" not in err and "\r" not in err
    assert "x\\x1b[2J\\rY\\n.toml: no such scenario file" in err


def test_a_dry_run_with_no_resume_counts_the_done_runs_as_the_real_run_runs_them(tmp_path, capsys):
    """Found by a newcomer: `--dry-run --no-resume` said "0 to run" over a finished ledger, then the real
    `--no-resume` ran every run again."""
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])
    argv = ["run", SCENARIO_FILE, "--model", f"replay:{tmp_path / 'done.jsonl'}", *RUN_FLAGS, "--repeats", "2",
            "--ledger", tmp_path / "ledger.sqlite"]  # fmt: skip
    assert cli(capsys, *argv)[0] == 0
    rc, out, _ = cli(capsys, *argv, "--dry-run")
    assert rc == 0 and out.strip().endswith("2 runs planned, 2 already done, 0 to run."), out
    rc, out, _ = cli(capsys, *argv, "--dry-run", "--no-resume")
    assert rc == 0 and out.count("(done; runs again)") == 2, out
    assert out.strip().endswith("2 runs planned, 2 already done (run again: --no-resume), 2 to run."), out
    rc, out, _ = cli(capsys, *argv, "--no-resume")
    with Ledger(tmp_path / "ledger.sqlite", readonly=True) as ledger:
        assert rc == 0 and len(ledger.runs()) == 4  # the real run did what the dry run said


def test_a_dry_run_numbers_the_runs_as_the_real_run_does_and_says_how_they_execute(tmp_path, capsys):
    """Newcomer finding: the dry run numbered every planned run [i/9] and the real run only those it does [i/7], so the
    two lists did not line up; and the dry run said nothing of --executor or --workers."""
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])
    argv = ["run", SCENARIO_FILE, "--model", f"replay:{tmp_path / 'done.jsonl'}", *RUN_FLAGS,
            "--ledger", tmp_path / "ledger.sqlite"]  # fmt: skip
    assert cli(capsys, *argv, "--repeats", "2")[0] == 0
    rc, dry, _ = cli(capsys, *argv, "--repeats", "5", "--dry-run", "--jobs", "3", "--executor", "processes", "--workers", "8")
    lines = dry.strip().splitlines()
    assert rc == 0 and [line.split("]")[0] + "]" for line in lines[:5]] == ["[done]", "[done]", "[1/3]", "[2/3]", "[3/3]"], dry
    # as many worker processes as start: no more than the 3 runs to do
    assert lines[5:] == ["Execution: up to 3 runs at a time (--jobs 3), in 3 worker processes (--executor processes, --workers 8).",
                         "5 runs planned, 2 already done, 3 to run."], dry  # fmt: skip
    rc, dry, _ = cli(capsys, *argv, "--repeats", "5", "--dry-run")
    threads = "Execution: one run at a time (--jobs 1), on threads of one process (--executor threads)."
    assert rc == 0 and dry.strip().splitlines()[5] == threads, dry
    rc, out, _ = cli(capsys, *argv, "--repeats", "5")
    real = [line for line in out.splitlines() if line.startswith("[")]
    assert rc == 0 and [line.split("]")[0] + "]" for line in real] == ["[1/3]", "[2/3]", "[3/3]"], out
    # the same runs under the same numbers at --jobs 1: the labels before " -> " equal the dry run's lines
    assert [line.split(" -> ")[0] for line in real] == lines[2:5], (dry, out)
    rc, dry, _ = cli(capsys, *argv, "--repeats", "5", "--dry-run", "--executor", "processes")  # nothing left to run: no such line
    assert rc == 0 and "Execution:" not in dry and dry.strip().endswith("5 runs planned, 5 already done, 0 to run."), dry


def test_the_dry_runs_execution_line_counts_models_side_by_side_and_replicas(tmp_path, capsys):
    """Red team: two --model specs at --jobs 1 ran two runs at once while the dry run said "one at a time per model
    server"; each spec, and each replica, gets its own --jobs."""
    write_cassette(tmp_path / "a.jsonl", [text_line("done")])
    write_cassette(tmp_path / "b.jsonl", [text_line("done")])
    argv = ["run", SCENARIO_FILE, "--model", f"replay:{tmp_path / 'a.jsonl'}", "--model", f"replay:{tmp_path / 'b.jsonl'}",
            *RUN_FLAGS, "--ledger", tmp_path / "ledger.sqlite", "--dry-run", "--repeats", "2"]  # fmt: skip
    rc, dry, _ = cli(capsys, *argv, "--jobs", "2", "--executor", "processes")
    assert rc == 0 and dry.strip().splitlines()[-2] == (
        "Execution: 2 models side by side, each up to 2 runs at a time (--jobs 2), in 2 worker processes "
        "(--executor processes, --workers: the CPU count)."
    ), dry
    with FakeAgentServer() as one, FakeAgentServer() as two:
        rc, dry, _ = cli(capsys, "run", SCENARIO_FILE, "--model", f"openai:m@{one.base_url},{two.base_url}", *RUN_FLAGS,
                         "--ledger", tmp_path / "ledger.sqlite", "--dry-run")  # fmt: skip
    assert rc == 0 and dry.strip().splitlines()[-2] == (
        "Execution: one run at a time per replica (--jobs 1), on threads of one process (--executor threads)."
    ), dry


def test_executor_ray_without_ray_is_refused_by_the_dry_run_too_and_leaves_no_ledger(tmp_path):
    """Red team: where Ray could not be imported, `--dry-run --executor ray` said "in 2 Ray actors per model" and exited
    0 while the real run exited 2, leaving an empty new ledger behind."""
    shadow = tmp_path / "shadow" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named ray (simulated)')\n", encoding="utf-8")
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), str(REPO)])}
    argv = [sys.executable, "-m", "harness", "run", str(SCENARIO_FILE), "--model", f"replay:{tmp_path / 'done.jsonl'}",
            *RUN_FLAGS, "--ledger", str(tmp_path / "ledger.sqlite"), "--executor", "ray"]  # fmt: skip
    for extra in (["--dry-run"], []):
        done = subprocess.run([*argv, *extra], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
        assert done.stderr.strip() == (
            "harness: --executor ray needs Ray (No module named ray (simulated)): pip install 'agent-loop-harness[ray]'."
        ), done.stderr
    assert not (tmp_path / "ledger.sqlite").exists()


def test_output_that_cannot_be_written_or_encoded_is_one_sentence_never_a_traceback(tmp_path):
    """Red team: `harness ... > /dev/full` (a full disk) and a console encoding without a model name's characters
    (PYTHONIOENCODING=ascii: tests/test_cli_output.py) each ended in a traceback; then (review) a buffered stdout
    failed only at the interpreter's exit ("Exception ignored", exit 120). Buffered here, as for users (this machine
    sets PYTHONUNBUFFERED)."""
    cassette = write_cassette(tmp_path / "caf\u00e9.jsonl", [text_line("done")])
    ledger = tmp_path / "ledger.sqlite"
    argv = [sys.executable, "-m", "harness", "run", str(SCENARIO_FILE), "--model", f"replay:{cassette}", *RUN_FLAGS,
            "--ledger", str(ledger), "--repeats", "3"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {"PYTHONPATH": str(REPO)}
    full = ("the output could not be written (No space left on device); nothing recorded in the ledger is lost; write the "
            "output somewhere with room (another disk, or a pipe).")  # fmt: skip
    with open("/dev/full", "w") as sink:
        for extra in (["--dry-run"], [], ["--help"]):
            done = subprocess.run([*argv, *extra], stdout=sink, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
            assert done.returncode == 1 and "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
            assert done.stderr.strip().splitlines()[-1] == f"harness: {full}", done.stderr
        verify = [sys.executable, "-m", "harness", "ledger", "verify", "--ledger", str(ledger)]
        done = subprocess.run(verify, stdout=sink, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
        assert done.returncode == 1 and done.stderr.strip() == f"harness: {full}", done.stderr
    with Ledger(ledger, readonly=True) as opened:  # the real run stopped at its first line: what ran is there
        assert opened.verify().ok and opened.runs() and all(run.outcome is not None for run in opened.runs())


def test_a_dry_run_with_executor_ray_names_its_actors(tmp_path, capsys):
    pytest.importorskip(
        "ray", reason="needs the [ray] extra; without it --executor ray is refused (test_executor_ray_without_ray_...)"
    )
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])
    rc, dry, _ = cli(capsys, "run", SCENARIO_FILE, "--model", f"replay:{tmp_path / 'done.jsonl'}", *RUN_FLAGS,
                     "--ledger", tmp_path / "ledger.sqlite", "--dry-run", "--executor", "ray")  # fmt: skip
    ray = "Execution: one run at a time (--jobs 1), in 2 Ray actors per model (--executor ray, --workers: the default)."
    assert rc == 0 and dry.strip().splitlines()[-2] == ray, dry


def test_a_resumed_runs_summary_says_how_many_runs_were_done_before_and_where_to_see_them_all(tmp_path, capsys):
    """Newcomer finding: after a resumed run the table counted only this command's runs, with no word about the others."""
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])
    ledger = tmp_path / "ledger.sqlite"
    argv = ["run", SCENARIO_FILE, "--model", f"replay:{tmp_path / 'done.jsonl'}", *RUN_FLAGS, "--ledger", ledger]
    rc, first, _ = cli(capsys, *argv, "--repeats", "2")
    assert rc == 0 and "done before" not in first, first
    rc, out, _ = cli(capsys, *argv, "--repeats", "5")
    lines = out.splitlines()
    under = lines[max(i for i, line in enumerate(lines) if line.startswith("|")) + 1]  # the line under the table
    assert rc == 0 and under == (f"This table counts only this command's 3 runs; 2 runs of the matrix done before are in "
                                 f"the ledger too: `harness report --ledger {ledger}` counts them all."), out  # fmt: skip
    rc, dry, _ = cli(capsys, *argv, "--repeats", "5", "--dry-run")
    assert rc == 0 and dry.strip().endswith("5 runs planned, 5 already done, 0 to run."), dry  # machine-read: unchanged


def test_the_run_line_of_an_unfinished_run_does_not_judge_its_checks(scenario, tmp_path):
    """Newcomer (stop 28): an interrupted run's line said "failed checks: ..." as if the model had missed the task."""
    from harness.console import format_run_line
    from harness.loop import RunPlan, RunSummary

    checks = [{"check": "file_exists", "passed": False, "detail": "report.txt is missing"},
              {"check": "names_files", "passed": True, "detail": ""}]  # fmt: skip
    plan = RunPlan(scenario, "openai:m@http://127.0.0.1:9/v1", 0.0, tool_mode="native")
    for outcome, said in (("task_failed", "; failed checks: file_exists;"),
                          ("interrupted", "; checks not judged (the run did not finish): file_exists;"),
                          ("infra_error", "; checks not judged (the run did not finish): file_exists;")):  # fmt: skip
        line = format_run_line(1, 1, RunSummary("ab" * 16, plan, outcome, 1, 10, [], checks, tmp_path))  # type: ignore[arg-type]
        assert said in line, line


# red-team finding: `--max-attempts 0` (or `--jobs 0`) said "--jobs and --embedded-slots must be from 1 to 256 and
# --max-attempts from 1 to 100.", not which option was wrong
@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--max-attempts", "0"], "--max-attempts must be from 1 to 100, not 0."),
        (["--jobs", "0"], "--jobs must be from 1 to 256, not 0."),
        (["--embedded-slots", "257"], "--embedded-slots must be from 1 to 256, not 257."),
        (["--max-attempts", "101", "--jobs", "0"], "--jobs must be from 1 to 256, not 0."),
    ],
)
def test_a_count_out_of_range_names_only_its_option(tmp_path, capsys, flags, said):
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", "replay:x.jsonl", *flags, "--ledger", tmp_path / "l.sqlite")
    assert (rc, err) == (2, f"harness: {said}\n") and not (tmp_path / "l.sqlite").exists()
