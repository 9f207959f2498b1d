"""Replicas of one model (README, "Running on a cluster" / "Replicas"): a spec listing several URLs, runs spread over
real HTTP servers on 127.0.0.1, digests checked at planning, a failing replica taken out of rotation."""

from __future__ import annotations

import functools
import json
import threading
from collections import Counter

import pytest

import harness.backends as backends
from harness.backends import open_backend, parse_model_spec, replica_specs
from harness.errors import UsageError
from harness.ledger import Ledger
from harness.loop import RetryPolicy, RunOptions
from harness.matrix import MatrixOverrides
from harness.replicas import Rotation
from harness.runner import MatrixEvents, expand_matrix, plan_matrix, run_matrix
from harness.scenarios import load_scenario
from tests.backend_fakes import FakeServer, closed_port, json_reply
from tests.fake_agent_server import FakeAgentServer
from tests.helpers import REPORT, RUN_FLAGS, SCENARIO_FILE, assert_one_sentence_error, cli
from tests.server_fakes import ollama_chat, ollama_show, ollama_tags

FAST_RETRY = RetryPolicy(max_attempts=5, base_delay_s=0.01, max_delay_s=0.05)
OLLAMA_MODEL = "qwen3:0.6b"


def plans_for(model: str, repeats: int):
    return expand_matrix([load_scenario(SCENARIO_FILE)], MatrixOverrides([model], [0.0], repeats, None, ["native"], ["lenient"]))


def run(tmp_path, model: str, repeats: int, *, jobs: int = 1, events: MatrixEvents | None = None, ledger_name="l.sqlite"):
    factory = functools.partial(open_backend, timeout_s=5)
    with Ledger(tmp_path / ledger_name) as ledger:
        result = run_matrix(plans_for(model, repeats), ledger, RunOptions(runs_dir=tmp_path / "runs", jobs=jobs, retry=FAST_RETRY),
                            events=events, backend_factory=factory)  # fmt: skip
        runs, attempts = ledger.runs(), ledger.attempts()
        assert ledger.verify().ok
    return result, runs, attempts


# -- the spec ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "replicas", "parsed"),
    [
        ("openai:m@http://gpu1:8000/v1,http://gpu2:8000/v1", ["openai:m@http://gpu1:8000/v1", "openai:m@http://gpu2:8000/v1"],
         ("openai", "m", "http://gpu1:8000/v1")),
        ("openai:m@gpu1/v1, gpu2/v1", ["openai:m@gpu1/v1", "openai:m@gpu2/v1"], ("openai", "m", "http://gpu1/v1")),
        ("ollama:qwen3:0.6b@h1,h2:1", ["ollama:qwen3:0.6b@h1", "ollama:qwen3:0.6b@h2:1"], ("ollama", "qwen3:0.6b", "http://h1:11434")),
        ("ollama:qwen3:0.6b@h1", ["ollama:qwen3:0.6b@h1"], ("ollama", "qwen3:0.6b", "http://h1:11434")),
        ("ollama:qwen3:0.6b", ["ollama:qwen3:0.6b"], ("ollama", "qwen3:0.6b", None)),
        ("embedded:/models/a,b.gguf", ["embedded:/models/a,b.gguf"], ("embedded", "/models/a,b.gguf", None)),
    ],
)  # fmt: skip
def test_a_spec_lists_replicas_after_the_at(spec, replicas, parsed):
    assert replica_specs(spec) == replicas
    assert parse_model_spec(spec) == parsed


@pytest.mark.parametrize("spec", ["openai:m@http://a/v1,", "openai:m@,http://a/v1", "openai:m@http://a/v1,,http://b/v1",
                                  "ollama:m@h1,ftp://h2"])  # fmt: skip
def test_a_malformed_replica_list_is_a_usage_error(spec):
    with pytest.raises(UsageError) as info:
        replica_specs(spec)
    assert str(info.value) == f"Model spec {spec!r} is not valid; use {backends.SPEC_FORMS}."


