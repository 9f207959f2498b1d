"""Matrix expansion and execution: scenarios x models x temperatures x seeds x tool modes x
parsers x repetitions, each cell run through :func:`harness.loop.run_once`.

A scenario file declares its default axes in ``[matrix]``; :class:`MatrixOverrides` (the CLI
flags) replace any axis for every scenario. Runs are grouped by model so that each backend is
opened (and an embedded server started) once.
"""

from __future__ import annotations

import uuid
import os
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.backends import open_backend, parse_model_spec
from harness.backends.base import Backend
from harness.backends.replay import CassetteRecorder
from harness.errors import BackendError, BackendUnavailable, LedgerError, ModelNotFound, UsageError
from harness.ledger import Ledger, RunEnd
from harness.loop import DEFAULT_RETRY, IdentityTaken, RetryPolicy, RunPlan, RunSummary, run_once
from harness.scenarios import Scenario

__all__ = [
    "MatrixOverrides", "MatrixResult", "PlannedRun", "expand_matrix", "format_run_line", "plan_matrix", "plural", "run_matrix",
    "summary_rows",
]  # fmt: skip


MAX_PLANNED_RUNS = 1_000_000


@dataclass(frozen=True)
class MatrixOverrides:
    """Axes given on the command line; ``None`` keeps the scenario's own axis.

    Attributes:
        models: model spec strings.
        temperatures: sampling temperatures.
        repeats: repetitions per cell.
        seeds: base seeds.
        tool_modes: ``native`` / ``prompt``.
        parsers: ``strict`` / ``lenient``.
    """

    models: Sequence[str] | None = None
    temperatures: Sequence[float] | None = None
    repeats: int | None = None
    seeds: Sequence[int] | None = None
    tool_modes: Sequence[str] | None = None
    parsers: Sequence[str] | None = None


def expand_matrix(scenarios: Iterable[Scenario], overrides: MatrixOverrides = MatrixOverrides()) -> list[RunPlan]:
    """Expand scenarios and overrides into planned runs, in a stable order.

    Order: scenario, model, tool mode, parser, temperature, seed, repetition.

    Raises:
        UsageError: a model spec is malformed, or the matrix has more than
            :data:`MAX_PLANNED_RUNS` runs.
    """
    scenarios = list(scenarios)
    total = 0
    for scenario in scenarios:
        m = scenario.matrix
        total += (len(overrides.models or m.models) * len(overrides.tool_modes or m.tool_modes) * len(overrides.parsers or m.parsers)
                  * len(overrides.temperatures or m.temperatures) * len(overrides.seeds or m.seeds) * (overrides.repeats or m.repeats))  # fmt: skip
    if total > MAX_PLANNED_RUNS:
        raise UsageError(f"the matrix has {total:,} runs; the limit is {MAX_PLANNED_RUNS:,}. Use fewer axis values or repeats.")
    plans = []
    for scenario in scenarios:
        m = scenario.matrix
        models = overrides.models or m.models
        for model in models:
            parse_model_spec(model)
        for model in models:
            for tool_mode in overrides.tool_modes or m.tool_modes:
                for parser in overrides.parsers or m.parsers:
                    for temperature in overrides.temperatures or m.temperatures:
                        for seed in overrides.seeds or m.seeds:
                            for repetition in range(overrides.repeats or m.repeats):
                                plans.append(RunPlan(scenario, model, float(temperature), int(seed), tool_mode, parser, repetition))
    unique: dict[tuple[Any, ...], RunPlan] = {}
    for p in plans:  # the same file given twice (or two identical files) plans each run once
        unique.setdefault((p.scenario.content_hash, p.model, p.temperature, p.seed, p.tool_mode, p.parser, p.repetition), p)
    return list(unique.values())


@dataclass
class PlannedRun:
    """A plan with its identity resolved against the model server.

    Attributes:
        plan: what to run.
        identity: :meth:`RunPlan.identity` with the model digest the server reported.
        done: the ledger already holds a finished, non-infrastructure run with this identity.
    """

    plan: RunPlan
    identity: str
    done: bool


