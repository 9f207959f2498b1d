"""Everything the harness writes to the terminal about a matrix: progress, run lines, summaries.

The library never prints (the runner reports through :class:`~harness.runner.MatrixEvents`
and raises on interrupts); the CLI and this module are the only code that does.
"""

from __future__ import annotations

import shlex
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from harness.executors import worker_count
from harness.executors.resources import DEFAULT_ACTORS
from harness.ledger import Attempt, check_failed
from harness.loop import RunPlan, RunSummary
from harness.run_options import STOPPED_BY_READER, stop_for
from harness.runner import MatrixEvents, MatrixResult
from harness.vocab import counted, is_scored, plural, printable

__all__ = [
    "Progress", "format_run_line", "next_steps", "plan_counts", "plan_label", "plural", "print_run_summary", "printable",
    "skipped_sentence", "summary_rows",
]  # fmt: skip

_ERROR_CHARS = 300
"""Characters of an error message shown on a console line (the ledger keeps it whole)."""


def format_run_line(index: int, total: int, summary: RunSummary) -> str:
    """One line per finished run, e.g. ``[2/4] list_and_report embedded:smollm2-135m T=0.7 ... -> task_failed
    (...); failed checks: names_files, file_json_field ×2; failure modes: none; run 3fa2b1c04e5d`` (the done checks that failed, if any;
    the run id's first 12 characters: a prefix that ``harness review`` and ``harness attest`` accept)."""
    p = summary.plan
    modes = ", ".join(summary.failure_modes) or "none"
    failed = [str(c.get("check")) for c in summary.checks if isinstance(c, dict) and check_failed(c)]
    judged = "failed checks" if is_scored(summary.outcome) else "checks not judged (the run did not finish)"  # unfinished
    checks = f"; {judged}: {counted(failed)}" if failed else ""
    timing = f", {summary.elapsed_s:.1f} s" if summary.elapsed_s is not None else ""
    extra = (
        f" ({printable(summary.error, _ERROR_CHARS)})"
        if summary.outcome in ("infra_error", "context_overflow") and summary.error
        else ""
    )
    return printable(
        f"[{index}/{total}] {p.scenario.name} {p.model} T={p.temperature:g} seed={p.seed + p.repetition} "
        f"{p.tool_mode}/{p.parser}{_think_note(p)}{' stream' if p.stream else ''} rep={p.repetition} -> {summary.outcome}{extra} "
        f"({plural(summary.turns, 'turn')}, {plural(summary.tokens, 'token')}{timing}){checks}; failure modes: {modes}; "
        f"run {summary.run_id[:12]}"
    )


def summary_rows(summaries: Sequence[RunSummary]) -> list[dict[str, Any]]:
    """One row per cell (scenario, model, temperature, tool mode, parser, think, stream) with outcome counts (the
    ``think`` column only when some run set thinking on or off, the ``stream`` column only when some run streamed).

    ``pass_rate`` is passes / scored runs (:func:`harness.vocab.is_scored`; in [0, 1], or None when none).
    """
    cells: dict[tuple[Any, ...], dict[str, Any]] = {}
    streamed = any(s.plan.stream for s in summaries)
    thought = any(s.plan.think != "default" for s in summaries)
    for s in summaries:
        p = s.plan
        key = (p.scenario.name, p.model, p.temperature, p.tool_mode, p.parser, p.think, p.stream)
        row = cells.setdefault(key, {
            "scenario": key[0], "model": key[1], "temperature": key[2], "tool_mode": key[3], "parser": key[4],
            **({"think": p.think} if thought else {}),
            **({"stream": "on" if p.stream else "off"} if streamed else {}),
            "runs": 0, "pass": 0, "task_failed": 0, "turn_limit": 0, "token_limit": 0, "infra_error": 0, "interrupted": 0,
            "context_overflow": 0,
        })  # fmt: skip
        row["runs"] += 1
        row[s.outcome] += 1
    for row in cells.values():
        scored = sum(n for outcome, n in row.items() if is_scored(outcome))
        row["pass_rate"] = row["pass"] / scored if scored else None
    return list(cells.values())


