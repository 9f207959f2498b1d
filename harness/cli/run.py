"""``harness run``: run a matrix (or plan it with ``--dry-run``)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cli._common import Subparsers, default_scenario, head_line, ledger_option, ledger_path
from harness.errors import LedgerSwapped, UsageError
from harness.executors import EXECUTORS, check_executor
from harness.vocab import PARSER_POLICIES, THINK_SETTINGS, TOOL_MODES

if TYPE_CHECKING:
    from harness.console import Progress
    from harness.ledger import Ledger, LedgerHead
    from harness.loop import RunOptions, RunPlan
    from harness.runner import MatrixResult

__all__ = ["add_run"]


# -- harness run -------------------------------------------------------------------------------------
def add_run(sub: Subparsers) -> None:
    """Register ``harness run``."""
    p = sub.add_parser("run", help="run scenarios over a matrix of models and options", description=(
        "Run scenario files over a matrix of models, temperatures, seeds, tool modes, parser policies and streaming, "
        "recording every turn in the ledger. With no arguments: scenarios/list_and_report.toml on "
        "embedded:smollm2-135m with the scenario's default matrix."))  # fmt: skip
    p.add_argument("scenarios", nargs="*", type=Path, metavar="SCENARIO", help="scenario TOML files")
    p.add_argument(
        "--model",
        action="append",
        metavar="SPEC",
        help="model spec (repeatable): ollama:M[@URL], openai:M@URL, embedded:NAME|PATH|hf:OWNER/REPO/FILE.gguf[@REV], replay:FILE",
    )
    p.add_argument("--temperature", action="append", type=float, metavar="T", help="temperature (repeatable)")
    p.add_argument("--seed", action="append", type=int, metavar="N", help="base seed (repeatable); repetition r sends seed N + r")
    p.add_argument("--repeats", type=int, metavar="N", help="repetitions per cell")
    p.add_argument("--tool-mode", action="append", choices=TOOL_MODES, help="how tools reach the model (repeatable)")
    p.add_argument("--parser", action="append", choices=PARSER_POLICIES, help="parser policy (repeatable)")
    p.add_argument("--think", action="append", choices=THINK_SETTINGS,
                   help="ask the model to think: default (say nothing), on or off (repeatable)")  # fmt: skip
    p.add_argument("--stream", action="append", choices=("on", "off"), help="stream replies and assemble the chunks (repeatable)")
    ledger_option(p)
    p.add_argument("--record", type=Path, metavar="DIR", help="write one replay cassette per run into DIR")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="concurrent runs per model server (default 1)")
    p.add_argument("--executor", choices=EXECUTORS, default="threads",
                   help="where runs execute: threads of this process (default), worker processes, or Ray actors "
                        "(needs the [ray] extra); this process stays the only writer of the ledger")  # fmt: skip
    p.add_argument("--workers", type=int, metavar="N",
                   help="worker processes for --executor processes (default: the CPU count); "
                        "actors per model for --executor ray (default 2)")  # fmt: skip
    p.add_argument("--ray-address", metavar="ADDRESS", help="the Ray cluster for --executor ray (default: start a local one)")
    p.add_argument("--ray-resources", action="append", default=[], metavar="MODEL_SPEC=NAME:AMOUNT",
                   help="Ray resources of each actor running MODEL_SPEC's runs (repeatable; default CPU:0.5)")  # fmt: skip
    p.add_argument("--embedded-slots", type=int, default=1, metavar="N",
                   help="parallel slots of each embedded model's server (default 1: replies reproduce byte for byte "
                        "at --jobs 1; with fewer slots than --jobs requests queue; more than 1 changes the replies "
                        "and the run identity)")  # fmt: skip
    p.add_argument(
        "--max-attempts", type=int, default=4, metavar="N", help="attempts per model call on server errors (default 4)"
    )
    p.add_argument("--request-timeout", "--timeout", dest="timeout", type=float, metavar="SECONDS",
                   help="total deadline of one model request, the whole reply included (default 60 plus 0.2 per token of "
                        "max_tokens; 60 plus 1 per token for embedded models); --timeout is the same flag")  # fmt: skip
    p.add_argument("--cache", action="store_true", help="reuse recorded replies for identical requests of the same run identity")
    p.add_argument("--no-resume", action="store_true", help="run every planned run even if the ledger already has it")
    p.add_argument("--dry-run", action="store_true", help="print the planned runs, how many are already done, and exit")
    p.add_argument("--shard", metavar="I/N", default=None,
                   help="run only shard I of N (0 <= I < N) of the planned runs, chosen by identity hash, into this "
                        "--ledger; `harness ledger merge` joins the shards' ledgers")  # fmt: skip
    p.set_defaults(func=_cmd_run)


def _cmd_run(args: argparse.Namespace) -> int:
    from harness.loop import RetryPolicy, RunOptions
    from harness.matrix import MatrixOverrides
    from harness.outputs import check_output_folder
    from harness.run_options import StopEvent
    from harness.runner import expand_matrix
    from harness.scenarios import load_scenario
    from harness.shards import parse_shard

    shard = parse_shard(args.shard) if args.shard is not None else None
    _check_counts(args)
    if args.workers is not None and args.executor == "threads":
        raise UsageError("--workers needs --executor processes or ray.")
    if args.workers is not None and not 1 <= args.workers <= 256:
        raise UsageError(f"--workers must be from 1 to 256, not {args.workers}.")
    if (args.ray_address or args.ray_resources) and args.executor != "ray":
        raise UsageError("--ray-address and --ray-resources need --executor ray.")
    if args.timeout is not None and not 1 <= args.timeout <= 86_400:  # also refuses nan
        raise UsageError("--request-timeout must be from 1 to 86400 seconds.")
    if args.record is not None:
        check_output_folder(args.record, option="--record")
    streams = None if args.stream is None else list(dict.fromkeys(value == "on" for value in args.stream))
    overrides = MatrixOverrides(
        args.model, args.temperature, args.repeats, args.seed, args.tool_mode, args.parser, args.think, streams
    )
    overrides.check()
    scenarios = [load_scenario(path) for path in (args.scenarios or [default_scenario()])]
    plans = expand_matrix(scenarios, overrides)
    resources = _ray_resources(args.ray_resources, plans)  # against the whole matrix: a shard may hold no run of a model
    check_executor(plans, args.executor)  # after the command line's own mistakes: Ray missing is said once they are fixed
    if shard is not None:
        mine = shard.select(plans)
        print(f"Shard {shard}: {len(mine)} of {len(plans)} planned runs (plan identity hash mod {shard.count} = {shard.index}).")
        plans = mine
    path = ledger_path(args)
    if args.dry_run:
        execution = (args.executor, args.workers)
        return _dry_run(plans, path, jobs=args.jobs, slots=args.embedded_slots, resume=not args.no_resume, execution=execution)
    options = RunOptions(runs_dir=path.parent / "runs", jobs=args.jobs, embedded_slots=args.embedded_slots,
                         retry=RetryPolicy(max_attempts=args.max_attempts), use_cache=args.cache, record_dir=args.record,
                         executor=args.executor, workers=args.workers, ray_address=args.ray_address,
                         ray_resources=resources, stop=StopEvent())  # fmt: skip
    result, reader_left = _run(plans, path, options, resume=not args.no_resume, timeout_s=args.timeout, sharded=shard is not None)
    if args.record is not None and not reader_left and not result.summaries and not result.skipped:  # skipped: said why
        print(
            "harness: nothing was recorded: every planned run is already in the ledger; add --no-resume to run them again.",
            file=sys.stderr,
        )
    # standard output's reader leaving (`| head`) stops the matrix and is no failure; a run its server failed or skipped is
    return 1 if result.skipped or any(s.outcome == "infra_error" for s in result.summaries) else 0


def _check_counts(args: argparse.Namespace) -> None:
    """Refuse the first of ``--jobs``, ``--embedded-slots`` and ``--max-attempts`` that is out of its range, by name."""
    for option, value, top in (("--jobs", args.jobs, 256), ("--embedded-slots", args.embedded_slots, 256),
                               ("--max-attempts", args.max_attempts, 100)):  # fmt: skip
        if not 1 <= value <= top:
            raise UsageError(f"{option} must be from 1 to {top}, not {value}.")


def _ray_resources(values: list[str], plans: list[RunPlan]) -> dict[str, dict[str, float]]:
    """``--ray-resources`` parsed (:func:`harness.executors.resources.parse_ray_resources`) without importing Ray."""
    if not values:
        return {}
    from harness.executors.resources import parse_ray_resources

    return parse_ray_resources(values, sorted({plan.model for plan in plans}))


def _dry_run(plans: list[RunPlan], path: Path, *, jobs: int, slots: int, resume: bool = True,
             execution: tuple[str, int | None] = ("threads", None)) -> int:  # fmt: skip
    """Print the planned runs and what a real run would do with them now (without ``resume``, ``--no-resume``: the
    runs already done run again; ``execution``: ``--executor`` and ``--workers``); never creates a ledger.

    Returns 1 when some runs are skipped (their server is down), as the real run would.

    Raises:
        LedgerError: the real run would not write to the ledger (a newer harness wrote it) or would not lock a run to
            do (``<ledger>.locks`` is not a folder, or its lock file is not a file).
    """
    from harness.backends import open_backend, replica_specs
    from harness.console import execution_words, plan_counts, plan_label, printable, skipped_sentence
    from harness.errors import LedgerError
    from harness.ledger import Ledger, cannot_create
    from harness.ownership import lock_folder, lock_in_the_way
    from harness.runner import plan_matrix

    problem = cannot_create(path)
    if problem:  # the real run would stop here too
        print(f"harness: {printable(problem)}", file=sys.stderr)
        return 1
    ledger = Ledger(path, readonly=True) if path.exists() else None
    try:
        newer = ledger.newer_schema() if ledger is not None else None
        if newer is not None:  # the real run refuses to write to it
            raise LedgerError(newer)
        factory = functools.partial(open_backend, plan_only=True)
        planned = plan_matrix(plans, ledger, jobs=jobs, embedded_slots=slots, backend_factory=factory, resume=resume)
    finally:
        if ledger is not None:
            ledger.close()
    settled = [item for item in planned.planned if item.to_do(resume=resume)]  # the real run counts its lines to these
    if settled and (locks := lock_in_the_way(lock_folder(path), settled[0].identity)):  # as the real run's first lock (stats)
        raise LedgerError(locks)
    for item in planned.planned:  # first: the runs to do stay in sight above the counts
        if not item.to_do(resume=resume):
            print(f"[done] {plan_label(item.plan)}")
    for i, item in enumerate(settled, 1):  # in plan order; the real run's in the order its runs end
        note = " (running in another process)" if item.running else " (done; runs again)" if item.done else ""
        print(f"[{i}/{len(settled)}] {plan_label(item.plan)}{note}")
    for warning in planned.warnings:  # e.g. a replica left out, or replicas checked by model name only
        print(f"harness: warning: {printable(warning)}", file=sys.stderr)
    for model, reason, count in planned.skipped:  # in the real run's words
        print(skipped_sentence(model, reason, count), file=sys.stderr)
    if settled:  # a run another process holds is still tried when its turn comes: it counts, as the executors count it
        models = {item.plan.model for item in settled}
        replicated = any(len(replica_specs(model)) > 1 for model in models)
        how = execution_words(jobs, *execution, runs=len(settled), models=len(models), replicated=replicated)
        print(f"Execution: {how}.")
    print(f"{plan_counts(planned, len(plans), resume=resume)}.")  # the real run's first line says the same
    return 1 if planned.skipped else 0


def _run(plans: list[RunPlan], path: Path, options: RunOptions, *, resume: bool, timeout_s: float | None,
         sharded: bool = False) -> tuple[MatrixResult, bool]:  # fmt: skip
    """Run the matrix and print its summary; a refused start leaves no new ledger behind.

    Returns:
        The result, and whether standard output's reader left (``harness run | head``; ``options.stop`` then stopped
        the matrix): one sentence on standard error then says what was recorded, and nothing more is written to
        standard output.
    """
    from harness.cli._common import say
    from harness.console import Progress, print_run_summary

    started = time.perf_counter()
    ledger = _LedgerOnDemand(path)
    progress = Progress(len(plans), path, resume=resume, stop=options.stop)
    try:
        result = _run_in(plans, ledger, options, progress, resume=resume, timeout_s=timeout_s)
    finally:
        ledger.close()
    if progress.reader_gone:
        print(progress.reader_gone_sentence(result), file=sys.stderr)
        return result, True
    print_run_summary(result, time.perf_counter() - started, path, sharded=sharded, skipped_said=progress.skipped_said, say=say)
    if ledger.head is not None:  # always, once the matrix got as far as running
        say(head_line(ledger.head.anchor))
    return result, False


class _LedgerOnDemand:
    """The ledger at ``path``, opened (created when new) only once the models are open and fit in memory, and not when
    every run is skipped.

    A start refused by the memory check, a failed download or every model skipped (its server down) thus creates no
    ledger, and nothing is ever deleted:
    deleting "our" new empty ledger could delete one that another process has just opened and is recording in.
    """

    def __init__(self, path: Path) -> None:
        from harness.errors import LedgerError
        from harness.ledger import Ledger, cannot_create

        self.path, self.ledger = path, Ledger(path) if path.exists() else None
        self.head: LedgerHead | None = None
        problem = None if self.ledger is not None else cannot_create(path)
        if problem:  # say so before a model is downloaded or loaded
            raise LedgerError(problem)

    def open(self) -> Ledger:
        from harness.ledger import Ledger

        if self.ledger is None:
            self.ledger = Ledger(self.path)
        return self.ledger

    def take_head(self) -> LedgerHead | None:
        """The ledger's head now (None when it was never opened); kept for the summary."""
        self.head = self.ledger.head() if self.ledger is not None else None
        return self.head

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()