def test_a_replica_listed_twice_is_refused():
    with pytest.raises(UsageError, match=r"lists the replica http://a:1/v1 twice; name each server once\.$"):
        replica_specs("openai:m@http://a:1/v1,a:1/v1/")
    with pytest.raises(UsageError, match="several replicas"):
        open_backend("openai:m@http://a:1/v1,http://b:1/v1")


def test_a_replica_list_names_the_model_by_its_first_url():
    [alone] = plans_for("openai:m@http://a:1/v1", 1)
    [listed] = plans_for("openai:m@http://a:1/v1,http://b:1/v1", 1)
    [swapped] = plans_for("openai:m@http://b:1/v1,http://a:1/v1", 1)
    assert listed.named_model == alone.model == "openai:m@http://a:1/v1"
    assert listed.identity("sha256:d") == alone.identity("sha256:d")  # adding replicas keeps the identities
    assert swapped.identity("sha256:d") != alone.identity("sha256:d")  # the first URL names the model


# -- rotation ------------------------------------------------------------------------------------------------------
def test_rotation_spreads_runs_and_keeps_a_failed_replica_out_for_a_doubling_cooldown():
    now = [100.0]
    rotation = Rotation(2, cooldown_s=30, max_cooldown_s=100, clock=lambda: now[0])
    assert [rotation.take(), rotation.take(), rotation.take()] == [0, 1, 0]
    assert rotation.in_flight() == [2, 1]
    rotation.failed(0)
    assert not rotation.in_rotation(0) and rotation.move(0) == 1 and rotation.in_flight() == [1, 2]
    rotation.failed(0)  # the same outage: a run still on it fails too; the cooldown does not grow
    now[0] = 129.9
    assert rotation.take() == 1
    now[0] = 130.0
    assert rotation.in_rotation(0) and rotation.take() == 0  # back, and the least loaded
    rotation.failed(0)  # failed again after coming back: 60 s
    now[0] = 189.9
    assert not rotation.in_rotation(0)
    now[0] = 190.0
    rotation.failed(0)  # and again: 100 s (the cap), not 120
    now[0] = 289.9
    assert not rotation.in_rotation(0)
    now[0] = 290.0
    rotation.answered(0)  # a reply resets the doubling
    rotation.failed(0)
    now[0] = 320.0
    assert rotation.in_rotation(0)


def test_rotation_with_every_replica_out_sends_a_run_to_the_one_back_soonest():
    now = [0.0]
    rotation = Rotation(3, cooldown_s=30, clock=lambda: now[0])
    rotation.failed(1)
    now[0] = 5.0
    rotation.failed(0)
    rotation.failed(2)
    assert rotation.take() == 1
    assert rotation.move(1) == 1  # no other replica is in rotation: the run stays
    rotation.release(1)
    assert rotation.in_flight() == [0, 0, 0]


def test_a_new_run_waits_for_a_place_while_a_replica_is_out():
    rotation = Rotation(2, limit=1, cooldown_s=0.3)
    assert [rotation.take(), rotation.take()] == [0, 1]
    rotation.failed(1)
    assert rotation.move(1) == 0 and rotation.in_flight() == [2, 0]  # a moved run goes past the limit
    taken: list[int] = []
    waiter = threading.Thread(target=lambda: taken.append(rotation.take()))
    waiter.start()
    waiter.join(0.1)
    assert waiter.is_alive() and taken == []  # replica 0 is full, replica 1 out of rotation
    rotation.release(0)
    waiter.join(0.1)
    assert waiter.is_alive()  # 0 still holds one run: the limit is 1
    waiter.join(5)
    assert taken == [1]  # replica 1 came back after its cooldown
    assert rotation.in_flight() == [1, 1]
    rotation.failed(0)
    rotation.failed(1)  # every replica out: a new run does not wait 0.3 s for one
    assert rotation.take() == 0