def plan_label(plan: RunPlan) -> str:
    """One planned run as ``scenario model T=.. seed=.. tool_mode/parser rep=..`` (``--dry-run`` lines)."""
    return printable(f"{plan.scenario.name} {plan.model} T={plan.temperature:g} seed={plan.seed + plan.repetition} "
            f"{plan.tool_mode}/{plan.parser}{_think_note(plan)}{' stream' if plan.stream else ''} rep={plan.repetition}")  # fmt: skip


def _think_note(plan: RunPlan) -> str:
    """`` think=on`` / `` think=off`` for a plan that sets thinking, nothing for the default."""
    return "" if plan.think == "default" else f" think={plan.think}"


class Progress(MatrixEvents):
    """The matrix's progress on the terminal: a tqdm bar on a terminal, a plain line per run otherwise (CI logs).

    Args:
        total: planned runs (reset to the runs still to do once they are known).
        ledger_path: named in the start line.
        resume: False for ``--no-resume`` (the runs already done run again; the start line says so).
        stop: the matrix's stop event (:class:`~harness.run_options.RunOptions`); when given, standard output's reader
            leaving (a run line fails with ``BrokenPipeError``: ``harness run | head``) sets it and ``reader_gone``, and
            the lines after are not written; without it, that error is raised.

    Attributes:
        reader_gone: standard output's reader stopped reading; the matrix was told to stop (runs in flight end as
            ``interrupted``, runs not started do not start).
        skipped_said: why each skipped model's runs were skipped has been said (:meth:`planned`), so the summary only
            points up to it (:func:`print_run_summary`).
    """

    def __init__(self, total: int, ledger_path: Path, *, resume: bool = True, stop: threading.Event | None = None) -> None:
        from tqdm import tqdm

        self.planned_total, self.ledger_path, self.resume, self.stop = total, ledger_path, resume, stop
        self.total, self.done, self.reader_gone, self.skipped_said = total, 0, False, False
        self.counts = {"pass": 0, "fail": 0, "infra": 0}
        self.bar = tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True) if sys.stderr.isatty() else None

    def planned(self, result: MatrixResult) -> None:
        """Say what the matrix holds as ``--dry-run`` says it (:func:`plan_counts`), then why each model that cannot
        be planned is skipped (its server is not running) and the planning's warnings (e.g. requests that queue at a
        server), once, before any run; size the bar to the runs not done (a run another process is running gets its
        own line when its turn comes)."""
        todo = len(result.planned) - result.already_done
        self.total = todo
        if self.bar is not None:
            self.bar.reset(total=todo)
        where = printable(str(self.ledger_path))
        if result.ledger_not_made:
            where += " (not created: nothing can run)"
        self._note(f"{plan_counts(result, self.planned_total, resume=self.resume)}; ledger: {where}")
        for model, reason, count in result.skipped:  # the counts' "skipped", explained before any run
            self._note(skipped_sentence(model, reason, count))
        self.skipped_said = True
        for warning in result.warnings:  # before the runs, not after the table (nor never, when `| head` stops them)
            self._note(f"harness: warning: {printable(warning)}")

    def model_starting(self, model: str) -> None:
        """Say that a model is loading, so a bar at 0 for a minute is not silent."""
        if model.startswith("embedded:"):
            self._note(
                f"Loading the model {printable(model)} into memory (a large model takes up to a minute), then one warm-up request..."
            )
        else:
            self._note(f"Warming up {printable(model)} with one request...")

    def _note(self, line: str) -> None:
        """A line on standard error above the bar (through tqdm, so the two never share a line)."""
        if self.bar is None:
            print(line, file=sys.stderr, flush=True)
        else:
            self.bar.write(line, file=sys.stderr)

    def run_finished(self, summary: RunSummary) -> None:
        """One line per finished run; the bar advances."""
        self.done += 1
        kind = "pass" if summary.outcome == "pass" else "fail" if is_scored(summary.outcome) else "infra"
        self.counts[kind] += 1
        self._line(format_run_line(self.done, self.total, summary))

    def run_taken(self, plan: RunPlan, *, in_flight: bool) -> None:
        """A run another process on the ledger took settles here too: a line of its own and the count advances, so the
        last line reaches ``[N/N]`` although this process ran only some of the N."""
        self.done += 1
        elsewhere = "running in another process" if in_flight else "done by another process"
        self._line(f"[{self.done}/{self.total}] {plan_label(plan)} -> {elsewhere}, not run here")

    def _line(self, line: str) -> None:
        """A progress line on standard output (none once its reader has gone); the bar advances."""
        if not self.reader_gone:
            try:
                if self.bar is None:
                    print(line, flush=True)
                else:
                    self.bar.write(line)
                    sys.stdout.flush()  # a redirected stdout (| tee log) gets each line as its run ends
            except BrokenPipeError:
                if self.stop is None:
                    raise
                self.reader_gone = True
                stop_for(self.stop, STOPPED_BY_READER)
        if self.bar is not None:
            self.bar.set_postfix(self.counts, refresh=False)
            self.bar.update(1)

    def reader_gone_sentence(self, result: MatrixResult) -> str:
        """What became of the matrix once standard output's reader left (``reader_gone``), for standard error: the
        runs recorded (``result.summaries``: each has its end row), how many were interrupted, how many are left."""
        again = [s.outcome for s in result.summaries if not is_scored(s.outcome)]  # resume runs these again
        skipped = sum(count for _, _, count in result.skipped)  # their server was down: never planned, still to do
        left = self.total - self.done + len(again) + skipped
        how = f" ({', '.join(f'{again.count(outcome)} {outcome}' for outcome in dict.fromkeys(again))})" if again else ""
        if not self.resume:
            rest = f"the same command runs all {self.total} again (--no-resume)"
        else:
            down = f" ({skipped} skipped: {'its' if skipped == 1 else 'their'} server was down)" if skipped else ""
            rest = f"{plural(left, 'run')} left to do{down}, which the same command runs" if left else "nothing is left to run"
        return (f"harness: the output's reader stopped reading, so the matrix stopped: {plural(len(result.summaries), 'run')} "
                f"recorded in {printable(str(self.ledger_path))}{how}; {rest}.")  # fmt: skip

    def stopping(self, in_flight: int) -> None:
        """The first Ctrl-C: say what happens to the runs in flight."""
        if in_flight:
            end, its, they = ("ends", "its", "it is") if in_flight == 1 else ("end", "their", "they are")
            print(f"harness: stopping; {plural(in_flight, 'run')} in flight {end} as interrupted when {its} model call "
                  f"returns. Press Ctrl-C again to quit at once ({they} recorded as interrupted without that reply).",
                  file=sys.stderr, flush=True)  # fmt: skip

    def retrying(self, plan: RunPlan, attempt: Attempt, max_attempts: int) -> None:
        """One line per failed model call that will be retried, so a slow or failing server is not silent."""
        wait = f" in {attempt.retry_in_ms / 1000:.1f} s" if attempt.retry_in_ms is not None else ""
        line = (f"harness: {plan_label(plan)}: turn {attempt.turn}, attempt {attempt.attempt} of {max_attempts} failed "
                f"({attempt.error_type}: {printable(attempt.error.rstrip('.'), _ERROR_CHARS)}); retrying{wait}.")  # fmt: skip
        self._note(line)

    def close(self) -> None:
        """Close the bar (idempotent)."""
        if self.bar is not None:
            self.bar.close()


