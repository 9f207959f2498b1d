"""OpenAICompatBackend against a real HTTP server on 127.0.0.1.

Also holds the red-team regression tests for odd server bodies: an infra error or data, recorded
by a run that ends with an outcome.
"""

from __future__ import annotations

import threading
from collections import Counter

import httpx
import pytest

from harness.backends import GenerateOptions, OpenAICompatBackend
from harness.backends.openai_compat import parse_retry_after
from harness.errors import BackendResponseError, BackendTimeout, BackendUnavailable, ModelNotFound
from tests.backend_fakes import FakeServer, closed_port, drop_mid_body, json_reply, raw_reply, slow_json_reply
from tests.helpers import assert_recorded, chat_body, run_server

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "list the files"}]
TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}]
TOOL_CALLS = [{"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}]
TOOL_BODY = {
    "choices": [
        {"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": TOOL_CALLS}}
    ],
    "usage": {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49},
    "system_fingerprint": "b4567-abc",
}
TEXT_BODY = {
    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "done"}}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 2},
}
OPTIONS = GenerateOptions(temperature=0.3, seed=7, max_tokens=64, num_ctx=2048)


def _backend(server: FakeServer, **kwargs) -> OpenAICompatBackend:
    return OpenAICompatBackend("m1", f"{server.url}/v1", **kwargs)


def test_tool_call_reply_and_exact_request_body():
    with FakeServer({("POST", CHAT): json_reply(200, TOOL_BODY)}) as server, _backend(server, api_key="sk-test") as backend:
        reply = backend.generate(MESSAGES, TOOLS, OPTIONS)
    assert server.posts(CHAT) == [
        {
            "model": "m1",
            "messages": MESSAGES,
            "temperature": 0.3,
            "seed": 7,
            "max_tokens": 64,
            "stream": False,
            "tools": TOOLS,
            "parallel_tool_calls": True,
        }
    ]
    assert server.requests[0].headers["Authorization"] == "Bearer sk-test"
    assert reply.tool_calls == TOOL_CALLS
    assert reply.content is None
    assert (reply.finish_reason, reply.prompt_tokens, reply.completion_tokens) == ("tool_calls", 42, 7)
    assert reply.raw == TOOL_BODY
    assert 0 < reply.latency_ms < 5000
    assert reply.identity.server_version == "b4567-abc"
    assert reply.identity.backend == "openai"


def test_content_only_reply_omits_tools_and_auth():
    with FakeServer({("POST", CHAT): json_reply(200, TEXT_BODY)}) as server, _backend(server) as backend:
        reply = backend.generate(MESSAGES, None, OPTIONS)
        backend.generate(MESSAGES, [], OPTIONS)
    bodies = server.posts(CHAT)
    assert all("tools" not in body for body in bodies)
    assert "Authorization" not in server.requests[0].headers
    assert (reply.content, reply.tool_calls, reply.finish_reason) == ("done", None, "stop")
    assert (reply.prompt_tokens, reply.completion_tokens) == (10, 2)


def test_missing_usage_gives_none_tokens():
    body = {"choices": [{"finish_reason": "stop", "message": {"content": "x"}}]}
    with FakeServer({("POST", CHAT): json_reply(200, body)}) as server, _backend(server) as backend:
        reply = backend.generate(MESSAGES, None, OPTIONS)
    assert (reply.prompt_tokens, reply.completion_tokens) == (None, None)


def test_http_500_is_retryable_response_error():
    with FakeServer({("POST", CHAT): json_reply(500, {"error": {"message": "kv cache full"}})}) as server:
        with _backend(server) as backend, pytest.raises(BackendResponseError) as info:
            backend.generate(MESSAGES, None, OPTIONS)
    err = info.value
    assert (err.status_code, err.retry_after_s, err.retryable) == (500, None, True)
    assert str(err) == f"The server at {server.url}/v1 answered HTTP 500 (kv cache full); the server failed; check its log."


def test_http_429_parses_retry_after():
    responder = json_reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "2"})
    with FakeServer({("POST", CHAT): responder}) as server, _backend(server) as backend:
        with pytest.raises(BackendResponseError) as info:
            backend.generate(MESSAGES, None, OPTIONS)
    assert (info.value.status_code, info.value.retry_after_s, info.value.retryable) == (429, 2.0, True)
    assert "rate limiting" in str(info.value)


