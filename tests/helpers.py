"""Helpers shared by the tests: repository paths, replay-cassette builders, and the red-team harness.

The red-team regression tests spread over the feature test files hold the harness to these rules
(README, "Errors you can cause"; docs/reports.md; docs/scenarios.md):

* bad user input gets one clear sentence and a non-zero exit, never a traceback, and loses
  nothing already recorded (:func:`assert_one_sentence_error`);
* bad model output is data: recorded, never a crash; every started run ends with one of the
  outcomes and the ledger verifies (:func:`assert_recorded`); a matrix runs each planned
  identity once;
* nothing the model sends touches anything outside its run's sandbox;
* reports give correct numbers and markdown that no stored name can break; the same ledger
  gives the same bytes; a review frame depends on the run, not on where you stand;
* a done check gives a verdict in bounded time, and the verdict matches its documented meaning.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO

from harness.backends import open_backend
from harness.cli import main
from harness.ledger import Labels, Ledger
from harness.loop import RetryPolicy, RunOptions, RunPlan, run_once
from harness.vocab import OUTCOMES

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).resolve().parent / "corpus" / "entries"
"""The real-output corpus (``tests/corpus/README.md``)."""
CASSETTES = Path(__file__).resolve().parent / "cassettes"
SCENARIO_FILE = REPO / "scenarios" / "list_and_report.toml"
REPORT = "There are 3 files:\nconfig.json\nhello.txt\nmemo.md\n"
"""A report.txt that passes every check of list_and_report."""
RUN_FLAGS = ["--temperature", "0", "--tool-mode", "native", "--parser", "lenient"]
"""``harness run`` flags that pin the matrix to one cell per model and repetition."""


def function_tool(name: str, description: str, props: dict | None = None, required=()) -> dict:
    """One offered tool in the OpenAI shape: ``{"type": "function", "function": {...}}`` with an object schema."""
    parameters = {"type": "object", "properties": props or {}, "required": list(required)}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


FILE_TOOLS = [
    function_tool(
        "list_files", "List the names of the files in a directory of the working directory.", {"path": {"type": "string"}}
    ),
    function_tool("read_file", "Read a text file from the working directory.", {"path": {"type": "string"}}, ["path"]),
    function_tool(
        "write_file", "Write text to a file.", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]
    ),
]
"""The three file tools the classifier rule tests offer (list, read, write)."""


def reply_modes(content, tools=None, prompt="Do the task.", *, history=None, requires_tool=True, **response) -> set[str]:
    """The failure modes of one reply with ``content`` (and any other ``response`` fields) to a one-line ``prompt``."""
    from harness.classifier import classify

    messages = [{"role": "user", "content": prompt}, *(history or [])]
    reply = {"content": content, **response}
    return set(classify(reply, tools=tools, history=messages, requires_tool=requires_tool).failure_modes)


def write_cassette(path: Path, replies: list[dict]) -> Path:
    """Write replies (cassette line dicts) to a JSONL cassette and return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in replies), encoding="utf-8")
    return path


def call_line(name: str, arguments: dict | str, *, content: str | None = None, tokens: tuple[int, int] = (50, 10)) -> dict:
    """A cassette line holding one structured tool call."""
    return {
        "content": content,
        "tool_calls": [{"function": {"name": name, "arguments": arguments}}],
        "finish_reason": "tool_calls",
        "usage": {"prompt_tokens": tokens[0], "completion_tokens": tokens[1]},
    }


def text_line(content: str | None, *, finish_reason: str = "stop", tokens: tuple[int, int] = (50, 10)) -> dict:
    """A cassette line holding only text."""
    return {
        "content": content,
        "tool_calls": None,
        "finish_reason": finish_reason,
        "usage": {"prompt_tokens": tokens[0], "completion_tokens": tokens[1]},
    }


