"""What a run's start records about where it runs: its scenario file's absolute path, its sandbox folder's real path,
and the process (pid, host). Each is remembered where it can be (per path, per runs folder, per process), so a run
pays for none of them again.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from harness.sandbox import plain_name, real_path_within

__all__ = ["process_facts", "resolved_text", "run_folder", "sandbox_path"]

_RESOLVED: dict[tuple[Path, str | None], str] = {}


def _key(path: Any) -> tuple[Any, str | None]:
    """``path`` and, for a relative one, the working folder it is read in: a memo key of what ``path`` names."""
    return path, None if os.path.isabs(path) else os.getcwd()


def resolved_text(path: Path) -> str:
    """``str(path.resolve())``, remembered per path (and working folder, for a relative one): every run of a
    scenario records its file's absolute path."""
    key = _key(path)
    text = _RESOLVED.get(key)
    if text is None:
        text = _RESOLVED[key] = str(path.resolve())
    return text


_REAL_FOLDERS: dict[tuple[str, str | None], Path] = {}


def sandbox_path(runs_dir: str | os.PathLike[str], run_id: str) -> str:
    """``os.path.realpath(os.path.join(runs_dir, run_id))``, with the runs folder's real path remembered once it exists
    (per folder, and working folder for a relative one): each run then looks at its own folder only (one ``lstat``),
    not at every folder from ``/`` down."""
    folder = os.fspath(runs_dir)
    key = _key(folder)
    real = _REAL_FOLDERS.get(key)
    if real is None:
        text = os.path.realpath(folder)
        if not os.path.isdir(text):  # not made yet (the first run's sandbox makes it): nothing to remember
            return os.path.realpath(os.path.join(folder, run_id))
        real = _REAL_FOLDERS[key] = Path(text)
    return str(real_path_within(real, run_id))


def run_folder(runs_dir: str | os.PathLike[str], run_id: str) -> str:
    """Where to make a run's sandbox with ``Sandbox(path, real=True)``, which records its real path as :attr:`Sandbox.root`.

    The runs folder's remembered real path joined with a plain ``run_id`` (:func:`~harness.sandbox.plain_name`), looking
    at nothing: a folder ``os.mkdir`` makes there is real, and one that was there already (perhaps a symlink) is
    resolved by :class:`~harness.sandbox.Sandbox`. Otherwise (the runs folder not seen yet, or another ``run_id``):
    :func:`sandbox_path`. Either way the sandbox's root is :func:`sandbox_path`'s answer.
    """
    real = _REAL_FOLDERS.get(_key(os.fspath(runs_dir)))
    if real is not None and plain_name(run_id):
        return f"{real}/{run_id}"
    return sandbox_path(runs_dir, run_id)


_PROCESS: dict[str, Any] = {}


def process_facts() -> dict[str, Any]:
    """``{"pid": os.getpid(), "host": socket.gethostname()}`` for a run's config, asked once per process (again in a
    forked child: the answer is dropped at a fork), not twice per run."""
    if not _PROCESS:
        _PROCESS.update(pid=os.getpid(), host=socket.gethostname())
    return _PROCESS


os.register_at_fork(after_in_child=_PROCESS.clear)
