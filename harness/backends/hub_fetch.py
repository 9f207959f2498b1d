"""Fetch GGUF files from the Hugging Face hub into the harness model cache: resumable, verified, with progress.

Requests, all made by ``huggingface_hub`` (its default endpoint, or ``$HF_ENDPOINT`` read at call time):

1. ``HEAD {endpoint}/{repo}/resolve/{revision}/{path}``, through :func:`huggingface_hub.get_hf_file_metadata`:
   the hub answers with the file's LFS SHA-256 (``X-Linked-Etag``), its size (``X-Linked-Size``) and the
   commit (``X-Repo-Commit``).
2. ``GET`` of the same URL (the hub redirects it to its file CDN), through ``huggingface_hub``'s ``http_get``,
   which shows a tqdm progress bar and, when the connection breaks mid-body, asks again for the rest with
   ``Range: bytes=N-`` (up to 5 times).

The bytes go to ``.FILE.<sha256[:16]>.incomplete`` beside the final file, held under an exclusive ``flock``
(a second process pulling the same file gets a clear error, not a corrupt file). A download that fails
or is interrupted leaves that file in place, and the next pull resumes it with ``Range``. When the
bytes are complete the file is hashed; only if its SHA-256 equals the one the hub reports (and the
harness's pin, for a ladder model) is it renamed to its final name and recorded in ``FILE.sha256``.
On a mismatch the partial file is deleted: nothing is left under the final name or for resuming.

A file whose sidecar is present and matches, and that was not modified after the sidecar was written, is
used without any request, so ``HF_HUB_OFFLINE=1``, a down endpoint or no network at all do not matter once a
model is cached; a file modified since is hashed again, and downloaded again unless it still matches.

The server is not trusted to end the body where it said: the download stops at the size the hub reports (a
body that never ends does not fill the disk), and a response that ends short without breaking (an HTML error
page served with status 200) or runs long is discarded rather than kept for resuming. The partial file is
opened without following a symbolic link (a shared cache cannot make a pull write elsewhere).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import logging
import os
import shutil
import socket
from pathlib import Path
from typing import IO, Any, BinaryIO
from urllib.parse import urlsplit

from tqdm import tqdm

from harness.backends import models
from harness.backends.hub import HubFile, HubSource, hub_offline, is_sha256, model_digest
from harness.backends.models import file_sha256, hub_paths, recheck_recorded, recorded_sha256, write_sidecar
from harness.errors import ModelCacheError
from harness.vocab import size_text

__all__ = ["fetch_source", "plan_model", "plan_source"]

_log = logging.getLogger(__name__)
"""Download progress (INFO); the CLI shows it on stderr."""

_METADATA_TIMEOUT_S = 30.0


class _SilentBar(tqdm):
    """A progress bar that never draws (``progress=False``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def fetch_source(source: HubSource, *, label: str, fetch: bool = True, progress: bool = True) -> tuple[Path, str]:
    """Make sure every file of a hub model is verified in the cache; download what is missing.

    Args:
        source: the repository, revision and file(s); pinned sizes and SHA-256 values are enforced.
        label: the name the user gave (an alias or the ``hf:`` reference), quoted in messages.
        fetch: download files that are not cached; if ``False``, raise instead.
        progress: log progress (INFO) and draw ``huggingface_hub``'s progress bar on stderr.

    Returns:
        ``(path of the first file, model digest)`` (:func:`harness.backends.hub.model_digest`).

    Raises:
        ModelCacheError: not cached and ``fetch`` is false or ``HF_HUB_OFFLINE`` is set; the hub cannot be
            reached or has no such file; the hub's SHA-256 or size differs from the pin; the download fails
            (partial bytes are kept for the next pull); the downloaded bytes do not hash to the expected
            SHA-256 (nothing is kept); or the cache folder cannot be written.
    """
    paths = hub_paths(source)
    recorded = [
        recorded_sha256(p, f.sha256, f.size) or recheck_recorded(p, f.sha256, f.size)
        for p, f in zip(paths, source.files, strict=True)
    ]
    missing = [(f, p) for f, p, sha in zip(source.files, paths, recorded, strict=True) if sha is None]
    if missing and not fetch:
        raise ModelCacheError(f"Model '{label}' is not in the cache {paths[0].parent}; run `harness models pull {label}`.")
    if missing and hub_offline():
        raise ModelCacheError(
            f"Model '{label}' is not in the cache {paths[0].parent} and HF_HUB_OFFLINE is set; "
            f"unset it and run `harness models pull {label}` on a machine that can reach the Hugging Face hub."
        )
    for file, path in missing:
        recorded[source.files.index(file)] = _download(source, file, path, label=label, progress=progress)
    digest = model_digest([(f.name, sha or "") for f, sha in zip(source.files, recorded, strict=True)])
    return paths[0], digest


def plan_model(name: str) -> tuple[Path, str] | None:
    """Where a known model or ``hf:`` reference is (or would be) cached and its digest, downloading nothing.

    For planning a run (``--dry-run``): a pinned digest (:func:`harness.backends.models.pinned`, no I/O), else,
    for a hub model (:func:`harness.backends.models.hub_source`, as :func:`~harness.backends.models.resolve` finds
    it), :func:`plan_source`.

    Returns:
        ``(path, digest)``, or ``None`` when ``name`` is neither a known model nor an ``hf:`` reference, or is a
        model shipped in a package without a pinned digest (resolve it instead).

    Raises:
        UsageError: a malformed ``hf:`` reference.
        ModelCacheError: as :func:`plan_source`.
    """
    pin = models.pinned(name)
    if pin is not None:
        return pin
    source = models.hub_source(name)
    return None if source is None else plan_source(source, label=name)


def plan_source(source: HubSource, *, label: str) -> tuple[Path, str]:
    """Where a hub model is (or would be) cached and the digest a fetch would give it, downloading nothing.

    For ``harness run --dry-run``: each file's SHA-256 is its pin, else what its verified cached copy records,
    else what the hub reports for it (one metadata request, as :func:`fetch_source` makes before downloading; the
    download must later hash to that value, so the planned identity is the one the run records).

    Args:
        source: the repository, revision and file(s).
        label: the name the user gave, quoted in messages.

    Returns:
        ``(path of the first file, model digest)`` (:func:`harness.backends.hub.model_digest`).

    Raises:
        ModelCacheError: a file's SHA-256 is neither pinned nor cached and ``HF_HUB_OFFLINE`` is set, or the hub
            cannot be reached, has no such file, or contradicts a pin.
    """
    paths = hub_paths(source)
    shas = []
    for path, file in zip(paths, source.files, strict=True):
        sha = file.sha256 or recorded_sha256(path, None, file.size)
        if sha is None and hub_offline():
            raise ModelCacheError(
                f"Model '{label}' is not in the cache {paths[0].parent} and HF_HUB_OFFLINE is set, so its digest is "
                f"unknown; unset it, or run `harness models pull {label}` on a machine that can reach the Hugging Face hub."
            )
        shas.append(sha or _hub_facts(source, file, label=label, planning=True)[1])
    return paths[0], model_digest([(f.name, sha) for f, sha in zip(source.files, shas, strict=True)])


def _download(source: HubSource, file: HubFile, path: Path, *, label: str, progress: bool) -> str:
    """Download one file to ``path`` (resuming a partial one), verify it, and record its SHA-256; return it."""
    url, expected, size = _hub_facts(source, file, label=label)
    partial = path.with_name(f".{path.name}.{expected[:16]}.incomplete")
    _make_room(partial, size, label=label)
    if progress:
        _log.info(
            "downloading %s (%s) from %s at %s for model '%s'...", file.path, size_text(size), source.repo, source.revision, label
        )
    try:
        # O_NOFOLLOW: a symbolic link planted under the partial's name must not make us append to (or truncate) its target
        descriptor = os.open(partial, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        with open(descriptor, "ab") as sink:
            _lock(sink, file, label=label)
            try:
                _transfer(url, sink, size, name=path.name, label=label, progress=progress)
            except ModelCacheError:
                if os.fstat(sink.fileno()).st_size == 0:  # nothing to resume: leave no empty partial behind
                    partial.unlink(missing_ok=True)
                raise
            sink.flush()
            os.fsync(sink.fileno())
        actual = file_sha256(partial)
    except OSError as exc:
        raise ModelCacheError(
            f"Cannot write {partial} ({exc}); free disk space or set HARNESS_CACHE to a writable folder."
        ) from exc
    if actual != expected:
        partial.unlink(missing_ok=True)
        raise ModelCacheError(
            f"{file.path} downloaded from {source.repo} at {source.revision} has SHA-256 {actual}, but the Hugging Face hub "
            f"reports {expected}; nothing was cached, run `harness models pull {label}` again."
        )
    try:
        os.chmod(partial, 0o644)
        os.replace(partial, path)
        write_sidecar(path, actual)
    except OSError as exc:
        raise ModelCacheError(
            f"Cannot write the model to {path.parent} ({exc}); set HARNESS_CACHE to a writable folder."
        ) from exc
    if progress:
        _log.info("%s verified (sha256 %s) and cached at %s", file.path, actual, path)
    return actual


def _hub_facts(source: HubSource, file: HubFile, *, label: str, planning: bool = False) -> tuple[str, str, int]:
    """Ask the hub for the file's URL, SHA-256 and size; check them against the pins. ``planning``: for a dry run
    (:func:`plan_source`), whose sentence for an unreachable hub says why a plan needs it and what to do.

    Raises:
        ModelCacheError: the hub is unreachable or refuses, reports no SHA-256 or size, or disagrees with a pin; or
            ``HF_ENDPOINT`` is a URL ``huggingface_hub`` cannot even parse (it raises ``ValueError`` at import).
    """
    import httpx2

    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its lazy importer prints the error to stdout too
            from huggingface_hub import get_hf_file_metadata, hf_hub_url
    except ValueError as exc:  # e.g. HF_ENDPOINT=http://[::1 or a port past 65535: urlsplit fails in its constants
        raise ModelCacheError(
            f"HF_ENDPOINT={os.environ.get('HF_ENDPOINT', '')!r} is not a URL ({exc}), so model '{label}' cannot be "
            "looked up on the Hugging Face hub; correct HF_ENDPOINT or unset it."
        ) from exc

    endpoint = os.environ.get("HF_ENDPOINT", "").rstrip("/") or None  # read now: huggingface_hub reads it once, at import
    url = hf_hub_url(source.repo, file.path, revision=source.revision, endpoint=endpoint)
    where = f"{file.path} in {source.repo} at {source.revision}"
    try:
        meta = get_hf_file_metadata(url, timeout=_METADATA_TIMEOUT_S, endpoint=endpoint)
    except (OSError, httpx2.HTTPError) as exc:  # HfHubHTTPError (404, 401, 5xx) and OfflineModeIsEnabled are OSErrors
        cause = _network_cause(exc, url)
        if cause is not None and planning:  # e.g. no network: say why a dry run asks the hub at all
            raise ModelCacheError(
                f"Could not reach the Hugging Face hub ({cause}) to resolve the unpinned model '{label}' ({where}), whose "
                f"SHA-256 the dry run needs and which is not cached; fetch it first with `harness models pull {label}`, "
                "or run where the hub is reachable (check your network connection or HF_ENDPOINT)."
            ) from exc
        raise ModelCacheError(
            f"Could not get {where} from the Hugging Face hub ({cause or _short(exc)}); {_hint(exc, label)}, "
            f"then run `harness models pull {label}`."
        ) from exc
    hub_sha = (meta.etag or "").strip('"').lower()
    if not is_sha256(hub_sha) or not meta.size:
        raise ModelCacheError(
            f"The Hugging Face hub reports no SHA-256 and size for {where} (etag {meta.etag!r}), so it cannot be "
            f"verified; only files stored with Git LFS, as GGUF models are, can be fetched."
        )
    for what, pinned, reported in (("SHA-256", file.sha256, hub_sha), ("size", file.size, meta.size)):
        if pinned is not None and pinned != reported:
            raise ModelCacheError(
                f"The Hugging Face hub reports {what} {reported} for {where}, but the harness pins {pinned} for "
                f"model '{label}'; nothing was downloaded, the harness's model table needs fixing."
            )
    return url, hub_sha, int(meta.size)


def _make_room(partial: Path, size: int, *, label: str) -> None:
    """Create the folder and check it has room for the bytes still missing from ``partial``.

    Raises:
        ModelCacheError: the folder cannot be created, the disk has less free space than is missing, or the file
            is larger than ``huggingface_hub`` downloads in one piece (it would raise a ``ValueError``).
    """
    from huggingface_hub import constants

    try:
        partial.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(partial.parent).free
        have = partial.stat().st_size if partial.exists() else 0
    except OSError as exc:
        raise ModelCacheError(
            f"Cannot create the model cache {partial.parent} ({exc}); set HARNESS_CACHE to a writable folder."
        ) from exc
    missing = max(size - have, 0)
    if free < missing:
        raise ModelCacheError(
            f"Model '{label}' needs {missing / 1e9:.1f} GB more but {partial.parent} has {free / 1e9:.1f} GB free; "
            f"free disk space or set HARNESS_CACHE to a bigger disk."
        )
    if size > constants.MAX_HTTP_DOWNLOAD_SIZE:
        raise ModelCacheError(
            f"Model '{label}' has a file of {size / 1e9:.0f} GB, more than the {constants.MAX_HTTP_DOWNLOAD_SIZE / 1e9:.0f} GB "
            f"huggingface_hub downloads in one piece; use the model split into parts (NAME-00001-of-0000N.gguf) instead."
        )


def _lock(sink: IO[bytes], file: HubFile, *, label: str) -> None:
    try:
        fcntl.flock(sink.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ModelCacheError(
            f"Another process is downloading {file.path} for model '{label}' into the cache; wait for it to finish and try again."
        ) from None


def _transfer(url: str, sink: BinaryIO, size: int, *, name: str, label: str, progress: bool) -> None:
    """Append the missing bytes of ``url`` to ``sink`` (opened for appending), resuming from its current length.

    Raises:
        ModelCacheError: the transfer failed after ``huggingface_hub``'s retries; the bytes so far stay in ``sink``.
    """
    import httpx2
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    have = sink.seek(0, os.SEEK_END)
    if have > size:  # not a prefix of this file: start again
        sink.truncate(0)
        have = 0
    if have:
        _log.info("resuming %s at %d of %d bytes", name, have, size)
    try:
        http_get(
            url,
            _CappedSink(sink, size),  # type: ignore[arg-type]  # the file methods http_get uses
            resume_size=have,
            headers=build_hf_headers(),
            expected_size=size,
            displayed_filename=name,
            tqdm_class=None if progress else _SilentBar,
        )
    except (_TooManyBytes, OSError, httpx2.HTTPError) as exc:
        sink.flush()
        done = sink.tell()
        if isinstance(exc, _TooManyBytes) or _ended_short(exc):  # the hub's answer is not this file: keep none of it
            sink.truncate(0)
            raise ModelCacheError(
                f"The Hugging Face hub sent {'more than' if isinstance(exc, _TooManyBytes) else 'only'} {done} bytes "
                f"of {name} but reports {size}; nothing was kept, run `harness models pull {label}` again."
            ) from exc
        raise ModelCacheError(
            f"Downloading {name} from the Hugging Face hub stopped at {done} of {size} bytes "
            f"({_network_cause(exc, url) or _short(exc)}); "
            f"run `harness models pull {label}` again to resume."
        ) from exc


class _TooManyBytes(Exception):
    """The server sent more bytes than the file's size (not an ``OSError``: ``huggingface_hub`` must not retry it)."""


class _CappedSink:
    """The download's file, refusing to grow past the file's size (a body that never ends must not fill the disk)."""

    def __init__(self, sink: BinaryIO, size: int) -> None:
        self._sink, self._size = sink, size

    def write(self, data: bytes) -> int:
        end = self._sink.tell() + len(data)
        if end > self._size:
            self._sink.write(data[: self._size - self._sink.tell()])
            raise _TooManyBytes(f"{end} bytes or more of {self._size}")
        return self._sink.write(data)

    def __getattr__(self, name: str) -> Any:  # seek, tell, truncate, flush: as the file's
        return getattr(self._sink, name)


def _ended_short(exc: BaseException) -> bool:
    """Whether ``huggingface_hub`` saw a whole response shorter than the file (its size check's plain ``OSError``),
    as an HTML error page served with status 200 is, rather than a broken connection or a disk error."""
    return type(exc) is OSError and exc.errno is None


def _hint(exc: BaseException, label: str) -> str:
    """What to check, by the cause: no answer at all (network, DNS), no such file, a gated repository, or the hub's error."""
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError

    response = getattr(exc, "response", None) if isinstance(exc, HfHubHTTPError) else None
    status = getattr(response, "status_code", None)
    if status is None:  # no HTTP answer: the connection, the name lookup or a timeout failed
        return "check your network connection (or HF_ENDPOINT)"
    if isinstance(exc, GatedRepoError) or status in (401, 403):
        if not label.startswith("hf:"):
            return "set HF_TOKEN to a token that may read the repository (or check HF_ENDPOINT)"
        return "check the owner, repository and file names, and for a gated or private repository set HF_TOKEN"
    if status == 404:
        if label.startswith("hf:"):
            return "check the owner, repository and file names and the revision"
        return f"the hub (or HF_ENDPOINT) has no such file for the known model '{label}'; check HF_ENDPOINT"
    return f"the hub answered HTTP {status}; try again later"


def _network_cause(exc: BaseException, url: str) -> str | None:
    """In words, why no answer came from ``url``'s host: its name does not resolve, it refused the connection, or it
    did not answer in time; None for anything else (an HTTP answer, a disk error), whose own message is shown instead.
    Read from the exception and its causes (``huggingface_hub`` and ``httpx`` wrap the socket's error)."""
    import httpx2

    parts = urlsplit(url)
    host = parts.netloc or url
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, socket.gaierror):
            return f"the host name {parts.hostname or host} could not be resolved"
        if isinstance(seen, ConnectionRefusedError):
            return f"{host} refused the connection"
        if isinstance(seen, (TimeoutError, httpx2.TimeoutException)):
            return f"{host} did not answer in time"
        seen = seen.__cause__ or seen.__context__
    return None


def _short(exc: BaseException) -> str:
    """The first line of an exception's message (``huggingface_hub``'s messages run over several lines)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
