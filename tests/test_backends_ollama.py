"""OllamaBackend against a real HTTP server on 127.0.0.1 imitating Ollama's native API.

The bodies follow ``api/types.go`` of ``ollama/ollama`` (``ChatResponse``: tool calls carry ``id`` and
``function.index``; the ``Metrics`` counts are ``omitempty``); :mod:`tests.server_fakes` and
``tests/test_wire_formats.py`` hold the fakes that also follow ``server/routes.go``.
"""

from __future__ import annotations

import httpx
import pytest

from harness.backends import GenerateOptions, OllamaBackend, open_backend
from harness.backends.ollama import to_ollama_messages
from harness.errors import BackendResponseError, BackendTimeout, BackendUnavailable, ModelNotFound
from tests.backend_fakes import FakeServer, closed_port, drop_mid_body, json_reply, raw_reply, slow_json_reply

CHAT = "/api/chat"
MODEL = "qwen2.5-coder:1.5b"
OPTIONS = GenerateOptions(temperature=0.0, seed=3, max_tokens=128, num_ctx=8192)
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
OLLAMA_CALLS = [{"id": "call_4s1xq0ze", "function": {"index": 0, "name": "read_file", "arguments": {"path": "a.txt"}}}]
TOOL_BODY = {
    "model": MODEL,
    "message": {"role": "assistant", "content": "", "tool_calls": OLLAMA_CALLS},
    "done": True,
    "done_reason": "stop",
    "prompt_eval_count": 120,
    "eval_count": 18,
}
TEXT_BODY = {
    "model": MODEL,
    "message": {"role": "assistant", "content": "hello"},
    "done": True,
    "done_reason": "length",
    "prompt_eval_count": 9,
    "eval_count": 128,
}

CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "read a.txt"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}},
            {"id": "c2", "type": "function", "function": {"name": "ls", "arguments": "{not json"}},
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "alpha"},
    {"role": "tool", "tool_call_id": "zz", "content": "orphan"},
    {"role": "tool", "tool_call_id": "c2", "name": "ls", "content": "a.txt"},
]
EXPECTED_OLLAMA_CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "read a.txt"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "function": {"name": "read_file", "arguments": {"path": "a.txt"}}},
            {"id": "c2", "function": {"name": "ls", "arguments": {}}},
        ],
    },
    {"role": "tool", "content": "alpha", "tool_call_id": "c1", "tool_name": "read_file"},
    {"role": "tool", "content": "orphan", "tool_call_id": "zz"},
    {"role": "tool", "content": "a.txt", "tool_call_id": "c2", "tool_name": "ls"},
]


def test_tool_call_reply_and_exact_request_body():
    with FakeServer({("POST", CHAT): json_reply(200, TOOL_BODY)}) as server:
        with OllamaBackend(MODEL, server.url) as backend:
            reply = backend.generate(CONVERSATION, TOOLS, OPTIONS)
    assert server.posts(CHAT) == [
        {
            "model": MODEL,
            "messages": EXPECTED_OLLAMA_CONVERSATION,
            "stream": False,
            "options": {"temperature": 0.0, "seed": 3, "num_ctx": 8192, "num_predict": 128},
            "tools": TOOLS,
            "truncate": False,
        }
    ]
    assert reply.tool_calls == OLLAMA_CALLS
    assert (reply.content, reply.finish_reason, reply.prompt_tokens, reply.completion_tokens) == ("", "stop", 120, 18)
    assert reply.raw == TOOL_BODY
    assert reply.identity.backend == "ollama"


def test_content_only_reply_omits_tools_but_keeps_options():
    with FakeServer({("POST", CHAT): json_reply(200, TEXT_BODY)}) as server:
        with OllamaBackend(MODEL, server.url) as backend:
            reply = backend.generate([{"role": "user", "content": "hi"}], None, GenerateOptions())
    (body,) = server.posts(CHAT)
    assert "tools" not in body
    assert body["options"] == {"temperature": 0.0, "seed": 0, "num_ctx": 4096, "num_predict": 512}
    assert (reply.content, reply.tool_calls, reply.finish_reason) == ("hello", None, "length")
    assert (reply.prompt_tokens, reply.completion_tokens) == (9, 128)


def test_translation_does_not_modify_input():
    before = repr(CONVERSATION)
    assert to_ollama_messages(CONVERSATION) == EXPECTED_OLLAMA_CONVERSATION
    assert repr(CONVERSATION) == before


def test_model_not_pulled():
    responder = json_reply(404, {"error": f'model "{MODEL}" not found, try pulling it first'})
    with FakeServer({("POST", CHAT): responder}) as server, OllamaBackend(MODEL, server.url) as backend:
        with pytest.raises(ModelNotFound) as info:
            backend.generate([{"role": "user", "content": "hi"}], None, OPTIONS)
    assert str(info.value) == f"Ollama has no model '{MODEL}'; run `ollama pull {MODEL}` first."


def test_500_and_429():
    with FakeServer() as server, OllamaBackend(MODEL, server.url) as backend:
        server.routes[("POST", CHAT)] = json_reply(500, {"error": "llama runner process has terminated"})
        with pytest.raises(BackendResponseError) as info:
            backend.generate([], None, OPTIONS)
        assert info.value.status_code == 500
        assert "llama runner process has terminated" in str(info.value)
        server.routes[("POST", CHAT)] = json_reply(429, {"error": "busy"}, headers={"Retry-After": "2"})
        with pytest.raises(BackendResponseError) as info:
            backend.generate([], None, OPTIONS)
        assert (info.value.status_code, info.value.retry_after_s) == (429, 2.0)