# -- runs over real servers ----------------------------------------------------------------------------------------
def test_two_replicas_share_the_runs_each_run_on_one_of_them(tmp_path, capsys):
    with FakeAgentServer(delay_s=0.1, slots=4) as a, FakeAgentServer(delay_s=0.1, slots=4) as b:
        spec = f"openai:ideal@{a.base_url},{b.base_url}"
        result, runs, attempts = run(tmp_path, spec, 10, jobs=2)
        assert [s.outcome for s in result.summaries] == ["pass"] * 10 and attempts == []
        served = Counter(r.start.config["replica"] for r in runs)
        assert served[a.base_url] > 0 and served[b.base_url] > 0 and sum(served.values()) == 10
        # three requests a run: every turn of a run went to the replica it records
        assert (a.requests, b.requests) == (3 * served[a.base_url], 3 * served[b.base_url])
        assert max(a.max_in_flight, b.max_in_flight) == 2 >= min(a.max_in_flight, b.max_in_flight)  # --jobs per replica
        assert a.warmups == b.warmups == 1
    assert {r.start.model for r in runs} == {f"openai:ideal@{a.base_url}"}
    assert all(r.start.base_url == r.start.config["replica"] for r in runs)
    assert all(r.start.config["replicas"] == [a.base_url, b.base_url] for r in runs)
    assert [w for w in result.warnings if "unverified" in w] == [
        f"{spec}: replicas {a.base_url}, {b.base_url} report no model digest, so the replicas are checked by model name "
        "only (unverified); make sure they serve the same weights."
    ]
    rc, out, _ = cli(capsys, "export", "--runs", "--ledger", tmp_path / "l.sqlite")
    assert rc == 0
    assert Counter(json.loads(line)["base_url"] for line in out.splitlines()) == served


def test_a_matrix_started_on_one_url_resumes_with_replicas_added(tmp_path):
    with FakeAgentServer() as a, FakeAgentServer() as b:
        first, _, _ = run(tmp_path, f"openai:ideal@{a.base_url}", 2)
        again, runs, _ = run(tmp_path, f"openai:ideal@{a.base_url},{b.base_url}", 3)
        assert [s.outcome for s in first.summaries] == ["pass"] * 2
        assert again.already_done == 2 and [s.outcome for s in again.summaries] == ["pass"]
        assert {p.identity for p in first.planned} < {p.identity for p in again.planned}
        assert b.requests + a.requests == 9


def test_a_replica_down_at_planning_is_left_out(tmp_path):
    dead = f"http://127.0.0.1:{closed_port()}/v1"
    with FakeAgentServer() as a:
        spec = f"openai:ideal@{dead},{a.base_url}"
        result, runs, attempts = run(tmp_path, spec, 3, jobs=2)
    assert [s.outcome for s in result.summaries] == ["pass"] * 3 and attempts == []
    assert {r.start.config["replica"] for r in runs} == {a.base_url} and a.requests == 9
    assert {r.start.config["replicas"] == [a.base_url] for r in runs} == {True}
    [left_out] = [w for w in result.warnings if "left out" in w]
    assert left_out == (
        f"{spec}: replica {dead} is left out of this matrix and its runs go to the other one: The server "
        f"at {dead} is not reachable; start it, or check the URL in the model spec."
    )
    # named by its first URL even though that one is down: the identity never depends on who answers
    assert {r.start.model for r in runs} == {f"openai:ideal@{dead}"}


def test_a_model_whose_replicas_are_all_down_is_skipped(tmp_path):
    one, two = (f"http://127.0.0.1:{closed_port()}/v1" for _ in range(2))
    result, runs, _ = run(tmp_path, f"openai:ideal@{one},{two}", 2)
    assert runs == [] and result.summaries == []
    [(model, reason, count)] = result.skipped
    assert (model, count) == (f"openai:ideal@{one},{two}", 2) and one in reason