@dataclass
class MatrixResult:
    """What a matrix came to.

    Attributes:
        planned: every planned run with its identity.
        summaries: one per run executed now, in completion order.
        skipped: ``(model, reason, runs)`` for models whose server could not be used at all;
            those runs were not started (nothing was recorded; re-run once fixed).
        already_done: planned runs skipped because the ledger already had them.
        warnings: sentences for the user (e.g. Ollama parallelism).
    """

    planned: list[PlannedRun] = field(default_factory=list)
    summaries: list[RunSummary] = field(default_factory=list)
    skipped: list[tuple[str, str, int]] = field(default_factory=list)
    already_done: int = 0
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Endpoint:
    backend: Backend
    plans: list[PlannedRun]
    parallel: int


def _open_endpoints(
    plans: Sequence[RunPlan], ledger: Ledger | None, *, jobs: int, backend_factory: Callable[..., Backend], result: MatrixResult
) -> dict[str, _Endpoint]:
    """Open one backend per model, preflight it, and resolve every plan's identity."""
    finished = ledger.finished_identities() if ledger is not None else {}
    by_model: dict[str, list[RunPlan]] = {}
    for plan in plans:
        by_model.setdefault(plan.model, []).append(plan)
    endpoints: dict[str, _Endpoint] = {}
    try:
        _open_each(by_model, endpoints, finished, jobs=jobs, backend_factory=backend_factory, result=result)
    except BaseException:
        for endpoint in endpoints.values():  # e.g. a later model's cassette is missing: stop servers already started
            endpoint.backend.close()
        raise
    return endpoints


def _ollama_num_parallel() -> int:
    """OLLAMA_NUM_PARALLEL as this machine's environment sets it (the server's own is not queryable)."""
    try:
        return max(1, int(os.environ.get("OLLAMA_NUM_PARALLEL") or 1))
    except ValueError:
        return 1


def _open_each(by_model: dict[str, list[RunPlan]], endpoints: dict[str, _Endpoint], finished: dict[str, int], *,
               jobs: int, backend_factory: Callable[..., Backend], result: MatrixResult) -> None:  # fmt: skip
    for model, model_plans in by_model.items():
        api_key_env = next((p.scenario.api_key_env for p in model_plans if p.scenario.api_key_env), None)
        num_ctx = max(p.scenario.num_ctx for p in model_plans)
        backend = backend_factory(model, api_key_env=api_key_env, num_ctx=num_ctx, parallel=jobs)
        try:
            digest = backend.identity().model_digest  # preflight: a dead server is one message, not N runs
        except (BackendUnavailable, ModelNotFound) as exc:
            result.skipped.append((model, str(exc), len(model_plans)))
            backend.close()
            continue
        except BackendError:
            digest = None  # may be transient: each run meets it again and records it as infra_error
        parallel = jobs
        if parse_model_spec(model)[0] == "ollama":
            parallel = min(jobs, _ollama_num_parallel())
            if jobs > parallel:
                result.warnings.append(
                    f"--jobs {jobs} for {model}: an Ollama server answers OLLAMA_NUM_PARALLEL requests at once "
                    f"(here {parallel}; Ollama's default is 1) and queues the rest; set it on the server to match."
                )
        planned = []
        for plan in model_plans:
            identity = plan.identity(digest)
            planned.append(PlannedRun(plan, identity, identity in finished))
        result.planned.extend(planned)
        endpoints[model] = _Endpoint(backend, planned, parallel)


def plan_matrix(plans: Sequence[RunPlan], ledger: Ledger | None, *, backend_factory: Callable[..., Backend] = open_backend) -> MatrixResult:
    """Resolve identities and what is already done, without running anything (``--dry-run``).

    Args:
        plans: from :func:`expand_matrix`.
        ledger: the ledger to compare against, or None when there is none yet (nothing done).
        backend_factory: opens a backend from a spec.
    """
    result = MatrixResult()
    for endpoint in _open_endpoints(plans, ledger, jobs=1, backend_factory=backend_factory, result=result).values():
        endpoint.backend.close()
    result.already_done = sum(p.done for p in result.planned)
    return result


