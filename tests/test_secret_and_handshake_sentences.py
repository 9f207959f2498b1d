"""A red team's findings on the sentences for faults before a model's reply, each test failing before its fix.

* A server quoting the API key in its error text, JSON-escaped (``\\/``, as FastAPI bodies may be) or near the
  200-character cut of a raw body, printed the key: it is blanked before the cut, in every form.
* A TLS handshake failing (a plain HTTP server at an ``https://`` URL), behind a live proxy, said the proxy "is not
  reachable; start it": it says the handshake failed.
* A proxy variable httpx cannot parse (``HTTP_PROXY=http://proxy:notaport``, ``NO_PROXY=[::1]``) was a traceback.
* ``<ledger>.locks`` that this user cannot search made ``harness run --dry-run`` a PermissionError traceback.

Real parts only: servers and a proxy on 127.0.0.1, real environment variables, the real CLI in-process (the last: in
a child process inside a user namespace, so that root meets a permission check).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.backends import open_backend
from harness.backends.base import GenerateOptions
from harness.errors import BackendError, BackendResponseError
from tests.backend_fakes import FakeServer, SocketThreads, accept_connections, raw_reply, relay_sockets
from tests.helpers import RUN_FLAGS, SCENARIO_FILE, cli

KEY = "sk-AbC/dEf+GhIjKlMnOpQrStUvWxYz0123456789"
CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def _no_proxy_settings(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def _refusal(body: bytes, monkeypatch) -> str:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with FakeServer({("POST", CHAT): raw_reply(401, body)}) as server:
        with open_backend(f"openai:m@{server.url}/v1", timeout_s=10) as backend, pytest.raises(BackendResponseError) as info:
            backend.generate(MESSAGES, None, GenerateOptions())
    return str(info.value)


def test_a_json_escaped_key_in_an_error_body_is_blanked(monkeypatch):
    body = b'{"detail": "Invalid API key: ' + KEY.replace("/", "\\/").encode() + b'"}'
    message = _refusal(body, monkeypatch)
    assert "GhIjKlMnOpQrStUvWxYz" not in message and "Invalid API key: <the key>" in message, message


def test_a_key_at_the_snippets_cut_is_blanked_before_the_cut(monkeypatch):
    prefix = "Unauthorized: the key " + "x" * (200 - len("Unauthorized: the key ") - len(KEY) + 1)
    message = _refusal((prefix + KEY + " is not valid").encode(), monkeypatch)
    assert KEY[:5] not in message and "x<the key> is not valid" in message, message  # blanked before the cut


@contextmanager
def _connect_proxy() -> Iterator[str]:
    """A live HTTP CONNECT proxy on 127.0.0.1 relaying bytes both ways; yields its URL."""
    threads, listener = SocketThreads(), socket.create_server(("127.0.0.1", 0))

    def relay(conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head and (piece := conn.recv(4096)):
                head += piece
            host, _, port = head.split(b" ")[1].decode().rpartition(":")
            with socket.create_connection((host, int(port))) as upstream:
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                relay_sockets(conn, upstream, threads.stop)

    threads.start(accept_connections, listener, threads, relay)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        threads.end(listener)


def test_a_tls_handshake_failing_behind_a_live_proxy_says_so_and_does_not_blame_the_proxy(monkeypatch):
    with FakeServer({}) as plain, _connect_proxy() as proxy:  # plain HTTP at an https:// URL: no TLS handshake
        monkeypatch.setenv("HTTPS_PROXY", proxy)
        url = plain.url.replace("http://", "https://")
        with open_backend(f"openai:m@{url}/v1", timeout_s=10) as backend, pytest.raises(BackendError) as info:
            backend.generate(MESSAGES, None, GenerateOptions())
    assert "is not reachable; start it" not in str(info.value), str(info.value)
    assert f"The TLS handshake with the server at {url}/v1 failed (" in str(info.value)
    assert str(info.value).endswith("check that it serves HTTPS there, or give its http:// URL in the model spec.")


@pytest.mark.parametrize("env", [{"HTTP_PROXY": "http://u:pw@127.0.0.1:notaport"},
                                 {"HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": "[::1]"}])  # fmt: skip
def test_a_proxy_variable_httpx_cannot_parse_is_one_sentence(env, monkeypatch, capsys, tmp_path):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", "openai:m@http://127.0.0.1:9/v1", *RUN_FLAGS,
                         "--ledger", tmp_path / "l.sqlite")  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the finding: it escapes main() as a traceback
        pytest.fail(f"traceback: {type(exc).__name__}: {exc}")
    assert rc == 2 and "pw" not in err and "Traceback" not in err, err


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs root and unshare")
def test_a_lock_folder_this_user_cannot_search_is_a_sentence_in_dry_run(tmp_path):
    locks = tmp_path / "l.sqlite.locks"
    locks.mkdir(mode=0o700)
    os.chown(locks, 12345, 12345)  # an owner not mapped in the namespace: root there meets the permission check
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("user namespaces not available")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    argv = [sys.executable, "-m", "harness", "run", "--dry-run", "--ledger", str(tmp_path / "l.sqlite"), str(SCENARIO_FILE)]
    done = subprocess.run(["unshare", "--user", "--map-root-user", *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=False)  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr[-600:]
    assert done.returncode == 1 and done.stderr.strip().endswith(
        f"cannot look into {locks} (Permission denied); give this user access to it, or use another --ledger."
    ), done.stderr


def test_finding_bodies_are_valid_json():
    assert json.loads(b'{"detail": "' + KEY.replace("/", "\\/").encode() + b'"}')["detail"] == KEY
