"""The ``processes`` executor's channel under stress: the driver killed, its workers' fate; turns sent as notices.

Real spawned worker processes, real HTTP servers on 127.0.0.1, real SQLite ledgers; each case takes a few seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.fake_agent_server import FakeAgentServer
from tests.helpers import REPO, SCENARIO_FILE


def _harness(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "harness", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip


def _children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]


def _alive(pid: int) -> bool:
    """Running (a zombie left for a reaper that never comes counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_workers_exit_at_once_when_the_driver_is_killed(tmp_path):
    """Found by red25: after a SIGKILL of the driver, each worker lived on until its runs' model calls came back (as long
    as the request timeout), holding the server's slots and then running the replies' tool calls in the sandboxes,
    though nothing it did could be recorded any more."""
    with FakeAgentServer(delay_s=30, slots=4) as server:
        proc = _harness("run", str(SCENARIO_FILE), "--model", f"openai:ideal@{server.base_url}", "--tool-mode", "native",
                        "--repeats", "4", "--temperature", "0", "--jobs", "4", "--ledger", str(tmp_path / "l.sqlite"),
                        "--executor", "processes", "--workers", "2")  # fmt: skip
        deadline = time.monotonic() + 60
        while server.requests < 4:  # both workers have runs waiting on a reply
            assert time.monotonic() < deadline and proc.poll() is None, "the matrix did not start"
            time.sleep(0.02)
        workers = _children(proc.pid)
        proc.kill()
        proc.wait()
        killed = time.monotonic()
        while any(_alive(pid) for pid in workers) and time.monotonic() - killed < 5:
            time.sleep(0.05)
        left = [pid for pid in workers if _alive(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert len(workers) >= 2 and not left