def _run_in(plans: list[RunPlan], ledger: _LedgerOnDemand, options: RunOptions, progress: Progress, *, resume: bool,
            timeout_s: float | None) -> MatrixResult:  # fmt: skip
    """The matrix with ``progress`` on the terminal; a second Ctrl-C quits the process at once."""
    from harness.backends import open_backend
    from harness.console import plural
    from harness.runner import MatrixQuit, run_matrix

    with _CtrlC():
        try:
            factory = functools.partial(open_backend, timeout_s=timeout_s)
            opened = ledger.ledger if ledger.ledger is not None else ledger.open
            result = run_matrix(plans, opened, options, resume=resume, events=progress, backend_factory=factory)
        except MatrixQuit as quit:
            progress.close()
            if quit.error is not None:  # an error had stopped the matrix: said as it would have been without the quit
                _say_error(quit.error)
            print(
                f"harness: quit; {plural(quit.abandoned, 'run')} in flight recorded as interrupted.", file=sys.stderr, flush=True
            )
            try:
                _print_head(ledger)  # the rows recorded are committed by now: the head ends the output, as after a first Ctrl-C
                sys.stdout.flush()
            finally:  # also when the output cannot be written (red team: it then waited for the model calls in flight)
                _close_moved(ledger, quit.error)
                os._exit(130)  # workers may be blocked in a model call; every committed turn is safe in the ledger (SQLite WAL)
        except KeyboardInterrupt:  # first Ctrl-C: the runs in flight are recorded as interrupted; the head still ends the output
            progress.close()
            with contextlib.suppress(BrokenPipeError):  # its reader left (`| head`, Ctrl-C reaching both): say the interrupt
                _print_head(ledger)
            raise
        finally:
            progress.close()
        ledger.take_head()
        return result


