"""The ``harness`` command line: a thin shell over library calls.

Each command is one ``_cmd_<noun>_<verb>`` function in the module of its group (``run``, ``data``,
``inputs``, ``reports``, ``view``), registered in :func:`build_parser`.
Errors are turned into one sentence and an exit code in one place, :func:`main`:
``HarnessError`` -> exit 1 (or 2 for usage errors), never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import select
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

from harness.cli.data import add_export, add_ledger, add_rescore
from harness.cli.inputs import add_classify, add_models, add_scenarios
from harness.cli.reports import add_attest, add_compare, add_report, add_review
from harness.cli.run import add_run
from harness.cli.view import add_view
from harness.errors import HarnessError, UsageError
from harness.vocab import printable

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="harness",
        description="Benchmark how LLM agent loops break, model by model.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in (add_run, add_ledger, add_export, add_scenarios, add_models, add_classify, add_rescore, add_report,
                add_compare, add_review, add_attest, add_view):  # fmt: skip
        add(sub)
    return parser


class _StderrHandler(logging.Handler):
    """Writes each record to the current ``sys.stderr`` as ``harness: <message>``."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"harness: {record.getMessage()}", file=sys.stderr, flush=True)


def _show_library_messages() -> None:
    """Show the library's INFO messages (e.g. model download progress) on stderr; the library itself never prints."""
    log = logging.getLogger("harness")
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        log.addHandler(_StderrHandler())
    log.setLevel(logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code (0 ok, 1 failure, 2 usage error).

    Standard output is written through :class:`_Output` and flushed before returning, so output that cannot be written
    (a full disk, ``/dev/full``, characters its encoding lacks) is one sentence and exit 1, never a traceback.
    """
    if isinstance(sys.stderr, io.TextIOWrapper):  # the sentences are for people: a character it lacks is escaped
        sys.stderr.reconfigure(errors="backslashreplace")
    stdout, sys.stdout = sys.stdout, _Output(sys.stdout)
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit:  # --help, or a usage error: argparse printed, maybe to a buffer not yet written
            sys.stdout.flush()
            raise
        _show_library_messages()
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, not at the interpreter's exit: a failure is still one sentence
        return code
    except UsageError as exc:  # escaped: a server's or a file's words may be in the sentence
        print(f"harness: {printable(str(exc))}", file=sys.stderr)
        return 2
    except HarnessError as exc:
        print(f"harness: {printable(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("harness: interrupted; everything finished so far is in the ledger.", file=sys.stderr)
        return 130
    except BrokenPipeError as exc:
        return broken_pipe_exit(exc)
    except _OutputFailed as failed:
        print(f"harness: {failed.sentence}", file=sys.stderr)
        with contextlib.suppress(OSError, ValueError):  # the interpreter's last flush must not fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())
        return 1
    finally:
        sys.stdout = stdout


class _OutputFailed(Exception):
    """Writing to standard output failed; ``sentence`` says why and what to do (nothing recorded is lost)."""

    def __init__(self, exc: OSError | UnicodeEncodeError, encoding: str | None) -> None:
        super().__init__(exc)
        if isinstance(exc, UnicodeEncodeError):  # never written escaped: JSONL or CSV would be silently changed
            self.sentence = (f"the output holds characters its encoding ({encoding}) cannot hold, so it stops here; "
                             "nothing recorded in the ledger is lost; set PYTHONIOENCODING=utf-8 and run again.")  # fmt: skip
        else:
            self.sentence = (f"the output could not be written ({printable(exc.strerror or str(exc))}); nothing recorded "
                             "in the ledger is lost; write the output somewhere with room (another disk, or a pipe).")  # fmt: skip


class _Output:
    """``sys.stdout`` while a command runs: a write or flush failing (an OSError other than a broken pipe, or a
    character its encoding lacks) raises :class:`_OutputFailed`, told apart from every other error."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._guarded(self._stream.write, text)

    def writelines(self, lines: Iterable[str]) -> None:
        self._guarded(self._stream.writelines, lines)

    def flush(self) -> None:
        self._guarded(self._stream.flush)

    def _guarded(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except (OSError, UnicodeEncodeError) as exc:
            raise _OutputFailed(exc, getattr(self._stream, "encoding", None)) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def broken_pipe_exit(exc: BrokenPipeError) -> int:
    """The exit code for a broken pipe: 0 when stdout's reader left (``harness ... | head``), else 1 with a sentence.

    Stdout is then pointed at ``/dev/null`` so the interpreter's final flush does not raise again.
    """
    if not stdout_reader_gone():  # some other pipe broke: a failure, never taken for `| head` leaving
        print(f"harness: a pipe closed unexpectedly ({printable(str(exc))}); nothing more was written.", file=sys.stderr)
        return 1
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
