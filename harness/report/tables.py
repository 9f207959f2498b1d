"""The report's tables, computed from :class:`~harness.report.frames.LedgerFrames`: summary per cell,
failure modes by model, shortest examples, lenient-parser rescue.

Statistics are in :mod:`harness.stats` (Wilson intervals, pass^k), each citing its source.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from harness.errors import UsageError
from harness.report.frames import LedgerFrames
from harness.report.grouping import grouped_median
from harness.stats import pass_hat_k, wilson_interval

__all__ = [
    "CELL_AXES",
    "EXCERPT_CHARS",
    "check_failure_table",
    "failure_mode_table",
    "lenient_rescue",
    "parse_axes",
    "shortest_examples",
    "summary_table",
]

CELL_AXES = ("scenario", "model", "temperature", "tool_mode", "parser", "think", "stream")
"""The axes that define a cell; runs of one cell differ only in repetition and seed."""
EXCERPT_CHARS = 120


def parse_axes(text: str | None) -> tuple[str, ...]:
    """Parse ``--by`` (comma-separated axes) into a tuple; None or empty means :data:`CELL_AXES`.

    Raises:
        UsageError: an axis is not one of :data:`CELL_AXES`.
    """
    if not text:
        return CELL_AXES
    axes = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = [a for a in axes if a not in CELL_AXES]
    if unknown or not axes:
        raise UsageError(f"--by: unknown axis '{unknown[0] if unknown else text}'; choose from {', '.join(CELL_AXES)}.")
    return tuple(dict.fromkeys(axes))


def _wilson_or_nan(k: int, n: int) -> tuple[float, float]:
    return wilson_interval(int(k), int(n)) if n > 0 else (math.nan, math.nan)


def summary_table(frames: LedgerFrames, by: Sequence[str] = CELL_AXES, *, latency: bool = True) -> pd.DataFrame:
    """One row per group of runs (default: per cell) with rates, pass^k, counts and medians.

    pass^k (Yao et al. 2024) is the mean over the group's cells of ``C(c, k) / C(n, k)``, each
    cell (scenario × model × temperature × tool mode × parser × think × stream) being one tau-bench task whose
    scored runs are its trials; it is NaN when a cell has fewer than k scored runs.

    Args:
        frames: from :func:`load_frames`.
        by: grouping axes, a subset of :data:`CELL_AXES` (``task_kind`` may be added).
        latency: False leaves out ``latency_p50_ms`` and ``latency_p95_ms`` (their order statistics cost the most).

    Returns:
        DataFrame sorted by ``by``, columns: the ``by`` axes; ``runs`` (one per run identity: a run interrupted and
        resumed, or repeated with ``--no-resume``, counts once); ``scored``;
        ``passes``; ``pass_rate`` with ``pass_low``/``pass_high`` (95% Wilson, rates in [0, 1],
        NaN with no scored run); ``pass^1`` .. ``pass^K`` (K = the most repetitions of any cell,
        at most its scored runs); ``infra_error``; ``interrupted`` (interrupted or unfinished); ``context_overflow``
        (the conversation outgrew ``num_ctx``); ``median_turns``; ``median_tokens`` (tokens); ``latency_p50_ms``
        and ``latency_p95_ms`` (per-turn wall latency, ms); ``ttft_ms`` (median over runs of each run's mean time to
        first token, ms) and ``decode_tps`` (the same for the decode rate, completion tokens/s), NaN where the ledger
        has none. Counts and medians cover scored runs only, except ``runs``,
        ``infra_error``, ``interrupted`` and ``context_overflow``.
    """
    by = list(by)
    runs = frames.runs
    if runs.empty:
        return pd.DataFrame(columns=[*by, "runs", "scored", "passes", "pass_rate", "pass_low", "pass_high"])
    by = [a for a in by if a in runs.columns]
    ids, table = frames.groups.ids(by)
    n = len(table)
    scored_flags = runs["scored"].to_numpy(dtype=bool)
    scored_ids = np.where(scored_flags, ids, -1)
    counted, outcome = runs["counted"].to_numpy(dtype=bool), frames.groups.isin
    for name, flags in (("runs", counted), ("scored", scored_flags), ("passes", runs["passed"].to_numpy(dtype=bool)),
                        ("infra_error", counted & outcome("outcome", ["infra_error"])),
                        ("interrupted", counted & outcome("outcome", ["interrupted", "unfinished"])),
                        ("context_overflow", counted & outcome("outcome", ["context_overflow"]))):  # fmt: skip
        table[name] = np.bincount(ids[flags & (ids >= 0)], minlength=n)[:n].astype("int64")
    scored = table["scored"].to_numpy()
    table.insert(
        len(by) + 3, "pass_rate", np.where(scored > 0, table["passes"].to_numpy() / np.where(scored > 0, scored, 1), np.nan)
    )
    bounds = [_wilson_or_nan(k, n) for k, n in zip(table["passes"], table["scored"], strict=True)]
    table.insert(len(by) + 4, "pass_low", [b[0] for b in bounds])
    table.insert(len(by) + 5, "pass_high", [b[1] for b in bounds])
    for name, column in (
        ("median_turns", "turns"),
        ("median_tokens", "tokens"),
        ("ttft_ms", "ttft_ms"),
        ("decode_tps", "decode_tps"),
    ):
        table[name] = grouped_median(scored_ids, runs[column].to_numpy(dtype=np.float64), n)
    table = pd.concat([table, _pass_k_columns(frames, table, by)], axis=1)
    if latency:
        quantiles = frames.latencies.quantiles(scored_ids, (0.5, 0.95), n)
        table["latency_p50_ms"], table["latency_p95_ms"] = quantiles[:, 0], quantiles[:, 1]
    return table.sort_values(by, kind="stable").reset_index(drop=True)


def _pass_k_cells(frames: LedgerFrames) -> pd.DataFrame:
    """Per cell (:data:`CELL_AXES` and ``task_kind``) with scored runs: ``n`` scored runs, ``c`` passes and ``repeats``
    (distinct repetitions), sorted by the cell; the tau-bench tasks of pass^k."""
    if "pass_k_cells" in frames.groups.memo:
        return frames.groups.memo["pass_k_cells"]
    runs = frames.runs
    ids, cells = frames.groups.ids([*CELL_AXES, "task_kind"], runs["scored"].to_numpy(dtype=bool))
    n = len(cells)
    has = ids >= 0
    cells["n"] = np.bincount(ids[has], minlength=n)[:n].astype("int64")
    cells["c"] = np.bincount(ids[has & runs["passed"].to_numpy(dtype=bool)], minlength=n)[:n].astype("int64")
    repetition = pd.factorize(runs["repetition"])[0].astype(np.int64)
    stride = int(repetition.max(initial=0)) + 1
    pairs = np.unique(ids[has] * stride + repetition[has])
    cells["repeats"] = np.bincount(pairs // stride, minlength=n)[:n].astype("int64")
    frames.groups.memo["pass_k_cells"] = cells
    return cells


def _pass_k_columns(frames: LedgerFrames, table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """``pass^1`` .. ``pass^K`` for each row of ``table`` (K = the most repetitions of any cell, at most its scored runs):
    the mean over the row's cells (tau-bench tasks) of C(c, k) / C(n, k); NaN if any of its cells has n < k."""
    cells = _pass_k_cells(frames)
    max_k = int(min(cells["n"].max(), cells["repeats"].max())) if not cells.empty else 0
    if "pass_hat_k" not in frames.groups.memo:  # per cell and k, computed once for every table
        frames.groups.memo["pass_hat_k"] = pd.DataFrame(
            [[pass_hat_k(n, c, k) if n >= k else math.nan for k in range(1, max_k + 1)]
             for n, c in zip(cells["n"].tolist(), cells["c"].tolist(), strict=True)], columns=range(1, max_k + 1))  # fmt: skip
    per_cell, sizes = frames.groups.memo["pass_hat_k"].to_numpy(dtype=float), cells["n"].to_numpy()
    cell_groups = (
        {key if isinstance(key, tuple) else (key,): idx for key, idx in cells.groupby(by, sort=True).indices.items()}
        if not cells.empty
        else {}
    )
    rows = [cell_groups.get(tuple(row), np.array([], dtype=np.int64)) for row in table[by].itertuples(index=False)]
    pass_k = {
        f"pass^{k}": [
            math.nan if not len(idx) or (sizes[idx] < k).any() else float(np.mean(per_cell[idx, k - 1])) for idx in rows
        ]
        for k in range(1, max_k + 1)
    }
    return pd.DataFrame(pass_k, index=table.index)