def _close_moved(ledger: _LedgerOnDemand, error: BaseException | None) -> None:
    """Before a quit's exit: when ``error`` says the ledger's file was moved or replaced (:class:`LedgerSwapped`), close
    it, so the rows still in the ``-wal`` file under the old name go into the moved file, where the error's sentence
    says they are (:func:`~harness.ledger.opening.close_writable`); a ledger that cannot be closed is left as it is."""
    if isinstance(error, LedgerSwapped):
        with contextlib.suppress(Exception):  # whatever it is (SQLite's too), the process exits next: the error was said
            ledger.close()


def _say_error(error: BaseException) -> None:
    """Say on standard error what :func:`harness.cli.main` would have said for ``error`` (a bug: its traceback; a
    broken standard output: nothing, as for `| head`)."""
    from harness.cli import error_line

    line = error_line(error)
    if line is not None:
        print(line, file=sys.stderr, flush=True)
    elif not isinstance(error, BrokenPipeError):
        traceback.print_exception(error, file=sys.stderr)


def _print_head(ledger: _LedgerOnDemand) -> None:
    """End the output with the ledger's head line after a Ctrl-C, when the ledger was opened and can be read."""
    from harness.errors import LedgerError

    try:
        head = ledger.take_head()
    except LedgerError:
        return  # unreadable now: `harness ledger verify` says why; the interrupt still ends the process
    if head is not None:
        print(head_line(head.anchor), flush=True)


