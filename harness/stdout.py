"""Standard output whose reader may leave (``harness ... | head``, ``| true``): how to tell, and how to go on without it.

The CLI's own module, kept free of the rest of the package so that :mod:`harness.cli` stays quick to import.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
from typing import TextIO

__all__ = ["point_at_devnull", "say", "stdout_reader_gone"]


def stdout_reader_gone() -> bool:
    """Whether ``sys.stdout`` is a pipe whose reading end is closed (``poll`` reports ``POLLERR`` on it).

    False for a terminal, a file, an open pipe, or a ``sys.stdout`` that has no file descriptor.
    """
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def point_at_devnull(stream: TextIO) -> None:
    """Point ``stream``'s file descriptor at ``/dev/null``, so what it still holds is flushed there without an error
    (nothing when it has no descriptor)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)


def say(text: str = "") -> None:
    """Print ``text`` on standard output, or drop it once the output's reader has left: standard output then points at
    ``/dev/null`` and the command goes on, so what it still says on standard error (why runs were skipped) and its exit
    status are those it has without the pipe (``harness run | true``).

    Raises:
        BrokenPipeError: another pipe broke (standard output's reader is still there).
    """
    try:
        print(text)
    except BrokenPipeError:
        if not stdout_reader_gone():
            raise
        point_at_devnull(sys.stdout)