def failure_mode_table(frames: LedgerFrames, by: str | Sequence[str] = "model") -> pd.DataFrame:
    """Per failure mode and group of scored runs: share of runs with >= 1 occurrence and per-turn rate.

    Args:
        frames: from :func:`load_frames`.
        by: the axis (or axes, e.g. ``["model", "temperature"]``) whose groups are compared (default ``model``).

    Returns:
        Long DataFrame, one row per (mode, group), columns ``mode``, the ``by`` axes,
        ``runs_with`` (count), ``scored_runs``, ``share`` with ``share_low``/``share_high``
        (95% Wilson; rates in [0, 1]), ``turns_with``, ``turns`` (turns of scored runs),
        ``per_turn_rate`` (in [0, 1]) and ``spread`` (max - min ``share`` across the groups
        for that mode). Sorted by ``spread`` descending, then mode, then the groups:
        the modes that separate the groups most come first.
    """
    keys = [by] if isinstance(by, str) else list(by)
    columns = ["mode", *keys, "runs_with", "scored_runs", "share", "share_low", "share_high", "turns_with", "turns",
               "per_turn_rate", "spread"]  # fmt: skip
    scored = frames.runs["scored"].to_numpy(dtype=bool)
    ids, groups = frames.groups.ids(keys, scored)
    run_pos = frames.run_modes["run_id"].cat.codes.to_numpy(dtype=np.int64)  # categories: the runs, in order
    pair_ids = np.where(run_pos >= 0, ids[np.maximum(run_pos, 0)] if len(ids) else -1, -1)
    mine = pair_ids >= 0
    if not mine.any():
        return pd.DataFrame(columns=columns)
    mode_codes, modes = pd.factorize(frames.run_modes["mode"].to_numpy(dtype=object)[mine], sort=True)
    n_groups, n_modes = len(groups), len(modes)
    cell = mode_codes.astype(np.int64) * n_groups + pair_ids[mine]
    turns_with = frames.run_modes["turns_with_mode"].to_numpy(dtype=np.int64)[mine]
    grid = np.tile(np.arange(n_groups), n_modes)
    table = pd.DataFrame({"mode": [str(m) for m in modes for _ in range(n_groups)]})
    for axis in keys:
        table[axis] = groups[axis].take(grid).to_numpy()
    table["runs_with"] = np.bincount(cell, minlength=n_modes * n_groups).astype("int64")
    table["turns_with"] = np.bincount(cell, weights=turns_with, minlength=n_modes * n_groups).astype("int64")
    has = ids >= 0
    table["scored_runs"] = np.bincount(ids[has], minlength=n_groups).astype("int64")[grid]
    recorded = frames.runs["turns_recorded"].to_numpy(dtype=np.int64)
    table["turns"] = np.bincount(ids[has], weights=recorded[has], minlength=n_groups).astype("int64")[grid]
    table["share"] = table["runs_with"] / table["scored_runs"]
    bounds = [wilson_interval(int(k), int(n)) for k, n in zip(table["runs_with"], table["scored_runs"], strict=True)]
    table["share_low"] = [b[0] for b in bounds]
    table["share_high"] = [b[1] for b in bounds]
    table["per_turn_rate"] = np.where(
        table["turns"] > 0, table["turns_with"] / table["turns"].where(table["turns"] > 0, 1), np.nan
    )
    table["spread"] = table.groupby("mode")["share"].transform(lambda s: s.max() - s.min())
    table = table.sort_values(["spread", "mode", *keys], ascending=[False, True, *([True] * len(keys))], kind="stable")
    return table[columns].reset_index(drop=True)


