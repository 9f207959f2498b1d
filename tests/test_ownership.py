"""Run ownership and resume (issue 11): who may run a planned identity, and what ``--dry-run`` says about it.

A run owns its identity through an advisory ``flock`` on ``<ledger>.locks/<identity>.lock``, which
the kernel releases when the process dies, however it dies. So a run killed with ``kill -9`` is
resumed even when its recorded pid now belongs to a live process (pid 1 in a container), and two
processes on one ledger never run the same identity, however long a model call takes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from harness.ledger import Ledger, RunStart
from harness.loop import RunOptions
from harness.matrix import MatrixOverrides
from harness.ownership import lock_folder, owned_elsewhere, take_lock
from harness.runner import expand_matrix, plan_matrix, run_matrix
from harness.scenarios import load_scenario
from tests.backend_fakes import closed_port
from tests.fake_agent_server import FakeAgentServer
from tests.helpers import REPO, SCENARIO_FILE

ARGS = ["--tool-mode", "native", "--temperature", "0", "--parser", "lenient"]


def _plans(model: str, repeats: int):
    return expand_matrix([load_scenario(SCENARIO_FILE)], MatrixOverrides([model], [0.0], repeats, None, ["native"], ["lenient"]))


def _harness(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    return subprocess.Popen([*prefix, sys.executable, "-m", "harness", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def _line_with(proc: subprocess.Popen[str], text: str = "", *, timeout: float, stderr: bool = False) -> str:
    """The first line of ``proc``'s stdout (``stderr``: its stderr) that contains ``text`` (the next line when ``text``
    is empty), without its newline; kills the process and fails the test when none comes within ``timeout`` seconds."""
    found: list[str] = []
    stream = proc.stderr if stderr else proc.stdout

    def read() -> None:
        for line in stream:  # type: ignore[union-attr]
            if text in line:
                found.append(line.rstrip("\n"))
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if not found:
        proc.kill()
        pytest.fail(f"no line with {text!r} from the process within {timeout} s")
    return found[0]


def _finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    """Wait for a harness process (a hang guard, not a speed assertion)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"harness did not finish within {timeout} s; stderr: {err[-2000:]}")
    return proc.returncode, out, err


