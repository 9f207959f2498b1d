"""Comparison reports: tidy DataFrames from the ledger, summary tables, and ``harness report``.

Design
------
* Reports only read: the ledger is opened read-only and never migrated or written.
* :func:`load_frames` is the one entry point (notebooks start there). It reads only the
  columns it needs with ``pandas.read_sql`` and decodes each distinct ``failure_modes`` JSON
  text once (a ledger has few distinct label sets), so a million turns load in seconds.
  Newest labels win: a ``labels`` row for a turn overrides the turn's own labels, as in
  :meth:`harness.ledger.Ledger.turns`.
* Scored runs: ``infra_error`` and ``interrupted`` runs, and runs with no end row yet
  (``unfinished``), are counted in their own columns and left out of every denominator,
  median and rate, since none of them says anything about the model.
* Everything written is deterministic for a given ledger: stable sort orders, no wall-clock
  time (the header states the newest run end recorded in the ledger), PNGs without dates.

Statistics are in :mod:`harness.stats`; plots in :mod:`harness._plots`.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tabulate import tabulate

from harness.errors import LedgerError, UsageError
from harness.ledger import Ledger
from harness.stats import pass_hat_k, wilson_interval

__all__ = [
    "CELL_AXES",
    "EXCLUDED_OUTCOMES",
    "SCORED_OUTCOMES",
    "LedgerFrames",
    "failure_mode_table",
    "lenient_rescue",
    "load_frames",
    "parse_axes",
    "shortest_examples",
    "summary_table",
    "write_report",
]

CELL_AXES = ("scenario", "model", "temperature", "tool_mode", "parser")
"""The axes that define a cell; runs of one cell differ only in repetition and seed."""
SCORED_OUTCOMES = ("pass", "task_failed", "turn_limit", "token_limit")
"""Outcomes that say something about the model: the denominators of every rate."""
EXCLUDED_OUTCOMES = ("infra_error", "interrupted", "unfinished")
"""Outcomes left out of every denominator (``unfinished``: the run has no end row)."""
MAX_PASS_K_COLUMNS = 10
"""The summary table shows pass^k for k = 1 .. min(repeats, this); the CSV and plot show all k."""
EXCERPT_CHARS = 120


@dataclass(frozen=True)
class LedgerFrames:
    """The ledger as tidy DataFrames. Build with :func:`load_frames`.

    Attributes:
        runs: one row per run, in start order. Columns: ``run_id``, ``scenario``,
            ``scenario_path``, ``scenario_hash``, ``model``, ``temperature``, ``seed``,
            ``tool_mode``, ``parser``, ``repetition``, ``started_at``, ``ended_at`` (UTC ISO
            text, None if unfinished), ``outcome`` (one of :data:`harness.loop.OUTCOMES` or
            ``unfinished``), ``scored`` and ``passed`` (bool; a run is scored when its outcome
            counts and it is the newest scored run of its ``identity``), ``superseded`` (bool: an
            older scored run of the same identity, left out of every rate), ``turns`` (model calls),
            ``prompt_tokens``, ``completion_tokens``, ``tokens`` (their sum, tokens),
            ``turns_recorded`` (rows in ``turns``; equals ``turns`` unless a turn was lost),
            ``latency_ms`` (summed over the run's turns, ms) and ``latency_ms_median`` (ms).
        turns: one row per turn, in ledger order. Columns: ``seq`` (ledger row), ``run_id``
            (categorical), ``turn`` (from 1), ``failure_modes`` (tuple of mode names, newest
            labels), ``labels_version`` (classifier version of those labels), ``finish_reason``,
            ``prompt_tokens``, ``completion_tokens`` (tokens), ``latency_ms`` (ms) and
            ``content_chars`` (length of the reply text; 0 when empty or null).
        turn_modes: one row per turn × failure mode: ``seq``, ``run_id``, ``turn``, ``mode``.
        run_modes: one row per run × failure mode with >= 1 occurrence: ``run_id``, ``mode``,
            ``turns_with_mode`` (count of the run's turns showing it).
        ledger_path: the file read.
        runs_chain_head: ``row_hash`` of the newest ``runs`` row (identifies the ledger's
            content), or None when empty.
    """

    runs: pd.DataFrame
    turns: pd.DataFrame
    turn_modes: pd.DataFrame
    run_modes: pd.DataFrame
    ledger_path: Path
    runs_chain_head: str | None

    @property
    def models(self) -> list[str]:
        """Model specs in the ledger, sorted."""
        return sorted(self.runs["model"].unique().tolist())

    @property
    def newest_end(self) -> str | None:
        """UTC time of the newest run end in the ledger, or None when no run has ended."""
        ends = self.runs["ended_at"].dropna()
        return None if ends.empty else str(ends.max())

    def replies(self, seqs: Sequence[int]) -> dict[int, str]:
        """Reply text of the given turns (``turns.seq``), read on demand to keep frames small.

        Returns:
            ``{seq: content}``; null content reads as ``""``.
        """
        if not seqs:
            return {}
        with _connect(self.ledger_path) as db:
            marks = ",".join("?" * len(seqs))
            rows = db.execute(f"SELECT seq, content FROM turns WHERE seq IN ({marks})", [int(s) for s in seqs]).fetchall()
        return {int(seq): content or "" for seq, content in rows}


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


_RUNS_SQL = (
    "SELECT r.run_id, r.identity, r.scenario, r.scenario_path, r.scenario_hash, r.model, r.temperature, r.seed, r.tool_mode,"
    " r.parser, r.repetition, r.started_at, e.ended_at, e.outcome, e.turns, e.prompt_tokens, e.completion_tokens"
    " FROM runs r LEFT JOIN run_ends e USING (run_id) ORDER BY r.seq"
)
_TURNS_SQL = (
    "SELECT seq, run_id, turn, failure_modes, classifier_version AS labels_version, finish_reason, prompt_tokens,"
    " completion_tokens, latency_ms, COALESCE(length(content), 0) AS content_chars FROM turns ORDER BY seq"
)
_LABELS_SQL = (
    "SELECT run_id, turn, failure_modes, classifier_version AS labels_version FROM labels"
    " WHERE seq IN (SELECT MAX(seq) FROM labels GROUP BY run_id, turn)"
)


def load_frames(ledger_path: str | Path) -> LedgerFrames:
    """Read a ledger (read-only) into tidy DataFrames.

    Args:
        ledger_path: the ledger file.

    Returns:
        :class:`LedgerFrames` (runs, turns, turn × mode, run × mode).

    Raises:
        LedgerError: the file is missing, not SQLite, or not a harness ledger.
    """
    path = Path(ledger_path)
    with Ledger(path, readonly=True) as ledger:  # validates the file and says what is wrong in one sentence
        head = ledger.query("SELECT row_hash FROM runs ORDER BY seq DESC LIMIT 1")
    try:
        with _connect(path) as db:
            runs = pd.read_sql(_RUNS_SQL, db)
            turns = pd.read_sql(_TURNS_SQL, db)
            labels = pd.read_sql(_LABELS_SQL, db)
    except (sqlite3.Error, pd.errors.DatabaseError) as exc:
        raise LedgerError(f"could not read the ledger {path} ({exc}); run `harness ledger verify --ledger {path}`.") from exc
    if not labels.empty:
        turns = turns.merge(labels, on=["run_id", "turn"], how="left", suffixes=("", "_new"), sort=False)
        newer = turns["failure_modes_new"].notna()
        turns.loc[newer, "failure_modes"] = turns.loc[newer, "failure_modes_new"]
        turns.loc[newer, "labels_version"] = turns.loc[newer, "labels_version_new"]
        turns = turns.drop(columns=["failure_modes_new", "labels_version_new"])
    turns["run_id"] = pd.Categorical(turns["run_id"], categories=runs["run_id"])
    turns["labels_version"] = turns["labels_version"].astype("category")
    turns["finish_reason"] = turns["finish_reason"].astype("category")
    turns["latency_ms"] = turns["latency_ms"].astype(float)
    codes, uniques = pd.factorize(turns["failure_modes"])
    decoded = [tuple(json.loads(text)) for text in uniques]
    as_objects = np.empty(len(decoded), dtype=object)
    for i, modes in enumerate(decoded):
        as_objects[i] = modes
    turns["failure_modes"] = as_objects[codes] if len(turns) else pd.Series([], dtype=object)
    turn_modes = _explode_modes(turns, codes, decoded)
    run_modes = (
        turn_modes.groupby(["run_id", "mode"], observed=True, sort=True).size().rename("turns_with_mode").reset_index()
    )
    runs = _finish_runs(runs, turns)
    return LedgerFrames(runs, turns, turn_modes, run_modes, path, head[0]["row_hash"] if head else None)


def _explode_modes(turns: pd.DataFrame, codes: np.ndarray, decoded: list[tuple[str, ...]]) -> pd.DataFrame:
    rows, modes = [], []
    for code, names in enumerate(decoded):
        if not names:
            continue
        where = np.flatnonzero(codes == code)
        for name in names:
            rows.append(where)
            modes.append(np.full(len(where), name, dtype=object))
    if not rows:
        return pd.DataFrame({"seq": pd.Series([], dtype="int64"), "run_id": pd.Categorical([], categories=turns["run_id"].cat.categories),
                             "turn": pd.Series([], dtype="int64"), "mode": pd.Series([], dtype=object)})  # fmt: skip
    index = np.concatenate(rows)
    order = np.lexsort((np.concatenate(modes).astype(str), index))
    index = index[order]
    out = turns.iloc[index][["seq", "run_id", "turn"]].reset_index(drop=True)
    out["mode"] = np.concatenate(modes)[order]
    return out


def _finish_runs(runs: pd.DataFrame, turns: pd.DataFrame) -> pd.DataFrame:
    runs = runs.copy()
    runs["outcome"] = runs["outcome"].fillna("unfinished")
    runs["scored"] = runs["outcome"].isin(SCORED_OUTCOMES)
    # One sample per run identity: a repeat of the same identity (``--no-resume``, ``--cache``) gets the
    # same seed and options, so it is not an independent sample. The newest scored run counts (as in compare).
    newest = runs[runs["scored"]].drop_duplicates("identity", keep="last").index
    runs["superseded"] = runs["scored"] & ~runs.index.isin(newest)
    runs["scored"] = runs["scored"] & ~runs["superseded"]
    runs["passed"] = (runs["outcome"] == "pass") & runs["scored"]
    runs["temperature"] = runs["temperature"].astype(float)
    per_run = turns.groupby("run_id", observed=False).agg(
        _turns=("turn", "size"), _prompt=("prompt_tokens", "sum"), _completion=("completion_tokens", "sum"),
        latency_ms=("latency_ms", "sum"), latency_ms_median=("latency_ms", "median"),
    )  # fmt: skip
    per_run = per_run.reindex(runs["run_id"]).reset_index(drop=True)
    unfinished = runs["turns"].isna().to_numpy()
    for column, fallback in (("turns", "_turns"), ("prompt_tokens", "_prompt"), ("completion_tokens", "_completion")):
        ended = pd.to_numeric(runs[column], errors="coerce").to_numpy(dtype=float)
        counted = pd.to_numeric(per_run[fallback], errors="coerce").to_numpy(dtype=float)
        runs[column] = np.nan_to_num(np.where(unfinished, counted, ended)).astype("int64")
    runs["tokens"] = runs["prompt_tokens"] + runs["completion_tokens"]
    runs["turns_recorded"] = per_run["_turns"].fillna(0).astype("int64").to_numpy()
    runs["latency_ms"] = per_run["latency_ms"].fillna(0.0).to_numpy()
    runs["latency_ms_median"] = per_run["latency_ms_median"].to_numpy()
    return runs


# -- tables --------------------------------------------------------------------------------------------
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


def _pass_k_for_group(cells: pd.DataFrame, k: int) -> float:
    """Mean over the group's cells (tau-bench tasks) of C(c, k) / C(n, k); NaN if any cell has n < k."""
    if cells.empty or (cells["n"] < k).any():
        return math.nan
    return float(np.mean([pass_hat_k(n, c, k) for n, c in zip(cells["n"].tolist(), cells["c"].tolist(), strict=True)]))


def summary_table(frames: LedgerFrames, by: Sequence[str] = CELL_AXES) -> pd.DataFrame:
    """One row per group of runs (default: per cell) with rates, pass^k, counts and medians.

    pass^k (Yao et al. 2024) is the mean over the group's cells of ``C(c, k) / C(n, k)``, each
    cell (scenario × model × temperature × tool mode × parser) being one tau-bench task whose
    scored runs are its trials; it is NaN when a cell has fewer than k scored runs.

    Args:
        frames: from :func:`load_frames`.
        by: grouping axes, a subset of :data:`CELL_AXES`.

    Returns:
        DataFrame sorted by ``by``, columns: the ``by`` axes; ``runs`` (all); ``scored``;
        ``passes``; ``pass_rate`` with ``pass_low``/``pass_high`` (95% Wilson, rates in [0, 1],
        NaN with no scored run); ``pass^1`` .. ``pass^K`` (K = the most repetitions of any cell,
        at most its scored runs); ``infra_error``; ``interrupted`` (interrupted or unfinished); ``median_turns``;
        ``median_tokens`` (tokens); ``latency_p50_ms`` and ``latency_p95_ms`` (per-turn, ms).
        Counts and medians cover scored runs only, except ``runs``, ``infra_error`` and
        ``interrupted``.
    """
    by = list(by)
    runs = frames.runs
    if runs.empty:
        return pd.DataFrame(columns=[*by, "runs", "scored", "passes", "pass_rate", "pass_low", "pass_high"])
    scored = runs[runs["scored"]]
    cells = scored.groupby(list(CELL_AXES), sort=True).agg(
        n=("passed", "size"), c=("passed", "sum"), repeats=("repetition", "nunique")).reset_index()
    max_k = int(min(cells["n"].max(), cells["repeats"].max())) if not cells.empty else 0
    groups = runs.groupby(by, sort=True)
    table = groups.agg(
        runs=("run_id", "size"),
        scored=("scored", "sum"),
        passes=("passed", "sum"),
        infra_error=("outcome", lambda s: int((s == "infra_error").sum())),
        interrupted=("outcome", lambda s: int(s.isin(("interrupted", "unfinished")).sum())),
    ).reset_index()
    medians = scored.groupby(by, sort=True).agg(median_turns=("turns", "median"), median_tokens=("tokens", "median"))
    table = table.merge(medians.reset_index(), on=by, how="left")
    bounds = [_wilson_or_nan(k, n) for k, n in zip(table["passes"], table["scored"], strict=True)]
    table.insert(len(by) + 3, "pass_rate", np.where(table["scored"] > 0, table["passes"] / table["scored"].where(table["scored"] > 0, 1), np.nan))
    table.insert(len(by) + 4, "pass_low", [b[0] for b in bounds])
    table.insert(len(by) + 5, "pass_high", [b[1] for b in bounds])
    cell_groups = {key if isinstance(key, tuple) else (key,): g for key, g in cells.groupby(by, sort=True)} if not cells.empty else {}
    keys = [tuple(row) for row in table[by].itertuples(index=False)]
    pass_k = {f"pass^{k}": [_pass_k_for_group(cell_groups.get(key, cells.iloc[0:0]), k) for key in keys] for k in range(1, max_k + 1)}
    table = pd.concat([table, pd.DataFrame(pass_k, index=table.index)], axis=1)
    latency = _turn_latency_quantiles(frames, by)
    table = table.merge(latency, on=by, how="left")
    table[["runs", "scored", "passes", "infra_error", "interrupted"]] = table[["runs", "scored", "passes", "infra_error", "interrupted"]].astype("int64")
    return table.sort_values(by, kind="stable").reset_index(drop=True)


def _turn_latency_quantiles(frames: LedgerFrames, by: list[str]) -> pd.DataFrame:
    runs = frames.runs
    run_pos = pd.Index(runs["run_id"]).get_indexer(frames.turns["run_id"])
    keep = runs["scored"].to_numpy()[run_pos] if len(run_pos) else np.array([], dtype=bool)
    turn_axes = pd.DataFrame({axis: runs[axis].to_numpy()[run_pos[keep]] for axis in by})
    turn_axes["latency_ms"] = frames.turns["latency_ms"].to_numpy()[keep]
    if turn_axes.empty:
        return pd.DataFrame({**{axis: pd.Series([], dtype=runs[axis].dtype) for axis in by},
                             "latency_p50_ms": pd.Series([], dtype=float), "latency_p95_ms": pd.Series([], dtype=float)})  # fmt: skip
    grouped = turn_axes.groupby(by, sort=True)["latency_ms"]
    return pd.concat([grouped.quantile(0.5).rename("latency_p50_ms"), grouped.quantile(0.95).rename("latency_p95_ms")], axis=1).reset_index()


def failure_mode_table(frames: LedgerFrames, by: str = "model") -> pd.DataFrame:
    """Per failure mode and model: share of scored runs with >= 1 occurrence and per-turn rate.

    Args:
        frames: from :func:`load_frames`.
        by: the axis to compare across (default ``model``).

    Returns:
        Long DataFrame, one row per (mode, ``by`` value), columns ``mode``, ``by``,
        ``runs_with`` (count), ``scored_runs``, ``share`` with ``share_low``/``share_high``
        (95% Wilson; rates in [0, 1]), ``turns_with``, ``turns`` (turns of scored runs),
        ``per_turn_rate`` (in [0, 1]) and ``spread`` (max - min ``share`` across the ``by``
        values for that mode). Sorted by ``spread`` descending, then mode, then ``by``:
        the modes that separate the models most come first.
    """
    runs = frames.runs[frames.runs["scored"]]
    columns = ["mode", by, "runs_with", "scored_runs", "share", "share_low", "share_high", "turns_with", "turns", "per_turn_rate", "spread"]
    run_modes = frames.run_modes.merge(runs[["run_id", by]], on="run_id", how="inner") if not runs.empty else frames.run_modes.iloc[0:0]
    if runs.empty or run_modes.empty:
        return pd.DataFrame(columns=columns)
    scored_runs = runs.groupby(by, sort=True).size().rename("scored_runs")
    turns_total = runs.groupby(by, sort=True)["turns_recorded"].sum().rename("turns")
    counts = run_modes.groupby(["mode", by], sort=True).agg(runs_with=("run_id", "size"), turns_with=("turns_with_mode", "sum"))
    modes = sorted(run_modes["mode"].unique())
    grid = pd.MultiIndex.from_product([modes, scored_runs.index], names=["mode", by])
    table = counts.reindex(grid, fill_value=0).reset_index()
    table = table.merge(scored_runs.reset_index(), on=by).merge(turns_total.reset_index(), on=by)
    table["share"] = table["runs_with"] / table["scored_runs"]
    bounds = [wilson_interval(int(k), int(n)) for k, n in zip(table["runs_with"], table["scored_runs"], strict=True)]
    table["share_low"] = [b[0] for b in bounds]
    table["share_high"] = [b[1] for b in bounds]
    table["per_turn_rate"] = np.where(table["turns"] > 0, table["turns_with"] / table["turns"].where(table["turns"] > 0, 1), np.nan)
    table["spread"] = table.groupby("mode")["share"].transform(lambda s: s.max() - s.min())
    table = table.sort_values(["spread", "mode", by], ascending=[False, True, True], kind="stable")
    return table[columns].reset_index(drop=True)


def shortest_examples(frames: LedgerFrames, *, max_chars: int = EXCERPT_CHARS) -> pd.DataFrame:
    """For each failure mode, the shortest recorded reply that shows it (ties: earliest turn).

    Returns:
        DataFrame sorted by mode: ``mode``, ``run_id``, ``turn``, ``model``, ``chars`` (reply
        length in characters) and ``excerpt`` (the reply, cut to ``max_chars`` with ``…``).
    """
    columns = ["mode", "run_id", "turn", "model", "chars", "excerpt"]
    if frames.turn_modes.empty:
        return pd.DataFrame(columns=columns)
    chars = frames.turns.set_index("seq")["content_chars"]
    tm = frames.turn_modes.assign(chars=chars.reindex(frames.turn_modes["seq"]).to_numpy())
    best = tm.sort_values(["mode", "chars", "seq"], kind="stable").drop_duplicates("mode")
    texts = frames.replies(best["seq"].tolist())
    model_of = frames.runs.set_index("run_id")["model"]
    out = pd.DataFrame({
        "mode": best["mode"].to_numpy(), "run_id": best["run_id"].astype(str).to_numpy(), "turn": best["turn"].to_numpy(),
        "model": model_of.reindex(best["run_id"].astype(str)).to_numpy(), "chars": best["chars"].to_numpy(),
        "excerpt": [_truncate(texts.get(int(s), ""), max_chars) for s in best["seq"]],
    })  # fmt: skip
    return out.reset_index(drop=True)


def _truncate(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def lenient_rescue(frames: LedgerFrames) -> pd.DataFrame:
    """Per model, pass rate under the lenient parser minus under strict, on matching cells.

    Only (model, scenario, temperature, tool mode) combinations that ran under both parser
    policies count, so the two rates compare like with like.

    Returns:
        One row per model with both policies: ``model``, ``lenient_passes``, ``lenient_scored``,
        ``strict_passes``, ``strict_scored``, ``lenient_rate``, ``strict_rate`` (in [0, 1]) and
        ``rescued`` (lenient minus strict, in [-1, 1]).
    """
    columns = ["model", "lenient_passes", "lenient_scored", "strict_passes", "strict_scored", "lenient_rate", "strict_rate", "rescued"]
    runs = frames.runs[frames.runs["scored"]]
    keys = ["model", "scenario", "temperature", "tool_mode"]
    both = runs.groupby(keys)["parser"].transform(lambda s: {"strict", "lenient"} <= set(s))
    runs = runs[both.astype(bool)] if not runs.empty else runs
    if runs.empty:
        return pd.DataFrame(columns=columns)
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
def _pct(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def _interval(rate: float, low: float, high: float) -> str:
    if math.isnan(rate):
        return "n/a (no scored run)"
    return f"{_pct(rate)} [{100 * low:.1f}, {100 * high:.1f}]"


def _num(x: float, fmt: str = "{:g}") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _cell_text(text: str, *, code: bool = False) -> str:
    """Any stored string made safe for one markdown table cell or line: no pipes, newlines, backticks or HTML.

    With ``code=True`` the text goes inside a code span, where ``<`` is shown as is (entities would not be decoded).
    """
    text = str(text).replace("\\", "\\\\").replace("|", "\\|").replace("`", "'")
    if not code:
        text = text.replace("<", "&lt;")
    return text.replace("\r\n", " ⏎ ").replace("\n", " ⏎ ").replace("\r", " ⏎ ")


def _md_table(rows: list[dict[str, object]]) -> str:
    return tabulate(rows, headers="keys", tablefmt="github", disable_numparse=True)


def _summary_markdown(table: pd.DataFrame, by: list[str]) -> str:
    ks = [c for c in table.columns if c.startswith("pass^")][:MAX_PASS_K_COLUMNS]
    rows = []
    for r in table.to_dict("records"):
        row: dict[str, object] = {axis: _cell_text(_num(r[axis]) if axis == "temperature" else str(r[axis])) for axis in by}
        row["runs"] = r["runs"]
        row["scored"] = r["scored"]
        row["pass rate [95% Wilson]"] = _interval(r["pass_rate"], r["pass_low"], r["pass_high"])
        for k in ks:
            row[k] = _num(r[k], "{:.3f}")
        row["infra_error"] = r["infra_error"]
        row["interrupted"] = r["interrupted"]
        row["median turns"] = _num(r["median_turns"])
        row["median tokens"] = _num(r["median_tokens"])
        row["latency p50 (ms)"] = _num(r["latency_p50_ms"], "{:.0f}")
        row["latency p95 (ms)"] = _num(r["latency_p95_ms"], "{:.0f}")
        rows.append(row)
    return _md_table(rows)


def _failure_markdown(table: pd.DataFrame, models: list[str]) -> str:
    rows = []
    for mode, group in table.groupby("mode", sort=False):
        row: dict[str, object] = {"failure mode": f"`{_cell_text(mode, code=True)}`"}
        by_model = group.set_index("model")
        for model in models:
            if model not in by_model.index:
                row[f"{_cell_text(model)}: runs with ≥1 [95% Wilson]"] = "n/a (no scored run)"
                row[f"{_cell_text(model)}: per turn"] = "n/a"
                continue
            r = by_model.loc[model]
            row[f"{_cell_text(model)}: runs with ≥1 [95% Wilson]"] = f"{int(r['runs_with'])}/{int(r['scored_runs'])} = {_interval(r['share'], r['share_low'], r['share_high'])}"
            row[f"{_cell_text(model)}: per turn"] = f"{int(r['turns_with'])}/{int(r['turns'])} = {_pct(r['per_turn_rate'])}"
        row["spread (points)"] = f"{100 * group['spread'].iloc[0]:.1f}"
        rows.append(row)
    return _md_table(rows)


def write_report(
    ledger_path: str | Path,
    out_dir: str | Path,
    *,
    by: Sequence[str] = CELL_AXES,
    formats: Sequence[str] = ("md", "png"),
) -> list[Path]:
    """Write the comparison report for a ledger into ``out_dir``.

    Files: ``report.md`` (format ``md``); ``pass_rate.png``, ``failure_modes.png``,
    ``outcomes.png``, ``pass_k.png`` (format ``png``, embedded in the markdown by relative
    path); ``summary.csv``, ``failure_modes.csv``, ``runs.csv`` (format ``csv``). The same
    ledger always gives byte-identical files.

    Args:
        ledger_path: the ledger, opened read-only.
        out_dir: created if missing; files of the same names are overwritten.
        by: grouping axes of the summary table, a subset of :data:`CELL_AXES`.
        formats: any of ``md``, ``png``, ``csv``.

    Returns:
        Paths written, in writing order.

    Raises:
        LedgerError: the ledger cannot be read.
        UsageError: an unknown format or axis.
    """
    unknown = sorted(set(formats) - {"md", "png", "csv"})
    if unknown or not formats:
        raise UsageError(f"--format: unknown format '{unknown[0] if unknown else ''}'; choose from md, png, csv.")
    by = list(parse_axes(",".join(by)))
    frames = load_frames(ledger_path)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the report folder {out}: {exc.strerror or exc}.") from exc
    summary = summary_table(frames, by)
    failures = failure_mode_table(frames)
    written: list[Path] = []
    figures: dict[str, tuple[str, str]] = {}
    if "png" in formats and frames.runs["scored"].any():
        from harness import _plots

        cells = summary if by == list(CELL_AXES) else summary_table(frames, CELL_AXES)
        figures = _plots.write_all(frames, cells, failures, out)
        written.extend(out / name for name in figures)
    if "csv" in formats:
        for name, table in (("summary.csv", summary), ("failure_modes.csv", failures),
                            ("runs.csv", frames.runs.drop(columns=["scenario_path"]))):  # fmt: skip
            table.to_csv(out / name, index=False, lineterminator="\n", float_format="%.10g")
            written.append(out / name)
    if "md" in formats:
        text = _markdown(frames, summary, failures, by, figures)
        (out / "report.md").write_text(text, encoding="utf-8", newline="\n")
        written.append(out / "report.md")
    return written


def _markdown(frames: LedgerFrames, summary: pd.DataFrame, failures: pd.DataFrame, by: list[str], figures: dict[str, tuple[str, str]]) -> str:
    runs = frames.runs
    outcome_counts = runs["outcome"].value_counts()
    n_scored = int(runs["scored"].sum())
    lines = ["# Comparison report", ""]
    lines.append(
        f"Ledger `{frames.ledger_path.name}`: {len(runs)} runs ({n_scored} scored, {int(outcome_counts.get('infra_error', 0))} infra_error, "
        f"{int(outcome_counts.get('interrupted', 0) + outcome_counts.get('unfinished', 0))} interrupted or unfinished), {len(frames.turns)} turns; "
        f"newest run end {frames.newest_end or 'none'}; runs chain head `{(frames.runs_chain_head or 'none')[:16]}`."
    )
    lines.append("")
    if runs.empty:
        lines += ["**The ledger holds no runs yet: nothing to compare.** Run `harness run`, then report again.", ""]
        return "\n".join(lines)
    superseded = int(runs["superseded"].sum())
    if superseded:
        lines += [f"{superseded} run(s) repeat a run identity that finished again later (same scenario, model, options, "
                  "seed and repetition, e.g. after `--no-resume`); only the newest of each counts: the `runs` column "
                  "includes the repeats, `scored` and every rate do not.", ""]  # fmt: skip
    if n_scored == 0:
        lines += ["**No scored run:** every run ended as infra_error, interrupted or unfinished, so there is no rate to "
                  "report. Fix the server and re-run; infrastructure errors are never counted as model failures.", ""]  # fmt: skip
    lines += ["## Summary", "", f"One row per {' × '.join(by)}. Pass rate = passes / scored runs; infra_error, interrupted and "
              "unfinished runs are counted in their own columns and excluded from every denominator and median. "
              "pass^k = chance that k runs of a cell all pass (tau-bench); – where a cell has fewer than k scored runs.", ""]  # fmt: skip
    constant = [a for a in by if len(by) > 1 and summary[a].nunique(dropna=False) == 1]
    shown = [a for a in by if a not in constant] or by[:1]
    constant = [a for a in constant if a not in shown]
    if constant:
        lines += ["Same in every row: " + ", ".join(f"{a} = `{_cell_text(_num(summary[a].iloc[0]) if a == 'temperature' else summary[a].iloc[0])}`" for a in constant) + ".", ""]
    lines += [_summary_markdown(summary, shown), ""]
    notes = _edge_notes(summary, runs)
    if notes:
        lines += [*(f"- {n}" for n in notes), ""]
    lines += ["## Failure modes", ""]
    if failures.empty:
        lines += ["No failure mode was labelled in any scored run.", ""]
    else:
        models = sorted(runs.loc[runs["scored"], "model"].unique())
        note = " Only one model has scored runs, so the spread is 0 and modes are in name order." if len(models) < 2 else ""
        lines += ["Share of scored runs with at least one turn showing the mode (95% Wilson interval), and share of those "
                  f"runs' turns showing it. Sorted by spread = max − min share across models, largest first.{note}", ""]  # fmt: skip
        lines += [_failure_markdown(failures, models), ""]
    examples = shortest_examples(frames)
    if not examples.empty:
        lines += ["### Shortest reply showing each mode", ""]
        for r in examples.to_dict("records"):
            excerpt = _cell_text(r["excerpt"], code=True) if r["excerpt"] else "(empty reply)"
            lines.append(f"- `{_cell_text(r['mode'], code=True)}` — {_cell_text(r['model'])}, run `{_cell_text(r['run_id'], code=True)}` turn {r['turn']} ({r['chars']} chars): `{excerpt}`")
        lines.append("")
    rescue = lenient_rescue(frames)
    lines += ["## Rescued by the lenient parser", ""]
    if rescue.empty:
        lines += ["Not measured: no model ran the same cells under both parser policies.", ""]
    else:
        for r in rescue.to_dict("records"):
            lines.append(f"- {_cell_text(r['model'])}: {100 * r['rescued']:+.1f} points (lenient {r['lenient_passes']}/{r['lenient_scored']} = "
                         f"{_pct(r['lenient_rate'])} vs strict {r['strict_passes']}/{r['strict_scored']} = {_pct(r['strict_rate'])})")  # fmt: skip
        lines.append("")
    if figures:
        lines += ["## Plots", ""]
        for name, (alt, caption) in figures.items():
            lines += [f"![{alt}]({name})", "", f"*{caption}*", ""]
    return "\n".join(lines)


def _edge_notes(summary: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    notes = []
    if (summary["scored"] == 0).any():
        notes.append(f"{int((summary['scored'] == 0).sum())} row(s) have no scored run (only infra_error or interrupted): no rate is given for them.")
    if (summary["scored"] == 1).any():
        notes.append("Rows with a single scored run have a Wilson interval spanning most of [0, 100]%: one run says little.")
    extreme = summary[(summary["scored"] > 0) & summary["pass_rate"].isin((0.0, 1.0))]
    if not extreme.empty:
        notes.append(f"{len(extreme)} row(s) pass 0% or 100% of their runs; the Wilson interval still bounds the true rate away from certainty.")
    per_model = runs[runs["scored"]].groupby("model").size()
    for model, n in per_model.items():
        if n == 1:
            notes.append(f"{_cell_text(model)} has a single scored run.")
    return notes