def test_http_400_is_not_retryable():
    with FakeServer({("POST", CHAT): raw_reply(400, b"bad request", content_type="text/plain")}) as server:
        with _backend(server) as backend, pytest.raises(BackendResponseError) as info:
            backend.generate(MESSAGES, None, OPTIONS)
    assert (info.value.status_code, info.value.retryable) == (400, False)
    assert "(bad request)" in str(info.value)


def test_404_model_not_found():
    body = {"error": {"message": "The model `m1` does not exist", "code": "model_not_found"}}
    with FakeServer({("POST", CHAT): json_reply(404, body)}) as server, _backend(server) as backend:
        with pytest.raises(ModelNotFound) as info:
            backend.generate(MESSAGES, None, OPTIONS)
    assert str(info.value).startswith(f"The server at {server.url}/v1 has no model 'm1'")
    assert info.value.retryable is False


def test_404_without_model_message_is_response_error():
    with FakeServer() as server, _backend(server) as backend:  # no route: "404 page not found"
        with pytest.raises(BackendResponseError) as info:
            backend.generate(MESSAGES, None, OPTIONS)
    assert info.value.status_code == 404
    assert not isinstance(info.value, ModelNotFound)


def test_body_that_is_not_json():
    with FakeServer({("POST", CHAT): raw_reply(200, b"<html>hello</html>", content_type="text/html")}) as server:
        with _backend(server) as backend, pytest.raises(BackendResponseError) as info:
            backend.generate(MESSAGES, None, OPTIONS)
    assert info.value.status_code is None
    assert "not JSON ('<html>hello</html>')" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)


@pytest.mark.parametrize("body", [{"object": "error"}, {"choices": []}, {"choices": [{"message": "x"}]}, [1, 2]])
def test_json_without_choices(body):
    with FakeServer({("POST", CHAT): json_reply(200, body)}) as server, _backend(server) as backend:
        with pytest.raises(BackendResponseError) as info:
            backend.generate(MESSAGES, None, OPTIONS)
    assert info.value.status_code is None


def test_connection_dropped_mid_response():
    with FakeServer({("POST", CHAT): drop_mid_body()}) as server, _backend(server) as backend:
        with pytest.raises(BackendUnavailable) as info:
            backend.generate(MESSAGES, None, OPTIONS)
    assert isinstance(info.value.__cause__, httpx.RemoteProtocolError)
    assert "broke the connection" in str(info.value)


def test_slow_response_times_out():
    with FakeServer() as server:
        server.routes[("POST", CHAT)] = slow_json_reply(5, TEXT_BODY, server.release)
        with _backend(server, timeout_s=0.2) as backend, pytest.raises(BackendTimeout) as info:
            backend.generate(MESSAGES, None, OPTIONS)
    assert (
        str(info.value)
        == f"The server at {server.url}/v1 did not answer completely within 0.2 s; raise --request-timeout or use a smaller model or prompt."
    )
    assert isinstance(info.value.__cause__, httpx.TimeoutException)


def test_connection_refused():
    url = f"http://127.0.0.1:{closed_port()}/v1"
    with OpenAICompatBackend("m1", url) as backend, pytest.raises(BackendUnavailable) as info:
        backend.generate(MESSAGES, None, OPTIONS)
    assert str(info.value) == f"The server at {url} is not reachable; start it, or check the URL in the model spec."
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    # newcomer (this stop): the /v1 hint was given for a URL that ends in /v1; it is kept for one that does not
    bare = url.removesuffix("/v1")
    with OpenAICompatBackend("m1", bare) as backend, pytest.raises(BackendUnavailable) as info:
        backend.generate(MESSAGES, None, OPTIONS)
    assert str(info.value).endswith(
        f"{bare} is not reachable; start it, or check the URL in the model spec (it usually ends in /v1)."
    )


def test_identity_from_props_build_info():
    with FakeServer({("GET", "/props"): json_reply(200, {"build_info": "b5000-deadbeef"})}) as server:
        with _backend(server) as backend:
            identity = backend.identity()
    assert (identity.backend, identity.model, identity.base_url) == ("openai", "m1", f"{server.url}/v1")
    assert (identity.server_version, identity.model_digest) == ("b5000-deadbeef", None)


