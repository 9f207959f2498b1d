"""The ledger's reads for the transcript viewer (``harness view``): a page of the run list filtered and sorted in
SQLite, one run's turns with the evidence of their newest labels, and the runs that pair with a run
(:class:`ViewerReads`, a base of :class:`harness.ledger.Ledger`).

A ledger of 1,000,000 turns must show the first page of its run list at once, so the list is one ``LIMIT``/``OFFSET``
query over ``runs`` joined with ``run_ends``; the failure modes of a page's runs are read for those runs only (by
an index that begins with ``run_id``, ``turns_report``), and a failure-mode filter is a correlated ``EXISTS`` over the run's turns.
Labels: a ``labels`` row for a turn (``harness rescore``) overrides the turn's own, newest first, as everywhere.
Checks: the failed done checks of a run whose outcome is not scored are not judged (the run did not finish): the
failed-check filter and sort leave them out, and a row gives them apart (``unjudged_checks``).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.ledger.queries import CHECK_FAILED_SQL, CHECK_NAME_SQL, axis_sql, check_items_sql
from harness.vocab import SCORED_OUTCOMES, is_scored

__all__ = ["LIST_SORTS", "PAIR_COLUMNS", "RunFilter", "ViewerReads"]

LIST_SORTS: dict[str, str] = {
    "started": "r.seq", "scenario": "r.scenario", "model": "r.model", "temperature": "r.temperature",
    "tool_mode": "r.tool_mode", "parser": "r.parser", "stream": "stream", "repetition": "r.repetition",
    "outcome": "outcome", "turns": "turns", "tokens": "tokens", "failed_checks": "failed_check_count",
}  # fmt: skip
"""Sort keys of the run list -> SQL expression (ties: start order). ``failed_checks`` counts judged failures only: a
run whose outcome is not scored (:func:`harness.vocab.is_scored`) counts 0."""
PAIR_COLUMNS = ("scenario", "temperature", "tool_mode", "parser", "think", "stream", "repetition", "seed")
"""Run attributes two runs of different models share to pair (as ``harness compare`` pairs them)."""

_SCORED = "(" + ", ".join(f"'{o}'" for o in SCORED_OUTCOMES) + ")"
_NEWEST_MODES = (
    "COALESCE((SELECT l.failure_modes FROM labels l WHERE l.run_id = t.run_id AND l.turn = t.turn"
    " ORDER BY l.seq DESC LIMIT 1), t.failure_modes)"
)
"""A turn ``t``'s newest failure modes (JSON text): its newest ``labels`` row's, else its own."""
_CELL = "r.scenario, r.model, r.temperature, r.tool_mode, r.parser, {stream}, {think}"


@dataclass(frozen=True)
class RunFilter:
    """What the run list shows: each field None (or False) shows every run.

    Attributes:
        scenario, model, tool_mode, parser, outcome: exact values (``outcome`` ``unfinished`` for runs without an end).
        temperature: exact value.
        stream: 0 or 1.
        repetition: repetition index, from 0.
        failure_mode: runs with at least one turn labelled with this mode (newest labels).
        failed_check: runs with a scored outcome whose done check of this name failed (a run that did not finish:
            its checks are not judged, as the run line and ``harness review`` say).
        only_failed: runs with a scored outcome other than ``pass``.
        failed_every_repetition: runs of a cell (scenario, model, temperature, tool mode, parser, stream, think) that
            has scored runs and none passed.
    """

    scenario: str | None = None
    model: str | None = None
    temperature: float | None = None
    tool_mode: str | None = None
    parser: str | None = None
    stream: int | None = None
    repetition: int | None = None
    outcome: str | None = None
    failure_mode: str | None = None
    failed_check: str | None = None
    only_failed: bool = False
    failed_every_repetition: bool = False


class ViewerReads:
    """The reads the viewer makes; a base of :class:`harness.ledger.Ledger`."""

    path: Path
    _db: sqlite3.Connection
    _lock: threading.RLock
    _columns: dict[str, list[str]]

    if TYPE_CHECKING:  # the ledger's one read path (:meth:`harness.ledger.Ledger._query`)

        def _query(
            self, sql: str, params: Sequence[Any] = (), payloads: str = "", refs: str = "blob_refs"
        ) -> list[dict[str, Any]]: ...

    def _axis_exprs(self) -> tuple[str, str]:
        """``stream`` and ``think`` of a run ``r`` as SQL expressions (as :func:`axis_sql` reads them)."""
        stream, think = axis_sql(self._columns["runs"]).split(" AS stream, ")
        return stream, think.removesuffix(" AS think")

    def _list_sql(self, where: str) -> str:
        return (
            f"SELECT r.seq, r.run_id, r.scenario, r.model, r.temperature, r.seed, r.tool_mode, r.parser, {axis_sql(self._columns['runs'])},"
            " r.repetition, COALESCE(e.outcome, 'unfinished') AS outcome, e.turns AS turns,"
            " CASE WHEN e.run_id IS NULL THEN NULL ELSE COALESCE(e.prompt_tokens, 0) + COALESCE(e.completion_tokens, 0) END AS tokens,"
            f" (SELECT json_group_array({CHECK_NAME_SQL}) FROM {check_items_sql('e.checks')} WHERE {CHECK_FAILED_SQL}) AS failed_names,"
            f" CASE WHEN e.outcome IN {_SCORED} THEN (SELECT COUNT(*) FROM {check_items_sql('e.checks')} WHERE {CHECK_FAILED_SQL})"
            " ELSE 0 END AS failed_check_count"
            f" FROM runs r LEFT JOIN run_ends e USING (run_id) {where}"
        )

    def _where(self, f: RunFilter) -> tuple[str, list[Any]]:
        stream, think = self._axis_exprs()
        clauses: list[str] = []
        params: list[Any] = []
        for column in ("scenario", "model", "temperature", "tool_mode", "parser", "repetition"):
            value = getattr(f, column)
            if value is not None:
                clauses.append(f"r.{column} = ?")
                params.append(value)
        if f.stream is not None:
            clauses.append(f"{stream} = ?")
            params.append(int(f.stream))
        if f.outcome is not None:
            clauses.append("COALESCE(e.outcome, 'unfinished') = ?")
            params.append(f.outcome)
        if f.only_failed:
            clauses.append(f"e.outcome IN {_SCORED} AND e.outcome <> 'pass'")
        if f.failed_check is not None:
            clauses.append(f"e.outcome IN {_SCORED} AND EXISTS (SELECT 1 FROM {check_items_sql('e.checks')}"
                           f" WHERE {CHECK_NAME_SQL} = ? AND {CHECK_FAILED_SQL})")  # fmt: skip
            params.append(f.failed_check)
        if f.failure_mode is not None:
            clauses.append(
                f"EXISTS (SELECT 1 FROM (SELECT {_NEWEST_MODES} AS fm FROM turns t WHERE t.run_id = r.run_id) x"
                " WHERE instr(x.fm, ?) > 0 AND EXISTS (SELECT 1 FROM json_each(CASE WHEN json_valid(x.fm) THEN x.fm"
                " ELSE '[]' END) j WHERE j.value = ?))"
            )
            params += [json.dumps(f.failure_mode), f.failure_mode]
        if f.failed_every_repetition:
            cell = _CELL.format(stream=stream, think=think)
            clauses.append(
                f"({cell}) IN (SELECT {cell} FROM runs r JOIN run_ends e USING (run_id) WHERE e.outcome IN {_SCORED}"
                f" GROUP BY {cell} HAVING SUM(e.outcome = 'pass') = 0)"
            )
        return ("WHERE " + " AND ".join(clauses)) if clauses else "", params

    def run_list(self, f: RunFilter, *, sort: str = "started", descending: bool = False, limit: int = 50,
                 offset: int = 0) -> tuple[list[dict[str, Any]], int]:  # fmt: skip
        """One page of the run list, filtered and sorted in SQLite.

        Args:
            f: which runs to show.
            sort: a key of :data:`LIST_SORTS`.
            descending: sort order; ties keep start order.
            limit, offset: the page (rows).

        Returns:
            ``(rows, total)``: ``total`` runs match; each row has ``seq, run_id, scenario, model, temperature, seed,
            tool_mode, parser, stream`` (0/1), ``think, repetition, outcome`` (``unfinished`` without an end row),
            ``turns`` (None if unfinished), ``tokens`` (prompt + completion; None if unfinished), ``failed_checks`` (names of the failed
            checks, in check order; empty when the outcome is not scored), ``judged`` (whether the outcome is scored:
            :func:`harness.vocab.is_scored`; if not, the checks are not judged, even when none ran), ``unjudged_checks``
            (the failed names when the outcome is not scored, e.g. ``interrupted``; else empty) and ``failure_modes``
            (sorted names shown by any turn, newest labels).

        Raises:
            ValueError: ``sort`` is not a known key.
            LedgerError: the ledger cannot be read.
        """
        if sort not in LIST_SORTS:
            raise ValueError(f"unknown sort key {sort!r}")
        where, params = self._where(f)
        order = f"{LIST_SORTS[sort]} {'DESC' if descending else 'ASC'}, r.seq"
        sql = self._list_sql(where) + f" ORDER BY {order} LIMIT ? OFFSET ?"
        rows = self._query(sql, [*params, int(limit), int(offset)])
        total = self._query(f"SELECT COUNT(*) AS n FROM runs r LEFT JOIN run_ends e USING (run_id) {where}", params)
        self._add_modes(rows)
        return [_list_row(row) for row in rows], int(total[0]["n"])

    def iter_run_list(self, batch: int = 2000) -> Iterator[list[dict[str, Any]]]:
        """Every run as :meth:`run_list` gives them, in start order, ``batch`` runs at a time (keyset paging on
        ``runs.seq``: memory holds one batch)."""
        last = 0
        while True:
            rows = self._query(self._list_sql("WHERE r.seq > ?") + " ORDER BY r.seq LIMIT ?", (last, int(batch)))
            if not rows:
                return
            last = rows[-1]["seq"]
            self._add_modes(rows)
            yield [_list_row(row) for row in rows]

    def _add_modes(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        marks = ",".join("?" * len(rows))
        found = self._query(
            f"SELECT DISTINCT t.run_id, j.value AS mode FROM turns t, json_each(CASE WHEN json_valid({_NEWEST_MODES})"
            f" THEN {_NEWEST_MODES} ELSE '[]' END) j WHERE t.run_id IN ({marks}) AND j.type = 'text'",
            [r["run_id"] for r in rows],
        )
        modes: dict[str, set[str]] = {}
        for m in found:
            modes.setdefault(m["run_id"], set()).add(m["mode"])
        for row in rows:
            row["failure_modes"] = sorted(modes.get(row["run_id"], ()))

    def list_choices(self) -> dict[str, list[Any]]:
        """The values each run-list filter can take, from the runs (sorted): ``scenario, model, temperature, tool_mode,
        parser, stream, repetition, outcome`` and ``check`` (the names of done checks that failed in a run whose outcome
        is scored: what the failed-check filter finds)."""
        stream = self._axis_exprs()[0]
        out: dict[str, list[Any]] = {}
        for column in ("scenario", "model", "temperature", "tool_mode", "parser", "repetition"):
            out[column] = [r["v"] for r in self._query(f"SELECT DISTINCT {column} AS v FROM runs r ORDER BY 1")]
        out["stream"] = [r["v"] for r in self._query(f"SELECT DISTINCT {stream} AS v FROM runs r ORDER BY 1")]
        out["outcome"] = [r["v"] for r in self._query(
            "SELECT DISTINCT COALESCE(e.outcome, 'unfinished') AS v FROM runs r LEFT JOIN run_ends e USING (run_id) ORDER BY 1")]  # fmt: skip
        out["check"] = [r["v"] for r in self._query(  # what the failed-check filter can find: failed in a judged run
            f"SELECT DISTINCT {CHECK_NAME_SQL} AS v FROM run_ends e, {check_items_sql('e.checks')}"
            f" WHERE e.outcome IN {_SCORED} AND {CHECK_FAILED_SQL} ORDER BY 1")]  # fmt: skip
        return out

    def run_turns(self, run_id: str) -> list[dict[str, Any]]:
        """One run's turns in order, each with its newest labels and their evidence.

        Returns:
            Dicts with every ``turns`` column as stored (JSON text, payloads put back) plus ``labels``,
            ``labels_details``, ``labels_recovered_by`` and ``labels_version``: the newest ``labels`` row's, else the
            turn's own ``failure_modes``, ``details``, ``recovered_by`` and ``classifier_version``.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        rows = self._query("SELECT t.* FROM turns t WHERE t.run_id = ? ORDER BY t.seq", (run_id,), payloads="turns")
        relabels = self._query(
            "SELECT l.* FROM labels l WHERE l.run_id = ? AND l.seq IN (SELECT MAX(seq) FROM labels WHERE run_id = ?"
            " GROUP BY turn)", (run_id, run_id), payloads="labels")  # fmt: skip
        newest = {r["turn"]: r for r in relabels}
        for row in rows:
            source = newest.get(row["turn"], row)
            row["labels"] = source["failure_modes"]
            row["labels_details"] = source["details"]
            row["labels_recovered_by"] = source["recovered_by"]
            row["labels_version"] = source["classifier_version"]
        return rows

    def paired_runs(self, run_id: str) -> list[dict[str, Any]]:
        """The runs of other models that agree with this run on :data:`PAIR_COLUMNS` (what ``harness compare`` pairs),
        in start order: ``run_id, model, outcome`` (``unfinished`` without an end row)."""
        stream, think = self._axis_exprs()
        keys = " AND ".join(f"{expr.replace('r.', 'o.')} IS {expr}" for expr in (
            "r.scenario", "r.temperature", "r.tool_mode", "r.parser", think, stream, "r.repetition", "r.seed"))  # fmt: skip
        return self._query(
            f"SELECT o.run_id, o.model, COALESCE(e.outcome, 'unfinished') AS outcome FROM runs r JOIN runs o ON {keys}"
            " AND o.model <> r.model LEFT JOIN run_ends e ON e.run_id = o.run_id WHERE r.run_id = ? ORDER BY o.seq",
            (run_id,),
        )


def _list_row(row: dict[str, Any]) -> dict[str, Any]:
    # the failed checks' names as the list's SQL filter, sort and choices read them (one reading of the stored JSON,
    # SQLite's: an edited ledger's duplicate keys, NaN or non-string names split none of them)
    failed = [str(name) for name in json.loads(row.pop("failed_names") or "[]")]
    judged = is_scored(row["outcome"])  # a run that did not finish: its checks say nothing about the model
    row["judged"] = judged
    row["failed_checks"], row["unjudged_checks"] = (failed, []) if judged else ([], failed)
    row.pop("failed_check_count", None)
    return row
