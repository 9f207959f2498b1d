"""The ledger as tidy DataFrames: the one entry point of every report (notebooks start here too).

* Reports only read: the ledger is opened read-only and never migrated or written; every
  query is a named read of :class:`~harness.ledger.Ledger`.
* :func:`load_frames` reads only the columns it needs and decodes each distinct
  ``failure_modes`` JSON text once (a ledger has few distinct label sets), so a million turns
  load in seconds. Newest labels win: a ``labels`` row for a turn overrides the turn's own
  labels, as in :meth:`harness.ledger.Ledger.turns`.
* Scored runs: ``infra_error`` and ``interrupted`` runs, and runs with no end row yet
  (``unfinished``), are counted in their own columns and left out of every denominator,
  median and rate, since none of them says anything about the model
  (:func:`harness.vocab.is_scored`); of several scored runs of one identity only the newest counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.ledger import Ledger, decode_labels
from harness.vocab import SCORED_OUTCOMES

__all__ = ["LedgerFrames", "load_frames"]


@dataclass(frozen=True)
class LedgerFrames:
    """The ledger as tidy DataFrames. Build with :func:`load_frames`.

    Attributes:
        runs: one row per run, in start order. Columns: ``run_id``, ``scenario``,
            ``scenario_path``, ``scenario_hash``, ``model``, ``temperature``, ``seed``,
            ``tool_mode``, ``parser``, ``think`` (``default``/``on``/``off``), ``stream`` (``on``/``off``), ``repetition``, ``started_at``, ``ended_at`` (UTC ISO
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
        model_runs: per run, in start order, what the model header shows (:meth:`harness.ledger.Ledger.model_runs`:
            ``model``, ``backend``, ``digest``, ``tool_mode``, ``provenance``, ``warmup_ms`` in ms, ``template``).
    """

    runs: pd.DataFrame
    turns: pd.DataFrame
    turn_modes: pd.DataFrame
    run_modes: pd.DataFrame
    ledger_path: Path
    runs_chain_head: str | None
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

    def replies(self, seqs: Sequence[int]) -> dict[int, str]:
        """Reply text of the given turns (``turns.seq``), read on demand to keep frames small.

        Returns:
            ``{seq: content}``; null content reads as ``""``.
        """
        if not seqs:
            return {}
        with Ledger(self.ledger_path, readonly=True) as ledger:
            return ledger.reply_texts(seqs)


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
        head = ledger.chain_head("runs")
        runs = ledger.runs_frame()
        turns = ledger.turns_frame()
        labels = ledger.newest_labels_frame()
        model_runs = ledger.model_runs()
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
    decoded = [tuple(decode_labels(text, {})) for text in uniques]
    as_objects = np.empty(len(decoded), dtype=object)
    for i, modes in enumerate(decoded):
        as_objects[i] = modes
    turns["failure_modes"] = as_objects[codes] if len(turns) else pd.Series([], dtype=object)
    turn_modes = _explode_modes(turns, codes, decoded)
    run_modes = turn_modes.groupby(["run_id", "mode"], observed=True, sort=True).size().rename("turns_with_mode").reset_index()
    runs = _finish_runs(runs, turns)
    return LedgerFrames(runs, turns, turn_modes, run_modes, path, head, model_runs)


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
    runs["stream"] = np.where(pd.to_numeric(runs["stream"]).fillna(0).astype(bool), "on", "off")
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