def run_matrix(
    plans: Sequence[RunPlan],
    ledger: Ledger,
    *,
    runs_dir: Path,
    record_dir: Path | None = None,
    on_run: Callable[[RunSummary], None] | None = None,
    on_planned: Callable[[MatrixResult], None] | None = None,
    backend_factory: Callable[..., Backend] = open_backend,
    jobs: int = 1,
    retry: RetryPolicy = DEFAULT_RETRY,
    use_cache: bool = False,
    resume: bool = True,
    stop: threading.Event | None = None,
) -> MatrixResult:
    """Run every plan not already in the ledger, up to ``jobs`` at once per model endpoint.

    Each model gets one backend (an embedded server is started with ``jobs`` slots); runs of
    different models proceed side by side, each endpoint with its own limit. Re-running the
    same matrix skips every run whose identity already has a finished outcome other than
    ``infra_error``/``interrupted`` (those are retried), so a matrix killed halfway completes
    exactly the planned set.

    Args:
        plans: from :func:`expand_matrix`.
        ledger: an open, writable ledger (thread-safe).
        runs_dir: parent folder for run sandboxes.
        record_dir: when set, one cassette per run is written there as ``<run_id>.jsonl``.
        on_run: called (from one thread at a time) with each finished run's summary.
        on_planned: called once identities are resolved, before the first run starts.
        backend_factory: opens a backend from a spec; called as ``factory(spec, api_key_env=,
            num_ctx=, parallel=)``.
        jobs: concurrent runs per endpoint, >= 1.
        retry: retry policy for infrastructure errors.
        use_cache: reuse recorded replies for identical requests of the same run identity.
        resume: skip runs already finished in the ledger.
        stop: set it to stop; runs in flight end as ``interrupted`` before their next call.

    Returns:
        The planned set, the summaries of runs executed now, and what was skipped.

    Raises:
        LedgerError: the ledger cannot be written.
        KeyboardInterrupt: after runs in flight were recorded as ``interrupted``.
    """
    result = MatrixResult()
    stop = stop or threading.Event()
    endpoints = _open_endpoints(plans, ledger, jobs=jobs, backend_factory=backend_factory, result=result)
    lock = threading.Lock()
    running_ids: set[str] = set()

    def execute(planned: PlannedRun, endpoint: _Endpoint) -> None:
        if stop.is_set():
            return
        handle = endpoint.backend.for_run()
        run_id = uuid.uuid4().hex
        with lock:
            running_ids.add(run_id)
        try:
            _execute_one(planned, endpoint, handle, run_id)
        finally:
            with lock:
                running_ids.discard(run_id)

    def _execute_one(planned: PlannedRun, endpoint: _Endpoint, handle: Backend, run_id: str) -> None:
        config = {"jobs": jobs, "endpoint_parallel": endpoint.parallel}
        kwargs = dict(runs_dir=runs_dir, run_id=run_id, retry=retry, stop=stop, use_cache=use_cache, extra_config=config, claim=resume)
        try:
            if record_dir is None:
                summary = run_once(planned.plan, handle, ledger, **kwargs)
            else:
                cassette = Path(record_dir) / f"{run_id}.jsonl"
                with CassetteRecorder(cassette) as recorder:
                    try:
                        summary = run_once(planned.plan, handle, ledger, on_reply=recorder.record, **kwargs)
                    except IdentityTaken:
                        cassette.unlink(missing_ok=True)
                        raise
        except IdentityTaken:  # another matrix on this ledger finished it or is running it now
            with lock:
                result.already_done += 1
            return
        with lock:
            result.summaries.append(summary)
            if on_run:
                on_run(summary)

    executors = []
    futures = []
    todos = {model: [p for p in e.plans if not (resume and p.done)] for model, e in endpoints.items()}
    result.already_done = sum(len(e.plans) - len(todos[m]) for m, e in endpoints.items())
    if on_planned:
        on_planned(result)
    try:
        for model, endpoint in endpoints.items():
            todo = todos[model]
            if not todo:
                continue
            pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="run")
            executors.append(pool)
            futures.extend(pool.submit(execute, p, endpoint) for p in todo)
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
            for future in finished:
                future.result()  # re-raise LedgerError or a harness bug from a worker
    except KeyboardInterrupt:
        stop.set()
        in_flight = sum(f.running() for f in futures)
        if in_flight:
            print(f"harness: stopping; {in_flight} run(s) in flight end as interrupted when their model call returns. "
                  "Press Ctrl-C again to quit at once (they are recorded as interrupted without that reply).", file=sys.stderr, flush=True)  # fmt: skip
        try:
            for pool in executors:
                pool.shutdown(wait=True, cancel_futures=True)
        except KeyboardInterrupt:  # second Ctrl-C: end the runs in flight now, then quit at once
            with lock:
                abandoned = sorted(running_ids)
            _end_abandoned(ledger, abandoned)
            print(f"harness: quit; {plural(len(abandoned), 'run')} in flight recorded as interrupted.", file=sys.stderr, flush=True)
            os._exit(130)  # every committed turn is safe in the ledger (SQLite WAL)
        raise
    except BaseException:
        stop.set()
        raise
    finally:
        for pool in executors:
            pool.shutdown(wait=True, cancel_futures=True)
        for endpoint in endpoints.values():
            endpoint.backend.close()
    return result