class _CtrlC:
    """While entered, Ctrl-C counts every SIGINT the kernel delivers, so two that arrive together are still two.

    Python runs a signal's handler once for several deliveries that come while the main thread
    cannot run Python (a worker in C code holding the GIL); the wakeup fd gets one byte per
    delivery. The first Ctrl-C raises KeyboardInterrupt, the second (or two at once)
    :class:`~harness.runner.QuitNow`, a third exits at once. Outside the main thread, or where
    SIGINT is ignored, it does nothing.
    """

    def __enter__(self) -> _CtrlC:
        main_thread = threading.current_thread() is threading.main_thread()
        self.active = main_thread and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN  # e.g. `harness run &` in a script
        if self.active:
            self.seen = 0
            self.read_fd, self.write_fd = os.pipe()
            os.set_blocking(self.read_fd, False)
            os.set_blocking(self.write_fd, False)
            self.old_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
            self.old_handler = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        from harness.runner import QuitNow

        try:
            delivered = os.read(self.read_fd, 4096).count(signal.SIGINT)
        except BlockingIOError:
            delivered = 0
        if not delivered:
            return  # its byte was read by the call before, which counted it
        before, self.seen = self.seen, self.seen + delivered
        if before >= 2:
            os._exit(130)  # a third Ctrl-C while quitting: out now (a run left without its end row is resumed next time)
        raise QuitNow if self.seen >= 2 else KeyboardInterrupt

    def __exit__(self, *exc_info: object) -> None:
        if self.active:
            signal.signal(signal.SIGINT, self.old_handler if self.old_handler is not None else signal.default_int_handler)
            signal.set_wakeup_fd(self.old_fd)
            os.close(self.read_fd)
            os.close(self.write_fd)