def _wait_until(condition, what: str, timeout: float = 180) -> None:
    """Poll ``condition`` (a hang guard, not a speed assertion: generous on a busy shared machine)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _start_row(planned, run_id: str, config: dict) -> RunStart:
    plan = planned.plan
    return RunStart(
        run_id=run_id, identity=planned.identity, scenario=plan.scenario.name, scenario_path=str(plan.scenario.path),
        scenario_hash=plan.scenario.content_hash, model=plan.model, backend="openai", base_url=None, server_version=None,
        model_digest=None, temperature=plan.temperature, seed=plan.seed, max_tokens=64, num_ctx=2048,
        tool_mode=plan.tool_mode, parser=plan.parser, repetition=plan.repetition, turn_limit=8, token_limit=32000,
        harness_version="0.1.0", git_sha=None, git_dirty=None, sandbox="/nonexistent", config=config,
    )  # fmt: skip


class _GatedServer(FakeAgentServer):
    """A scripted server whose chat requests wait until :attr:`gate` is set (a model call that takes as long as the test wants)."""

    def __init__(self, **kwargs):
        self.gate = threading.Event()
        super().__init__(faults=lambda n: self.gate.wait(120) and None, slots=8, **kwargs)

    def close(self) -> None:
        self.gate.set()
        super().close()


# finding: a run killed with kill -9 whose pid is reused by a live process was skipped forever
@pytest.mark.parametrize("pid", ["own", "1"])
def test_an_unfinished_run_whose_recorded_pid_is_a_live_process_is_resumed(tmp_path, pid):
    """The crashed run's start row names this host and a pid that is alive now (the test's own, or
    pid 1): it used to count as "in flight" forever, so the matrix reported complete with the run
    missing. Nobody holds its lock, so it is run again; the stale start row stays (append-only)."""
    with FakeAgentServer() as server:
        model = f"openai:m@{server.base_url}"
        with Ledger(tmp_path / "l.sqlite") as ledger:
            [planned] = plan_matrix(_plans(model, 1), ledger).planned
            recorded_pid = os.getpid() if pid == "own" else 1
            ledger.start_run(_start_row(planned, uuid.uuid4().hex, {"pid": recorded_pid, "host": socket.gethostname()}))
            dry = plan_matrix(_plans(model, 1), ledger)  # what --dry-run says: 1 to run
            assert (dry.planned[0].done, dry.planned[0].running, dry.already_done, dry.running_elsewhere) == (False, False, 0, 0)
            result = run_matrix(_plans(model, 1), ledger, RunOptions(runs_dir=tmp_path / "runs"))
            assert (result.already_done, result.running_elsewhere) == (0, 0)
            runs = ledger.runs()
            assert ledger.verify().ok
    assert [s.outcome for s in result.summaries] == ["pass"]
    assert [r.outcome for r in runs] == [None, "pass"]
    config = runs[1].start.config  # the lock it held, beside the ledger: its identity's byte of the one lock file
    assert (config["lock"], config["lock_byte"]) == ("l.sqlite.locks/runs.lock", int(planned.identity[:15], 16))
    lock = take_lock(tmp_path / "l.sqlite", planned.identity)  # released once the run ended
    assert lock is not None and (lock.path, lock.offset) == (tmp_path / "l.sqlite.locks" / "runs.lock", config["lock_byte"])
    lock.release()


def _child_pid(parent: int) -> int | None:
    try:
        children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run(["unshare", "-pf", "--kill-child", sys.executable, "-c", "import os; print(os.getpid())"],
                               capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0 and probe.stdout.strip() == "1"


# finding: in a container the harness is pid 1; after kill -9 and a restart the killed run was skipped forever
def test_a_matrix_killed_as_pid_1_resumes_as_pid_1_in_a_new_pid_namespace(tmp_path):
    if not _unshare_works():
        pytest.skip("unshare -pf (a new pid namespace) is not available here")
    ledger_path = tmp_path / "ledger.sqlite"
    as_pid_1 = ("unshare", "-pf", "--kill-child")
    with _GatedServer() as server:
        args = ["run", str(SCENARIO_FILE), "--model", f"openai:m@{server.base_url}", *ARGS, "--repeats", "1",
                "--ledger", str(ledger_path)]  # fmt: skip
        first = _harness(*args, prefix=as_pid_1)
        _wait_until(lambda: server.requests >= 1, "the first model call")
        harness_pid = _child_pid(first.pid)
        assert harness_pid is not None
        os.kill(harness_pid, signal.SIGKILL)  # the harness (pid 1 in its namespace) dies mid-call
        _finish(first)
        with Ledger(ledger_path, readonly=True) as ledger:
            [killed] = ledger.runs()
        assert killed.outcome is None and killed.start.config["pid"] == 1
        server.gate.set()  # the server answers at once from now on
        rc, out, err = _finish(_harness("run", "--dry-run", *args[1:], prefix=as_pid_1))
        assert rc == 0 and out.strip().endswith("1 run planned, 0 already done, 1 to run."), (out, err)
        rc, out, err = _finish(_harness(*args, prefix=as_pid_1))
        assert rc == 0, err
        assert "0 runs" not in out and "1 run in" in out, out
        rc, dry_out, err = _finish(_harness("run", "--dry-run", *args[1:]))
    assert dry_out.strip().endswith("1 run planned, 1 already done, 0 to run."), dry_out
    with Ledger(ledger_path, readonly=True) as ledger:
        assert [r.outcome for r in ledger.runs()] == [None, "pass"]
        assert ledger.verify().ok


# newcomer finding: while another process ran one run, the dry run said "1 running in another process, 2 to run" but
# the real run started at that moment opened with "Running 3 of 4 planned runs (1 already in the ledger)"
def test_the_real_runs_opening_line_counts_what_the_dry_run_counts_at_that_moment(tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    with _GatedServer() as server:
        args = [str(SCENARIO_FILE), "--model", f"openai:m@{server.base_url}", *ARGS, "--ledger", str(ledger_path)]
        server.gate.set()
        assert _finish(_harness("run", *args, "--repeats", "1"))[0] == 0  # rep 0 done
        server.gate.clear()
        before = server.requests
        first = _harness("run", *args, "--repeats", "4")  # skips rep 0, takes rep 1: its call waits for the gate
        second = None
        try:
            _wait_until(lambda: server.requests > before or first.poll() is not None, "the first process's model call")
            rc, dry_out, err = _finish(_harness("run", "--dry-run", *args, "--repeats", "4"))
            assert rc == 0, err
            said = dry_out.strip().splitlines()[-1]
            assert said == "4 runs planned, 1 already done, 1 running in another process, 2 to run.", dry_out
            # review: the run held elsewhere is still tried when its turn comes, so it counts for the workers that start
            rc, dry_out, err = _finish(_harness("run", "--dry-run", *args, "--repeats", "4", "--jobs", "4",
                                                "--executor", "processes", "--workers", "8"))  # fmt: skip
            assert rc == 0 and dry_out.strip().splitlines()[-2] == (
                "Execution: up to 4 runs at a time (--jobs 4), in 3 worker processes (--executor processes, --workers 8)."
            ), dry_out
            second = _harness("run", *args, "--repeats", "4")
            opening = _line_with(second, "; ledger: ", timeout=180, stderr=True)
        finally:
            server.gate.set()
        assert opening == f"{said[:-1]}; ledger: {ledger_path}", opening
        for proc in (first, second):
            rc, out, err = _finish(proc)
            assert rc == 0, err
    with Ledger(ledger_path, readonly=True) as ledger:
        assert sorted(r.outcome for r in ledger.runs()) == ["pass"] * 4 and ledger.verify().ok


# guard: two processes on one ledger never run one identity, even while its model call takes minutes
def test_two_processes_on_one_ledger_never_both_run_an_identity_while_its_call_is_pending(tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    with _GatedServer() as server:
        args = [str(SCENARIO_FILE), "--model", f"openai:m@{server.base_url}", *ARGS, "--repeats", "2", "--jobs", "2",
                "--ledger", str(ledger_path)]  # fmt: skip
        first = _harness("run", *args)
        _wait_until(lambda: server.requests >= 2, "both runs of the first process to call the model")
        rc, dry_out, err = _finish(_harness("run", "--dry-run", *args))  # while both calls are pending
        assert rc == 0, err
        assert dry_out.count("(running in another process)") == 2, dry_out
        assert dry_out.strip().endswith("2 runs planned, 0 already done, 2 running in another process, 0 to run."), dry_out
        rc, out, err = _finish(_harness("run", *args))
        assert rc == 0, err
        assert "2 running in another process" in out, out
        assert server.requests == 2  # the second process called nothing
        server.gate.set()
        rc, out, err = _finish(first)
        assert rc == 0, err
    with Ledger(ledger_path, readonly=True) as ledger:
        runs = ledger.runs()
        assert ledger.verify().ok
    assert sorted(r.outcome for r in runs) == ["pass", "pass"]
    assert len({r.start.identity for r in runs}) == 2  # one start row per identity: none was run twice


def test_a_done_run_another_process_runs_again_counts_as_running_for_no_resume(tmp_path):
    """Red team: a --no-resume dry run, while another --no-resume process ran a done identity again, said "(done; runs
    again)" and "1 to run"; the real run then skipped it as running in another process."""
    ledger_path = tmp_path / "ledger.sqlite"
    with _GatedServer() as server:
        args = [
            str(SCENARIO_FILE),
            "--model",
            f"openai:m@{server.base_url}",
            *ARGS,
            "--repeats",
            "1",
            "--ledger",
            str(ledger_path),
        ]
        server.gate.set()
        assert _finish(_harness("run", *args))[0] == 0  # rep 0 done
        server.gate.clear()
        before = server.requests
        again = _harness("run", *args, "--no-resume")  # runs it again: its call waits for the gate
        try:
            _wait_until(lambda: server.requests > before or again.poll() is not None, "the second run's model call")
            rc, dry_out, err = _finish(_harness("run", "--dry-run", *args, "--no-resume"))
            assert rc == 0, err
            assert dry_out.strip().splitlines()[0].endswith(" rep=0 (running in another process)"), dry_out
            assert dry_out.strip().endswith(
                "1 run planned, 1 already done (run again: --no-resume), 1 running in another process, 0 to run."
            ), dry_out
        finally:
            server.gate.set()
        assert _finish(again)[0] == 0


