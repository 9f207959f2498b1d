"""Models from the Hugging Face hub, fetched for real from a local stand-in (tests/hub_standin.py).

``HF_ENDPOINT`` points ``huggingface_hub`` at a threading HTTP server on 127.0.0.1 that serves the cached
SmolLM2 GGUF (98 MB) in the hub's layout; nothing is mocked between the harness, ``huggingface_hub`` and
the socket. ``HARNESS_CACHE`` is a tmp folder per test, and tests/conftest.py gives ``huggingface_hub`` a
tmp ``HF_HOME`` and no telemetry before it is imported, so no user cache is touched and the stand-in sees
only the HEAD and GET requests of the downloads.
"""

from __future__ import annotations

import hashlib
import os

import pytest
from huggingface_hub import constants as hub_constants
from huggingface_hub import file_download  # noqa: F401 - its logger's stderr handler is made now, not under a test's capsys

from harness.backends import EmbeddedBackend, models, parse_model_spec
from harness.backends.embedded import resolve_model
from harness.backends.hub import HubFile, HubSource, model_digest, parse_hub_spec
from harness.backends.ladder import LADDER
from harness.errors import ModelCacheError, UsageError
from tests.helpers import cli
from tests.hub_standin import serving

REPO = "test-org/SmolLM2-GGUF"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
REF = f"hf:{REPO}/{FILE}"
CHUNK = hub_constants.DOWNLOAD_CHUNK_SIZE
"""huggingface_hub writes a download in chunks of this size (10 MiB); a cut keeps the whole chunks received."""


