"""Model spec parsing and open_backend.

Also holds a red-team regression test: a malformed URL in a spec is a usage error, not a traceback.
"""

from __future__ import annotations

import re

import pytest

import harness.backends as backends
from harness.backends import (
    EmbeddedBackend,
    OllamaBackend,
    OpenAICompatBackend,
    ReplayBackend,
    open_backend,
    parse_model_spec,
)
from harness.errors import UsageError
from tests.helpers import SCENARIO_FILE, assert_one_sentence_error, cli


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("ollama:qwen2.5-coder:1.5b@http://h:1", ("ollama", "qwen2.5-coder:1.5b", "http://h:1")),
        ("ollama:qwen2.5-coder:1.5b", ("ollama", "qwen2.5-coder:1.5b", None)),
        ("ollama:llama3@gpu-box:11434", ("ollama", "llama3", "http://gpu-box:11434")),
        ("ollama:llama3@gpu-box", ("ollama", "llama3", "http://gpu-box:11434")),
        ("ollama:llama3@http://gpu-box", ("ollama", "llama3", "http://gpu-box")),
        ("openai:m@gpu-box/v1", ("openai", "m", "http://gpu-box/v1")),
        ("openai:gpt-x@http://127.0.0.1:8080/v1/", ("openai", "gpt-x", "http://127.0.0.1:8080/v1")),
        ("openai:org/model:q4@https://api.example/v1", ("openai", "org/model:q4", "https://api.example/v1")),
        ("embedded:smollm2-135m", ("embedded", "smollm2-135m", None)),
        ("embedded:/models/a@b:c.gguf", ("embedded", "/models/a@b:c.gguf", None)),
        ("replay:tests/cassettes/pass.jsonl", ("replay", "tests/cassettes/pass.jsonl", None)),
    ],
)
def test_parse_model_spec(spec, expected):
    assert parse_model_spec(spec) == expected


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "qwen",
        "vllm:m@http://h:1",
        "ollama:",
        "ollama:@http://h:1",
        "ollama:m@",
        "openai:m",
        "openai:m@",
        "openai:@http://h:1/v1",
        "embedded:",
        "replay:",
        "ollama:m@ftp://h:1",
        "openai:m@http://h:notaport/v1",
    ],
)
def test_malformed_specs_are_usage_errors(spec):
    with pytest.raises(UsageError) as info:
        parse_model_spec(spec)
    assert str(info.value) == f"Model spec {spec!r} is not valid; use {backends.SPEC_FORMS}."


@pytest.mark.parametrize(
    ("host", "url"),
    [
        (None, "http://localhost:11434"),
        ("127.0.0.1:9999", "http://127.0.0.1:9999"),
        ("gpu-box", "http://gpu-box:11434"),
        ("https://o.example", "https://o.example"),
    ],
)
def test_ollama_default_url_from_env(monkeypatch, host, url):
    if host is None:
        monkeypatch.delenv("OLLAMA_HOST", raising=False)
    else:
        monkeypatch.setenv("OLLAMA_HOST", host)
    with open_backend("ollama:qwen2.5-coder:1.5b") as backend:
        assert isinstance(backend, OllamaBackend)
        assert (backend.model, backend.base_url) == ("qwen2.5-coder:1.5b", url)
        assert backend.spec == "ollama:qwen2.5-coder:1.5b"


def test_open_openai_api_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-default")
    monkeypatch.setenv("MY_KEY", "sk-mine")
    with open_backend("openai:m@http://h:1/v1", timeout_s=12) as backend:
        assert isinstance(backend, OpenAICompatBackend)
        assert backend._headers == {"Authorization": "Bearer sk-default"}
        assert backend.timeout_s == 12
    with open_backend("openai:m@http://h:1/v1", api_key_env="MY_KEY") as backend:
        assert backend._headers == {"Authorization": "Bearer sk-mine"}
    monkeypatch.delenv("OPENAI_API_KEY")
    with open_backend("openai:m@http://h:1/v1") as backend:
        assert backend._headers == {}
    with pytest.raises(UsageError, match="Environment variable NOPE_KEY"):
        open_backend("openai:m@http://h:1/v1", api_key_env="NOPE_KEY")