def test_identity_without_props_is_best_effort():
    with FakeServer() as server, _backend(server) as backend:
        assert backend.identity().server_version is None
    url = f"http://127.0.0.1:{closed_port()}/v1"
    with OpenAICompatBackend("m1", url) as backend, pytest.raises(BackendUnavailable, match="is not reachable"):
        backend.identity()  # nothing listens: the runner skips the model with this one sentence


def test_caller_client_is_not_closed():
    client = httpx.Client()
    with FakeServer({("POST", CHAT): json_reply(200, TEXT_BODY)}) as server:
        with OpenAICompatBackend("m1", f"{server.url}/v1", client=client) as backend:
            assert backend.generate(MESSAGES, None, OPTIONS).content == "done"
    assert not client.is_closed
    client.close()


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("2", 2.0), ("0.5", 0.5), ("-3", 0.0), ("soon", None), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0)],
)
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value) == expected


# -- red-team: odd server bodies inside a run ------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        {"choices": []},
        {"choices": [{"message": None}]},
        {"error": {"message": "model overloaded"}},
        (200, "application/json", b"[1, 2]"),
        (200, "application/json", b"\xff\xfe{"),
        (200, "text/html", b"<html>not json</html>"),
    ],
    ids=["choices-empty", "message-null", "200-with-error", "json-array", "bad-utf8", "html"],
)
def test_guard_odd_server_bodies_are_infra_errors(tmp_path, scenario, body):
    summary, facts = run_server(tmp_path, scenario, [body])
    assert_recorded(summary, facts)
    assert summary.outcome == "infra_error" and summary.error


def test_guard_tool_calls_of_the_wrong_shape_from_a_server_are_data(tmp_path, scenario):
    done = chat_body({"role": "assistant", "content": "done"})
    for i, calls in enumerate(["list_files()", {"function": {"name": "list_files"}}, ["x", 1, None]]):
        summary, facts = run_server(
            tmp_path / str(i), scenario, [chat_body({"role": "assistant", "content": None, "tool_calls": calls}), done]
        )
        assert_recorded(summary, facts)


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_beside_the_content_is_kept(field):
    # vLLM, llama.cpp (--reasoning-format) and SGLang return reasoning_content; newer servers name it reasoning
    body = {
        "choices": [{"message": {"role": "assistant", "content": "Hi.", field: "The user greets me."}, "finish_reason": "stop"}]
    }
    with FakeServer({("POST", CHAT): json_reply(200, body)}) as server, _backend(server) as backend:
        reply = backend.generate(MESSAGES, None, OPTIONS)
    assert (reply.content, reply.reasoning) == ("Hi.", "The user greets me.")
    assert reply.response_dict()["reasoning_content"] == "The user greets me."


def test_reasoning_reaches_the_ledger(tmp_path, scenario):
    body = chat_body({"role": "assistant", "content": "Done.", "reasoning_content": "<tool_call>no</tool_call> maybe"})
    summary, facts = run_server(tmp_path, scenario, [body])
    assert [t.record.reasoning for t in facts["turn_rows"]] == ["<tool_call>no</tool_call> maybe"]
    assert summary.turns == 1


# red-team finding: a server that sends "reasoning_content": null beside "reasoning" lost the reasoning
def test_a_null_reasoning_content_falls_back_to_reasoning():
    message = {"role": "assistant", "content": "Hi.", "reasoning_content": None, "reasoning": "The user greets me."}
    body = {"choices": [{"message": message, "finish_reason": "stop"}]}
    with FakeServer({("POST", CHAT): json_reply(200, body)}) as server, _backend(server) as backend:
        assert backend.generate(MESSAGES, None, OPTIONS).reasoning == "The user greets me."


# red-team finding: a lone surrogate in the messages (echoed from a model's reply) made the request a traceback
def test_text_utf8_cannot_hold_is_sent_as_json_escapes():
    messages = [{"role": "user", "content": "file says \udcff here"}]
    with FakeServer({("POST", CHAT): json_reply(200, TEXT_BODY)}) as server, _backend(server) as backend:
        reply = backend.generate(messages, None, OPTIONS)
    assert reply.content == "done"
    assert server.posts(CHAT)[0]["messages"] == messages  # the server decodes exactly what was sent