@pytest.fixture(scope="session")
def smollm2_bytes():
    """The SmolLM2 GGUF from the user's model cache (fetched once per machine, as the slow tests do)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("HARNESS_CACHE", raising=False)
        return models.model_path("smollm2-135m").read_bytes()


@pytest.fixture
def hub(tmp_path, monkeypatch, smollm2_bytes):
    """A started stand-in serving SmolLM2 as ``REF``; empty tmp harness and hub caches; no token, not offline."""
    yield from serving(monkeypatch, str(tmp_path / "cache"), REPO, FILE, smollm2_bytes)


def _cached_file(tmp_path, *parts):
    return tmp_path.joinpath("cache", "hf", *REPO.split("/"), "main", *parts)


def _listing(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_pull_downloads_verifies_and_records_the_digest(hub, tmp_path, capsys, smollm2_bytes):
    sha = hashlib.sha256(smollm2_bytes).hexdigest()
    rc, out, err = cli(capsys, "models", "pull", REF)
    target = _cached_file(tmp_path, FILE)
    assert (rc, out) == (0, f"{target}\n"), err
    assert f"downloading {FILE} (98.4 MB) from {REPO} at main for model '{REF}'" in err
    assert f"verified (sha256 {sha}) and cached at {target}" in err
    assert target.read_bytes() == smollm2_bytes
    assert (target.parent / f"{FILE}.sha256").read_text() == f"{sha}  {FILE}\n"
    assert _listing(target.parent) == [FILE, f"{FILE}.sha256"]  # no .incomplete left
    assert [(s.method, s.range, s.sent) for s in hub.served] == [("HEAD", None, 0), ("GET", None, len(smollm2_bytes))]
    # a run records the hub's SHA-256 as the model digest, from the cache: no further request
    backend = EmbeddedBackend(REF)
    assert (backend.model_file, backend.identity().model_digest) == (target, f"sha256:{sha}")
    assert len(hub.served) == 2


def test_a_cut_connection_is_resumed_with_range(hub, tmp_path, smollm2_bytes):
    hub.cut_after = [3 * CHUNK]  # the first GET breaks 31.5 MB into the body
    path, digest = models.resolve(REF, progress=False)
    assert path.read_bytes() == smollm2_bytes and digest == hashlib.sha256(smollm2_bytes).hexdigest()
    first, second = hub.gets()
    assert (first.range, first.sent) == (None, 3 * CHUNK)
    assert (second.range, second.sent) == (f"bytes={3 * CHUNK}-", len(smollm2_bytes) - 3 * CHUNK)


def test_a_failed_pull_keeps_its_bytes_and_the_next_pull_resumes_them(hub, tmp_path, capsys, smollm2_bytes):
    hub.cut_after = [2 * CHUNK] + [0] * 5  # 21 MB, then every retry breaks before any byte: huggingface_hub gives up
    rc, out, err = cli(capsys, "models", "pull", REF)
    last = err.strip().splitlines()[-1]
    assert rc == 1 and out == "" and "Traceback" not in err
    assert last.startswith(
        f"harness: Downloading {FILE} from the Hugging Face hub stopped at {2 * CHUNK} of {len(smollm2_bytes)}"
    )
    assert last.endswith(f"run `harness models pull {REF}` again to resume.")
    folder = _cached_file(tmp_path)
    (partial,) = list(folder.iterdir())
    assert partial.name.startswith(f".{FILE}.") and partial.name.endswith(".incomplete")
    assert partial.stat().st_size == 2 * CHUNK and not (folder / FILE).exists()
    assert [(g.range, g.sent) for g in hub.gets()] == [(None, 2 * CHUNK)] + [(f"bytes={2 * CHUNK}-", 0)] * 5

    before = len(hub.gets())
    rc, out, err = cli(capsys, "models", "pull", REF)
    assert rc == 0, err
    assert f"resuming {FILE} at {2 * CHUNK} of {len(smollm2_bytes)} bytes" in err
    (resumed,) = hub.gets()[before:]
    assert (resumed.range, resumed.sent) == (f"bytes={2 * CHUNK}-", len(smollm2_bytes) - 2 * CHUNK)
    assert (folder / FILE).read_bytes() == smollm2_bytes
    assert _listing(folder) == [FILE, f"{FILE}.sha256"]


def test_checksum_mismatch_is_one_sentence_and_caches_nothing(hub, tmp_path, capsys, smollm2_bytes):
    claimed = hashlib.sha256(b"some other file").hexdigest()
    hub.etags[f"/{REPO}/resolve/main/{FILE}"] = claimed
    rc, out, err = cli(capsys, "models", "pull", REF)
    actual = hashlib.sha256(smollm2_bytes).hexdigest()
    assert rc == 1 and out == "" and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"harness: {FILE} downloaded from {REPO} at main has SHA-256 {actual}, but the Hugging Face hub reports "
        f"{claimed}; nothing was cached, run `harness models pull {REF}` again."
    )
    assert _listing(_cached_file(tmp_path)) == []  # nothing under the final name, no partial bytes, no sidecar
    with pytest.raises(ModelCacheError, match="is not in the cache"):
        models.resolve(REF, fetch=False)


def test_a_file_bigger_than_the_free_disk_is_refused_before_downloading(hub, tmp_path, capsys):
    hub.sizes[f"/{REPO}/resolve/main/{FILE}"] = 10**18  # the hub says 1 EB
    rc, out, err = cli(capsys, "models", "pull", REF)
    assert rc == 1 and "Traceback" not in err and err.count("\n") == 1
    assert err.startswith(f"harness: Model '{REF}' needs 1000000000.0 GB more but ")
    assert "free disk space or set HARNESS_CACHE to a bigger disk." in err
    assert hub.gets() == []


def test_a_verified_file_is_used_offline_with_no_request(hub, tmp_path, monkeypatch, smollm2_bytes):
    path, digest = models.resolve(REF, progress=False)
    hub.stop()  # the endpoint is down: its port refuses connections
    count = len(hub.served)
    assert models.resolve(REF) == (path, digest)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model(REF) == (path, digest)
    assert len(hub.served) == count
    other = "hf:test-org/SmolLM2-GGUF/other.gguf"
    with pytest.raises(ModelCacheError, match=r"is not in the cache .* and HF_HUB_OFFLINE is set; unset it"):
        models.resolve(other)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(
        ModelCacheError, match=r"Could not get other\.gguf in test-org/SmolLM2-GGUF at main from the Hugging Face hub \("
    ):
        models.resolve(other)


def test_a_split_model_is_named_by_its_first_part_and_every_part_lands(hub, tmp_path, smollm2_bytes):
    cuts = [0, 40_000_000, 70_000_000, len(smollm2_bytes)]
    names = [f"smol-q4-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    for name, start, end in zip(names, cuts, cuts[1:], strict=False):
        hub.add(REPO, f"parts/{name}", smollm2_bytes[start:end])
    path, digest = models.resolve(f"hf:{REPO}/parts/{names[0]}", progress=False)
    folder = _cached_file(tmp_path, "parts")
    assert path == folder / names[0]
    assert b"".join((folder / n).read_bytes() for n in names) == smollm2_bytes
    shas = [hashlib.sha256(smollm2_bytes[a:b]).hexdigest() for a, b in zip(cuts, cuts[1:], strict=False)]
    listing = "".join(f"{sha}  {name}\n" for sha, name in zip(shas, names, strict=True))
    assert digest == hashlib.sha256(listing.encode()).hexdigest() == model_digest(list(zip(names, shas, strict=True)))
    assert [s.path.rsplit("/", 1)[1] for s in hub.gets()] == names
    with pytest.raises(UsageError, match=r"part 2 of a split GGUF model; name its first part, smol-q4-00001-of-00003\.gguf"):
        models.resolve(f"hf:{REPO}/parts/{names[1]}")


def _alias_at_standin(hub, smollm2_bytes, *, sha256=None):
    """The real qwen2.5-coder-1.5b-instruct pin (repository, commit, file) with SmolLM2's bytes served in its place."""
    real = models.KNOWN_MODELS["qwen2.5-coder-1.5b-instruct"].hub
    pinned = sha256 or hashlib.sha256(smollm2_bytes).hexdigest()
    hub.add(real.repo, real.files[0].path, smollm2_bytes, revision=real.revision)
    source = HubSource(real.repo, real.revision, (HubFile(real.files[0].path, len(smollm2_bytes), pinned),))
    return models.ModelInfo(
        name="qwen2.5-coder-1.5b-instruct", sha256=pinned, size=len(smollm2_bytes), license="Apache-2.0", hub=source
    )


