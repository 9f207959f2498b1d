"""Streaming benchmark: the harness's overhead per turn with ``--stream on`` against ``--stream off``.

Run: ``python benchmarks/stream_overhead.py [--runs 60] [--piece-chars 4] [--embedded N]`` (about half a minute on 2
cores, plus about a second per embedded request).

A scripted OpenAI-compatible server on 127.0.0.1 answers instantly with the three replies that pass
``list_and_report`` (a ``list_files`` call, a ``write_file`` call, a final answer): as one JSON body when the
request says ``stream: false``, as server-sent events in llama.cpp's shape (one chunk per ``--piece-chars``
characters of content or arguments, then the finish chunk, the usage chunk and ``[DONE]``) when it says
``stream: true``. Runs alternate between the two settings. Measured per turn: the wall time from the model request
to the turn committed in the ledger (the HTTP exchange, reading and assembling the chunks, classifying, running
the tool, compressing the chunks and writing the row); the overhead is the difference of the medians. Also
printed: chunks per turn and the stored size of a turn's chunks (zlib + base64) against their raw size.

With ``--embedded N``, also N requests of 64 tokens at temperature 0 to the real embedded model (SmolLM2-135M),
alternating the two settings: the median request latency of each, and the time to first token (measured on the
stream, from llama.cpp's ``timings.prompt_ms`` unstreamed) and decode rate of each.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.backends import EmbeddedBackend, GenerateOptions, OpenAICompatBackend  # noqa: E402
from harness.ledger import Ledger  # noqa: E402
from harness.ledger.records import pack_chunks  # noqa: E402
from harness.loop import RunOptions, RunPlan, run_once  # noqa: E402
from harness.scenarios import load_scenario  # noqa: E402

SCENARIO = load_scenario(REPO / "scenarios" / "list_and_report.toml")
REPORT = "There are 3 files:\nconfig.json\nhello.txt\nmemo.md\n"
REPLIES: list[dict[str, Any]] = [
    {"calls": [("list_files", {"path": "."})]},
    {"calls": [("write_file", {"path": "report.txt", "content": REPORT})]},
    {"content": "I wrote report.txt: it lists the 3 files of the folder, one per line, after a count."},
]


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"finish_reason": finish, "index": 0, "delta": delta}], "object": "chat.completion.chunk"}


def _stream(reply: dict[str, Any], size: int) -> list[Any]:
    """llama.cpp's event sequence for one reply."""
    events: list[Any] = [_chunk({"role": "assistant", "content": None})]
    for index, (name, args) in enumerate(reply.get("calls", [])):
        events.append(_chunk({"tool_calls": [{"index": index, "id": f"c{index}", "type": "function",
                                              "function": {"name": name, "arguments": ""}}]}))  # fmt: skip
        events += [
            _chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]}) for p in _pieces(json.dumps(args), size)
        ]
    if "content" in reply:
        events += [_chunk({"content": p}) for p in _pieces(reply["content"], size)]
    events.append(_chunk({}, "tool_calls" if "calls" in reply else "stop"))
    events.append({"choices": [], "usage": {"prompt_tokens": 200, "completion_tokens": len(events)}})
    return [*events, "[DONE]"]