def test_not_json_and_missing_message():
    with FakeServer() as server, OllamaBackend(MODEL, server.url) as backend:
        server.routes[("POST", CHAT)] = raw_reply(200, b"Ollama is running", content_type="text/plain")
        with pytest.raises(BackendResponseError, match="not JSON") as info:
            backend.generate([], None, OPTIONS)
        assert info.value.status_code is None
        server.routes[("POST", CHAT)] = json_reply(200, {"done": True})
        with pytest.raises(BackendResponseError, match="without a 'message' object"):
            backend.generate([], None, OPTIONS)


def test_dropped_and_slow():
    # the dropped connection gets a generous deadline: on a loaded machine the server's thread may take longer than
    # 0.2 s to drop it, and the test must then not see a timeout (newcomer: failed once at load 8-15)
    with FakeServer() as server, OllamaBackend(MODEL, server.url, timeout_s=30) as patient:
        server.routes[("POST", CHAT)] = drop_mid_body(b'{"message": {')
        with pytest.raises(BackendUnavailable):
            patient.generate([], None, OPTIONS)
    with FakeServer() as server, OllamaBackend(MODEL, server.url, timeout_s=0.2) as backend:
        server.routes[("POST", CHAT)] = slow_json_reply(5, TEXT_BODY, server.release)
        with pytest.raises(BackendTimeout):
            backend.generate([], None, OPTIONS)


def test_not_running():
    url = f"http://127.0.0.1:{closed_port()}"
    with OllamaBackend(MODEL, url) as backend:
        with pytest.raises(BackendUnavailable) as info:
            backend.generate([], None, OPTIONS)
        assert str(info.value) == f"Ollama is not running at {url}; start it with `ollama serve` or set OLLAMA_HOST."
        assert isinstance(info.value.__cause__, httpx.ConnectError)
        with pytest.raises(BackendUnavailable):
            backend.identity()


# stop 31's note: the sentence said "or set OLLAMA_HOST" even when the URL came from the spec, where that cannot help
def test_not_running_points_at_where_the_url_came_from(monkeypatch):
    port = closed_port()
    monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{port}")
    sentences = []
    for spec in (f"ollama:{MODEL}", f"ollama:{MODEL}@http://127.0.0.1:{port}"):
        with open_backend(spec) as backend, pytest.raises(BackendUnavailable) as info:
            backend.generate([], None, OPTIONS)
        sentences.append(str(info.value))
    start = f"Ollama is not running at http://127.0.0.1:{port}; start it with `ollama serve` or "
    assert sentences == [start + "set OLLAMA_HOST.", start + "correct the URL in the model spec."]


def test_identity_digest_is_the_manifest_digest_from_tags():
    # /api/tags answers ListModelResponse (api/types.go): "digest" is the hex SHA-256 of the manifest file
    # (manifest/manifest.go), without a prefix; /api/show (ShowResponse) has no digest at all
    tags = {"models": [{"name": "other:latest", "model": "other:latest", "digest": "111"},
                       {"name": "llama3:latest", "model": "llama3:latest", "digest": "222"}]}  # fmt: skip
    routes = {
        ("GET", "/api/version"): json_reply(200, {"version": "0.6.2"}),
        ("POST", "/api/show"): json_reply(200, {"modelfile": "FROM x", "details": {}, "capabilities": ["completion"]}),
        ("GET", "/api/tags"): json_reply(200, tags),
    }
    with FakeServer(routes) as server:
        with OllamaBackend("llama3", server.url) as backend:
            identity = backend.identity()
            assert backend.identity() is identity  # cached
        with OllamaBackend("absent:7b", server.url) as backend:
            assert backend.identity().manifest_digest is None
    assert (identity.server_version, identity.manifest_digest, identity.model_digest) == ("0.6.2", "sha256:222", None)
    assert identity.identity_digest == "sha256:222"  # what a run's identity hashes, as before the rename
    assert (identity.backend, identity.model, identity.base_url) == ("ollama", "llama3", server.url)
    assert server.posts("/api/show") == []  # the digest is never looked for where it is not


def test_identity_after_generate_is_stamped_on_replies():
    routes = {
        ("GET", "/api/version"): json_reply(200, {"version": "0.6.2"}),
        ("GET", "/api/tags"): json_reply(200, {"models": [{"name": MODEL, "model": MODEL, "digest": "feed"}]}),
        ("POST", CHAT): json_reply(200, TEXT_BODY),
    }
    with FakeServer(routes) as server, OllamaBackend(MODEL, server.url) as backend:
        before = backend.generate([], None, OPTIONS).identity
        backend.identity()
        after = backend.generate([], None, OPTIONS).identity
    assert (before.server_version, before.manifest_digest) == (None, None)
    assert (after.server_version, after.manifest_digest) == ("0.6.2", "sha256:feed")


def test_thinking_is_kept_as_reasoning():
    body = {**TEXT_BODY, "message": {"role": "assistant", "content": "Hello!", "thinking": "A greeting; no tool needed."}}
    with FakeServer({("POST", CHAT): json_reply(200, body)}) as server, OllamaBackend(MODEL, server.url) as backend:
        reply = backend.generate([{"role": "user", "content": "hi"}], None, OPTIONS)
    assert (reply.content, reply.reasoning) == ("Hello!", "A greeting; no tool needed.")