IDEAL = [
    call_line("list_files", {"path": "."}),
    call_line("write_file", {"path": "report.txt", "content": REPORT}),
    text_line("I wrote report.txt: 3 files."),
]
"""An ideal model's replies for list_and_report: list, write the report, answer."""


# -- one run fed hostile model output ----------------------------------------------------------------
_FAST_RETRY = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05)


def child_pids(pid: int) -> list[int]:
    """The process ids of ``pid``'s children (every thread's, from ``/proc``: Linux only); none once ``pid`` is gone."""
    try:
        return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    except OSError:
        return []


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie left for a reaper that never comes counts as gone; Linux only)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def left_after(pids: list[int], seconds: float) -> list[int]:
    """Those of ``pids`` still running ``seconds`` from now (or once all are gone); they are killed (SIGKILL)."""
    deadline = time.monotonic() + seconds
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in pids if running(pid)]
    for pid in left:
        with suppress(ProcessLookupError):  # it ended meanwhile
            os.kill(pid, signal.SIGKILL)
    return left


def processes_matrix(
    base_url: str, ledger_path: Path, *, repeats: int, jobs: int, stdout: int | IO[str] = subprocess.PIPE
) -> subprocess.Popen[str]:
    """``harness run`` of the reference scenario in a child process, ``--executor processes --workers 2``, against the
    OpenAI-compatible server at ``base_url`` (model ``ideal``, native tools, temperature 0); stderr is piped."""
    argv = [str(SCENARIO_FILE), "--model", f"openai:ideal@{base_url}", "--tool-mode", "native", "--repeats", str(repeats),
            "--temperature", "0", "--jobs", str(jobs), "--ledger", str(ledger_path), "--executor", "processes", "--workers", "2"]  # fmt: skip
    return subprocess.Popen([sys.executable, "-m", "harness", "run", *argv], stdout=stdout, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[str], what: str, timeout: float = 60) -> None:
    """Poll ``condition`` every 10 ms until it holds; fail the test when ``proc`` ends first or ``timeout`` s pass (a
    hang guard, not a speed assertion)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"{what}: the process ended (exit code {proc.returncode}); stderr: {err[-2000:]}")
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.01)


def worker_pids(pid: int) -> list[int]:
    """The worker processes of the ``--executor processes`` driver ``pid`` (multiprocessing's resource tracker aside)."""
    return [c for c in child_pids(pid) if b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()]


def ledger_counts(ledger: Ledger) -> dict[str, int]:
    """Row counts of the runs, turns and run_ends tables."""
    return {t: n for t, n in ledger.row_counts().items() if t in ("runs", "turns", "run_ends")}


def _run_plan(tmp_path, plan, backend):
    """Run one plan; return (summary, ledger facts). Any exception escapes (that is the finding)."""
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        summary = run_once(plan, backend, ledger, RunOptions(runs_dir=tmp_path / "runs", retry=_FAST_RETRY))
        facts = {"verify": ledger.verify(), **ledger_counts(ledger), "turn_rows": ledger.turns(summary.run_id)}
    return summary, facts


def run_replay(tmp_path, scenario, lines, *, raw=False, tool_mode="native", parser="lenient", **changes):
    """Replay cassette lines (dicts, or raw text lines with raw=True) through one run."""
    cassette = tmp_path / "cassette.jsonl"
    if raw:
        cassette.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    else:
        write_cassette(cassette, lines)
    plan = RunPlan(dataclasses.replace(scenario, **changes), f"replay:{cassette}", 0.0, tool_mode=tool_mode, parser=parser)
    with open_backend(plan.model) as backend:
        return _run_plan(tmp_path, plan, backend)


def assert_recorded(summary, facts):
    """The rules for a run fed bad model output: an outcome, an end row, a ledger that verifies."""
    assert summary.outcome in OUTCOMES
    assert facts["run_ends"] == facts["runs"] == 1
    assert facts["verify"].ok, facts["verify"].problem


def chat_body(message, *, finish="stop", usage=None):
    """An OpenAI chat-completions body holding one choice with ``message``."""
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage if usage is not None else {"prompt_tokens": 5, "completion_tokens": 5}}  # fmt: skip