def test_two_processes_racing_on_one_ledger_run_each_identity_once(tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    Ledger(ledger_path).close()
    runs = _two_processes(ledger_path, ledger_path)
    assert len(runs) == 6 and len({r.start.identity for r in runs}) == 6
    assert {r.outcome for r in runs} == {"pass"}


def _two_processes(first: Path, second: Path) -> list:
    """Run a 6-run matrix in two `harness run` processes at once, on ``first`` and ``second``; the verified runs of ``first``."""
    with FakeAgentServer(delay_s=0.05, slots=8) as server:
        args = [str(SCENARIO_FILE), "--model", f"openai:m@{server.base_url}", *ARGS, "--repeats", "6", "--jobs", "3"]
        procs = [_harness("run", *args, "--ledger", str(path)) for path in (first, second)]
        for proc in procs:
            rc, _out, err = _finish(proc)
            assert rc == 0, err
    with Ledger(first, readonly=True) as ledger:
        assert ledger.verify().ok
        return ledger.runs()


# red-team finding: one ledger reached through a symlink got two lock folders, so both processes ran every identity
def test_two_processes_on_a_ledger_and_a_symlink_to_it_run_each_identity_once(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    real, link = tmp_path / "a" / "ledger.sqlite", tmp_path / "b" / "link.sqlite"
    Ledger(real).close()
    link.symlink_to(real)
    assert lock_folder(link) == lock_folder(real)
    runs = _two_processes(real, link)
    assert len(runs) == 6 and len({r.start.identity for r in runs}) == 6


# red-team finding: under two hard-linked names SQLite kept two journals and one process's runs were lost
def test_a_hard_linked_ledger_is_refused_before_anything_is_written(tmp_path, capsys):
    from tests.helpers import assert_one_sentence_error, cli

    real = tmp_path / "ledger.sqlite"
    Ledger(real).close()
    os.link(real, tmp_path / "other.sqlite")
    rc, _out, err = cli(capsys, "run", SCENARIO_FILE, "--model", "replay:/dev/null", "--ledger", tmp_path / "other.sqlite")
    assert_one_sentence_error(rc, err)
    assert "hard links" in err
    rc, out, _err = cli(capsys, "ledger", "verify", "--ledger", real)  # reading stays possible
    assert rc == 0, out


# finding: --dry-run with a server down said "4 to run" for runs it had just said cannot be planned, and exited 0
def test_dry_run_with_a_server_down_counts_what_cannot_be_planned_and_fails_like_the_run(tmp_path):
    args = [str(SCENARIO_FILE), "--model", f"openai:m@http://127.0.0.1:{closed_port()}/v1", *ARGS, "--repeats", "4",
            "--ledger", str(tmp_path / "l.sqlite")]  # fmt: skip
    rc, out, err = _finish(_harness("run", "--dry-run", *args))
    assert rc == 1, (out, err)
    assert "Traceback" not in err and "skipped 4 runs of openai:m@" in err  # the real run's sentence
    assert out.strip().endswith("4 runs planned, 0 already done, 4 skipped, 0 to run."), out
    run_rc, _, run_err = _finish(_harness("run", *args))
    assert run_rc == rc and "skipped 4 runs" in run_err
    assert not (tmp_path / "l.sqlite.locks").exists() or not any((tmp_path / "l.sqlite.locks").iterdir())


# -- Ctrl-C --------------------------------------------------------------------------------------------------
class _MuteServer:
    """A socket on 127.0.0.1 that accepts connections and never answers: a model reply that never comes.

    The one warm-up request the runner sends before a model's runs (``WARM_UP_MESSAGES``, ``max_tokens`` 1) is answered,
    and the metadata probes get a 404, so the runs start at once and their model call is the one left waiting.
    """

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.conns: list[socket.socket] = []
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(65536)
        except OSError:
            return
        if b'"max_tokens":1,' in data.replace(b" ", b"") and b'"content":"Hi"' in data.replace(b" ", b""):
            body = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                                            "finish_reason": "length"}]}).encode()  # fmt: skip
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip
            conn.close()
            return
        if data.startswith(b"GET "):  # the metadata probes (/props, /v1/models): none here, at once, not after their timeout
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            conn.close()
            return
        self.conns.append(conn)

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.sock.close()


