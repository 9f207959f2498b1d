"""The per-run sandbox folder and the path rules that confine the tools to it (:mod:`harness.tools` is the tools).

Confinement (nothing the model sends may touch anything outside its run's sandbox): see :mod:`harness.tools`. This
module holds the folder (:class:`Sandbox`), how a model-given path is resolved inside it (:func:`real_path_within`,
:func:`is_within`, :func:`plain_name`) and the unbuffered reads and writes the tools and the checks share.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.errors import ToolError

__all__ = [
    "DEFAULT_WRITE_LIMIT_BYTES",
    "Sandbox",
    "is_within",
    "open_plain",
    "plain_name",
    "read_at_most",
    "real_path_within",
    "write_all",
]

DEFAULT_WRITE_LIMIT_BYTES = 16 * 1024 * 1024


def real_path_within(root: Path, path: str) -> Path:
    """``os.path.realpath(root / path)`` for a ``root`` that is a real path itself (absolute, free of symlinks).

    The result is the same, but only the components below ``root`` are looked at (one ``lstat`` each) instead of
    every folder from ``/`` down, which a sandbox several folders deep pays on every tool call. At the first symlink,
    an absolute ``path`` or a ``..`` that climbs above ``root``, it hands the whole path to ``os.path.realpath``.

    Args:
        root: the real path the relative ``path`` is resolved against (e.g. :attr:`Sandbox.root`).
        path: a path, ``/``-separated.

    Returns:
        The absolute, symlink-free path, as ``os.path.realpath`` (non-strict) gives it.
    """
    if path.startswith("/"):
        return Path(os.path.realpath(path))
    parts: list[str] = []
    base = str(root)
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return Path(os.path.realpath(root / path))
            parts.pop()
            continue
        parts.append(part)
        try:
            link = stat.S_ISLNK(os.lstat(os.path.join(base, *parts)).st_mode)
        except OSError:
            link = False  # as realpath: a missing component is taken as it is
        if link:
            return Path(os.path.realpath(root / path))
    return root.joinpath(*parts)


NO_SUCH_FILE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})
"""The errors with which ``Path.is_file`` says False instead of raising (``pathlib._IGNORED_ERRNOS``)."""


_SEED = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
"""How :meth:`Sandbox.seed` opens a fixture (as ``write_text``, unbuffered)."""


def read_at_most(fd: int, limit: int, size: int | None = None) -> bytes:
    """The bytes of the open file ``fd`` from its offset, up to ``limit`` of them or its end (it stays open).

    What ``os.fdopen(fd, "rb").read(limit)`` gives, without the file object (and its ``fstat``, ``ioctl`` and
    ``lseek``): ``os.read`` until ``limit`` bytes or the end. With ``size``, the regular file's size as ``fstat`` gave it,
    the first read asks for ``size + 1`` bytes: fewer back is the file's end (a regular file's read is short only
    there), so a file that did not grow is read with one ``read``, not two, and no 1 MiB buffer is allocated for it.
    Raises OSError as ``os.read`` does.
    """
    if size is not None and size < limit:
        first = os.read(fd, size + 1)
        if len(first) <= size:
            return first
        return first + read_at_most(fd, limit - len(first))  # it grew since: read on as without the size
    chunks = []
    while limit > 0:
        chunk = os.read(fd, limit)
        if not chunk:
            break
        chunks.append(chunk)
        limit -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to the open file ``fd`` (``os.write`` until none is left; it stays open), as an
    unbuffered file object's ``write`` would, without making one. Raises OSError as ``os.write`` does."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def plain_name(path: str) -> bool:
    """Whether ``path`` names an entry of the folder it is resolved in, itself: not blank, no ``/``, not ``.`` or ``..``,
    no NUL. :func:`real_path_within` gives ``root/path`` for it unless a symlink is there, so opening ``root/path``
    with ``O_NOFOLLOW`` does what opening the resolved path does, without an ``lstat`` first; ``ELOOP`` says a symlink
    is there (then resolve it as any path)."""
    return bool(path.strip()) and "/" not in path and path not in (".", "..") and "\x00" not in path


def open_plain(root: str | os.PathLike[str], rel: str, flags: int, mode: int = 0o666) -> int | None:
    """Open the plain name ``rel`` (:func:`plain_name`) in the folder ``root`` with ``flags | O_NOFOLLOW``.

    Returns:
        The open file descriptor; None when ``rel`` is not a plain name or a symlink is there (``ELOOP``): resolve it
        as any path then (:func:`real_path_within`).

    Raises:
        OSError: as ``os.open`` does otherwise (e.g. ``IsADirectoryError`` for a folder there when writing).
    """
    if not plain_name(rel):
        return None
    try:
        return os.open(f"{root}/{rel}", flags | os.O_NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        return None


def is_within(root: Path, path: Path) -> bool:
    """Whether ``path`` is ``root`` or below it (both absolute and normalized, as :func:`real_path_within` gives them).

    The same as ``path == root or root in path.parents``, compared as text (no ``parents`` sequence is built).
    """
    text, prefix = str(path), str(root)
    return text == prefix or text.startswith(prefix if prefix.endswith("/") else prefix + "/")


class Sandbox:
    """A folder that one run's tools are confined to.

    Args:
        root: the sandbox folder; created if missing.
        write_limit: bytes the run's tools may write in total (every write counts, rewrites too).
        real: ``root`` is a real path already (absolute, normalized, no symlink in it: as ``os.path.realpath`` gives
            it); a folder this call makes there is then taken as it is, without resolving it again.

    Attributes:
        root: the resolved absolute sandbox path.
        escape_attempts: paths refused for pointing outside, in order.
        written: sandbox-relative paths written by tools, in order (duplicates kept once).
        bytes_written: bytes written by tools so far.
        made: this call made the folder (it was not there).
    """

    def __init__(self, root: str | os.PathLike[str], *, write_limit: int = DEFAULT_WRITE_LIMIT_BYTES, real: bool = False):
        self.made = True
        try:
            os.mkdir(root)  # the usual case, a fresh run folder: one system call
        except OSError:  # its parent is missing, or it exists: as Path.mkdir(parents=True, exist_ok=True)
            self.made = not os.path.lexists(root)
            Path(root).mkdir(parents=True, exist_ok=True)
            real = False  # not made here: it may be a symlink
        self.root = Path(root) if real else Path(os.path.realpath(root))
        self.escape_attempts: list[str] = []
        self.written: list[str] = []
        self.write_limit = write_limit
        self.bytes_written = 0

    def discard(self) -> None:
        """Remove the folder again if this sandbox made it and nothing was put in it since (a run that did not start)."""
        if self.made:
            with contextlib.suppress(OSError):
                os.rmdir(self.root)

    def seed(self, files: Mapping[str, str]) -> None:
        """Write fixture files (sandbox-relative path -> text) before the run starts.

        Raises:
            ToolError: a fixture path points outside the sandbox.
        """
        for rel, text in files.items():
            fd = None
            with contextlib.suppress(OSError):  # any failure: resolved as any path below, which raises what it must
                fd = open_plain(self.root, rel, _SEED)
            if fd is None:
                target = self.resolve(rel)
                if target.parent != self.root:  # the root exists
                    target.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(target, _SEED, 0o666)
            try:
                write_all(fd, text.encode("utf-8"))
            finally:
                os.close(fd)

    def resolve(self, path: Any) -> Path:
        """Resolve a model-given path to an absolute path inside the sandbox.

        Args:
            path: the path argument as the model sent it (any type).

        Returns:
            The absolute, symlink-free path inside :attr:`root`.

        Raises:
            ToolError: not a non-empty string, contains NUL, or resolves outside the sandbox
                (``escape_attempt=True``; the attempt is appended to :attr:`escape_attempts`).
        """
        if not isinstance(path, str) or not path.strip():
            raise ToolError(f"path must be a non-empty string, got {json.dumps(path)[:80]}")
        if "\x00" in path:
            raise ToolError("path must not contain NUL bytes")
        candidate = real_path_within(self.root, path)
        if not is_within(self.root, candidate):
            self.escape_attempts.append(path)
            raise ToolError(f"path {path!r} is outside the working directory; use paths relative to it", escape_attempt=True)
        return candidate

    def relative(self, path: Path) -> str:
        """Return ``path`` relative to the sandbox root, with ``/`` separators."""
        text, root = str(path), str(self.root)
        if text == root:
            return "."
        if text.startswith(root + "/"):
            return text[len(root) + 1 :]
        return path.relative_to(self.root).as_posix()  # raises ValueError: not below the root

    def hide_root(self, text: str) -> str:
        """``text`` (an error message for the model) with the sandbox's absolute path shown relative to it.

        ``'/host/results/runs/abc/a.txt'`` becomes ``'a.txt'`` and the root itself ``'.'``, so
        the model never learns where on the host its sandbox lives.
        """
        root = str(self.root)
        return text.replace(root + os.sep, "").replace(root, ".")
