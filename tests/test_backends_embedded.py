"""EmbeddedBackend: fast checks on fake files, and one slow test with the real smollm2 model."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from harness.backends import EmbeddedBackend, GenerateOptions, models
from harness.errors import BackendUnavailable, UsageError

SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_invalid_gguf_fails_to_start_with_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file")
    with EmbeddedBackend(str(bad)) as backend:
        with pytest.raises(BackendUnavailable, match="could not start with .*bad.gguf.*valid GGUF model"):
            backend.generate([{"role": "user", "content": "hi"}], None, GenerateOptions(max_tokens=4))
        assert backend.base_url is None


def test_identity_of_a_path_hashes_the_file_without_starting(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF-fake-weights")
    backend = EmbeddedBackend(str(gguf))
    identity = backend.identity()
    assert identity.backend == "embedded"
    assert identity.model == str(gguf)
    assert identity.model_digest == "sha256:" + hashlib.sha256(b"GGUF-fake-weights").hexdigest()
    assert identity.server_version.startswith("xllamacpp 2")
    assert identity.base_url is None
    backend.close()


@pytest.mark.parametrize(("parallel", "num_ctx"), [(0, 4096), (1, 0)])
def test_bad_sizes(tmp_path, parallel, num_ctx):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(UsageError, match="must both be at least 1"):
        EmbeddedBackend(str(gguf), parallel=parallel, num_ctx=num_ctx)


@pytest.fixture(scope="session")
def real_model_cache():
    """The user's real cache folder, so the 98 MB model is fetched once per machine."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("HARNESS_CACHE", raising=False)
        yield models.cache_dir()


@pytest.mark.slow
def test_real_smollm2_reply_identity_and_shutdown(real_model_cache):
    backend = EmbeddedBackend("smollm2-135m", num_ctx=1024, timeout_s=120)
    try:
        assert backend.model_file == real_model_cache / "SmolLM2-135M-Instruct.Q4_1.gguf"
        reply = backend.generate(
            [{"role": "user", "content": "Say hello."}], None, GenerateOptions(max_tokens=16, temperature=0.0)
        )
        base_url = backend.base_url
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        assert reply.prompt_tokens > 0
        assert 1 <= reply.completion_tokens <= 16
        assert isinstance(reply.content, str) and reply.content
        assert reply.finish_reason in ("stop", "length")
        assert reply.raw["usage"]["completion_tokens"] == reply.completion_tokens
        identity = backend.identity()
        assert identity == reply.identity
        assert (identity.backend, identity.model, identity.model_digest) == (
            "embedded",
            "smollm2-135m",
            f"sha256:{SMOLLM2_SHA256}",
        )
    finally:
        backend.close()
    with pytest.raises(httpx.ConnectError):
        httpx.get(base_url.removesuffix("/v1") + "/health", timeout=5)
    assert backend.base_url is None