def test_an_alias_is_pulled_from_its_pinned_repository_and_listed(hub, tmp_path, capsys, monkeypatch, smollm2_bytes):
    info = _alias_at_standin(hub, smollm2_bytes)
    monkeypatch.setitem(models.KNOWN_MODELS, info.name, info)
    rc, out, err = cli(capsys, "models", "pull", info.name)
    assert rc == 0, err
    expected = tmp_path.joinpath("cache", "hf", "Qwen", "Qwen2.5-Coder-1.5B-Instruct-GGUF", info.hub.revision, info.filename)
    assert out == f"{expected}\n" and expected.read_bytes() == smollm2_bytes
    assert hub.gets()[0].path == f"/Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF/resolve/{info.hub.revision}/{info.filename}"
    rc, out, err = cli(capsys, "models", "list")
    row = next(line for line in out.splitlines() if line.startswith(info.name + " "))
    assert row.split()[1:4] == ["98.4", "MB", "yes"]
    assert f"hub Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF@{info.hub.revision[:7]}" in row
    assert resolve_model(info.name) == (expected, info.sha256)


def test_an_alias_whose_pin_the_hub_contradicts_downloads_nothing(hub, tmp_path, capsys, monkeypatch, smollm2_bytes):
    info = _alias_at_standin(hub, smollm2_bytes, sha256="c" * 64)
    monkeypatch.setitem(models.KNOWN_MODELS, info.name, info)
    rc, out, err = cli(capsys, "models", "pull", info.name)
    assert rc == 1 and "Traceback" not in err
    assert f"but the harness pins {'c' * 64} for model '{info.name}'; nothing was downloaded" in err
    assert hub.gets() == [] and not (tmp_path / "cache" / "hf").exists()


def test_a_missing_file_is_one_sentence(hub, capsys):
    rc, out, err = cli(capsys, "models", "pull", f"hf:{REPO}/nope.gguf@v1")
    assert rc == 1 and "Traceback" not in err and err.count("\n") == 1
    assert err.startswith(f"harness: Could not get nope.gguf in {REPO} at v1 from the Hugging Face hub (")
    assert err.endswith(
        f"; check the owner, repository and file names and the revision, then run `harness models pull hf:{REPO}/nope.gguf@v1`.\n"
    )