def _end_abandoned(ledger: Ledger, run_ids: Sequence[str]) -> None:
    """Append an ``interrupted`` end row for runs whose worker is still waiting on a model call."""
    for run_id in run_ids:
        if not ledger.query("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)):
            continue  # claimed by no one yet: nothing was started
        turns = ledger.query(
            "SELECT COUNT(*) AS n, COALESCE(SUM(prompt_tokens), 0) AS p, COALESCE(SUM(completion_tokens), 0) AS c"
            " FROM turns WHERE run_id = ?", (run_id,))[0]  # fmt: skip
        try:
            ledger.end_run(RunEnd(run_id=run_id, outcome="interrupted", turns=turns["n"], prompt_tokens=turns["p"],
                                  completion_tokens=turns["c"], breach=None, error="interrupted by the user (second Ctrl-C)",
                                  checks=[], final_answer=None, escape_attempts=[], files_written=[]))  # fmt: skip
        except LedgerError:
            pass  # its worker wrote the end row meanwhile, or the run never started


def plural(count: int, word: str) -> str:
    """``"1 run"``, ``"3 runs"``: a count with its noun."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def format_run_line(index: int, total: int, summary: RunSummary) -> str:
    """One line per finished run, e.g. ``[2/4] list_and_report embedded:smollm2-135m T=0.7 ... -> task_failed``."""
    p = summary.plan
    modes = ", ".join(summary.failure_modes) or "none"
    timing = f", {summary.elapsed_s:.1f} s" if summary.elapsed_s is not None else ""
    extra = f" ({summary.error})" if summary.outcome == "infra_error" and summary.error else ""
    return (
        f"[{index}/{total}] {p.scenario.name} {p.model} T={p.temperature:g} seed={p.seed + p.repetition} "
        f"{p.tool_mode}/{p.parser} rep={p.repetition} -> {summary.outcome}{extra} "
        f"({plural(summary.turns, 'turn')}, {plural(summary.tokens, 'token')}{timing}); failure modes: {modes}"
    )


def summary_rows(summaries: Sequence[RunSummary]) -> list[dict[str, Any]]:
    """One row per cell (scenario, model, temperature, tool mode, parser) with outcome counts.

    ``pass_rate`` is passes / runs that were not ``infra_error`` (in [0, 1], or None when none).
    """
    cells: dict[tuple[Any, ...], dict[str, Any]] = {}
    for s in summaries:
        p = s.plan
        key = (p.scenario.name, p.model, p.temperature, p.tool_mode, p.parser)
        row = cells.setdefault(key, {
            "scenario": key[0], "model": key[1], "temperature": key[2], "tool_mode": key[3], "parser": key[4],
            "runs": 0, "pass": 0, "task_failed": 0, "turn_limit": 0, "token_limit": 0, "infra_error": 0, "interrupted": 0,
        })  # fmt: skip
        row["runs"] += 1
        row[s.outcome] += 1
    for row in cells.values():
        scored = row["runs"] - row["infra_error"] - row["interrupted"]
        row["pass_rate"] = row["pass"] / scored if scored else None
    return list(cells.values())