def check_failure_table(frames: LedgerFrames, by: Sequence[str] = ("model",)) -> pd.DataFrame:
    """Why runs failed: per group of scored runs and done check, how many runs failed that check.

    Args:
        frames: from :func:`load_frames`.
        by: grouping axes (e.g. ``["model"]`` or every cell axis).

    Returns:
        Long DataFrame sorted by the groups, then ``failed`` descending, then check name: the ``by`` axes, ``check``
        (name, as ``scenario: name`` unless ``scenario`` is in ``by``), ``failed`` (scored runs in which it failed; a
        check listed twice by a scenario counts a run once), ``checked`` (scored runs that ran it) and ``share``
        (``failed / checked``, in [0, 1]). Only checks that failed at least once in a group are listed.
    """
    keys = list(by)
    columns = [*keys, "check", "failed", "checked", "share"]
    scored = frames.runs["scored"].to_numpy(dtype=bool)
    checks = frames.run_checks.merge(
        frames.runs[["run_id", "scenario", *[k for k in keys if k != "scenario"]]][scored], on="run_id", how="inner"
    )
    if checks.empty:
        return pd.DataFrame(columns=columns)
    if "scenario" not in keys:  # check names repeat across scenarios (file_exists, ...): say whose check it was
        checks["check"] = checks["scenario"].astype(str) + ": " + checks["check"].astype(str)
    # a scenario may list a check kind twice: a run counts once per check name, failed if any of them failed
    per_run = checks.assign(failed=~checks["passed"]).groupby([*keys, "check", "run_id"], sort=True)["failed"].any().reset_index()
    table = per_run.groupby([*keys, "check"], sort=True).agg(failed=("failed", "sum"), checked=("run_id", "size")).reset_index()
    table = table[table["failed"] > 0].copy()
    table[["failed", "checked"]] = table[["failed", "checked"]].astype("int64")
    table["share"] = table["failed"] / table["checked"]
    table = table.sort_values([*keys, "failed", "check"], ascending=[*([True] * len(keys)), False, True], kind="stable")
    return table[columns].reset_index(drop=True)


