"""Matrix execution at scale: concurrency, resume after SIGKILL, Ctrl-C, retries of flaky servers, cache.

Also holds the red-team regression tests for the runner: every started run ends with an outcome,
and a matrix runs each planned identity once (two matrices on one ledger, a scenario given twice).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from harness.backends import open_backend
from harness.cli import main
from harness.console import summary_rows
from harness.ledger import Ledger
from harness.loop import RetryPolicy, RunOptions
from harness.matrix import MatrixOverrides
from harness.report import load_frames, summary_table
from harness.runner import expand_matrix, plan_matrix, run_matrix
from harness.scenarios import load_scenario
from harness.vocab import OUTCOMES
from tests.backend_fakes import closed_port
from tests.fake_agent_server import FakeAgentServer
from tests.helpers import IDEAL, REPO, RUN_FLAGS, SCENARIO_FILE, ledger_counts, write_cassette

SCENARIO = SCENARIO_FILE
FAST_RETRY = RetryPolicy(max_attempts=5, base_delay_s=0.01)


def plans_for(model: str, *, repeats: int, temperatures=(0.0,), tool_mode="native"):
    return expand_matrix(
        [load_scenario(SCENARIO)], MatrixOverrides([model], list(temperatures), repeats, None, [tool_mode], None)
    )


def test_expand_matrix_order_and_overrides():
    scenario = load_scenario(SCENARIO)
    plans = expand_matrix(
        [scenario], MatrixOverrides(["replay:a.jsonl", "replay:b.jsonl"], [0.0, 1.0], 2, [7], None, ["strict", "lenient"])
    )
    assert len(plans) == 2 * 2 * 2 * 2
    first = plans[0]
    assert (first.model, first.tool_mode, first.parser, first.temperature, first.seed, first.repetition) == (
        "replay:a.jsonl",
        "prompt",
        "strict",
        0.0,
        7,
        0,
    )
    assert plans[1].repetition == 1 and plans[1].options().seed == 8
    assert len({p.identity("d") for p in plans}) == len(plans)  # every planned run has its own identity
    assert plans[0].identity("d") == dataclasses.replace(plans[0]).identity("d")  # deterministic
    assert plans[0].identity("d") != plans[0].identity("other-digest")


def test_concurrent_replay_runs_are_independent(tmp_path):
    cassette = write_cassette(tmp_path / "ideal.jsonl", IDEAL)
    plans = plans_for(f"replay:{cassette}", repeats=8)
    with Ledger(tmp_path / "l.sqlite") as ledger:
        result = run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs", jobs=4))
        assert [s.outcome for s in result.summaries] == ["pass"] * 8
        assert len({s.run_id for s in result.summaries}) == 8
        assert ledger.verify().ok
        again = run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs", jobs=4))
        assert again.summaries == [] and again.already_done == 8
        assert all(run.start.config and run.start.config["jobs"] == 4 for run in ledger.runs())


def test_flaky_server_retries_and_infra_errors_stay_out_of_failure_rates(tmp_path):
    faults = {1: "drop", 2: "500", 3: "429", 4: "slow", **{n: "500" for n in range(8, 13)}}
    with FakeAgentServer(slots=4, faults=faults.get, slow_s=3) as server:
        plans = plans_for(f"openai:ideal@{server.base_url}", repeats=3)
        factory = functools.partial(open_backend, timeout_s=0.5)
        with Ledger(tmp_path / "l.sqlite") as ledger:
            result = run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs", retry=FAST_RETRY), backend_factory=factory)
            attempts = ledger.attempts()
            assert ledger.verify().ok
    assert [s.outcome for s in result.summaries] == ["pass", "infra_error", "pass"]
    first, second = result.summaries[0].run_id, result.summaries[1].run_id
    assert [(a.attempt, a.error_type, a.status_code) for a in attempts if a.run_id == first] == [
        (1, "BackendUnavailable", None),
        (2, "BackendResponseError", 500),
        (3, "BackendResponseError", 429),
        (4, "BackendTimeout", None),
    ]
    assert [a.retry_in_ms for a in attempts if a.run_id == first][2] == 1000.0  # Retry-After: 1 honoured
    assert [a.attempt for a in attempts if a.run_id == second] == [1, 2, 3, 4, 5]
    [row] = summary_rows(result.summaries)
    assert (row["runs"], row["pass"], row["infra_error"], row["pass_rate"]) == (3, 2, 1, 1.0)


def test_dead_server_skips_its_runs_with_one_message(tmp_path):
    plans = plans_for(f"openai:m@http://127.0.0.1:{closed_port()}/v1", repeats=3)
    with Ledger(tmp_path / "l.sqlite") as ledger:
        result = run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs"))
        assert ledger.runs() == []
    [(model, reason, count)] = result.skipped
    assert count == 3 and "not reachable" in reason


def test_cache_reuses_recorded_replies_of_the_same_identity(tmp_path):
    with FakeAgentServer(faults=lambda n: "500" if n >= 2 else None) as broken:
        port_url = broken.base_url
        plans = plans_for(f"openai:ideal@{port_url}", repeats=1)
        with Ledger(tmp_path / "l.sqlite") as ledger:
            first = run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs", retry=RetryPolicy(max_attempts=1)))
    assert first.summaries[0].outcome == "infra_error"
    # same URL again (same identity), now healthy: turn 1 comes from the cache
    host_port = port_url.removeprefix("http://127.0.0.1:").removesuffix("/v1")
    with FakeAgentServer() as healthy:
        healthy_spec = f"openai:ideal@{healthy.base_url}"
        plans = [dataclasses.replace(p, model=healthy_spec) for p in plans]
        with Ledger(tmp_path / "l2.sqlite") as ledger:
            run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs"))
            second = run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs", use_cache=True), resume=False)
            turns = ledger.turns(second.summaries[0].run_id)
        assert healthy.requests == 3  # the second run was served entirely from the cache
    assert host_port and second.summaries[0].outcome == "pass"
    assert all(t.record.details.get("cache_hit") for t in turns)


def _harness(*args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "harness", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, **kwargs)  # fmt: skip


def _finished_runs(ledger_path) -> int:
    try:
        db = sqlite3.connect(f"file:{ledger_path}?mode=ro", uri=True)
        try:
            return db.execute("SELECT COUNT(*) FROM run_ends").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        return 0


def _wait_for_runs(ledger_path, n: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while _finished_runs(ledger_path) < n:
        assert time.monotonic() < deadline, "the matrix did not progress"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("sig", "executor", "delay_s"),
    [(signal.SIGKILL, "threads", 0.05), (signal.SIGINT, "threads", 0.05), (signal.SIGKILL, "processes", 0.05),
     (signal.SIGKILL, "threads", 0.02), (signal.SIGINT, "threads", 0.02)],  # 0.02: quick turns, deferred (GROUP_COMMIT_S)
)  # fmt: skip
def test_killed_matrix_resumes_to_exactly_the_planned_set(tmp_path, sig, executor, delay_s):
    ledger_path = tmp_path / "ledger.sqlite"
    with FakeAgentServer(delay_s=delay_s, slots=2) as server:
        args = [str(SCENARIO), "--model", f"openai:ideal@{server.base_url}", "--tool-mode", "native", "--repeats", "10",
                "--temperature", "0", "--temperature", "0.5", "--jobs", "2", "--ledger", str(ledger_path),
                "--executor", executor]  # fmt: skip
        proc = _harness("run", *args)
        _wait_for_runs(ledger_path, 4)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        if sig == signal.SIGINT:
            assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err
            head_at_stop = out.strip().splitlines()[-1]  # the head still ends the output, as after a whole matrix
            assert head_at_stop.startswith("Ledger head")
        with Ledger(ledger_path, readonly=True) as ledger:
            runs = ledger.runs()
            assert ledger.verify().ok
            if sig == signal.SIGINT:
                assert head_at_stop.endswith(ledger.head().anchor)
            turn_rows = Counter(turn.record.run_id for turn in ledger.turns())
        # an ended run has every turn its end row counts (the processes executor's turns are not waited for)
        assert all(turn_rows[r.run_id] == r.end.turns for r in runs if r.end is not None)
        assert 4 <= len([r for r in runs if r.outcome in ("pass",)]) < 20
        if sig == signal.SIGINT:  # every run that started has an end row
            assert all(r.outcome is not None for r in runs)
        again = _harness("run", *args)
        out, err = again.communicate(timeout=120)
        assert again.returncode == 0, err
        dry = _harness("run", "--dry-run", *args)
        out, err = dry.communicate(timeout=60)
        with Ledger(ledger_path) as ledger:
            finished = ledger.finished_identities()
            assert ledger.verify().ok
            plans = plan_matrix(plans_for(f"openai:ideal@{server.base_url}", repeats=10, temperatures=(0.0, 0.5)), ledger)
    assert out.strip().endswith("20 runs planned, 20 already done, 0 to run.")
    assert set(finished) == {p.identity for p in plans.planned} and len(finished) == 20
    assert set(finished.values()) == {1}  # no identity finished twice


def test_a_run_in_flight_when_stopped_records_its_reply_and_ends_interrupted(tmp_path):
    import threading

    stop = threading.Event()

    def stop_at_first_call(number: int) -> None:  # the server is answering the first model call (not the warm-up)
        if number == 1:
            stop.set()

    with FakeAgentServer(delay_s=0.6, faults=stop_at_first_call) as server:
        plans = plans_for(f"openai:ideal@{server.base_url}", repeats=3)
        with Ledger(tmp_path / "l.sqlite") as ledger:
            result = run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs", stop=stop))
            [run] = ledger.runs()
            assert ledger.verify().ok
    assert [(s.outcome, s.turns) for s in result.summaries] == [("interrupted", 1)]
    assert (run.outcome, run.end.turns) == ("interrupted", 1)  # the other two runs never started


@pytest.mark.parametrize(("env", "warned", "parallel"), [(None, True, 1), ("2", True, 2), ("4", False, 4), ("junk", True, 1)])
def test_ollama_parallelism_is_warned_about_and_recorded(tmp_path, monkeypatch, env, warned, parallel):
    from tests.backend_fakes import FakeServer, json_reply

    if env is None:
        monkeypatch.delenv("OLLAMA_NUM_PARALLEL", raising=False)
    else:
        monkeypatch.setenv("OLLAMA_NUM_PARALLEL", env)
    from tests.server_fakes import ollama_chat, ollama_show, ollama_tags

    replies = [{"content": "Done.", "prompt_eval_count": 10, "eval_count": 2}] * 2
    routes = {("GET", "/api/version"): json_reply(200, {"version": "0.6.2"}),
              ("POST", "/api/show"): ollama_show(["completion", "tools"]),
              ("GET", "/api/tags"): ollama_tags({"m:latest": "abc123"}),
              ("POST", "/api/chat"): ollama_chat(replies, model="m")}  # fmt: skip
    with FakeServer(routes) as server:
        plans = plans_for(f"ollama:m@{server.url}", repeats=2)
        with Ledger(tmp_path / "l.sqlite") as ledger:
            result = run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs", jobs=4))
            configs = [r.start.config for r in ledger.runs()]
    assert bool(result.warnings) == warned
    assert [s.outcome for s in result.summaries] == ["task_failed"] * 2
    assert {(c["jobs"], c["endpoint_parallel"]) for c in configs} == {(4, parallel)}
    assert all(run.plan.model.startswith("ollama:") for run in result.summaries)


@pytest.mark.parametrize("executor", [[], ["--executor", "processes", "--workers", "2"]], ids=["threads", "processes"])
@pytest.mark.parametrize("output", ["pipe", "full"])
def test_a_second_ctrl_c_quits_at_once_and_still_ends_the_runs_in_flight(tmp_path, executor, output):
    """``full``: stdout on a full disk, buffered as for users (review: printing the head after the second Ctrl-C raised,
    so the process waited for the model calls in flight, 36 s, instead of quitting)."""
    ledger_path = tmp_path / "ledger.sqlite"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {"PYTHONPATH": str(REPO)}
    with FakeAgentServer(delay_s=20, slots=2) as server, open("/dev/full", "w") as full:  # every call would take 20 s
        argv = [sys.executable, "-m", "harness", "run", str(SCENARIO), "--model", f"openai:slow@{server.base_url}",
                "--tool-mode", "native", "--repeats", "2", "--temperature", "0", "--jobs", "2", "--ledger", str(ledger_path),
                *executor]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=full if output == "full" else subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)  # fmt: skip
        deadline = time.monotonic() + 60
        while server.requests < 2:  # both runs are waiting on their first reply
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
        assert time.monotonic() - started < 10  # did not wait for the 20 s replies
    assert proc.returncode == 130 and "2 runs in flight recorded as interrupted" in err and "Traceback" not in err, err
    with Ledger(ledger_path, readonly=True) as ledger:
        runs = ledger.runs()
        assert ledger.verify().ok
        anchor = ledger.head().anchor
    assert [(r.outcome, r.end.turns) for r in runs] == [("interrupted", 0), ("interrupted", 0)]
    # the head ends the output, as after a first Ctrl-C or a whole matrix (found: a second Ctrl-C printed none)
    if output == "pipe":
        assert out.strip().splitlines()[-1] == f"Ledger head (check later with `harness ledger verify --anchor`): {anchor}", out


# -- red-team: every started run ends, each planned identity runs once -------------------------------------
# red-team finding: a backend bug left runs without an end row
def test_a_backend_bug_leaves_no_run_without_an_end_row(tmp_path):
    """A backend raising something other than BackendError inside generate (a bug in a backend,
    an unexpected body shape, a KeyError in a client library) escapes run_once: that run never
    gets an end row (it stays 'unfinished' forever) and every other run in flight is recorded as
    'interrupted by the user', which the user did not do. The CLI then prints a traceback."""
    cassette = write_cassette(tmp_path / "c.jsonl", IDEAL)
    calls = {"n": 0}
    lock = threading.Lock()

    class Buggy:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def for_run(self):
            return Buggy(self.inner.for_run())

        def generate(self, *args, **kwargs):
            with lock:
                calls["n"] += 1
                n = calls["n"]
            if n == 2:
                raise KeyError("choices")  # a bug, not a BackendError
            time.sleep(0.3)
            return self.inner.generate(*args, **kwargs)

    def factory(spec, **kw):
        return Buggy(open_backend(spec, **kw))

    with Ledger(tmp_path / "l.sqlite") as ledger:
        try:
            run_matrix(
                plans_for(f"replay:{cassette}", repeats=4),
                ledger,
                RunOptions(runs_dir=tmp_path / "runs", jobs=2),
                backend_factory=factory,
            )
        except Exception:
            pass  # raising is acceptable; what the ledger says is not
        runs = ledger.runs()
    assert runs, "no run was recorded at all"
    assert [r.run_id for r in runs if r.outcome is None] == []
    assert not any(r.end.error == "interrupted by the user" for r in runs)


# red-team finding: two matrices on one ledger ran every identity twice
def test_two_matrices_on_one_ledger_do_not_run_each_identity_twice(tmp_path):
    """Two `harness run` processes started on one ledger (two terminals, a CI retry) both read the
    finished identities before either starts a run, so every planned run is executed twice; the
    report then counts the copies as independent samples (n = 8 for 4 planned runs). README:
    'completes exactly the planned set'. Threads with their own Ledger connection stand in for
    the two processes; the barrier makes the race deterministic."""
    cassette = write_cassette(tmp_path / "c.jsonl", IDEAL)
    plans = plans_for(f"replay:{cassette}", repeats=4)
    barrier = threading.Barrier(2)

    def factory(spec, **kw):
        barrier.wait(10)  # both matrices have planned before either runs
        return open_backend(spec, **kw)

    Ledger(tmp_path / "l.sqlite").close()

    def one_matrix():
        with Ledger(tmp_path / "l.sqlite") as ledger:
            run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs", jobs=2), backend_factory=factory)

    threads = [threading.Thread(target=one_matrix) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    with Ledger(tmp_path / "l.sqlite") as ledger:
        per_identity = ledger.finished_identities()
    assert sorted(per_identity.values()) == [1, 1, 1, 1]


# red-team finding: a scenario given twice ran twice
def test_the_same_scenario_given_twice_runs_once(tmp_path, capsys):
    """`harness run s.toml ./s.toml` (or a shell glob that matches a file twice) plans every run
    twice with the same identity, and both copies run: the ledger holds duplicates."""
    cassette = write_cassette(tmp_path / "c.jsonl", IDEAL)
    scenario = tmp_path / "s.toml"
    scenario.write_bytes(SCENARIO_FILE.read_bytes())
    main(["run", "s.toml", "./s.toml", "--model", f"replay:{cassette}", "--repeats", "2", *RUN_FLAGS])
    with Ledger(tmp_path / "results" / "ledger.sqlite") as ledger:
        runs = ledger.runs()
    assert len(runs) == len({r.start.identity for r in runs}) == 2


# red-team finding: cached turns recorded 0 ms latency
def test_cached_replies_do_not_count_as_zero_millisecond_latency(tmp_path, capsys):
    """`--cache --no-resume` re-runs a matrix from recorded replies and stores each cached turn
    with latency_ms = 0.0; the report's per-turn latency p50 then drops to 0 ms although every real
    request took ~50 ms. A cache hit has no latency: it should be NULL (or left out of the
    percentiles), like any other measurement that was not taken."""
    scenario = tmp_path / "s.toml"
    scenario.write_bytes(SCENARIO_FILE.read_bytes())
    with FakeAgentServer(delay_s=0.05) as server:
        argv = ["run", "s.toml", "--model", f"openai:ideal@{server.base_url}", "--repeats", "1", *RUN_FLAGS]
        assert main(argv) == 0
        assert main([*argv, "--cache", "--no-resume"]) == 0
        assert main([*argv, "--cache", "--no-resume"]) == 0
    [row] = summary_table(load_frames(tmp_path / "results" / "ledger.sqlite")).to_dict("records")
    assert row["latency_p50_ms"] >= 40, row


def test_guard_sixteen_jobs_on_a_replay_model(tmp_path):
    cassette = write_cassette(tmp_path / "c.jsonl", IDEAL)
    with Ledger(tmp_path / "l.sqlite") as ledger:
        result = run_matrix(plans_for(f"replay:{cassette}", repeats=48), ledger, RunOptions(runs_dir=tmp_path / "runs", jobs=16, record_dir=tmp_path / "rec"))  # fmt: skip
        assert [s.outcome for s in result.summaries] == ["pass"] * 48
        assert ledger.verify().ok
        assert sorted(ledger.finished_identities().values()) == [1] * 48
    assert len(list((tmp_path / "rec").glob("*.jsonl"))) == 48


def test_guard_server_faults_mid_matrix_end_as_outcomes(tmp_path, scenario):
    faults = {2: "drop", 3: "500", 5: "garbage", 7: "429"}
    with FakeAgentServer(faults=faults.get, slots=4) as server:
        plans = expand_matrix([scenario], MatrixOverrides(models=[f"openai:m@{server.base_url}"], repeats=4,
                                                          temperatures=[0.0], tool_modes=["native"]))  # fmt: skip
        with Ledger(tmp_path / "ledger.sqlite") as ledger:
            result = run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs", jobs=4, retry=RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)))  # fmt: skip
            assert len(result.summaries) == 4 and all(s.outcome in OUTCOMES for s in result.summaries)
            assert ledger_counts(ledger)["run_ends"] == 4
            assert ledger.verify().ok
