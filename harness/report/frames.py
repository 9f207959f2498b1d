"""The ledger as tidy DataFrames: the one entry point of every report (notebooks start here too).

* Reports only read: the ledger is opened read-only and never migrated or written; every
  query is a named read of :class:`~harness.ledger.Ledger`.
* One row per run, not one per turn: :func:`load_frames` takes every sum and count over turns from SQL
  (:meth:`~harness.ledger.Ledger.runs_frame`, :meth:`~harness.ledger.Ledger.mode_reads`), and the turns'
  latencies as one float array for the order statistics (a run's median, a group's p50/p95:
  :func:`grouped_quantiles`), so a million turns report in seconds and well under 1 GB. :attr:`LedgerFrames.turns`
  (one row per turn) is read only when asked for, for notebooks. Newest labels win: a ``labels`` row for a turn
  overrides the turn's own labels, as in :meth:`harness.ledger.Ledger.turns`.
* Scored runs: ``infra_error`` and ``interrupted`` runs, and runs with no end row yet
  (``unfinished``), are counted in their own columns and left out of every denominator,
  median and rate, since none of them says anything about the model
  (:func:`harness.vocab.is_scored`); of several scored runs of one identity only the newest counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.ledger import Ledger, check_failed, decode_labels
from harness.report.child import ChildCall, fork_is_safe
from harness.report.grouping import RunGroups, sort_by_group
from harness.vocab import SCORED_OUTCOMES

__all__ = ["LedgerFrames", "TurnLatencies", "grouped_quantiles", "load_frames"]


@dataclass(frozen=True)
class TurnLatencies:
    """Every turn's latency, grouped by run, in one array (:meth:`harness.ledger.Ledger.turn_latencies`).

    Attributes:
        run_pos: per run with turns, its row in :attr:`LedgerFrames.runs` (-1 for turns of a run with no ``runs`` row).
        counts: per run with turns, its number of turns.
        recorded: per run with turns, how many of them have a latency.
        values: the turns' ``latency_ms`` (ms), ``counts[0]`` of the first run (NaN where not recorded first, then
            ascending), then the next run's.
    """

    run_pos: np.ndarray
    counts: np.ndarray
    recorded: np.ndarray
    values: np.ndarray

    def per_turn(self, per_run: np.ndarray, missing: int = -1) -> np.ndarray:
        """A value per run (indexed like :attr:`LedgerFrames.runs`) repeated for each of its turns, aligned with
        :attr:`values`; ``missing`` for turns of a run with no ``runs`` row."""
        known = np.where(self.run_pos >= 0, per_run[np.maximum(self.run_pos, 0)] if len(per_run) else missing, missing)
        return np.repeat(known, self.counts)

    def medians(self, n_runs: int) -> np.ndarray:
        """Each run's median turn latency (ms) as pandas' ``groupby(...).median()`` computes it, indexed like
        :attr:`LedgerFrames.runs` (``n_runs`` rows): NaN for a run without a latency."""
        first = np.concatenate(([0], np.cumsum(self.counts)[:-1])).astype(np.int64) + (self.counts - self.recorded)
        k, has = self.recorded, self.recorded > 0
        low = self.values[(first + (k - 1) // 2)[has]]
        high = self.values[(first + k // 2)[has]]
        medians = np.full(len(k), np.nan)
        medians[has] = np.where(k[has] % 2 == 1, high, (high + low) / 2)
        out = np.full(n_runs, np.nan)
        known = self.run_pos >= 0
        out[self.run_pos[known]] = medians[known]
        return out

    @cached_property
    def ascending(self) -> np.ndarray:
        """Positions in :attr:`values` of the recorded latencies, in ascending order of latency (sorted once)."""
        known = np.flatnonzero(~np.isnan(self.values))
        return known[np.argsort(self.values[known], kind="stable")]

    def quantiles(self, per_run: np.ndarray, qs: Sequence[float], n_groups: int) -> np.ndarray:
        """:func:`grouped_quantiles` of the turns' latencies grouped by their runs' groups (``per_run``: a group per run,
        indexed like :attr:`LedgerFrames.runs`, negative for none), from :attr:`ascending`: a stable sort by group of
        values already in order, instead of sorting the values again for every table."""
        groups = self.per_turn(per_run)[self.ascending]
        keep = groups >= 0
        groups, positions = groups[keep], self.ascending[keep]
        regroup = np.argsort(groups.astype(np.min_scalar_type(max(n_groups, 1))), kind="stable")  # radix sort when small
        sizes = np.bincount(groups, minlength=n_groups)[:n_groups]
        return _sorted_quantiles(self.values[positions[regroup]], sizes, qs)


def grouped_quantiles(groups: np.ndarray, values: np.ndarray, qs: Sequence[float], n_groups: int) -> np.ndarray:
    """Quantiles of ``values`` per group, as pandas' ``groupby(...).quantile(q)`` computes them (linear interpolation).

    Args:
        groups: group code of each value (int, 0 .. n_groups - 1; negative: in no group).
        values: the values (NaN: skipped).
        qs: quantiles in [0, 1].
        n_groups: number of groups.

    Returns:
        Array of shape ``(n_groups, len(qs))``; NaN for a group without values.
    """
    return _sorted_quantiles(*sort_by_group(groups, values, n_groups), qs)


def _sorted_quantiles(values: np.ndarray, sizes: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """Quantiles per group of ``values`` (the first group's ``sizes[0]`` values ascending, then the next group's)."""
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    out = np.full((len(sizes), len(qs)), np.nan)
    has = np.flatnonzero(sizes > 0)
    for k, q in enumerate(qs):
        q_idx = q * (sizes[has] - 1).astype(np.float64)
        idx = q_idx.astype(np.int64)  # truncates, as pandas does
        frac = q_idx % 1
        low = values[starts[has] + idx]
        high = values[starts[has] + np.minimum(idx + 1, sizes[has] - 1)]
        out[has, k] = np.where(frac == 0.0, low, low + (high - low) * frac)
    return out


@dataclass(frozen=True)
class LedgerFrames:
    """The ledger as tidy DataFrames. Build with :func:`load_frames`.

    Attributes:
        runs: one row per run, in start order. Columns: ``run_id``, ``identity``, ``scenario``,
            ``scenario_path``, ``scenario_hash``, ``model``, ``temperature``, ``seed``,
            ``tool_mode``, ``parser``, ``stream`` (``on``/``off``), ``think`` (``default``/``on``/``off``), ``repetition``,
            ``started_at``, ``ended_at`` (UTC ISO text, None if unfinished), ``outcome`` (one of :data:`harness.loop.OUTCOMES` or
            ``unfinished``), ``turns`` (model calls), ``prompt_tokens``, ``completion_tokens``, ``scored`` and ``passed``
            (bool; a run is scored when its outcome counts and it is the newest scored run of its ``identity``),
            ``superseded`` (bool: an older scored run of the same identity, left out of every rate),
            ``tokens`` (prompt plus completion, tokens), ``turns_recorded`` (rows in ``turns``; equals ``turns`` unless a
            turn was lost), ``latency_ms`` (summed over the run's turns, ms), ``latency_ms_median`` (ms), ``counted``
            (bool: the one run that stands for its identity, the scored one if any, else the newest: a run interrupted
            and then resumed counts once), ``requires_tool`` (bool: the scenario needs a tool; runs recorded before
            the flag read True, its default), ``task_kind`` (``tool`` or ``restraint``: the same flag as text),
            ``checks_failed`` (tuple of the names of the done checks that failed, in check order; ``()`` if none or
            unfinished), ``ttft_ms`` (mean time to first token over its turns, ms) and ``decode_tps`` (mean decode
            rate, completion tokens/s; both NaN where the ledger has none).
        run_checks: one row per run × done check: ``run_id``, ``check`` (name), ``passed`` (bool).
        run_modes: one row per run × failure mode with >= 1 occurrence: ``run_id``, ``mode``,
            ``turns_with_mode`` (count of the run's turns showing it).
        mode_examples: per failure mode (sorted), its shortest reply: ``mode``, ``seq`` (``turns`` row), ``run_id``,
            ``turn`` and ``chars`` (reply length in characters; ties: the earliest turn).
        latencies: the turns' latencies (:class:`TurnLatencies`), for order statistics.
        turn_count: rows in ``turns`` (those of the other attempts at an identity too: a report counts each run's ``turns_recorded``).
        ledger_path: the file read.
        ledger_head: the ledger's head anchor read after the rest (:meth:`harness.ledger.Ledger.head`: the line
            `harness run` and `harness report` print last, which `harness ledger verify --anchor` checks).
        model_runs: what the model header shows, once per distinct run configuration in the order of its newest run
            (:meth:`harness.ledger.Ledger.model_runs`: ``model``, ``backend``, ``digest``, ``tool_mode``, ``provenance``,
            ``warmup_ms`` in ms, ``template``).
    """

    runs: pd.DataFrame
    run_modes: pd.DataFrame
    run_checks: pd.DataFrame
    mode_examples: pd.DataFrame
    latencies: TurnLatencies
    turn_count: int
    ledger_path: Path
    ledger_head: str
    model_runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def models(self) -> list[str]:
        """Model specs in the ledger, sorted."""
        return sorted(self.runs["model"].unique().tolist())

    @property
    def newest_end(self) -> str | None:
        """UTC time of the newest run end in the ledger, or None when no run has ended."""
        ends = self.runs["ended_at"].dropna()
        return None if ends.empty else str(ends.max())

    @cached_property
    def groups(self) -> RunGroups:
        """The runs' axes as integer codes (:class:`harness.report.grouping.RunGroups`), made on first use; every table
        groups runs through it. Assumes :attr:`runs` is not changed after that."""
        return RunGroups(self.runs)

    @cached_property
    def turns(self) -> pd.DataFrame:
        """One row per turn, in ledger order, read from the ledger on first use (a report never needs it).

        Columns: ``seq`` (ledger row), ``run_id`` (categorical), ``turn`` (from 1), ``failure_modes`` (tuple of mode
        names, newest labels), ``labels_version`` (classifier version of those labels), ``finish_reason``,
        ``prompt_tokens``, ``completion_tokens`` (tokens), ``latency_ms`` (ms) and ``content_chars`` (length of the
        reply text; 0 when empty or null).

        Raises:
            LedgerError: the ledger cannot be read.
        """
        return _load_turns(self.ledger_path, self.runs["run_id"])

    @cached_property
    def turn_modes(self) -> pd.DataFrame:
        """One row per turn × failure mode (from :attr:`turns`, read on first use): ``seq``, ``run_id``, ``turn``, ``mode``."""
        turns = self.turns
        codes, uniques = pd.factorize(turns["failure_modes"])
        return _explode_modes(turns, codes, list(uniques))

    def reply_calls(self, seqs: Sequence[int]) -> dict[int, Any]:
        """Structured tool calls of the given turns (``turns.seq``) that made any, as the server sent them."""
        if not seqs:
            return {}
        with Ledger(self.ledger_path, readonly=True) as ledger:
            return ledger.reply_calls(seqs)

    def replies(self, seqs: Sequence[int]) -> dict[int, str]:
        """Reply text of the given turns (``turns.seq``), read on demand to keep frames small.

        Returns:
            ``{seq: content}``; null content reads as ``""``.
        """
        if not seqs:
            return {}
        with Ledger(self.ledger_path, readonly=True) as ledger:
            return ledger.reply_texts(seqs)


def load_frames(ledger_path: str | Path, *, processes: bool = False) -> LedgerFrames:
    """Read a ledger (read-only): one row per run with its turns aggregated in SQL, per run × failure mode counts.

    Args:
        ledger_path: the ledger file.
        processes: read the turns (failure modes, latencies) in a forked child process while this one reads the
            runs, where the platform forks and this process runs no other thread (:func:`~harness.report.child.fork_is_safe`;
            ``harness report`` does for a large ledger: 1.2 s less on a million turns with two cores); the frames are
            the same.

    Returns:
        :class:`LedgerFrames` (runs, run × mode, the shortest reply of each mode, the turns' latencies).

    Raises:
        LedgerError: the file is missing, not SQLite, or not a harness ledger.
    """
    path = Path(ledger_path)
    # Reads take turns on one connection: in threads (SQLite gives up the interpreter lock for every row it steps)
    # they convoyed on that lock, 6-7 s of wall for 3.6 s of CPU on the 1,000,000-turn benchmark; a child does not.
    turn_reads = ChildCall(_read_turns, path) if processes and fork_is_safe() and path.is_file() else None
    try:
        with Ledger(path, readonly=True) as ledger:  # validates the file and says what is wrong in one sentence
            runs = ledger.runs_frame()
            details = ledger.run_detail_columns()
            model_runs = ledger.model_runs()
            (modes, examples), (totals, values) = _read_turns(path, ledger) if turn_reads is None else turn_reads.result()
            head = ledger.head().anchor  # last: it covers every row read (and a row another process appended meanwhile)
    finally:
        if turn_reads is not None:
            turn_reads.close()
    run_pos = pd.Index(runs["run_id"]).get_indexer(totals["run_id"]).astype(np.int64)
    counts = totals["turns_recorded"].to_numpy(dtype=np.int64)
    latencies = TurnLatencies(run_pos, counts, totals["latencies_recorded"].to_numpy(dtype=np.int64), values)
    runs = _finish_runs(runs, totals, latencies)
    runs, run_checks = _add_details(runs, details)
    examples = examples[["mode", "seq", "run_id", "turn", "chars"]]
    run_modes = modes[["run_id", "mode", "turns_with_mode"]].copy()
    run_modes["run_id"] = pd.Categorical(run_modes["run_id"], categories=runs["run_id"])
    run_modes["mode"] = run_modes["mode"].astype(object)
    run_modes = run_modes.dropna(subset=["run_id"]).sort_values(["run_id", "mode"], kind="stable").reset_index(drop=True)
    run_modes["turns_with_mode"] = run_modes["turns_with_mode"].astype("int64")
    return LedgerFrames(runs, run_modes, run_checks, examples, latencies, int(counts.sum()), path, head, model_runs)


def _add_details(runs: pd.DataFrame, details: dict[str, list[Any]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The columns :meth:`harness.ledger.Ledger.run_detail_columns` gives (both read in start order) and the run × check
    rows."""
    import json

    run_ids = runs["run_id"].tolist()
    if details["run_id"] != run_ids:  # a run started between the two reads: align by id
        at = {r: i for i, r in enumerate(details["run_id"])}
        order = [at.get(r) for r in run_ids]
        details = {name: [None if i is None else values[i] for i in order] for name, values in details.items()}
    failed: list[tuple[str, ...]] = []
    rows: list[tuple[str, str, bool]] = []
    for run_id, text in zip(run_ids, details["checks"], strict=True):
        names: list[str] = []
        if text and text != "[]":
            try:
                checks = json.loads(text)
            except (ValueError, RecursionError):  # an edited ledger: not JSON, or nested past Python's stack
                checks = []
            for check in checks if isinstance(checks, list) else []:
                if isinstance(check, dict) and isinstance(check.get("check"), str):
                    rows.append((run_id, check["check"], not check_failed(check)))
                    if check_failed(check):
                        names.append(check["check"])
        failed.append(tuple(names))
    runs["requires_tool"] = np.array([f is None or bool(f) for f in details["requires_tool"]], dtype=bool)
    runs["task_kind"] = np.where(runs["requires_tool"], "tool", "restraint")
    runs["checks_failed"] = pd.Series(failed, index=runs.index, dtype=object)
    for column in ("ttft_ms", "decode_tps"):
        runs[column] = np.array([np.nan if v is None else v for v in details[column]], dtype=float)
    run_checks = pd.DataFrame(rows, columns=["run_id", "check", "passed"])
    run_checks["passed"] = run_checks["passed"].astype(bool)
    return runs, run_checks


def _read_turns(
    path: Path, ledger: Ledger | None = None
) -> tuple[tuple[pd.DataFrame, pd.DataFrame], tuple[pd.DataFrame, np.ndarray]]:
    """:meth:`~harness.ledger.Ledger.mode_reads` and :meth:`~harness.ledger.Ledger.turn_latencies` (on a connection of
    their own unless ``ledger`` is given)."""
    if ledger is not None:
        return ledger.mode_reads(), ledger.turn_latencies()
    with Ledger(path, readonly=True) as own:
        return own.mode_reads(), own.turn_latencies()


def _load_turns(path: Path, run_ids: pd.Series) -> pd.DataFrame:
    """Every turn as a row (:attr:`LedgerFrames.turns`), with the newest labels decoded once per distinct text."""
    with Ledger(path, readonly=True) as ledger:
        turns = ledger.turns_frame()
        labels = ledger.newest_labels_frame()
    if not labels.empty:
        turns = turns.merge(labels, on=["run_id", "turn"], how="left", suffixes=("", "_new"), sort=False)
        newer = turns["failure_modes_new"].notna()
        turns.loc[newer, "failure_modes"] = turns.loc[newer, "failure_modes_new"]
        turns.loc[newer, "labels_version"] = turns.loc[newer, "labels_version_new"]
        turns = turns.drop(columns=["failure_modes_new", "labels_version_new"])
    turns["run_id"] = pd.Categorical(turns["run_id"], categories=run_ids)
    turns["labels_version"] = turns["labels_version"].astype("category")
    turns["finish_reason"] = turns["finish_reason"].astype("category")
    turns["latency_ms"] = turns["latency_ms"].astype(float)
    codes, uniques = pd.factorize(turns["failure_modes"])
    as_objects = np.empty(len(uniques), dtype=object)
    for i, text in enumerate(uniques):
        as_objects[i] = tuple(decode_labels(text, {}))
    turns["failure_modes"] = as_objects[codes] if len(turns) else pd.Series([], dtype=object)
    return turns


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


def _finish_runs(runs: pd.DataFrame, totals: pd.DataFrame, latencies: TurnLatencies) -> pd.DataFrame:
    known = latencies.run_pos >= 0
    per_run = {}
    for column in ("turns_recorded", "turn_prompt_tokens", "turn_completion_tokens", "latency_ms"):
        per_run[column] = np.zeros(len(runs))  # a run without turns: 0 of each
        per_run[column][latencies.run_pos[known]] = totals[column].to_numpy(dtype=float)[known]
    runs["outcome"] = runs["outcome"].fillna("unfinished")
    runs["scored"] = runs["outcome"].isin(SCORED_OUTCOMES)
    # One sample per run identity: a repeat of the same identity (``--no-resume``, ``--cache``) gets the
    # same seed and options, so it is not an independent sample. The newest scored run counts (as in compare).
    newest = runs[runs["scored"]].drop_duplicates("identity", keep="last").index
    runs["superseded"] = runs["scored"] & ~runs.index.isin(newest)
    runs["scored"] = runs["scored"] & ~runs["superseded"]
    runs["passed"] = (runs["outcome"] == "pass") & runs["scored"]
    with_scored = runs.loc[runs["scored"], "identity"]
    newest_any = runs.drop_duplicates("identity", keep="last").index
    runs["counted"] = runs["scored"] | (~runs["identity"].isin(with_scored) & runs.index.isin(newest_any))
    runs["temperature"] = runs["temperature"].astype(float)
    runs["stream"] = np.where(pd.to_numeric(runs["stream"]).fillna(0).astype(bool), "on", "off")
    unfinished = runs["turns"].isna().to_numpy()
    for column, counted in (("turns", "turns_recorded"), ("prompt_tokens", "turn_prompt_tokens"),
                            ("completion_tokens", "turn_completion_tokens")):  # fmt: skip
        ended = pd.to_numeric(runs[column], errors="coerce").to_numpy(dtype=float)
        runs[column] = np.nan_to_num(np.where(unfinished, per_run[counted], ended)).astype("int64")
    runs["tokens"] = runs["prompt_tokens"] + runs["completion_tokens"]
    runs["turns_recorded"] = per_run["turns_recorded"].astype("int64")
    runs["latency_ms"] = per_run["latency_ms"]
    runs["latency_ms_median"] = latencies.medians(len(runs))
    return runs


# -- tables --------------------------------------------------------------------------------------------
