"""The sentences of a request that never reached the model server, or whose credentials it refused.

Findings (issue: three user-facing sentences of the HTTP backends):

1. An ``https://`` server whose certificate does not verify (self-signed) was "not reachable; start it, or check
   the URL": it is a certificate ssl could not verify, and the fix is ``SSL_CERT_FILE`` (or ``SSL_CERT_DIR``).
2. HTTP 401 and 403 ended with "check the model name and options": the server refused the key; the sentence names
   the variable the key was read from (never the key), or says that none was sent.
3. With a proxy variable naming a port where nothing listens, the sentence blamed the model server: it names the
   proxy (without its user name or password) and its variable, unless ``NO_PROXY`` sends the request past it.

Real parts only: HTTPS and HTTP servers on 127.0.0.1 (:class:`tests.backend_fakes.FakeServer`), a certificate made
here with ``cryptography``, real ports where nothing listens, real environment variables, a real run and ledger.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import ssl
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from harness.backends import open_backend
from harness.backends.base import GenerateOptions
from harness.errors import BackendResponseError, BackendUnavailable, ServerConfigError
from harness.loop import RunPlan
from tests.backend_fakes import FakeServer, closed_port, json_reply
from tests.helpers import _run_plan

MESSAGES = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
REPLY = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 3, "completion_tokens": 1}}  # fmt: skip
PROXY_NAMES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
SECRET = "sk-test-0123456789abcdef"


@pytest.fixture(autouse=True)
def _no_proxy_settings(monkeypatch):
    """No proxy variable from the machine running the tests: each test sets what it means."""
    for name in PROXY_NAMES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


# -- 1. a certificate that does not verify --------------------------------------------------------------------


def _certificate(folder, *, ends_in_days: int = 30) -> tuple[Path, ssl.SSLContext]:
    """``(PEM file of a self-signed certificate for 127.0.0.1, a server-side TLS context holding it)``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "harness test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=60))
        .not_valid_after(now + datetime.timedelta(days=ends_in_days))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return cert_file, context


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory):
    return _certificate(tmp_path_factory.mktemp("tls"))


def _https(context: ssl.SSLContext) -> FakeServer:
    return FakeServer({("POST", CHAT): json_reply(200, REPLY), ("GET", "/props"): json_reply(200, {})}, tls=context)


def test_a_self_signed_certificate_is_said_to_be_unverified_with_the_variables_that_fix_it(self_signed, monkeypatch):
    _, context = self_signed
    with _https(context) as server:
        url = f"{server.url}/v1"
        with open_backend(f"openai:m@{url}", timeout_s=10) as backend, pytest.raises(ServerConfigError) as info:
            backend.generate(MESSAGES, None, GenerateOptions())
        with open_backend(f"openai:m@{url}", timeout_s=10) as backend, pytest.raises(ServerConfigError) as preflight:
            backend.identity()  # the runner's preflight: one message, the model's runs skipped
    assert str(info.value) == (
        f"The TLS certificate of the server at {url} could not be verified (self-signed certificate); set SSL_CERT_FILE "
        "to a PEM file holding the certificate of the CA that signed it (or SSL_CERT_DIR to a folder of them, with "
        "SSL_CERT_FILE unset)."
    )
    assert "not reachable" not in str(info.value) and info.value.retryable is False  # no retry verifies it
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert str(preflight.value) == str(info.value)
    assert [r.path for r in server.requests] == []  # no request got past the handshake


def test_the_ollama_backend_says_the_same_of_a_certificate(self_signed):
    _, context = self_signed
    with _https(context) as server, open_backend(f"ollama:m@{server.url}", timeout_s=10) as backend:
        with pytest.raises(ServerConfigError, match=r"^The TLS certificate of the server at https://127\.0\.0\.1:\d+ could"):
            backend.generate(MESSAGES, None, GenerateOptions())


def test_with_ssl_cert_file_naming_the_certificate_the_request_succeeds(self_signed, monkeypatch):
    """The sentence's advice works: the backends' TLS context reads SSL_CERT_FILE (made when the backend first sends)."""
    cert_file, context = self_signed
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    with _https(context) as server, open_backend(f"openai:m@{server.url}/v1", timeout_s=10) as backend:
        assert backend.generate(MESSAGES, None, GenerateOptions()).content == "done"
    assert [r.path for r in server.requests] == [CHAT]


