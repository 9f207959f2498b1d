"""Matrix expansion and execution: scenarios x models x temperatures x seeds x tool modes x
parsers x repetitions, each cell run through :func:`harness.loop.run_once`.

A scenario file declares its default axes in ``[matrix]``; :class:`MatrixOverrides` (the CLI
flags) replace any axis for every scenario. Runs are grouped by model so that each backend is
opened (and an embedded server started) once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.backends import open_backend, parse_model_spec
from harness.backends.base import Backend
from harness.backends.replay import CassetteRecorder
from harness.errors import BackendError, BackendUnavailable, ModelNotFound
from harness.ledger import Ledger
from harness.loop import RunPlan, RunSummary, run_once
from harness.scenarios import Scenario

__all__ = ["MatrixOverrides", "MatrixResult", "expand_matrix", "run_matrix"]


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
        UsageError: a model spec is malformed.
    """
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
    return plans


@dataclass
class MatrixResult:
    """What a matrix came to.

    Attributes:
        summaries: one per finished run, in execution order.
        skipped: ``(model, reason, planned runs)`` for models whose server could not be used at all; their
            runs were not started (nothing was recorded for them; re-run once fixed).
    """

    summaries: list[RunSummary]
    skipped: list[tuple[str, str, int]]


def run_matrix(
    plans: Sequence[RunPlan],
    ledger: Ledger,
    *,
    runs_dir: Path,
    record_dir: Path | None = None,
    on_run: Callable[[int, int, RunSummary], None] | None = None,
    backend_factory: Callable[..., Backend] = open_backend,
) -> MatrixResult:
    """Run every plan, one model at a time, appending everything to the ledger.

    Args:
        plans: from :func:`expand_matrix`.
        ledger: an open, writable ledger.
        runs_dir: parent folder for run sandboxes.
        record_dir: when set, one cassette per run is written there as ``<run_id>.jsonl``.
        on_run: progress callback ``(index from 1, total, summary)``.
        backend_factory: opens a backend from a spec (tests can pass their own).

    Returns:
        The summaries and the models skipped because their server was unusable.

    Raises:
        LedgerError: the ledger cannot be written.
        KeyboardInterrupt: after the run in flight is recorded as ``interrupted``.
    """
    by_model: dict[str, list[RunPlan]] = {}
    for plan in plans:
        by_model.setdefault(plan.model, []).append(plan)
    summaries: list[RunSummary] = []
    skipped: list[tuple[str, str, int]] = []
    done = 0
    for model, model_plans in by_model.items():
        api_key_env = next((p.scenario.api_key_env for p in model_plans if p.scenario.api_key_env), None)
        num_ctx = max(p.scenario.num_ctx for p in model_plans)
        backend = backend_factory(model, api_key_env=api_key_env, num_ctx=num_ctx)
        try:
            try:
                backend.identity()  # preflight: a server that is down or lacks the model is one message, not N runs
            except (BackendUnavailable, ModelNotFound) as exc:
                skipped.append((model, str(exc), len(model_plans)))
                continue
            except BackendError:
                pass  # may be transient: each run meets it again and records it as infra_error
            for plan in model_plans:
                run_id = uuid.uuid4().hex
                if record_dir is None:
                    summary = run_once(plan, backend, ledger, runs_dir=runs_dir, run_id=run_id)
                else:
                    with CassetteRecorder(Path(record_dir) / f"{run_id}.jsonl") as recorder:
                        summary = run_once(plan, backend, ledger, runs_dir=runs_dir, run_id=run_id, on_reply=recorder.record)
                summaries.append(summary)
                done += 1
                if on_run:
                    on_run(done, len(plans), summary)
        finally:
            backend.close()
    return MatrixResult(summaries, skipped)


def format_run_line(index: int, total: int, summary: RunSummary, elapsed_s: float | None = None) -> str:
    """One line per finished run, e.g. ``[2/4] list_and_report embedded:smollm2-135m T=0.7 ... -> task_failed``."""
    p = summary.plan
    modes = ", ".join(summary.failure_modes) or "none"
    timing = f", {elapsed_s:.1f} s" if elapsed_s is not None else ""
    extra = f" ({summary.error})" if summary.outcome == "infra_error" and summary.error else ""
    return (
        f"[{index}/{total}] {p.scenario.name} {p.model} T={p.temperature:g} seed={p.seed + p.repetition} "
        f"{p.tool_mode}/{p.parser} rep={p.repetition} -> {summary.outcome}{extra} "
        f"({summary.turns} turns, {summary.tokens} tokens{timing}); failure modes: {modes}"
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

