"""The ``processes`` executor against the ``threads`` one: same plan, same ledger contents; a killed worker; Ctrl-C.

Worker processes are real spawned processes; servers are real HTTP servers on 127.0.0.1; ledgers are real files.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.backends import open_backend
from harness.ledger import Ledger
from harness.loop import RetryPolicy, RunOptions
from harness.matrix import MatrixOverrides
from harness.runner import MatrixEvents, expand_matrix, run_matrix
from harness.scenarios import load_scenario
from tests.fake_agent_server import FakeAgentServer
from tests.helpers import REPO, SCENARIO_FILE, child_pids, cli, processes_matrix, wait_for, worker_pids

CASSETTES = REPO / "tests" / "cassettes" / "list_and_report"
EXECUTORS = ("threads", "processes")


def _plans(models: list[str], *, repeats: int, tool_modes=("native", "prompt")):
    return expand_matrix([load_scenario(SCENARIO_FILE)], MatrixOverrides(models, [0.0], repeats, None, list(tool_modes), None))


class _Seen(MatrixEvents):
    """What the progress bar would be told."""

    def __init__(self) -> None:
        self.finished: list[str] = []
        self.retries = 0

    def run_finished(self, summary) -> None:
        self.finished.append(summary.run_id)

    def retrying(self, plan, attempt, max_attempts) -> None:
        self.retries += 1


def _matrix(tmp_path: Path, executor: str, plans, **options):
    """Run ``plans`` with ``executor`` into a fresh ledger; ``(result, events, {identity: (outcome, labels)})``."""
    folder = tmp_path / executor
    events = _Seen()
    factory = options.pop("factory", open_backend)
    with Ledger(folder / "ledger.sqlite") as ledger:
        result = run_matrix(plans, ledger, RunOptions(runs_dir=folder / "runs", executor=executor, workers=2, **options),
                            events=events, backend_factory=factory)  # fmt: skip
        assert ledger.verify().ok
        turns: dict[str, list[list[str]]] = {}
        for turn in ledger.turns():
            turns.setdefault(turn.record.run_id, []).append(turn.record.failure_modes)
        runs = {run.start.identity: (run.outcome, turns.get(run.run_id, [])) for run in ledger.runs()}
        assert len(runs) == len(ledger.runs())  # no identity twice
        sandboxes = {Path(run.start.sandbox) for run in ledger.runs()}
    assert all(path.parent == (folder / "runs").resolve() for path in sandboxes)
    return result, events, runs


def test_a_replay_matrix_records_the_same_runs_with_threads_and_processes(tmp_path):
    plans = _plans([f"replay:{CASSETTES / 'ideal.jsonl'}", f"replay:{CASSETTES / 'broken.jsonl'}"], repeats=3)
    seen = {}
    for executor in EXECUTORS:
        result, events, runs = _matrix(tmp_path, executor, plans, jobs=3)
        assert sorted(events.finished) == sorted(s.run_id for s in result.summaries) and len(result.summaries) == len(plans)
        seen[executor] = (runs, sorted((s.outcome, tuple(s.failure_modes), s.turns) for s in result.summaries))
    assert seen["threads"] == seen["processes"]
    runs = seen["processes"][0]
    assert {outcome for outcome, _ in runs.values()} >= {"pass"} and any(any(t) for _, t in runs.values())  # labels seen


def test_a_server_matrix_records_the_same_runs_and_retries_with_threads_and_processes(tmp_path):
    faults, first = {2: "500", 5: "429", **{n: "500" for n in range(9, 14)}}, [0]  # by request number within a matrix
    seen = {}
    with FakeAgentServer(faults=lambda n: faults.get(n - first[0])) as server:  # one server: one model spec, one identity
        plans = _plans([f"openai:ideal@{server.base_url}"], repeats=2)
        for executor in EXECUTORS:  # jobs 1: the faults hit the same requests in both
            first[0] = server.requests
            retry = RetryPolicy(max_attempts=3, base_delay_s=0.01)
            result, events, runs = _matrix(
                tmp_path, executor, plans, retry=retry, factory=functools.partial(open_backend, timeout_s=5)
            )
            seen[executor] = (runs, events.retries)
    assert seen["threads"] == seen["processes"]
    runs, retries = seen["processes"]
    assert retries >= 3 and {outcome for outcome, _ in runs.values()} == {"pass", "infra_error"}


def test_the_reply_cache_is_read_through_the_driver(tmp_path):
    with FakeAgentServer() as server:
        plans = _plans([f"openai:ideal@{server.base_url}"], repeats=1, tool_modes=("native",))
        folder = tmp_path / "l"
        with Ledger(folder / "ledger.sqlite") as ledger:
            run_matrix(plans, ledger, RunOptions(runs_dir=folder / "runs"))
            again = run_matrix(plans, ledger, RunOptions(runs_dir=folder / "runs", use_cache=True, executor="processes", workers=1),
                               resume=False)  # fmt: skip
            turns = ledger.turns(again.summaries[0].run_id)
            assert ledger.verify().ok
        assert server.requests == 3  # the second run was served from the cache
    assert again.summaries[0].outcome == "pass" and all(t.record.details.get("cache_hit") for t in turns)


def _workers() -> list[int]:
    return [p.pid for p in multiprocessing.active_children() if p.name == "harness-worker" and p.pid is not None]


def test_a_killed_worker_ends_its_run_as_infra_error_and_resume_redoes_it(tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    with FakeAgentServer(delay_s=0.3, slots=8) as server:
        plans = _plans([f"openai:ideal@{server.base_url}"], repeats=6, tool_modes=("native",))
        options = RunOptions(runs_dir=tmp_path / "runs", jobs=4, executor="processes", workers=2)
        with Ledger(ledger_path) as ledger:
            outcome: dict[str, object] = {}
            runner = threading.Thread(target=lambda: outcome.update(result=run_matrix(plans, ledger, options)))
            runner.start()
            deadline = time.monotonic() + 60
            while server.requests < 6:  # both workers have runs waiting on a reply
                assert time.monotonic() < deadline, "the matrix did not start"
                time.sleep(0.02)
            victim = _workers()[0]
            os.kill(victim, signal.SIGKILL)
            runner.join(120)
            result = outcome["result"]
            assert ledger.verify().ok
            first = {run.run_id: run for run in ledger.runs()}
            again = run_matrix(plans, ledger, options)
            runs = ledger.runs()
            finished = ledger.finished_identities()
            assert ledger.verify().ok
    dead = [s for s in result.summaries if s.outcome == "infra_error"]  # type: ignore[attr-defined]
    assert dead and all("worker process running it died" in (s.error or "") for s in dead)
    assert len(result.summaries) == 6 and {s.outcome for s in result.summaries} == {"pass", "infra_error"}  # type: ignore[attr-defined]
    assert all(run.outcome is not None for run in first.values())  # every started run has an end row
    assert [s.outcome for s in again.summaries] == ["pass"] * len(dead) and again.already_done == 6 - len(dead)
    assert len(finished) == 6 and set(finished.values()) == {1}  # every identity finished once, none twice
    assert len(runs) == 6 + len(dead)


def _harness(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "harness", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip


def test_ctrl_c_once_ends_the_runs_in_flight_as_interrupted_and_resume_completes_the_set(tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    with FakeAgentServer(delay_s=0.2, slots=4) as server:
        args = [str(SCENARIO_FILE), "--model", f"openai:ideal@{server.base_url}", "--tool-mode", "native", "--repeats", "8",
                "--temperature", "0", "--jobs", "2", "--ledger", str(ledger_path), "--executor", "processes", "--workers", "2"]  # fmt: skip
        proc = _harness("run", *args)
        deadline = time.monotonic() + 60
        while server.requests < 4:
            assert time.monotonic() < deadline, "the matrix did not start"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
        assert out.strip().splitlines()[-1].startswith("Ledger head")
        with Ledger(ledger_path, readonly=True) as ledger:
            runs = ledger.runs()
            assert ledger.verify().ok
        assert runs and all(r.outcome is not None for r in runs) and "interrupted" in {r.outcome for r in runs}
        again = _harness("run", *args)
        out, err = again.communicate(timeout=120)
        assert again.returncode == 0, err
        with Ledger(ledger_path, readonly=True) as ledger:
            finished = ledger.finished_identities()
    assert len(finished) == 8 and set(finished.values()) == {1}


# a second Ctrl-C with --executor processes: tests/test_matrix.py, parametrized over both executors


def test_a_second_ctrl_c_before_any_run_started_says_how_many_it_recorded(tmp_path):
    """Found by red22: a quit while the workers were still starting said "2 runs in flight recorded as interrupted"
    over a ledger without a run: the count was of runs handed to workers, not of end rows written."""
    ledger_path = tmp_path / "ledger.sqlite"
    with FakeAgentServer(delay_s=20, slots=2) as server:
        proc = processes_matrix(server.base_url, ledger_path, repeats=2, jobs=2)
        # Ctrl-C twice once the runs are handed out, before the workers start them
        wait_for(lambda: len(worker_pids(proc.pid)) >= 2, proc, "the workers did not start")
        assert not server.requests
        time.sleep(0.2)  # the workers are still importing
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    with Ledger(ledger_path, readonly=True) as ledger:
        interrupted = [r for r in ledger.runs() if r.outcome == "interrupted"]
        assert ledger.verify().ok
        anchor = ledger.head().anchor
    assert proc.returncode == 130 and "Traceback" not in err, err
    said = re.search(r"quit; (\d+) runs? in flight recorded as interrupted", err)
    assert said is not None and int(said.group(1)) == len(interrupted), err
    assert out.strip().splitlines()[-1].endswith(f": {anchor}"), out  # the head ends the output, as after one Ctrl-C


def test_a_second_ctrl_c_keeps_the_turns_and_end_rows_still_in_the_pipes(tmp_path):
    """Found in stop 25: after a second Ctrl-C the driver wrote the interrupted runs' end rows without reading what their
    workers had sent, so those turns were lost. Here the first Ctrl-C comes while both runs wait on their first reply;
    the driver is then stopped (SIGSTOP) while the replies come and each worker sends its run's turn (a notice) and
    its ``interrupted`` end row (a call, left waiting); the second Ctrl-C is pending when it goes on (SIGCONT), so
    everything sent is still unread in the pipes when it quits."""
    ledger_path = tmp_path / "ledger.sqlite"
    with FakeAgentServer(delay_s=1.5, slots=2) as server:
        proc = processes_matrix(server.base_url, ledger_path, repeats=2, jobs=2)
        wait_for(lambda: server.requests >= 2, proc, "the matrix did not start")  # both runs wait on their first reply
        asked = time.monotonic()
        proc.send_signal(signal.SIGINT)  # the first: the workers are told to stop; the driver waits for their runs
        time.sleep(0.5)
        proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(max(0.0, asked + 1.5 + 1.0 - time.monotonic()))  # the replies came, the turns and ends were sent
            proc.send_signal(signal.SIGINT)  # the second, delivered when the driver goes on
        finally:
            proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
        answered = server.requests
    assert proc.returncode == 130 and "Traceback" not in err and "quit;" in err, err
    with Ledger(ledger_path, readonly=True) as ledger:
        runs = ledger.runs()
        turns = {run.run_id: len(ledger.turns(run.run_id)) for run in runs}
        assert ledger.verify().ok
    assert len(runs) == 2 and all(run.end is not None and turns[run.run_id] == run.end.turns for run in runs)
    assert sum(turns.values()) == answered == 2  # no turn a worker sent was dropped
    assert {run.outcome for run in runs} == {"interrupted"} and "quit; 0 runs in flight" in err  # their end rows too


def test_ctrl_c_while_the_workers_are_spawned_prints_no_traceback(tmp_path):
    """Found by red22: a Ctrl-C in the middle of starting a worker process cut its start-up data short, and the child
    printed a traceback (EOFError in multiprocessing's spawn) on the user's terminal."""
    ledger_path = tmp_path / "ledger.sqlite"
    with FakeAgentServer(delay_s=20, slots=2) as server:
        proc = _harness("run", str(SCENARIO_FILE), "--model", f"openai:slow@{server.base_url}", "--repeats", "2",
                        "--temperature", "0", "--jobs", "2", "--ledger", str(ledger_path), "--executor", "processes",
                        "--workers", "2")  # fmt: skip
        deadline = time.monotonic() + 60
        while len(child_pids(proc.pid)) < 2:  # the second worker is being started
            assert time.monotonic() < deadline
            time.sleep(0.005)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in err, err
    if ledger_path.exists():  # the ledger is made when the first row is written
        with Ledger(ledger_path, readonly=True) as ledger:
            assert ledger.verify().ok and all(r.outcome is not None for r in ledger.runs())


def test_workers_need_the_processes_executor(tmp_path, capsys):
    from tests.helpers import assert_one_sentence_error, cli

    rc, _, err = cli(
        capsys, "run", str(SCENARIO_FILE), "--model", "replay:x.jsonl", "--workers", "2", "--ledger", str(tmp_path / "l.sqlite")
    )
    assert_one_sentence_error(rc, err)
    assert "--workers needs --executor processes or ray" in err and not (tmp_path / "l.sqlite").exists()


@pytest.mark.parametrize("flag", [["--ray-address", "127.0.0.1:6379"], ["--ray-resources", "replay:x.jsonl=GPU:1"]])
def test_ray_options_need_the_ray_executor(tmp_path, capsys, flag):
    from tests.helpers import assert_one_sentence_error, cli

    rc, _, err = cli(
        capsys, "run", str(SCENARIO_FILE), "--model", "replay:x.jsonl", *flag, "--ledger", str(tmp_path / "l.sqlite")
    )
    assert_one_sentence_error(rc, err)
    assert "need --executor ray" in err


@pytest.mark.parametrize(("value", "words"), [("replay:x.jsonl=GPU", "write MODEL_SPEC=NAME:AMOUNT"),
                                             ("replay:x.jsonl=GPU:0", "write MODEL_SPEC=NAME:AMOUNT"),
                                             ("replay:other.jsonl=GPU:1", "has no model")])  # fmt: skip
def test_bad_ray_resources_are_one_sentence(tmp_path, capsys, value, words):
    from tests.helpers import assert_one_sentence_error, cli

    rc, _, err = cli(capsys, "run", str(SCENARIO_FILE), "--model", "replay:x.jsonl", "--executor", "ray", "--ray-resources", value,
                     "--ledger", str(tmp_path / "l.sqlite"))  # fmt: skip
    assert_one_sentence_error(rc, err)
    assert words in err and not (tmp_path / "l.sqlite").exists()


def test_worker_processes_are_imported_only_when_chosen():
    code = (
        "import sys; from harness.cli import main; from harness import runner; "
        "print('harness.executors.processes' in sys.modules, 'multiprocessing.connection' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True
    )
    assert out.stdout.split() == ["False", "False"]


# -- the driver's group commit ------------------------------------------------------------------------------
def test_a_group_commits_its_appends_together_or_not_at_all(tmp_path):
    from tests.ledger_builders import add_run

    path = tmp_path / "l.sqlite"
    with Ledger(path) as ledger, Ledger(path, readonly=True) as reader:
        with ledger.group():
            add_run(ledger, "a", model="m", turns=[([], "x")] * 2)
            add_run(ledger, "b", model="m")
            assert reader.row_counts()["turns"] == 0  # nothing durable inside the group
            assert ledger.turn_totals("a") == (2, 200, 30)  # the writer reads its own group
        assert reader.row_counts()["turns"] == 3
        with pytest.raises(RuntimeError), ledger.group():
            add_run(ledger, "c", model="m")
            raise RuntimeError("the driver failed halfway")
        assert [run.run_id for run in ledger.runs()] == ["a", "b"]  # c rolled back whole
        add_run(ledger, "d", model="m")  # and the chain goes on from b
        assert ledger.verify().ok


def test_a_worker_reaches_an_embedded_model_at_the_drivers_server_under_its_identity():
    from harness.backends.base import BackendIdentity, GenerateOptions
    from harness.executors.worker import BackendRecipe

    identity = BackendIdentity(backend="embedded", model="smollm2-135m", base_url=None, server_version="xllamacpp 0.2",
                               model_digest="sha256:" + "ab" * 32, slots=1)  # fmt: skip
    with FakeAgentServer() as server:  # stands in for the driver's llama.cpp server: OpenAI-compatible on 127.0.0.1
        recipe = BackendRecipe("embedded:smollm2-135m", open_backend, {"num_ctx": 4096}, (server.base_url, identity, 30.0))
        backend = recipe.open()
        try:
            reply = backend.generate([{"role": "user", "content": "List the files."}], None, GenerateOptions(max_tokens=16))
        finally:
            backend.close()
        assert server.requests == 1
    assert backend.identity() == identity and reply.identity == identity and reply.tool_calls


def test_workers_open_their_backends_with_the_arguments_the_driver_opened_them_with(tmp_path):
    from dataclasses import replace

    from harness.endpoints import Concurrency, open_endpoints
    from harness.executors.worker import recipe_for
    from harness.runner import MatrixResult

    scenario = replace(load_scenario(SCENARIO_FILE), api_key_env="HARNESS_TEST_KEY", num_ctx=8192)
    model = f"replay:{sorted(CASSETTES.glob('*.jsonl'))[0]}"
    plans = expand_matrix([scenario, load_scenario(SCENARIO_FILE)], MatrixOverrides([model], [0.0], 1, None, ["native"], None))
    opened: list[dict] = []

    def factory(spec, **kwargs):  # the real factory, its arguments noted
        opened.append(kwargs)
        return open_backend(spec, **kwargs)

    endpoints = open_endpoints(plans, None, Concurrency(jobs=4, embedded_slots=3), backend_factory=factory, result=MatrixResult())
    try:
        recipe = recipe_for(model, endpoints[model], factory)
    finally:
        endpoints[model].backend.close()
    assert opened == [{"api_key_env": "HARNESS_TEST_KEY", "num_ctx": 8192, "parallel": 3}]
    assert recipe.kwargs == opened[0]


def test_an_error_in_a_run_thread_stops_the_threads_matrix_with_that_error(tmp_path):
    class ThirdRunFails:  # the real backend, but its third run cannot start: a harness bug, not the model's doing
        def __init__(self, inner) -> None:
            self.inner, self.runs, self.lock = inner, 0, threading.Lock()

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def for_run(self):
            with self.lock:
                self.runs += 1
                if self.runs == 3:
                    raise RuntimeError("a bug in the third run")
            return self.inner.for_run()

    def factory(spec, **kwargs):
        return ThirdRunFails(open_backend(spec, **kwargs))

    plans = _plans([f"replay:{CASSETTES / 'ideal.jsonl'}"], repeats=4)
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        with pytest.raises(RuntimeError, match="a bug in the third run"):
            run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs", jobs=2), backend_factory=factory)
        runs = ledger.runs()
        assert len(runs) < len(plans) and all(run.outcome is not None for run in runs) and ledger.verify().ok


def test_workers_out_of_range_says_so_alone(tmp_path, capsys):
    """Found by a newcomer: `--executor processes --workers 0` was told it needed --executor processes."""
    rc, _, err = cli(capsys, "run", str(SCENARIO_FILE), "--model", "replay:x.jsonl", "--executor", "processes",
                     "--workers", "0", "--ledger", str(tmp_path / "l.sqlite"))  # fmt: skip
    assert rc == 2 and err.strip() == "harness: --workers must be from 1 to 256, not 0." and not (tmp_path / "l.sqlite").exists()


def _allowed_cpus(pid: int) -> list[set[int]]:
    """The CPUs each thread of process ``pid`` may run on (``Cpus_allowed_list`` of /proc/PID/task/*/status)."""
    sets = []
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        line = next(x for x in status.read_text().splitlines() if x.startswith("Cpus_allowed_list:"))
        cpus: set[int] = set()
        for part in line.split(":", 1)[1].strip().split(","):
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
        sets.append(cpus)
    return sets


@pytest.mark.parametrize("one_per_cpu", [True, False], ids=["as-many-workers-as-cpus", "one-more-worker"])
def test_workers_are_pinned_one_per_cpu_only_when_they_are_a_multiple_of_the_cpus(tmp_path, one_per_cpu):
    """Issue 14: a worker pinned to its CPU keeps its caches (about a tenth less CPU per turn); a count that is no
    multiple of the CPUs is not pinned (red team: 3 workers on 2 CPUs stacked two on the first and ran 40 % slower)."""
    cpus = sorted(os.sched_getaffinity(0))
    if one_per_cpu and len(cpus) < 2:
        pytest.skip("one CPU: pinning changes nothing")
    workers = len(cpus) if one_per_cpu else (len(cpus) + 1 if len(cpus) > 1 else 1)  # no multiple of the CPUs
    with FakeAgentServer(delay_s=0.5, slots=2 * workers) as server:
        plans = _plans([f"openai:ideal@{server.base_url}"], repeats=workers, tool_modes=("native",))
        options = RunOptions(runs_dir=tmp_path / "runs", jobs=2 * workers, executor="processes", workers=workers)
        with Ledger(tmp_path / "ledger.sqlite") as ledger:
            outcome: dict[str, object] = {}
            runner = threading.Thread(target=lambda: outcome.update(result=run_matrix(plans, ledger, options)))
            runner.start()
            deadline = time.monotonic() + 60
            while server.requests < workers:  # every worker's run threads are up and waiting on a reply
                assert time.monotonic() < deadline, "the matrix did not start"
                time.sleep(0.02)
            seen = {pid: _allowed_cpus(pid) for pid in _workers()}
            runner.join(120)
    assert len(seen) == workers and all(len(threads) >= 2 for threads in seen.values())  # the main and a run thread
    if one_per_cpu:
        assert all(all(t == threads[0] and len(t) == 1 for t in threads) for threads in seen.values()), seen
        assert sorted(next(iter(threads[0])) for threads in seen.values()) == cpus
    else:
        assert all(t == set(cpus) for threads in seen.values() for t in threads), seen
    assert {s.outcome for s in outcome["result"].summaries} == {"pass"}  # type: ignore[attr-defined]