def test_a_certificate_for_another_host_or_out_of_date_gets_the_fix_for_that(self_signed, tmp_path, monkeypatch):
    """No trust store fixes these, so the sentence does not send the user to SSL_CERT_FILE."""
    cert_file, context = self_signed
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))
    with _https(context) as server, open_backend(f"openai:m@{server.url.replace('127.0.0.1', 'localhost')}/v1") as backend:
        with pytest.raises(ServerConfigError) as info:
            backend.generate(MESSAGES, None, GenerateOptions())
    assert str(info.value).endswith(
        "could not be verified (Hostname mismatch, certificate is not valid for 'localhost'); give the URL with a host "
        "name the certificate is for."
    )
    expired_file, expired = _certificate(tmp_path, ends_in_days=-1)
    monkeypatch.setenv("SSL_CERT_FILE", str(expired_file))
    with _https(expired) as server, open_backend(f"openai:m@{server.url}/v1") as backend:
        with pytest.raises(ServerConfigError) as info:
            backend.generate(MESSAGES, None, GenerateOptions())
    assert str(info.value).endswith(
        "could not be verified (certificate has expired); renew the server's certificate (or check this machine's clock)."
    )


# -- 2. HTTP 401 and 403: the credentials refused ---------------------------------------------------------------

_REFUSED = {"error": {"message": f"Incorrect API key provided: {SECRET}.", "type": "invalid_request_error"}}


def _refusing(status: int, path: str = CHAT) -> FakeServer:
    return FakeServer({("POST", path): json_reply(status, _REFUSED if status == 401 else {"error": "forbidden"})})


def _refusal(spec: str, **kwargs) -> BackendResponseError:
    with open_backend(spec, timeout_s=10, **kwargs) as backend, pytest.raises(BackendResponseError) as info:
        backend.generate(MESSAGES, None, GenerateOptions())
    assert info.value.retryable is False  # no retry fixes a key
    return info.value


def test_a_401_names_the_variable_the_scenario_named_and_never_the_key(monkeypatch):
    monkeypatch.setenv("MY_KEY", SECRET)
    with _refusing(401) as server:
        error = _refusal(f"openai:m@{server.url}/v1", api_key_env="MY_KEY")
    assert server.requests[0].headers["Authorization"] == f"Bearer {SECRET}"
    assert str(error) == (
        f"The server at {server.url}/v1 answered HTTP 401 (Incorrect API key provided: <the key>.): it refused the API "
        "key read from the environment variable MY_KEY; set MY_KEY to a key it accepts."
    )
    assert error.status_code == 401 and SECRET not in str(error)


def test_a_403_names_openai_api_key_when_the_key_came_from_it(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    with _refusing(403) as server:
        error = _refusal(f"openai:m@{server.url}/v1")
    assert str(error) == (
        f"The server at {server.url}/v1 answered HTTP 403 (forbidden): it refused the API key read from the environment "
        "variable OPENAI_API_KEY; set OPENAI_API_KEY to a key it accepts."
    )


def test_a_401_without_a_key_says_none_was_sent():
    with _refusing(401) as server:
        error = _refusal(f"openai:m@{server.url}/v1")
    assert "Authorization" not in server.requests[0].headers
    assert str(error) == (
        f"The server at {server.url}/v1 answered HTTP 401 (Incorrect API key provided: {SECRET}.): it wants an API key, "
        "and none was sent (OPENAI_API_KEY is not set); export the key and name its variable in the scenario's "
        "api_key_env, or export it as OPENAI_API_KEY."
    )


def test_ollama_behind_a_proxy_that_refuses_the_key_says_so(monkeypatch):
    monkeypatch.setenv("OLLAMA_KEY", SECRET)
    with _refusing(401, "/api/chat") as server:
        named = _refusal(f"ollama:m@{server.url}", api_key_env="OLLAMA_KEY")
        unnamed = _refusal(f"ollama:m@{server.url}")
    assert "it refused the API key read from the environment variable OLLAMA_KEY; set OLLAMA_KEY" in str(named)
    assert str(unnamed).endswith(
        "it wants an API key, and none was sent; export the key and name its variable in the scenario's api_key_env."
    )
    assert SECRET not in str(named)


def test_a_refused_key_ends_the_run_after_one_request(tmp_path, scenario, monkeypatch):
    monkeypatch.setenv("MY_KEY", SECRET)
    with _refusing(401) as server:
        plan = RunPlan(dataclasses.replace(scenario, api_key_env="MY_KEY"), f"openai:m@{server.url}/v1", 0.0)
        with open_backend(plan.model, api_key_env="MY_KEY", timeout_s=5) as backend:
            summary, facts = _run_plan(tmp_path, plan, backend)  # its retry policy allows 2 attempts
    assert summary.outcome == "infra_error" and "refused the API key read from the environment variable MY_KEY" in summary.error
    assert len(server.posts(CHAT)) == 1 and facts["verify"].ok


# -- 3. a proxy where nothing listens -------------------------------------------------------------------------


def _unreachable(spec: str) -> BackendUnavailable:
    with open_backend(spec, timeout_s=10) as backend, pytest.raises(BackendUnavailable) as info:
        backend.generate(MESSAGES, None, GenerateOptions())
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    return info.value


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "ALL_PROXY", "http_proxy"])
def test_a_dead_proxy_is_named_with_its_variable_and_without_its_password(monkeypatch, variable):
    proxy_port, server_port = closed_port(), closed_port()
    monkeypatch.setenv(variable, f"http://user:s3cret@127.0.0.1:{proxy_port}")
    url = f"http://127.0.0.1:{server_port}/v1"
    error = _unreachable(f"openai:m@{url}")
    assert str(error) == (
        f"The proxy at http://127.0.0.1:{proxy_port} named by {variable}, through which requests to the server at {url} "
        f"go, is not reachable; start it, or correct or unset {variable} (or add 127.0.0.1 to NO_PROXY to reach the "
        "server directly)."
    )
    assert "s3cret" not in str(error) and "user" not in str(error)


