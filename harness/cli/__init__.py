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

__all__ = ["build_parser", "error_line", "main"]


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
    for stream in (sys.stdout, sys.stderr):  # for people: a character the console lacks is escaped (export: UTF-8 bytes)
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    stdout, wrapper = sys.stdout, None
    if not isinstance(stdout, _Output):  # one main() in another thread wrapped it already: that one restores it
        # None: started with stdout closed (`>&-`): the output goes nowhere, as print's would
        wrapper = _Output(stdout if stdout is not None else open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115 - open for the whole process
        sys.stdout = wrapper
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
    except HarnessError as exc:  # escaped: a server's or a file's words may be in the sentence
        print(error_line(exc), file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
    except KeyboardInterrupt:
        print("harness: interrupted; everything finished so far is in the ledger.", file=sys.stderr)
        return 130
    except BrokenPipeError as exc:
        return broken_pipe_exit(exc)
    except _OutputFailed as failed:
        print(error_line(failed), file=sys.stderr)
        with contextlib.suppress(OSError, ValueError, AttributeError):  # the interpreter's last flush must not fail again
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())
            os.close(null)
        return 1
    finally:
        if wrapper is not None and sys.stdout is wrapper:
            sys.stdout = stdout


def error_line(exc: BaseException) -> str | None:
    """The line :func:`main` prints on standard error for an error it reports in one sentence (a
    :class:`~harness.errors.HarnessError`, output that cannot be written), else None (a bug, a broken pipe)."""
    if isinstance(exc, HarnessError):
        return f"harness: {printable(str(exc))}"
    if isinstance(exc, _OutputFailed):
        return f"harness: {exc.sentence}"
    return None


class _OutputFailed(Exception):
    """Writing to standard output failed; ``sentence`` says why and what to do (nothing recorded is lost)."""

    def __init__(self, exc: OSError) -> None:
        super().__init__(exc)
        self.sentence = (f"the output could not be written ({printable(exc.strerror or str(exc))}); nothing recorded "
                         "in the ledger is lost; write the output somewhere with room (another disk, or a pipe).")  # fmt: skip


class _Output:
    """``sys.stdout`` while a command runs: a write or flush failing with an OSError other than a broken pipe raises
    :class:`_OutputFailed`, told apart from every other error. ``stream`` is the stream it writes to."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self._guarded(self.stream.write, text)

    def writelines(self, lines: Iterable[str]) -> None:
        self._guarded(self.stream.writelines, lines)

    def flush(self) -> None:
        self._guarded(self.stream.flush)

    @staticmethod
    def _guarded(call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _OutputFailed(exc) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def write_machine_output(text: str) -> None:
    """Write machine-readable output (JSONL, CSV) to standard output as UTF-8 bytes whatever the console's encoding:
    escaping would change it silently. Raises as a write to ``sys.stdout`` does (:class:`_Output`)."""
    sys.stdout.flush()
    binary = getattr(sys.stdout, "buffer", None)
    if binary is None:  # a text-only stream (a test's capture): nothing to encode
        sys.stdout.write(text)
        return
    _Output._guarded(binary.write, text.encode("utf-8", "backslashreplace"))  # a lone surrogate: \\udXXX, JSON's own escape
    _Output._guarded(binary.flush)


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