def shortest_examples(frames: LedgerFrames, *, max_chars: int = EXCERPT_CHARS) -> pd.DataFrame:
    """For each failure mode, the shortest recorded reply that shows it (ties: earliest turn).

    Returns:
        DataFrame sorted by mode: ``mode``, ``run_id``, ``turn``, ``model``, ``chars`` (reply
        length in characters) and ``excerpt`` (the reply, cut to ``max_chars`` with ``…``; for an empty reply that
        made structured tool calls, the calls as ``name(arguments)``, so a mode that came from a call shows it) and
        ``kind`` (``reply`` or ``call``).
    """
    columns = ["mode", "run_id", "turn", "model", "chars", "excerpt", "kind"]
    best = frames.mode_examples
    if best.empty:
        return pd.DataFrame(columns=columns)
    texts = frames.replies(best["seq"].tolist())
    calls = {seq: _calls_text(c) for seq, c in frames.reply_calls([int(s) for s in best["seq"] if not texts.get(int(s))]).items()}
    model_of = pd.Series(frames.runs["model"].to_numpy(), index=frames.runs["run_id"].to_numpy())
    out = pd.DataFrame({
        "mode": best["mode"].to_numpy(), "run_id": best["run_id"].astype(str).to_numpy(), "turn": best["turn"].to_numpy(),
        "model": model_of.reindex(best["run_id"].astype(str)).to_numpy(), "chars": best["chars"].to_numpy(),
        "excerpt": [_truncate(calls.get(int(s)) or texts.get(int(s), ""), max_chars) for s in best["seq"]],
        "kind": ["call" if int(s) in calls else "reply" for s in best["seq"]],
    })  # fmt: skip
    return out.reset_index(drop=True)


def _calls_text(calls: object) -> str:
    """Structured tool calls as ``name(arguments)``, ``; ``-separated (OpenAI ``function`` shape or flat)."""
    import json

    parts = []
    for call in calls if isinstance(calls, list) else [calls]:
        body = call.get("function", call) if isinstance(call, dict) else {}
        name = body.get("name") if isinstance(body, dict) else None
        args = body.get("arguments") if isinstance(body, dict) else None
        args_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, sort_keys=True)
        parts.append(f"{name if isinstance(name, str) else '?'}({args_text if args is not None else ''})")
    return "; ".join(parts)


def _truncate(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def lenient_rescue(frames: LedgerFrames) -> pd.DataFrame:
    """Per model, pass rate under the lenient parser minus under strict, on matching cells.

    Only (model, scenario, temperature, tool mode, think, stream) combinations that ran under both parser
    policies count, so the two rates compare like with like.

    Returns:
        One row per model with both policies: ``model``, ``lenient_passes``, ``lenient_scored``,
        ``strict_passes``, ``strict_scored``, ``lenient_rate``, ``strict_rate`` (in [0, 1]) and
        ``rescued`` (lenient minus strict, in [-1, 1]).
    """
    columns = [
        "model",
        "lenient_passes",
        "lenient_scored",
        "strict_passes",
        "strict_scored",
        "lenient_rate",
        "strict_rate",
        "rescued",
    ]
    scored = frames.runs["scored"].to_numpy(dtype=bool)
    ids, groups = frames.groups.ids(["model", "scenario", "temperature", "tool_mode", "think", "stream"], scored)
    parser = frames.runs["parser"].to_numpy(dtype=object)
    has_both = np.ones(len(groups) + 1, dtype=bool)  # the last entry is read for ids -1 (unscored: dropped by `scored`)
    for policy in ("strict", "lenient"):
        has_both[:-1] &= np.bincount(ids[scored & (parser == policy)], minlength=len(groups))[: len(groups)] > 0
    both = scored & has_both[ids]
    if not both.any():
        return pd.DataFrame(columns=columns)
    runs = pd.DataFrame({c: frames.runs[c].to_numpy()[both] for c in ("model", "parser", "passed")})
    counts = runs.groupby(["model", "parser"], sort=True)["passed"].agg(["sum", "size"]).unstack("parser")
    out = pd.DataFrame({
        "model": counts.index,
        "lenient_passes": counts[("sum", "lenient")].astype(int).to_numpy(), "lenient_scored": counts[("size", "lenient")].astype(int).to_numpy(),
        "strict_passes": counts[("sum", "strict")].astype(int).to_numpy(), "strict_scored": counts[("size", "strict")].astype(int).to_numpy(),
    })  # fmt: skip
    out["lenient_rate"] = out["lenient_passes"] / out["lenient_scored"]
    out["strict_rate"] = out["strict_passes"] / out["strict_scored"]
    out["rescued"] = out["lenient_rate"] - out["strict_rate"]
    return out[columns].reset_index(drop=True)


# -- the markdown report -------------------------------------------------------------------------------