def test_each_thread_keeps_its_own_connection_and_close_ends_them():
    threads, calls = 6, 3
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            start.wait(5)  # every thread is in flight at once, as --jobs runs are
            for _ in range(calls):
                backend.generate(MESSAGES, None, OPTIONS)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    with FakeServer({("POST", CHAT): json_reply(200, TEXT_BODY)}) as server, _backend(server) as backend:
        workers = [threading.Thread(target=run) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(10)
        peers = Counter(r.peer for r in server.requests)
        backend.close()
        backend.generate(MESSAGES, None, OPTIONS)  # after close, a thread gets a new client and connection
        after = server.requests[-1].peer
    assert errors == []
    assert sorted(peers.values()) == [calls] * threads  # one connection per thread, reused for all its calls
    assert after not in peers


class _RecordingProxy:
    """A forward HTTP proxy on 127.0.0.1 that answers every request itself with a chat reply and records the request
    line's target (a proxied request names the whole URL)."""

    def __init__(self) -> None:
        import http.server
        import json

        seen: list[str] = []
        headers: list[dict[str, str]] = []
        body = json.dumps(TEXT_BODY).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's method name
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                seen.append(self.path)
                headers.append({k.lower(): v for k, v in self.headers.items()})
                self.send_response(200)
                self.send_header("Set-Cookie", f"AWSALB=sticky{len(seen)}; Path=/")  # a load balancer's sticky session
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.seen, self.headers = seen, headers
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# a chat request goes to the client's own transport directly only when no proxy is set: with HTTP_PROXY it still goes
# through the proxy the environment names, as httpx.Client routes it
def test_a_proxy_set_in_the_environment_still_carries_the_chat_requests(monkeypatch):
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    target = f"http://127.0.0.1:{closed_port()}/v1"  # nothing listens there: only the proxy can answer
    proxy = _RecordingProxy()
    try:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        with OpenAICompatBackend("m1", target) as backend:
            assert backend.generate(MESSAGES, None, OPTIONS).content == "done"
        assert proxy.seen == [f"{target}/chat/completions"]
        monkeypatch.delenv("HTTP_PROXY")
        with OpenAICompatBackend("m1", target) as backend, pytest.raises(BackendUnavailable):
            backend.generate(MESSAGES, None, OPTIONS)  # without it the request goes straight to the target
        assert len(proxy.seen) == 1
    finally:
        proxy.close()


# red team 3: a chat request sent directly kept no cookie while one sent through the client kept a load balancer's, so
# a proxy setting changed what the runs sent; now neither path keeps one
@pytest.mark.parametrize("proxied", [False, True], ids=["direct", "through-a-proxy"])
def test_no_cookie_a_server_sets_is_sent_back_whichever_way_the_requests_go(monkeypatch, proxied):
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    server = _RecordingProxy()
    try:
        target = f"http://127.0.0.1:{closed_port()}/v1" if proxied else f"{server.url}/v1"
        if proxied:
            monkeypatch.setenv("HTTP_PROXY", server.url)
        with OpenAICompatBackend("m1", target) as backend:
            for _ in range(3):
                assert backend.generate(MESSAGES, None, OPTIONS).content == "done"
        assert len(server.seen) == 3 and [h.get("cookie") for h in server.headers] == [None, None, None]
    finally:
        server.close()


# red team 3: a user and password in the URL (the library's API; the CLI refuses such a spec) were dropped when the
# request skipped the client's layers, which send them as Basic auth
def test_a_user_in_the_url_is_still_sent_as_basic_auth(monkeypatch):
    for name in ("ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    server = _RecordingProxy()
    try:
        with OpenAICompatBackend("m1", server.url.replace("http://", "http://user:pw@") + "/v1") as backend:
            assert backend.generate(MESSAGES, None, OPTIONS).content == "done"
        assert server.headers[0]["authorization"] == "Basic dXNlcjpwdw=="  # base64 of user:pw
    finally:
        server.close()


# red team 3: a proxy variable httpx cannot use (a scheme it does not know) was a traceback from deep in a request
def test_a_proxy_in_the_environment_that_cannot_be_used_is_one_sentence(monkeypatch, tmp_path, capsys):
    from tests.helpers import assert_one_sentence_error, cli

    monkeypatch.setenv("HTTP_PROXY", "ftp://127.0.0.1:21")
    server = _RecordingProxy()
    try:
        rc, _, err = cli(capsys, "run", "--model", f"openai:m@{server.url}/v1", "--ledger", tmp_path / "l.sqlite")
    finally:
        server.close()
    assert_one_sentence_error(rc, err)
    assert "the proxy set in the environment cannot be used" in err and "HTTP_PROXY" in err
    assert server.seen == []