@contextmanager
def odd_server(bodies):
    """A 127.0.0.1 OpenAI-ish server answering POSTs with ``bodies`` in order (the last repeats).

    Each body is a dict (sent as JSON, HTTP 200) or a ``(status, content_type, bytes)`` tuple.
    """
    count = [0]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, status, ctype, data):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            self._send(404, "application/json", b"{}")

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = bodies[min(count[0], len(bodies) - 1)]
            count[0] += 1
            if isinstance(body, dict):
                body = (200, "application/json", json.dumps(body).encode())
            self._send(*body)

    with serve(Handler) as url:
        yield url


@contextmanager
def serve(handler: type[BaseHTTPRequestHandler]):
    """Serve ``handler`` on 127.0.0.1 (a free port) in a thread; yields the ``/v1`` base URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


def structured_writes(files: dict[str, str]) -> dict:
    """A cassette reply holding one structured ``write_file`` call per ``{path: content}``, ids ``c0, c1, ...``."""
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "write_file", "arguments": {"path": path, "content": text}}}
             for i, (path, text) in enumerate(files.items())]  # fmt: skip
    return {
        "content": None,
        "tool_calls": calls,
        "finish_reason": "tool_calls",
        "usage": {"prompt_tokens": 9, "completion_tokens": 9},
    }


def run_server(tmp_path, scenario, bodies, **changes):
    """Run one native-mode run against :func:`odd_server` answering with ``bodies``."""
    with odd_server(bodies) as url:
        plan = RunPlan(dataclasses.replace(scenario, **changes), f"openai:m@{url}", 0.0, tool_mode="native")
        with open_backend(plan.model, timeout_s=5) as backend:
            return _run_plan(tmp_path, plan, backend)


def finished_ledger(tmp_path, scenario) -> Path:
    """A ledger holding one finished, passing run."""
    summary, facts = run_replay(tmp_path, scenario, IDEAL)
    assert summary.outcome == "pass" and facts["verify"].ok
    return tmp_path / "ledger.sqlite"


# -- bad command lines and scenario files ------------------------------------------------------------
def cli(capsys, *argv):
    """Run the CLI in-process; an exception escaping main() is a traceback for the user."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_sentence_error(rc, err):
    """A non-zero exit with one ``harness: ...`` line on stderr and no traceback."""
    assert rc != 0
    assert "Traceback" not in err
    assert err.startswith("harness: ") and err.count("\n") == 1, err


def scenario_toml(tmp_path, *, head_replace=(), fixtures=None, checks=None, matrix="", name="s.toml") -> Path:
    """The reference scenario with some parts swapped out, written to tmp_path/name."""
    text = SCENARIO_FILE.read_text(encoding="utf-8")
    head, rest = text.split("[fixtures]", 1)
    for old, new in head_replace:
        head = head.replace(old, new)
    fixtures_part = "[fixtures]" + rest.split("[[checks]]", 1)[0] if fixtures is None else "[fixtures]\n" + fixtures + "\n"
    checks_part = "[[checks]]" + rest.split("[[checks]]", 1)[1].split("[matrix]", 1)[0] if checks is None else checks + "\n"
    path = tmp_path / name
    path.write_text(head + fixtures_part + checks_part + matrix, encoding="utf-8")
    return path


# -- the transcript viewer (harness view) --------------------------------------------------------------
HOSTILE_TEXT = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
"""Model output that would run as script if a page put it into HTML unescaped."""
HOSTILE_NAME = "<img src=x onerror=window.__pwned=3>.txt"
"""A file name a model chooses, that would run as script if a page put it into HTML unescaped."""
HOSTILE_LABEL = "<svg onload=window.__pwned=6>"
"""A failure-mode label of a hand-appended labels row (not canonical: the file was written by other code)."""