def _body(reply: dict[str, Any]) -> dict[str, Any]:
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
             for i, (n, a) in enumerate(reply.get("calls", []))] or None  # fmt: skip
    message = {"role": "assistant", "content": reply.get("content"), "tool_calls": calls}
    return {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": 200, "completion_tokens": 20}}  # fmt: skip


def _server(size: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle wait between header and body

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:  # noqa: N802
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            turn = sum(1 for m in request["messages"] if m["role"] == "assistant")
            reply = REPLIES[min(turn, len(REPLIES) - 1)]
            if request.get("stream"):
                data = "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in _stream(reply, size))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                for line in data.splitlines(keepends=True):
                    self.wfile.write(line.encode())  # one write per line: the client sees chunks arrive apart
                return
            body = json.dumps(_body(reply)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return httpd


class _Timed(OpenAICompatBackend):
    """Stamps each model request's start."""

    started = 0.0

    def generate(self, messages, tools, options):  # type: ignore[no-untyped-def]
        _Timed.started = time.perf_counter()
        return super().generate(messages, tools, options)


class _TimedLedger(Ledger):
    """Records request-start -> turn-committed, and the turn's chunks."""

    def __init__(self, path: Path, sink: list[tuple[float, Any]]) -> None:
        super().__init__(path)
        self.sink = sink

    def record_turn(self, record, *, defer=False):  # type: ignore[no-untyped-def]  # committed at once: timed to the commit
        super().record_turn(record)
        self.sink.append(((time.perf_counter() - _Timed.started) * 1000, record.stream_chunks))


def measure(folder: Path, *, runs: int, piece_chars: int) -> dict[bool, list[tuple[float, Any]]]:
    """Per-turn times (ms) and chunks, by stream setting; runs alternate between the settings."""
    httpd = _server(piece_chars)
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    turns: dict[bool, list[tuple[float, Any]]] = {False: [], True: []}
    try:
        with _Timed("m", url, timeout_s=30) as backend:
            for i in range(runs * 2 + 2):
                stream = i % 2 == 1
                sink: list[tuple[float, Any]] = []
                with _TimedLedger(folder / "ledger.sqlite", sink) as ledger:
                    plan = RunPlan(SCENARIO, f"openai:m@{url}", 0.0, seed=i, tool_mode="native", stream=stream)
                    summary = run_once(plan, backend, ledger, RunOptions(runs_dir=folder / "runs"))
                assert summary.outcome == "pass", summary
                if i >= 2:  # the first run of each setting warms up
                    turns[stream] += sink
    finally:
        httpd.shutdown()
        httpd.server_close()
    return turns


def embedded(requests: int) -> None:
    """Print the real embedded model's latency, time to first token and decode rate, streamed and not."""
    messages = [{"role": "user", "content": "Write a short paragraph about rivers."}]
    seen: dict[bool, list[Any]] = {False: [], True: []}
    with EmbeddedBackend("smollm2-135m", num_ctx=1024, timeout_s=300) as backend:
        backend.generate(messages, None, GenerateOptions(max_tokens=8))  # load the model first
        for i in range(requests * 2):
            stream = i % 2 == 1
            seen[stream].append(backend.generate(messages, None, GenerateOptions(max_tokens=64, stream=stream)))
    for stream, replies in seen.items():
        med = {k: statistics.median(getattr(r, k) for r in replies) for k in ("latency_ms", "ttft_ms", "decode_tps")}
        print(f"embedded, stream {'on ' if stream else 'off'}: {len(replies)} requests of 64 tokens, median latency "
              f"{med['latency_ms']:.0f} ms, time to first token {med['ttft_ms']:.0f} ms, {med['decode_tps']:.1f} tokens/s")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60, help="runs per setting (3 turns each)")
    parser.add_argument("--piece-chars", type=int, default=4, help="characters per streamed chunk (a token is about 4)")
    parser.add_argument("--embedded", type=int, default=0, metavar="N", help="also N requests per setting to SmolLM2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        turns = measure(Path(tmp), runs=args.runs, piece_chars=args.piece_chars)
    report(turns)
    if args.embedded:
        embedded(args.embedded)
    return 0


def report(turns: dict[bool, list[tuple[float, Any]]]) -> None:
    """Print the medians, the overhead and the storage figures."""
    off = [t for t, _ in turns[False]]
    on = [t for t, _ in turns[True]]
    chunks = [c for _, c in turns[True]]
    raw = statistics.median(len(json.dumps(c)) for c in chunks)
    stored = statistics.median(len(pack_chunks(c)) for c in chunks)
    per_turn = statistics.median(len(c) for c in chunks)
    p_off, p_on = statistics.median(off), statistics.median(on)
    print(f"{len(off)} turns per setting; {per_turn:.0f} chunks per streamed turn (median)")
    print(f"per turn, request to committed row: stream off median {p_off:.2f} ms (p90 {_p90(off):.2f}), "
          f"stream on median {p_on:.2f} ms (p90 {_p90(on):.2f})")  # fmt: skip
    print(f"streaming overhead per turn: {p_on - p_off:+.2f} ms median ({(p_on - p_off) * 1000 / per_turn:.0f} us per chunk)")
    print(f"stored chunks per turn: {stored:.0f} bytes (zlib + base64) for {raw:.0f} bytes of chunk JSON")


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


if __name__ == "__main__":
    sys.exit(main())