def plan_counts(result: MatrixResult, total: int, *, resume: bool = True) -> str:
    """What a matrix holds as it starts, e.g. ``6 runs planned, 1 already done, 1 running in another process, 4 to
    run``: ``--dry-run``'s last line and the real run's first, so the two say the same.

    Args:
        result: :func:`~harness.runner.plan_matrix`'s, or :func:`~harness.runner.run_matrix`'s once planned (each
            :class:`~harness.endpoints.PlannedRun`'s ``done`` and ``running``; ``skipped`` models are not run).
        total: the planned runs, also those of skipped models.
        resume: False for ``--no-resume``: the runs already done are counted as to run again.
    """
    done = sum(item.done for item in result.planned)
    running = sum(item.running for item in result.planned)
    unplanned = sum(count for _, _, count in result.skipped)
    to_run = sum(item.to_do(resume=resume) and not item.running for item in result.planned)
    parts = [plural(total, "run") + " planned", f"{done} already done" + ("" if resume else " (run again: --no-resume)")]
    parts += [f"{running} running in another process"] if running else []
    parts += [f"{unplanned} skipped"] if unplanned else []  # their model's server is not usable: said with the reason
    return ", ".join([*parts, f"{to_run} to run"])


def execution_words(jobs: int, executor: str, workers: int | None, *, runs: int, models: int, replicated: bool) -> str:
    """How a real run would execute its runs, for ``--dry-run``'s line before its counts, e.g. ``2 models side by
    side, each up to 4 runs at a time (--jobs 4), in 2 worker processes (--executor processes, --workers: the CPU
    count)``.

    Args:
        jobs: ``--jobs``.
        executor: ``--executor`` (``threads``, ``processes`` or ``ray``).
        workers: ``--workers``, None when not given.
        runs: the runs to do (no more worker processes start than can run at once).
        models: the ``--model`` specs with runs to do (each gets its own ``jobs``).
        replicated: some of them list replicas (each replica gets its own ``jobs``).
    """
    at_once = (
        f"{'one run' if jobs == 1 else f'up to {jobs} runs'} at a time{' per replica' if replicated else ''} (--jobs {jobs})"
    )
    if models > 1:
        at_once = f"{models} models side by side, each {at_once}"
    if executor == "processes":
        given = f"--workers {workers}" if workers else "--workers: the CPU count"
        count = worker_count(workers, runs, jobs, models)
        return f"{at_once}, in {count} worker process{'' if count == 1 else 'es'} (--executor processes, {given})"
    if executor == "ray":
        count, given = (workers, f"--workers {workers}") if workers else (DEFAULT_ACTORS, "--workers: the default")
        return f"{at_once}, in {count} Ray actor{'' if count == 1 else 's'} per model (--executor ray, {given})"
    return f"{at_once}, on threads of one process (--executor threads)"