def test_ollama_blames_the_dead_proxy_too(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", f"127.0.0.1:{closed_port()}")  # no scheme: httpx reads it as http://
    error = _unreachable(f"ollama:m@http://127.0.0.1:{closed_port()}")
    assert str(error).startswith("The proxy at http://127.0.0.1:") and "named by HTTP_PROXY" in str(error)


def test_a_host_in_no_proxy_goes_past_the_proxy_and_the_server_is_blamed(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("NO_PROXY", "example.org, 127.0.0.1")
    url = f"http://127.0.0.1:{closed_port()}/v1"
    assert str(_unreachable(f"openai:m@{url}")) == (
        f"The server at {url} is not reachable; start it, or check the URL in the model spec."
    )


_URLS = ["http://127.0.0.1:8080/v1", "https://api.example.com/v1", "http://sub.internal.example:11434", "http://[::1]:1/v1",
         "http://localhost:8000/v1", "https://example.net:8443/v1"]  # fmt: skip


_NO_PROXIES = ["", "*", "127.0.0.1", "example.com", ".example.com", "internal.example", "::1", "localhost",
               "https://example.net", "all://example.net:8443", "example.org,*", "EXAMPLE.com"]  # fmt: skip


@pytest.mark.parametrize("no_proxy", _NO_PROXIES)
def test_the_proxy_named_is_the_one_httpx_routes_through(monkeypatch, no_proxy):
    """:func:`environment_proxy` mirrors httpx's reading of the environment: checked against httpx's own client (its
    private ``_transport_for_url``, here only to catch a new httpx version routing otherwise)."""
    import os
    import urllib.request

    from harness.backends.server_words import environment_proxy

    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:3128")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3129")
    monkeypatch.setenv("NO_PROXY", no_proxy)
    with httpx.Client() as client:
        for url in map(httpx.URL, _URLS):
            proxied = client._transport_for_url(url) is not client._transport
            named = environment_proxy(url, urllib.request.getproxies(), os.environ)
            assert (named is not None) == proxied, (no_proxy, url)
            if named is not None:
                assert named == (f"{url.scheme.upper()}_PROXY", f"http://127.0.0.1:{3128 if url.scheme == 'http' else 3129}")


def test_harness_run_skips_the_model_of_a_server_whose_certificate_does_not_verify(self_signed, tmp_path, capsys):
    """One sentence before any run, as for a server that is not running, not one infra_error per run."""
    from tests.helpers import RUN_FLAGS, SCENARIO_FILE, cli

    _, context = self_signed
    with _https(context) as server:
        spec = f"openai:x@{server.url}/v1"
        rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", spec, *RUN_FLAGS, "--repeats", "2",
                         "--ledger", tmp_path / "l.sqlite")  # fmt: skip
    assert rc == 1 and f"harness: skipped 2 runs of {spec}: The TLS certificate of the server at " in err, err
    assert server.requests == []