# newcomer finding: a DNS failure during `harness run` said "check the name" of a known alias, and "run ... pull again"
def test_a_hub_that_cannot_be_reached_is_a_network_hint_in_harness_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://harness-test-host.invalid")  # a reserved name that never resolves
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    for name in ("HF_HUB_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    ledger = tmp_path / "ledger.sqlite"
    rc, out, err = cli(capsys, "run", "--model", "embedded:qwen2.5-coder-1.5b-instruct", "--repeats", "1", "--temperature", "0",
                       "--ledger", ledger)  # fmt: skip
    assert rc != 0 and "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("harness: Could not get qwen2.5-coder-1.5b-instruct-q4_k_m.gguf in Qwen/")
    assert err.endswith(
        "; check your network connection (or HF_ENDPOINT), then run `harness models pull qwen2.5-coder-1.5b-instruct`.\n"
    )
    assert "check the name" not in err and "again" not in err
    assert not ledger.exists()  # the refused start leaves no empty ledger behind


@pytest.mark.parametrize(
    "reference",
    ["hf:a/b", "hf:a/b/model.bin", "hf:a/b/../x.gguf", "hf:a//x.gguf", "hf:a/b/x.gguf@", "hf:a/b/x-00003-of-00004.gguf"],
)
def test_malformed_references_are_usage_errors(reference, capsys):
    with pytest.raises(UsageError):
        parse_model_spec(f"embedded:{reference}")
    rc, out, err = cli(capsys, "models", "pull", reference)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err


def test_parse_hub_spec_forms():
    source = parse_hub_spec("Qwen/Qwen2.5-7B-Instruct-GGUF/qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf@refs/pr/1")
    assert (source.repo, source.revision) == ("Qwen/Qwen2.5-7B-Instruct-GGUF", "refs/pr/1")
    assert [f.path for f in source.files] == [
        "qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf",
        "qwen2.5-7b-instruct-q4_k_m-00002-of-00002.gguf",
    ]
    assert source.folder_parts() == ("hf", "Qwen", "Qwen2.5-7B-Instruct-GGUF", "refs%2Fpr%2F1")
    assert parse_hub_spec("o/r/sub/m.gguf").spec == "hf:o/r/sub/m.gguf@main"
    assert parse_model_spec(f"embedded:{REF}") == ("embedded", REF, None)


def test_the_ladder_is_pinned_and_known():
    names = [entry.name for entry in LADDER]
    assert names == [f"qwen2.5-{kind}{size}-instruct" for kind in ("", "coder-") for size in ("0.5b", "1.5b", "3b", "7b")]
    for entry in LADDER:
        info = models.KNOWN_MODELS[entry.name]
        source = entry.source
        assert source.repo.startswith("Qwen/Qwen2.5-") and source.repo.endswith("-Instruct-GGUF")
        assert len(source.revision) == 40 and int(source.revision, 16) >= 0
        assert all("q4_k_m" in f.path and len(f.sha256) == 64 and f.size > 400_000_000 // len(source.files) for f in source.files)
        assert (info.sha256, info.size, info.hub) == (source.digest, source.size, source)
        assert parse_hub_spec(source.spec[len("hf:") :]).files == tuple(HubFile(f.path) for f in source.files)
    assert len(models.KNOWN_MODELS["qwen2.5-7b-instruct"].hub.files) == 2
    assert models.KNOWN_MODELS["qwen2.5-coder-7b-instruct"].size == 4_683_073_536
    assert os.path.basename(str(models.list_models()[-1].path)) == "qwen2.5-coder-7b-instruct-q4_k_m.gguf"


# a dry run plans a hub file that is not cached from the hub's metadata: one HEAD per file, no download
def test_a_dry_run_learns_an_unpinned_files_digest_without_downloading_it(hub, tmp_path, capsys, monkeypatch, smollm2_bytes):
    from harness.backends import hub_fetch

    sha = hashlib.sha256(smollm2_bytes).hexdigest()
    ledger = tmp_path / "ledger.sqlite"
    rc, out, err = cli(capsys, "run", "--model", f"embedded:{REF}", "--repeats", "1", "--temperature", "0", "--ledger", ledger,
                       "--dry-run")  # fmt: skip
    assert rc == 0, err
    assert out.endswith("1 run planned, 0 already done, 1 to run.\n")
    assert [(s.method, s.sent) for s in hub.served] == [("HEAD", 0)]
    assert _listing(_cached_file(tmp_path)) == [] and not ledger.exists()
    planned = hub_fetch.plan_model(REF)
    assert planned == (_cached_file(tmp_path, FILE), sha)
    assert models.resolve(REF, progress=False) == planned  # the run fetches what was planned: same digest
    count = len(hub.served)
    assert hub_fetch.plan_model(REF) == planned and len(hub.served) == count  # cached now: no request
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelCacheError, match=r"is not in the cache .* and HF_HUB_OFFLINE is set, so its digest is unknown"):
        hub_fetch.plan_model(f"hf:{REPO}/other.gguf")
    assert hub_fetch.plan_model("smollm2-135m") == models.pinned("smollm2-135m")  # a pin needs no request
    assert hub_fetch.plan_model(str(tmp_path / "local.gguf")) is None


def test_a_sidecar_that_names_no_sha256_is_not_trusted_by_a_dry_run_or_a_run(hub, tmp_path, smollm2_bytes):
    from harness.backends import hub_fetch

    sha = hashlib.sha256(smollm2_bytes).hexdigest()
    path, digest = models.resolve(REF, progress=False)
    assert digest == sha
    sidecar = path.parent / f"{FILE}.sha256"
    sidecar.write_text(f"{'Z' * 64}  {FILE}\n")  # tampered: 64 characters, not a SHA-256
    count = len(hub.served)
    assert hub_fetch.plan_model(REF) == (path, sha)  # before: the digest 'ZZZ…', planned from the sidecar
    assert [(s.method, s.sent) for s in hub.served[count:]] == [("HEAD", 0)]  # the hub's word, nothing downloaded
    sidecar.write_text(f"{sha.upper()}  {FILE}\n")
    assert models.resolve(REF, progress=False) == (path, sha)  # before: the upper-case text recorded as the digest
    assert sidecar.read_text() == f"{sha}  {FILE}\n"
