"""The one policy for files and folders the user names on the command line (``--out``, ``--record``).

A user-named output *file* (``harness export --out PATH``) is written so that what the path
is stays what it was:

* a symlink is written through: its target gets the content and the link stays a link (a
  dangling link creates its target);
* a FIFO or a character device (``/dev/stdout``, ``/dev/null``, a terminal) is opened and
  written directly, never replaced (a terminal may get a form of the data made for people:
  ``on_terminal``); so are the descriptor paths ``/dev/stdout``,
  ``/dev/stderr``, ``/dev/fd/N`` and ``/proc/self/fd/N`` whatever they lead to (opened for
  appending, so ``--out /dev/stdout >> all.jsonl`` appends as the shell promised);
* a regular file (or a path that does not exist yet) is replaced atomically: the content goes
  to a temporary file beside it, which is renamed over it only if the path is still a regular
  file or absent at that moment; an existing file keeps its permission bits;
* anything else (a folder, a socket, a block device) is refused with one sentence.

A user-named output *folder* (``harness report --out DIR``, ``harness run --record DIR``) must
be a folder or not exist yet; a path that exists and is not a folder is refused.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from harness.errors import UsageError

__all__ = ["check_output_folder", "write_output_file"]

_DESCRIPTOR_FOLDERS = ("/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/")
_DESCRIPTOR_PATHS = ("/dev/stdout", "/dev/stderr")


def write_output_file(
    path: str | os.PathLike[str], data: bytes, *, option: str = "--out", on_terminal: Callable[[], bytes] | None = None
) -> None:
    """Write ``data`` to the user-named file ``path`` under the policy of this module.

    Args:
        path: the path as the user gave it (relative to the working folder or absolute).
        data: the complete content, bytes.
        option: the option that named the path, used in error sentences (e.g. ``--out``).
        on_terminal: what to write instead when the path opens a terminal (``/dev/tty``, ``/dev/stdout`` on one),
            built only then: people read it, so what a model wrote can be escaped there and only there.

    Raises:
        UsageError: the path is a folder, a socket or a block device, its folder does not
            exist, or the write failed (the sentence carries the system's reason).
        BrokenPipeError: the path is a pipe (or a descriptor path leading to one, ``/dev/stdout | head``) whose
            reader stopped reading: not the user's mistake, so the caller decides (the CLI: quiet, exit 0).
    """
    given = Path(path)
    try:
        if _is_descriptor_path(given):
            _write_in_place(given, data, os.O_WRONLY | os.O_APPEND, on_terminal)
            return
        try:
            mode = os.stat(given).st_mode  # follows symlinks: what the data will really land in
        except FileNotFoundError:
            mode = None
        if mode is not None and (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
            _write_in_place(given, data, os.O_WRONLY, on_terminal)
            return
        if mode is not None and not stat.S_ISREG(mode):
            raise UsageError(
                f"{option} {path} is {_kind(mode)}, not a file; give the path of a regular file, a FIFO or a device."
            )
        _replace_regular(Path(os.path.realpath(given)), data, option, path)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise UsageError(f"cannot write {option} {path}: {exc.strerror or exc}.") from exc


def check_output_folder(path: str | os.PathLike[str], *, option: str) -> None:
    """Refuse a user-named output folder that exists and is not a folder (a missing one is created later).

    Args:
        path: the folder as the user gave it.
        option: the option that named it, used in the error sentence (e.g. ``--record``).

    Raises:
        UsageError: ``path`` exists (or is a dangling symlink) and is not a folder; nothing was written.
    """
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UsageError(f"{option} {path} exists and is not a folder; give a folder path (a missing one is created).")


def _is_descriptor_path(path: Path) -> bool:
    """Whether ``path`` names one of this process's open descriptors (``/dev/stdout``, ``/dev/fd/1``...)."""
    text = os.path.abspath(path)
    return text in _DESCRIPTOR_PATHS or text.startswith(_DESCRIPTOR_FOLDERS)


def _write_in_place(path: Path, data: bytes, flags: int, on_terminal: Callable[[], bytes] | None) -> None:
    """Open an existing FIFO, device or descriptor path and write ``data`` to it (``on_terminal()`` instead when it is
    a terminal); nothing is created or replaced."""
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "wb") as handle:
        handle.write(on_terminal() if on_terminal is not None and handle.isatty() else data)


def _replace_regular(target: Path, data: bytes, option: str, given: str | os.PathLike[str]) -> None:
    """Atomically replace the regular file ``target`` (or create it) with ``data``.

    Raises:
        UsageError: the folder is missing, or ``target`` stopped being a regular file before the rename.
        OSError: the system refused a step.
    """
    if not target.parent.is_dir():
        raise UsageError(f"{option} {given}: the folder {target.parent} does not exist; create it or give another path.")
    try:
        previous = os.lstat(target).st_mode
    except FileNotFoundError:
        previous = None
    tmp_name = target.parent / f".{target.name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        if previous is not None:
            os.chmod(tmp_name, stat.S_IMODE(previous))
        try:
            now = os.lstat(target).st_mode
        except FileNotFoundError:
            now = None
        if now is not None and not stat.S_ISREG(now):
            raise UsageError(f"{option} {given} became {_kind(now)} while it was being written; nothing was replaced.")
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise


def _kind(mode: int) -> str:
    """``mode``'s file type in words: ``a folder``, ``a socket``..."""
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISLNK, "a symlink"))  # fmt: skip
    return next((word for test, word in kinds if test(mode)), "not a regular file")