def build_viewer_ledger(folder: Path) -> Path:
    """A ledger of real runs in ``folder``: each scenario's ideal and broken replay cassettes through ``harness run``
    (list_and_report with 2 repetitions, the others 1); sandboxes in ``folder/runs``."""
    path = folder / "ledger.sqlite"
    for scenario in sorted(p.name for p in CASSETTES.iterdir()):
        for kind in ("ideal", "broken"):
            repeats = "2" if scenario == "list_and_report" else "1"
            rc = main(["run", str(REPO / "scenarios" / f"{scenario}.toml"), "--model", f"replay:{CASSETTES / scenario / kind}.jsonl",
                       "--ledger", str(path), "--repeats", repeats, *RUN_FLAGS])  # fmt: skip
            assert rc == 0, f"{scenario} {kind}"
    return path


def build_hostile_ledger(folder: Path) -> Path:
    """A ledger in ``folder`` whose one run (list_and_report, a replay model named by hostile markup) writes a file with
    a hostile name and content through a call recovered from its text, reads it back, then answers with closing
    ``</script>`` tags, ``javascript:`` links and U+2028; a labels row then adds :data:`HOSTILE_LABEL`."""
    cassette = write_cassette(folder / "<img src=x onerror=window.__pwned=7>.jsonl", [
        text_line(json.dumps({"name": "write_file", "arguments": {"path": HOSTILE_NAME, "content": HOSTILE_TEXT + "</script>\u2028"}})),
        call_line("read_file", {"path": HOSTILE_NAME}),
        text_line("</script><script>document.title='pwned'</script> <a href=\"javascript:window.__pwned=4\">click</a>"
                  " [x](javascript:window.__pwned=5) \u2028 done"),
    ])  # fmt: skip
    path = folder / "ledger.sqlite"
    assert (
        main(["run", str(SCENARIO_FILE), "--model", f"replay:{cassette}", "--ledger", str(path), "--repeats", "1", *RUN_FLAGS])
        == 0
    )
    with Ledger(path) as ledger:
        run_id = ledger.runs()[0].run_id
        ledger.record_labels(Labels(run_id=run_id, turn=3, classifier_version="hand", failure_modes=[HOSTILE_LABEL],
                                    recovered_calls=[], recovered_by=None,
                                    details={"evidence": {HOSTILE_LABEL: {"rule": HOSTILE_TEXT, "span": HOSTILE_TEXT}}}))  # fmt: skip
    return path


@contextmanager
def viewer_process(*argv: str):
    """``harness view ARGV`` as a child process (on a free port); yields the address it printed; Ctrl-C at the end."""
    import re
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "harness", "view", *argv], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert found, f"no address printed: {line!r} {proc.stderr.read() if proc.stderr and proc.poll() is not None else ''}"
        yield found.group(0)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 0 and "Traceback" not in err, err  # Ctrl-C stops it cleanly


# -- reports of two executions of one matrix (sharded and merged, or not) ---------------------------------
REPORT_TIMING_COLUMNS = frozenset({"started_at", "ended_at", "latency_ms", "latency_ms_median", "ttft_ms", "decode_tps",
                                   "latency_p50_ms", "latency_p95_ms"})  # fmt: skip
"""Columns of the report's CSV tables that measure time: they differ between any two executions of one matrix."""


def report_csv_rows(path: Path) -> list[dict[str, str]]:
    """A report CSV table's rows without :data:`REPORT_TIMING_COLUMNS` and ``run_id`` (drawn when a run starts, so two
    executions never share one), sorted (a merged ledger holds its runs input by input)."""
    with path.open(newline="", encoding="utf-8") as handle:
        rows = [{k: v for k, v in row.items() if k not in REPORT_TIMING_COLUMNS | {"run_id"}} for row in csv.DictReader(handle)]
    return sorted(rows, key=lambda row: sorted(row.items()))
