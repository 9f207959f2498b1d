"""The ``harness`` command line: a thin shell over library calls.

Each command is one ``_cmd_<noun>_<verb>`` function in the module of its group (``run``, ``data``,
``inputs``, ``reports``, ``view``), registered in :func:`build_parser`.
Errors are turned into one sentence and an exit code in one place, :func:`main`:
``HarnessError`` -> exit 1 (or 2 for usage errors), never a traceback. Standard output that cannot be written is a
sentence and exit 1 (a reader that left, ``| head``: quiet, exit 0); standard error is diagnostics only, and what
cannot be written there is dropped without changing the command's result or exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TextIO

from harness.cli._common import point_at_devnull, stdout_reader_gone
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
        print(f"harness: {printable(record.getMessage())}", file=sys.stderr, flush=True)  # names a file, a repository


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
    Standard error holds diagnostics only (progress, warnings, the error sentence): written through
    :class:`_Diagnostics`, what cannot be written there (``2>/dev/full``, a closed ``2>&-``, a reader that left) is
    dropped, and the command's result and exit code stay what they would have been. Both streams are restored on return.
    """
    for stream in (sys.stdout, sys.stderr):  # for people: a character the console lacks is escaped (export: UTF-8 bytes)
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    with _guarded(_Output, "stdout"), _guarded(_Diagnostics, "stderr"):
        return _command(argv)


@contextlib.contextmanager
def _guarded(kind: type[_Output] | type[_Diagnostics], name: str) -> Iterator[None]:
    """``sys.<name>`` wrapped in ``kind`` while entered, then restored, unless it is one already (one main() in another
    thread wrapped it: that one restores it). A stream that is None (started with it closed, ``>&-``) becomes
    ``/dev/null``: the output goes nowhere, as print's would, and never to the other stream."""
    stream = getattr(sys, name)
    if isinstance(stream, kind):
        yield
        return
    wrapper = kind(stream if stream is not None else open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115 - open for the whole process
    setattr(sys, name, wrapper)
    try:
        yield
    finally:
        _settle(wrapper.stream)
        if getattr(sys, name) is wrapper:
            setattr(sys, name, stream)


def _command(argv: Sequence[str] | None) -> int:
    """Parse ``argv``, run its command and turn its errors into one sentence and an exit code (see :func:`main`)."""
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit:  # --help, or a usage error: argparse printed, maybe to a buffer not yet written
            sys.stdout.flush()
            raise
        _show_library_messages()
        code = int(args.func(args) or 0)
        try:
            sys.stdout.flush()  # here, not at the interpreter's exit: a failure is still one sentence
        except BrokenPipeError as exc:  # what the command left unwritten met a reader gone: its own result stands
            return max(code, broken_pipe_exit(exc))
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
        point_at_devnull(sys.stdout)  # the interpreter's last flush must not fail again
        return 1


def _settle(stream: TextIO) -> None:
    """Flush ``stream`` on leaving :func:`main`. What cannot be written by then (a command that failed for another reason
    after the reader left, ``| head``; stderr on a full disk) goes to ``/dev/null``: else the interpreter's last flush
    fails again ("Exception ignored", exit 120)."""
    try:
        stream.flush()
    except (OSError, ValueError):
        point_at_devnull(stream)
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


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


class _Diagnostics:
    """``sys.stderr`` while a command runs: a write or flush that fails (``OSError``: a full disk, a closed descriptor,
    a reader that left; ``ValueError``: a closed file) is dropped, so diagnostics never change a command's result.
    ``stream`` is the stream it writes to."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self._dropping(self.stream.write, text)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        self._dropping(self.stream.writelines, lines)

    def flush(self) -> None:
        self._dropping(self.stream.flush)

    def _dropping(self, call: Callable[..., Any], *args: Any) -> None:
        with contextlib.suppress(OSError, ValueError):
            call(*args)

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
    point_at_devnull(sys.stdout)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