def test_a_replica_dying_mid_matrix_is_skipped_and_every_run_is_scored(tmp_path):
    dead = threading.Event()

    def die_after_first_run(number):  # three requests make a run; then the server goes away
        if number > 3 and not dead.is_set():
            dead.set()
            threading.Thread(target=b.close).start()
        return "drop" if dead.is_set() else None

    with FakeAgentServer() as a, FakeAgentServer(faults=die_after_first_run) as b:
        result, runs, attempts = run(tmp_path, f"openai:ideal@{a.base_url},{b.base_url}", 8)
    assert [s.outcome for s in result.summaries] == ["pass"] * 8
    assert dead.is_set() and attempts, "replica b served a run, then failed one"
    assert (a.requests, b.requests) == (3 * 8 - 3, 3 + 1)  # b: one whole run, then one request it dropped
    assert {t.error_type for t in attempts} == {"BackendUnavailable"} and all(b.base_url in t.error for t in attempts)
    moved = {t.run_id for t in attempts}
    assert all(r.start.config["replica"] == b.base_url for r in runs if r.run_id in moved)
    # out of rotation for 30 s: after the failure only replica a takes new runs
    first_failed = min(r.seq for r in runs if r.run_id in moved)
    assert {r.start.config["replica"] for r in runs if r.seq > first_failed} == {a.base_url}


def test_runs_end_infra_error_when_every_replica_fails(tmp_path):
    with FakeAgentServer(faults=lambda n: "drop") as a, FakeAgentServer(faults=lambda n: "drop") as b:
        result, runs, attempts = run(tmp_path, f"openai:ideal@{a.base_url},{b.base_url}", 2)
    assert [s.outcome for s in result.summaries] == ["infra_error"] * 2
    assert len(attempts) == 2 * FAST_RETRY.max_attempts
    assert {a.base_url, b.base_url} == {url for url in (a.base_url, b.base_url) if any(url in t.error for t in attempts)}


# -- digests (Ollama reports one) ----------------------------------------------------------------------------------
LIST_REPORT_REPLIES = [
    {"calls": [("list_files", {"path": "."})], "prompt_eval_count": 30, "eval_count": 5},
    {"calls": [("write_file", {"path": "report.txt", "content": REPORT})], "prompt_eval_count": 60, "eval_count": 9},
    {"content": "I wrote report.txt: 3 files.", "prompt_eval_count": 90, "eval_count": 8},
]


def ollama_server(digest: str) -> FakeServer:
    return FakeServer({
        ("GET", "/api/version"): json_reply(200, {"version": "0.33.0"}),
        ("GET", "/api/tags"): ollama_tags({OLLAMA_MODEL: digest}),
        ("POST", "/api/show"): ollama_show(["completion", "tools"]),
        ("POST", "/api/chat"): ollama_chat(LIST_REPORT_REPLIES, model=OLLAMA_MODEL),
    })  # fmt: skip


def test_ollama_replicas_with_one_digest_run_under_the_first_urls_identities(tmp_path):
    with ollama_server("a1" * 32) as a, ollama_server("a1" * 32) as b:
        spec = f"ollama:{OLLAMA_MODEL}@{a.url},{b.url}"
        with Ledger(tmp_path / "alone.sqlite") as ledger:
            alone = plan_matrix(plans_for(f"ollama:{OLLAMA_MODEL}@{a.url}", 2), ledger)
        result, runs, _ = run(tmp_path, spec, 2)  # two runs at once, one per replica (jobs 1)
        assert len(a.posts("/api/chat")) == len(b.posts("/api/chat")) == 1 + 3  # the warm-up and one run's turns
    assert [s.outcome for s in result.summaries] == ["pass", "pass"]
    assert result.warnings == []  # both reported their digest: verified
    assert [p.identity for p in result.planned] == [p.identity for p in alone.planned]
    assert {r.start.manifest_digest for r in runs} == {"sha256:" + "a1" * 32}
    assert sorted(r.start.config["replica"] for r in runs) == sorted([a.url, b.url])