def test_open_replay_and_embedded_path(tmp_path):
    cassette = tmp_path / "c.jsonl"
    cassette.write_text('{"content": "x", "tool_calls": null, "finish_reason": "stop"}\n')
    with open_backend(f"replay:{cassette}") as backend:
        assert isinstance(backend, ReplayBackend)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with open_backend(f"embedded:{gguf}", parallel=2, num_ctx=1024) as backend:
        assert isinstance(backend, EmbeddedBackend)
        assert (backend.parallel, backend.num_ctx, backend.base_url) == (2, 1024, None)  # lazy: not started


@pytest.mark.parametrize("host", ["ftp://x:1", "gpu..box"])  # (red team) the latter: UnicodeError at the first request
def test_bad_ollama_host(monkeypatch, host):
    monkeypatch.setenv("OLLAMA_HOST", host)
    with pytest.raises(UsageError, match=f"OLLAMA_HOST='{re.escape(host)}' is not a valid host or URL"):
        open_backend("ollama:m")


def test_embedded_unknown_name(tmp_path):
    with pytest.raises(UsageError, match=r"embedded:nope is neither an existing \.gguf file nor a known model"):
        open_backend("embedded:nope")


def test_all_is_sorted_and_complete():
    assert backends.__all__ == sorted(backends.__all__)
    for name in backends.__all__:
        assert hasattr(backends, name)


@pytest.mark.parametrize("module_name", ["base", "openai_compat", "ollama", "embedded", "replay"])
def test_every_module_exports_what_it_lists(module_name):
    import importlib

    module = importlib.import_module(f"harness.backends.{module_name}")
    assert module.__all__ and all(hasattr(module, name) for name in module.__all__)


# -- red-team ---------------------------------------------------------------------------------------------
# red-team finding: a malformed URL in a model spec was a traceback
@pytest.mark.parametrize(
    "spec",
    [
        "openai:m@http://[::1",
        "ollama:m@http://[zz]:1",
        "openai:m@http://127.0.0.1:9/v\x01",
        "ollama:m@http://h:1/a\x7fb",
        "openai:m@http://a..b:9/v1",
        f"ollama:m@{'h' * 64}.local:9",
    ],
)  # and (red team, stop 29) a control character, which httpx refused only at the first request: a traceback; and
# (red team) an empty host label or one over 63 characters, which the socket module refused there (UnicodeError)
def test_model_spec_with_a_malformed_url_is_a_usage_error(tmp_path, capsys, spec):
    # urllib's urlsplit raises ValueError("Invalid IPv6 URL") out of _normalize_url -> traceback
    with pytest.raises(UsageError):
        parse_model_spec(spec)
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", spec)
    assert_one_sentence_error(rc, err)


# red team (stop 29): a query or fragment was accepted, and the API's paths were appended after it: every request went to
# the wrong path and the error spoke of an HTTP status, not of the URL
@pytest.mark.parametrize("spec", ["openai:m@http://h:8000/v1?x=1", "openai:m@http://h:8000/v1#f", "ollama:m@http://h:1/?"])
def test_a_url_with_a_query_or_fragment_is_one_sentence(capsys, spec, monkeypatch):
    with pytest.raises(UsageError, match="has a query or fragment"):
        parse_model_spec(spec)
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", spec)
    assert_one_sentence_error(rc, err)
    monkeypatch.setenv("OLLAMA_HOST", "localhost:11434/?a")
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", "ollama:m")
    assert_one_sentence_error(rc, err)
    assert "The URL in OLLAMA_HOST has a query or fragment" in err


# red team (stop 29): a password in a model spec's URL was stored in the ledger (model column, base_url, identity payload)
# and printed in error messages; it is refused without being echoed
@pytest.mark.parametrize("spec", ["openai:m@http://user:s3cret@h:8000/v1", "ollama:m@http://user@h:1"])
def test_a_url_with_a_user_name_or_password_is_refused_without_echoing_it(tmp_path, capsys, spec):
    with pytest.raises(UsageError, match="holds a user name or password"):
        parse_model_spec(spec)
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", spec, "--ledger", tmp_path / "l.sqlite")
    assert_one_sentence_error(rc, err)
    assert "s3cret" not in err and not (tmp_path / "l.sqlite").exists()