def _double_ctrl_c(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    return _finish(proc, timeout=60)  # a hang guard: the reply never comes, so waiting for it would never end


# the documented behaviour: a second Ctrl-C quits at once, even while a model reply is pending
def test_a_double_ctrl_c_quits_while_a_reply_that_never_comes_is_pending(tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    server = _MuteServer()
    try:
        args = [str(SCENARIO_FILE), "--model", f"openai:m@{server.url}", *ARGS, "--repeats", "3", "--ledger", str(ledger_path)]
        proc = _harness("run", *args)
        _wait_until(lambda: len(server.conns) >= 1 and ledger_path.exists() and _runs(ledger_path) == 1, "the first model call")
        rc, out, err = _double_ctrl_c(proc)
        assert rc == 130 and "1 run in flight recorded as interrupted" in err and "Traceback" not in err, err
        with Ledger(ledger_path, readonly=True) as ledger:
            runs = ledger.runs()
            assert ledger.verify().ok
        assert [(r.outcome, r.end.turns) for r in runs] == [("interrupted", 0)]
        rc, out, err = _finish(_harness("run", "--dry-run", *args))  # the killed process's lock went with it
        assert out.strip().endswith("3 runs planned, 0 already done, 3 to run."), (out, err)
    finally:
        server.close()


def _runs(ledger_path: Path) -> int:
    with Ledger(ledger_path, readonly=True) as ledger:
        return len(ledger.runs())


SLOW_TERMINAL = """
import os, sys, time
from pathlib import Path
from harness.ledger import Ledger
from harness.loop import RunOptions
from harness.matrix import MatrixOverrides
from harness.ownership import lock_folder, owned_elsewhere, take_lock
from harness.runner import MatrixEvents, MatrixQuit, expand_matrix, run_matrix
from harness.scenarios import load_scenario

class SlowTerminal(MatrixEvents):
    def stopping(self, in_flight):
        print("stopping", flush=True)
        time.sleep(5)  # the message takes a while to reach the user (a slow or paused terminal)

scenario, model, ledger_path = sys.argv[1:4]
plans = expand_matrix([load_scenario(Path(scenario))], MatrixOverrides([model], [0.0], 1, None, ["native"], ["lenient"]))
with Ledger(ledger_path) as ledger:
    try:
        run_matrix(plans, ledger, RunOptions(runs_dir=Path(ledger_path).parent / "runs"), events=SlowTerminal())
    except MatrixQuit:
        os._exit(130)
    except KeyboardInterrupt:
        os._exit(1)
"""


# a second Ctrl-C that came while the first was being reported was lost: the matrix then waited for the reply
def test_a_second_ctrl_c_while_the_first_is_being_reported_still_quits_at_once(tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    server = _MuteServer()
    proc = subprocess.Popen([sys.executable, "-c", SLOW_TERMINAL, str(SCENARIO_FILE), f"openai:m@{server.url}", str(ledger_path)],
                            cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        _wait_until(lambda: len(server.conns) >= 1 and ledger_path.exists() and _runs(ledger_path) == 1, "the model call")
        proc.send_signal(signal.SIGINT)
        line = _line_with(proc, timeout=120)  # the first Ctrl-C is being reported
        assert line.strip() == "stopping"
        proc.send_signal(signal.SIGINT)
        rc, out, err = _finish(proc, timeout=60)
        assert rc == 130, err
        with Ledger(ledger_path, readonly=True) as ledger:
            assert [r.outcome for r in ledger.runs()] == ["interrupted"]
            assert ledger.verify().ok
    finally:
        if proc.poll() is None:  # a failed wait: leave no process or pipe behind for later tests' gc
            proc.kill()
        proc.communicate()
        server.close()


# -- the lock itself -------------------------------------------------------------------------------------------
def test_a_run_lock_is_exclusive_between_open_files_and_free_once_released(tmp_path):
    ledger_path, identity = tmp_path / "l.sqlite", "ab" * 32
    assert not owned_elsewhere(ledger_path, identity) and not lock_folder(ledger_path).exists()  # a probe creates nothing
    first = take_lock(ledger_path, identity)
    assert first is not None
    assert take_lock(ledger_path, identity) is None  # another open file (another thread or process) cannot own it
    assert owned_elsewhere(ledger_path, identity)
    first.release()
    assert not owned_elsewhere(ledger_path, identity)
    second = take_lock(ledger_path, identity)
    assert second is not None
    second.release()
    with pytest.raises(ValueError):
        take_lock(ledger_path, "../escape")


def test_a_dry_run_probe_never_makes_a_run_skip_its_identity(tmp_path):
    """``owned_elsewhere`` takes no lock (it asks with F_OFD_GETLK): probes running all the time never make a run skip."""
    ledger_path, identity = tmp_path / "l.sqlite", "cd" * 32
    take_lock(ledger_path, identity).release()  # the lock file exists
    done = threading.Event()
    seen: list[bool] = []

    def probe() -> None:
        while not done.is_set():
            seen.append(owned_elsewhere(ledger_path, identity))

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        for _ in range(200):
            lock = take_lock(ledger_path, identity)
            assert lock is not None
            lock.release()
    finally:
        done.set()
        prober.join()
    assert seen and not all(seen)


def test_identities_lock_their_own_bytes_of_one_file_and_old_lock_files_are_ignored(tmp_path):
    """One lock file per ledger; each identity its byte; an old-layout ``<identity>.lock`` held by ``flock`` (a run
    recorded by an older harness) neither blocks nor is needed."""
    import fcntl

    ledger_path, first, second = tmp_path / "l.sqlite", "ab" * 32, "ab" * 7 + "c" + "d" * 49
    folder = lock_folder(ledger_path)
    folder.mkdir()
    old = os.open(folder / f"{first}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(old, fcntl.LOCK_EX)  # an old-style lock file, held
    try:
        a, b = take_lock(ledger_path, first), take_lock(ledger_path, second)
        assert a is not None and b is not None and a.path == b.path == folder / "runs.lock"
        assert (a.offset, b.offset) == (int(first[:15], 16), int(second[:15], 16))
        assert take_lock(ledger_path, first) is None and owned_elsewhere(ledger_path, second)
        a.release()
        assert not owned_elsewhere(ledger_path, first) and owned_elsewhere(ledger_path, second)
        b.release()
    finally:
        os.close(old)
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"{first}.lock", "runs.lock"])


BUSY_WORKER = """
import sys, threading
import harness.backends
from harness.backends.openai_compat import OpenAICompatBackend
from harness.cli import main

real_open = harness.backends.open_backend

class BusyThenPending:
    # a run whose reply first needs seconds of C code that holds the GIL (e.g. parsing a huge body), then never comes
    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def for_run(self):
        return BusyThenPending(self.inner.for_run())

    def generate(self, *args, **kwargs):
        print("busy", flush=True)
        sum(range(200_000_000))  # one C call: the main thread cannot run Python meanwhile
        threading.Event().wait()

harness.backends.open_backend = lambda spec, **kw: BusyThenPending(real_open(spec, **kw))
sys.exit(main(sys.argv[1:]))
"""


# two Ctrl-Cs that arrive while the main thread cannot run Python were handled as one: the matrix waited for the reply
def test_two_ctrl_cs_that_arrive_together_still_quit_at_once(tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    with FakeAgentServer() as server:
        args = ["run", str(SCENARIO_FILE), "--model", f"openai:m@{server.base_url}", *ARGS, "--repeats", "1",
                "--ledger", str(ledger_path)]  # fmt: skip
        proc = subprocess.Popen([sys.executable, "-c", BUSY_WORKER, *args], cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        assert _line_with(proc, timeout=60).strip() == "busy"
        rc, out, err = _double_ctrl_c(proc)
    assert rc == 130 and "1 run in flight recorded as interrupted" in err, err
    with Ledger(ledger_path, readonly=True) as ledger:
        assert [r.outcome for r in ledger.runs()] == ["interrupted"]
        assert ledger.verify().ok


# red-team finding: a lock file replaced by a folder said "check that the ledger's folder is writable"
def test_a_lock_file_that_is_a_folder_or_symlink_is_named_as_such(tmp_path, capsys):
    from tests.helpers import IDEAL, cli, write_cassette

    ledger_path = tmp_path / "ledger.sqlite"
    cassette = tmp_path / "c.jsonl"
    write_cassette(cassette, IDEAL)
    argv = [
        "run",
        SCENARIO_FILE,
        "--model",
        f"replay:{cassette}",
        *ARGS,
        "--repeats",
        "1",
        "--ledger",
        ledger_path,
        "--no-resume",
    ]
    assert cli(capsys, *argv)[0] == 0
    [lock] = lock_folder(ledger_path).iterdir()
    lock.unlink()
    lock.mkdir()
    rc, _out, err = cli(capsys, *argv)
    assert rc == 1 and "Traceback" not in err
    assert f"harness: {lock} is not a lock file" in err
    lock.rmdir()
    lock.symlink_to(tmp_path / "elsewhere")
    rc, _out, err = cli(capsys, *argv)
    assert f"{lock} is not a lock file" in err and not (tmp_path / "elsewhere").exists()
    lock.unlink()
    assert cli(capsys, *argv)[0] == 0


def test_a_lock_file_that_is_a_fifo_is_refused_by_a_run_and_never_blocks_a_dry_run(tmp_path):
    from tests.helpers import IDEAL, write_cassette

    ledger_path = tmp_path / "ledger.sqlite"
    cassette = tmp_path / "c.jsonl"
    write_cassette(cassette, IDEAL)
    argv = ["run", str(SCENARIO_FILE), "--model", f"replay:{cassette}", *ARGS, "--ledger", str(ledger_path), "--repeats"]
    assert _finish(_harness(*argv, "1"))[0] == 0
    lock = lock_folder(ledger_path) / "runs.lock"
    lock.unlink()
    os.mkfifo(lock)
    sentence = f"harness: {lock} is not a lock file (a folder, a symlink or a FIFO); delete it and run again."
    rc, out, err = _finish(_harness(*argv, "2", "--dry-run"), timeout=60)  # before: blocked opening the FIFO
    assert (rc, out, err.strip()) == (1, "", sentence)  # then (helper): "1 to run" while the run refused
    rc, _out, err = _finish(_harness(*argv, "2"), timeout=60)  # before: ran, a FIFO for its lock
    assert rc == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == sentence
    with Ledger(ledger_path, readonly=True) as ledger:
        assert len(ledger.runs_frame()) == 1


def test_a_lock_folder_that_is_a_file_refuses_a_dry_run_as_it_refuses_the_run(tmp_path, capsys):
    """Red team: with `<ledger>.locks` a regular file the run refused (lock_refusal) but the dry run said "1 to run"."""
    from tests.helpers import IDEAL, assert_one_sentence_error, cli, write_cassette

    ledger_path = tmp_path / "ledger.sqlite"
    cassette = tmp_path / "c.jsonl"
    write_cassette(cassette, IDEAL)
    argv = ["run", SCENARIO_FILE, "--model", f"replay:{cassette}", *ARGS, "--ledger", ledger_path, "--repeats"]
    assert cli(capsys, *argv, 1)[0] == 0
    folder = lock_folder(ledger_path)
    shutil.rmtree(folder)
    folder.write_bytes(b"")  # e.g. `harness export --out ledger.sqlite.locks`
    sentence = f"harness: {folder} is not a folder, but the ledger keeps its run locks there; move or remove it and run again.\n"
    rc, out, err = cli(capsys, *argv, 2, "--dry-run")
    assert_one_sentence_error(rc, err)
    assert (rc, out, err) == (1, "", sentence)  # before any plan line
    rc, _out, err = cli(capsys, *argv, 2)  # the real run: the same sentence and exit code
    assert (rc, err.splitlines(keepends=True)[-1]) == (1, sentence)
    rc, out, err = cli(capsys, *argv, 1, "--dry-run")  # nothing to run: no lock taken, as the real run takes none
    assert (rc, err) == (0, "") and "0 to run" in out
    assert folder.is_file() and folder.read_bytes() == b""


def _progress(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("[")]


# newcomer finding: two processes splitting a matrix each stopped their progress at [2/4]; the runs the other took
# were never counted, so neither output looked finished
@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_two_processes_splitting_a_matrix_each_count_it_to_the_end(tmp_path, executor):
    gate = threading.Event()
    with FakeAgentServer(faults=lambda n: gate.wait(120) and None if n <= 2 else None, slots=8) as server:
        args = [str(SCENARIO_FILE), "--model", f"openai:m@{server.base_url}", *ARGS, "--repeats", "4",
                "--executor", executor, "--ledger", str(tmp_path / "ledger.sqlite")]  # fmt: skip
        first = _harness("run", *args, "--jobs", "2")  # takes runs 0 and 1; their first calls wait for the gate
        try:
            _wait_until(
                lambda: server.requests >= 2 or first.poll() is not None, "both runs of the first process to call the model"
            )
            rc, second_out, err = _finish(_harness("run", *args, "--jobs", "1"))  # finds 0 and 1 taken, runs 2 and 3
        finally:
            gate.set()  # a failure above leaves no process waiting 120 s for it
        assert rc == 0, err
        rc, first_out, err = _finish(first)  # finishes 0 and 1, then finds 2 and 3 done
        assert rc == 0, err
    second, first_lines = _progress(second_out), _progress(first_out)
    assert [line[:5] for line in second] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"], second_out
    assert sum(line.endswith("-> running in another process, not run here") for line in second) == 2, second_out
    assert sum(" -> pass " in line for line in second) == 2, second_out
    assert [line[:5] for line in first_lines] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"], first_out
    assert sum(line.endswith("-> done by another process, not run here") for line in first_lines) == 2, first_out
    assert "2 running in another process, skipped" in second_out and "2 already in the ledger, skipped" in first_out
    with Ledger(tmp_path / "ledger.sqlite", readonly=True) as ledger:
        assert sorted(r.outcome for r in ledger.runs()) == ["pass"] * 4 and ledger.verify().ok


def test_a_replaced_lock_file_is_noticed_when_the_next_identity_is_held_in_the_new_one(tmp_path):
    """CI (stop 27): the lock file deleted under a matrix, a second matrix locked the first's next identities in the new
    file before the first reached them; the first saw them only as held elsewhere, never compared files, ran on and
    exited 0."""
    from harness.errors import LedgerSwapped
    from harness.ownership import LOCK_FILE, LockFile

    ledger_path = tmp_path / "ledger.sqlite"
    Ledger(ledger_path).close()
    mine = LockFile(ledger_path)
    held = mine.take("a")  # in the first lock file
    assert held is not None
    (lock_folder(ledger_path) / LOCK_FILE).unlink()
    theirs = take_lock(ledger_path, "b")  # another matrix makes a new lock file and holds b in it
    assert theirs is not None
    with pytest.raises(LedgerSwapped, match="was deleted or replaced while this matrix held run locks in it"):
        mine.take("b")
    theirs.release()
    held.release()


def test_a_deleted_lock_files_number_is_not_given_to_the_new_one_while_the_matrix_runs(tmp_path):
    """Newcomer (stop 28), 2 runs in 8: the first matrix's locks were all released when the lock file was deleted, so the
    file system gave its inode number to the new lock file, and ``(st_dev, st_ino)`` could not tell them apart: the
    matrix ran on and exited 0. The matrix now keeps the first lock file open (not locked) while it runs."""
    from harness.errors import LedgerSwapped
    from harness.ownership import LOCK_FILE, LockFile

    ledger_path = tmp_path / "ledger.sqlite"
    Ledger(ledger_path).close()
    mine = LockFile(ledger_path)
    held = mine.take("a")
    assert held is not None
    first = os.stat(lock_folder(ledger_path) / LOCK_FILE).st_ino
    held.release()  # no run of this matrix holds a lock now
    (lock_folder(ledger_path) / LOCK_FILE).unlink()
    theirs = take_lock(ledger_path, "b")  # the new lock file, made at once (a freed inode is reused first on ext4)
    assert theirs is not None
    assert os.stat(lock_folder(ledger_path) / LOCK_FILE).st_ino != first
    with pytest.raises(LedgerSwapped, match="was deleted or replaced while this matrix held run locks in it"):
        mine.take("c")
    theirs.release()
    again = take_lock(ledger_path, "a")  # the file kept open holds no lock: a releases as before
    assert again is not None
    again.release()