def test_replicas_reporting_different_digests_are_refused(tmp_path, capsys):
    with ollama_server("a1" * 32) as a, ollama_server("b2" * 32) as b:
        spec = f"ollama:{OLLAMA_MODEL}@{a.url},{b.url}"
        with pytest.raises(UsageError) as info:
            plan_matrix(plans_for(spec, 1), None)
        assert str(info.value) == (
            f"The replicas {a.url} and {b.url} of {spec} serve different models (digest sha256:a1a1a1a1a1a1 against "
            "sha256:b2b2b2b2b2b2); list only servers of the same weights."
        )
        rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", spec, "--ledger", tmp_path / "l.sqlite", *RUN_FLAGS)
        assert_one_sentence_error(rc, err)
        assert a.posts("/api/chat") == b.posts("/api/chat") == []
    assert not (tmp_path / "l.sqlite").exists()


@pytest.mark.parametrize("executor", ["processes", "ray"])
def test_replicas_with_another_executor_are_refused_before_anything_runs(tmp_path, capsys, executor):
    with FakeAgentServer() as a, FakeAgentServer() as b:
        spec = f"openai:ideal@{a.base_url},{b.base_url}"
        rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", spec, "--executor", executor,
                         "--ledger", tmp_path / "l.sqlite", *RUN_FLAGS)  # fmt: skip
        assert_one_sentence_error(rc, err)
        assert "lists replicas, which run with --executor threads only" in err
        assert a.requests == b.requests == 0
    assert not (tmp_path / "l.sqlite").exists()


def test_dry_run_says_which_replicas_are_left_out_and_unverified(tmp_path, capsys):
    dead = f"http://127.0.0.1:{closed_port()}/v1"
    with FakeAgentServer() as a:
        spec = f"openai:ideal@{a.base_url},{dead}"
        rc, out, err = cli(
            capsys,
            "run",
            SCENARIO_FILE,
            "--model",
            spec,
            "--ledger",
            tmp_path / "l.sqlite",
            "--dry-run",
            "--repeats",
            1,
            *RUN_FLAGS,
        )
        assert a.requests == a.warmups == 0
    assert rc == 0 and out.endswith("1 run planned, 0 already done, 1 to run.\n")
    assert err.splitlines() == [
        f"harness: warning: {spec}: replica {dead} is left out of this matrix and its runs go to the other one: The server "
        f"at {dead} is not reachable; start it, or check the URL in the model spec.",
        f"harness: warning: {spec}: replica {a.base_url} reports no model digest, so the replicas are checked by model name "
        "only (unverified); make sure they serve the same weights.",
    ]


def test_run_matrix_refuses_replicas_with_another_executor_before_any_run(tmp_path):
    with FakeAgentServer() as a, FakeAgentServer() as b:
        plans = plans_for(f"openai:ideal@{a.base_url},{b.base_url}", 1)
        with pytest.raises(UsageError, match="lists replicas, which run with --executor threads only"):
            run_matrix(plans, lambda: Ledger(tmp_path / "l.sqlite"), RunOptions(runs_dir=tmp_path / "runs", executor="processes"))
        assert a.requests == b.requests == 0
    assert not (tmp_path / "l.sqlite").exists()


def test_replicas_with_one_down_are_still_refused_with_another_executor(tmp_path):
    """The check reads the spec, not the replicas that answered: with one down, a worker would otherwise get the
    two-URL spec and fail (review finding)."""
    with FakeAgentServer() as a:
        plans = plans_for(f"openai:ideal@{a.base_url},http://127.0.0.1:{closed_port()}/v1", 1)
        with pytest.raises(UsageError, match="lists replicas, which run with --executor threads only"):
            run_matrix(plans, lambda: Ledger(tmp_path / "l.sqlite"), RunOptions(runs_dir=tmp_path / "runs", executor="processes"))
        assert a.requests == 0
    assert not (tmp_path / "l.sqlite").exists()