def skipped_sentence(model: str, reason: str, count: int) -> str:
    """Why ``count`` runs of ``model`` are skipped, for standard error, e.g. ``harness: skipped 4 runs of ollama:m:
    Ollama is not running at ...`` (``reason``: the preflight's error, :attr:`MatrixResult.skipped`); ``--dry-run`` says
    the same."""
    return f"harness: skipped {plural(count, 'run')} of {printable(model)}: {printable(reason)}"


def print_run_summary(result: MatrixResult, elapsed_s: float, ledger_path: Path, *, sharded: bool = False,
                      skipped_said: bool = False, say: Callable[[str], None] = print) -> None:  # fmt: skip
    """After a matrix: a table per cell, the totals, what was skipped and what to retry (the planning's warnings were
    said before the runs: :meth:`Progress.planned`). With ``skipped_said`` (:attr:`Progress.skipped_said`) the skipped
    models get one line pointing up to why, which was said before the runs; without it, the reason of each. ``say``
    writes each standard-output line (the CLI's drops them once the output's reader has left); standard error's lines
    (why runs were skipped or failed) are printed whatever it does."""
    rows = summary_rows(result.summaries)
    if rows:
        table = [
            {**r, "model": printable(r["model"]), "pass_rate": "n/a" if r["pass_rate"] is None else f"{r['pass_rate']:.0%}"}
            for r in rows
        ]
        for key in ("turn_limit", "token_limit", "interrupted"):
            if not any(r[key] for r in rows):
                for row in table:
                    row.pop(key)
        say("")
        say(tabulate(table, headers="keys", tablefmt="github"))
        if result.already_done:  # the table counts this command's runs only: say where the others are
            say(f"This table counts only this command's {plural(len(result.summaries), 'run')}; "
                f"{plural(result.already_done, 'run')} of the matrix done before are in the ledger too: "
                f"`harness report{_ledger_flag(ledger_path)}` counts them all.")  # fmt: skip
        say("")
    notes = [f"{result.already_done} already in the ledger, skipped"] if result.already_done else []
    if result.running_elsewhere:
        notes.append(f"{result.running_elsewhere} running in another process, skipped")
    done_note = f" ({'; '.join(notes)})" if notes else ""
    where = "no ledger written (nothing could run)" if result.ledger_not_made else f"ledger: {printable(str(ledger_path))}"
    say(f"{plural(len(result.summaries), 'run')} in {elapsed_s:.1f} s{done_note}; {where}")
    _print_skipped(result.skipped, said=skipped_said)
    infra = sum(s.outcome == "infra_error" for s in result.summaries)
    if infra:
        print(f"harness: {plural(infra, 'run')} could not be done (infra_error: server failures, not model failures, "
              "excluded from pass rates); run the same command again to retry them.", file=sys.stderr)  # fmt: skip
    overflow = sum(s.outcome == "context_overflow" for s in result.summaries)
    if overflow:
        print(f"harness: {plural(overflow, 'run')} outgrew the context (context_overflow: excluded from pass rates); "
              "raise the scenario's num_ctx to score them.", file=sys.stderr)  # fmt: skip
    if result.summaries or result.already_done:
        say(next_steps(ledger_path, sharded=sharded))


