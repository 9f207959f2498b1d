"""A run's sandbox as the viewer shows it: its final files, read-only, never following a link out of the folder.

The sandbox folder is the one the run recorded (``runs.sandbox``, e.g. ``results/runs/<run_id>``). A model chooses
the names and contents of the files in it, so: the folder itself must be a real folder (not a symbolic link);
symbolic links inside it are listed as links and never followed; every file read must resolve to a path inside the
folder; at most :data:`MAX_FILES` files and :data:`MAX_BYTES` bytes of each are read.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_BYTES", "MAX_FILES", "SandboxFile", "SandboxListing", "sandbox_files"]

MAX_FILES = 200
"""Files listed at most (the rest are counted)."""
MAX_BYTES = 65536
"""Bytes of a file shown at most."""


@dataclass(frozen=True)
class SandboxFile:
    """One entry of a sandbox: ``path`` relative to the sandbox (``/``-separated), ``size`` in bytes, ``kind``
    (``text``, ``binary``, ``link`` or ``other``), ``text`` (the first :data:`MAX_BYTES` bytes decoded as UTF-8 with
    replacement, for ``text``) and ``cut`` (True when the file is longer than what is shown)."""

    path: str
    size: int
    kind: str
    text: str = ""
    cut: bool = False


@dataclass(frozen=True)
class SandboxListing:
    """The sandbox's files (sorted by path), ``note`` (why nothing is shown, or None) and ``more`` (entries past
    :data:`MAX_FILES`, not listed)."""

    files: list[SandboxFile]
    note: str | None = None
    more: int = 0


def _shown(name: str) -> str:
    """A file system name as text a page can carry: bytes that are not UTF-8 (a model can create such names; Python
    hands them over as lone surrogates, which cannot be encoded) become U+FFFD."""
    return os.fsencode(name).decode("utf-8", "replace")


def _read(path: Path, root: Path, rel: str) -> SandboxFile:
    info = os.lstat(path)
    rel = _shown(rel)
    if stat.S_ISLNK(info.st_mode):
        return SandboxFile(rel, info.st_size, "link", "symbolic link to " + _shown(os.readlink(path)) + " (not followed)")
    if not stat.S_ISREG(info.st_mode) or not Path(os.path.realpath(path)).is_relative_to(root):
        return SandboxFile(rel, info.st_size, "other")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_BYTES + 1)
    cut = len(data) > MAX_BYTES
    data = data[:MAX_BYTES]
    if b"\x00" in data[:8192]:
        return SandboxFile(rel, info.st_size, "binary", cut=cut)
    return SandboxFile(rel, info.st_size, "text", data.decode("utf-8", "replace"), cut)


def sandbox_files(folder: Path) -> SandboxListing:
    """List and read a run's sandbox (see the module docstring); never raises for a missing or odd folder."""
    try:
        if folder.is_symlink() or not folder.is_dir():
            return SandboxListing([], f"the sandbox folder {folder} is not there (or is not a plain folder); nothing to show.")
        root = Path(os.path.realpath(folder))
        entries: list[tuple[Path, str]] = []
        for here, dirs, names in os.walk(root, followlinks=False):
            dirs.sort()
            for name in [*names, *(d for d in dirs if os.path.islink(os.path.join(here, d)))]:
                full = Path(here) / name
                entries.append((full, full.relative_to(root).as_posix()))
        entries.sort(key=lambda e: e[1])
        files = [_read(full, root, rel) for full, rel in entries[:MAX_FILES]]
        return SandboxListing(files, None, max(0, len(entries) - MAX_FILES))
    except OSError as exc:
        return SandboxListing([], f"the sandbox folder {folder} cannot be read ({exc.strerror or exc}).")
