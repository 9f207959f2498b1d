"""Helpers shared by the command modules: the ``--ledger`` option and default paths, and standard output whose reader may
leave (``harness ... | head``, ``| true``): how to tell, and how to go on without it."""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import sys
from pathlib import Path
from typing import Any, TextIO

__all__ = [
    "Subparsers", "default_scenario", "head_line", "ledger_option", "ledger_path", "point_at_devnull", "say",
    "stdout_reader_gone",
]  # fmt: skip

Subparsers = Any
"""``argparse._SubParsersAction``: private in argparse, so typed loosely here."""


def ledger_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--ledger PATH``."""
    parser.add_argument("--ledger", type=Path, default=None, help="ledger file (default: results/ledger.sqlite)")


def ledger_path(args: argparse.Namespace) -> Path:
    """The ``--ledger`` given, or the default ``results/ledger.sqlite``."""
    from harness.ledger import DEFAULT_LEDGER_PATH

    return args.ledger or DEFAULT_LEDGER_PATH


def default_scenario() -> Path:
    """``scenarios/list_and_report.toml`` under the working folder, else in the checkout the package runs from."""
    from harness.scenarios import DEFAULT_SCENARIO

    if DEFAULT_SCENARIO.exists():
        return DEFAULT_SCENARIO
    return Path(__file__).resolve().parent.parent.parent / DEFAULT_SCENARIO


def head_line(anchor: str) -> str:
    """The closing line of ``harness run`` and ``harness report``: the ledger head to keep outside the ledger."""
    return f"Ledger head (check later with `harness ledger verify --anchor`): {anchor}"


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