def _print_skipped(skipped: Sequence[tuple[str, str, int]], *, said: bool) -> None:
    """Say on standard error why the models in ``skipped`` were skipped (the exit status is 1); when ``said`` before
    the runs, one line points up to it, so that the end of the output still says why the command failed."""
    if not said:
        for model, reason, count in skipped:
            print(skipped_sentence(model, reason, count), file=sys.stderr)
    elif skipped:
        runs = plural(sum(count for _, _, count in skipped), "run")
        reasons = "the reason" if len(skipped) == 1 else "the reasons"
        print(f"harness: skipped {runs} of {plural(len(skipped), 'model')}, for {reasons} said above.", file=sys.stderr)


def next_steps(ledger_path: Path, *, sharded: bool = False) -> str:
    """The line that ends a run: the commands to try next (``harness view`` only when the viewer is installed; for a
    ``--shard`` run, the merge that comes first)."""
    from importlib.util import find_spec

    ledger = _ledger_flag(ledger_path)
    review = f"`harness review RUN_ID{ledger}` shows one run."
    if sharded:
        return (
            "Next: once every shard has run, `harness ledger merge merged.sqlite SHARD_LEDGER...` joins their ledgers "
            f"for `harness report --ledger merged.sqlite`; {review}"
        )
    view = f", or browse the runs with `harness view{ledger}`" if find_spec("harness.viewer") is not None else ""
    return f"Next: `harness report{ledger}` writes the comparison report into reports/{view}; {review}"


def _ledger_flag(ledger_path: Path) -> str:
    """`` --ledger PATH`` (quoted for a shell) to name ``ledger_path`` in a command; nothing for the default ledger."""
    from harness.ledger import DEFAULT_LEDGER_PATH

    return "" if Path(ledger_path) == DEFAULT_LEDGER_PATH else f" --ledger {shlex.quote(printable(str(ledger_path)))}"
