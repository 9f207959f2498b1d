"""The ledger's reads for reports: one row per run with its turns aggregated in SQL, failure-mode counts per run,
and the turns' latencies as one compact array (:class:`ReportReads`, a base of :class:`harness.ledger.Ledger`).

A report of 1,000,000 turns must not hold a Python object per turn, so every sum and count over turns is a
``GROUP BY`` in SQLite (:data:`RUN_TURN_TOTALS`, :data:`RUN_MODE_COUNTS`). Order statistics (a run's median
latency, a group's p50/p95) need the values themselves: SQLite's window functions took 5-7 s on a million turns,
so :meth:`ReportReads.turn_latencies` streams the one ``latency_ms`` column, sorted within each run, into a float
array (8 bytes a turn).
Labels: a ``labels`` row for a turn (``harness rescore``) overrides the turn's own, newest first, as in
:meth:`harness.ledger.Ledger.turns`.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import LedgerError
from harness.ledger.blobs import content_length_sql, resolve_rows
from harness.ledger.queries import NEWEST_LABELS, axis_sql, runs_frame_sql

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

__all__ = ["RUN_EXPORT_COLUMNS", "RUN_MODE_COUNTS", "RUN_TURN_TOTALS", "TURN_LATENCIES", "ReportReads", "run_details_sql"]

RUN_EXPORT_COLUMNS = (
    "run_id", "identity", "scenario", "model", "base_url", "temperature", "seed", "tool_mode", "parser", "think", "stream", "repetition",
    "requires_tool", "started_at", "ended_at", "outcome", "turns", "prompt_tokens", "completion_tokens", "latency_ms",
    "checks_passed", "checks_failed", "failure_modes", "final_answer", "error",
)  # fmt: skip
"""The fields of ``harness export --runs``, one record per run (:meth:`ReportReads.export_run_rows`)."""

RUN_TURN_TOTALS = (
    "SELECT run_id, COUNT(*) AS turns_recorded, COUNT(latency_ms) AS latencies_recorded,"
    " TOTAL(prompt_tokens) AS turn_prompt_tokens, TOTAL(completion_tokens) AS turn_completion_tokens,"
    " TOTAL(latency_ms) AS latency_ms FROM turns GROUP BY run_id ORDER BY run_id"
)
"""Per run with turns, by ``run_id``: rows in ``turns``, those with a latency, their prompt and completion tokens
(sums; NULL counts 0) and latency (ms, sum; NULL counts 0)."""
TURN_LATENCIES = "SELECT latency_ms FROM turns ORDER BY run_id, latency_ms"
"""Every turn's latency, by ``run_id`` and, within a run, ascending (NULL first)."""
RUN_MODE_COUNTS = (
    "SELECT run_id, mode, turns_with_mode, shortest >> 32 AS shortest_chars, shortest & 4294967295 AS shortest_seq,"
    " shortest_turn FROM (SELECT t.run_id, j.value AS mode, COUNT(*) AS turns_with_mode,"
    " MIN(({chars}) * 4294967296 + t.seq) AS shortest, t.turn AS shortest_turn"
    f" FROM turns t LEFT JOIN {NEWEST_LABELS} l USING (run_id, turn),"
    " json_each(CASE WHEN json_type(COALESCE(l.failure_modes, t.failure_modes)) = 'array'"
    " THEN COALESCE(l.failure_modes, t.failure_modes) ELSE '[]' END) j"
    " WHERE COALESCE(l.failure_modes, t.failure_modes) <> '[]' AND j.type = 'text'"
    " GROUP BY t.run_id, j.value)"
)
"""Per run × failure mode shown by >= 1 of its turns (newest labels): the turns showing it, and the reply length in
characters, ``seq`` and turn number of its shortest such turn (ties: the earliest). The shortest is the smallest of
``chars × 2^32 + seq`` (one integer: SQLite caps a text at 2^31 - 1 characters, so it fits 64 bits while ``seq`` <
2^32), and ``shortest_turn`` is a bare column of that ``MIN`` row (SQLite's documented min/max bare-column rule); this
replaced three numbers packed as zero-padded text, which cost 40% more. ``{chars}`` is :func:`content_length_sql`."""


def run_details_sql(run_columns: Sequence[str], turn_columns: Sequence[str], end_columns: Sequence[str]) -> str:
    """The query behind :meth:`ReportReads.run_details` (timings NULL before ``m008_streaming``, no blobs before ``m005``)."""
    timing = (
        "LEFT JOIN (SELECT run_id, AVG(ttft_ms) AS ttft_ms, AVG(decode_tps) AS decode_tps FROM turns"
        " WHERE ttft_ms IS NOT NULL OR decode_tps IS NOT NULL GROUP BY run_id) t USING (run_id)"
        if "ttft_ms" in turn_columns
        else ""
    )
    columns = "t.ttft_ms, t.decode_tps" if timing else "NULL AS ttft_ms, NULL AS decode_tps"
    refs = "e.blob_refs" if "blob_refs" in end_columns else "NULL"
    return (
        "SELECT r.run_id, CASE WHEN json_valid(r.config) THEN json_extract(r.config, '$.requires_tool') END AS requires_tool,"
        f" e.checks, e.final_answer, e.error, e.breach, {refs} AS blob_refs, {columns}"
        f" FROM runs r LEFT JOIN run_ends e USING (run_id) {timing} ORDER BY r.seq"
    )


class ReportReads:
    """The reads reports make (pandas and numpy imported on first use); a base of :class:`harness.ledger.Ledger`."""

    path: Path
    _db: sqlite3.Connection
    _lock: threading.RLock
    _columns: dict[str, list[str]]

    def _fail(self, exc: BaseException) -> LedgerError:
        return LedgerError(f"could not read the ledger {self.path} ({exc}); run `harness ledger verify --ledger {self.path}`.")

    def _frame(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        import pandas as pd

        try:
            with self._lock:
                return pd.read_sql(sql, self._db, params=tuple(params))
        except (sqlite3.Error, pd.errors.DatabaseError) as exc:
            raise self._fail(exc) from exc

    def runs_frame(self) -> pd.DataFrame:
        """One row per run in start order: its start columns a report needs and its end columns (NaN/None if unfinished).

        Columns: ``run_id, identity, scenario, scenario_path, scenario_hash, model, temperature, seed, tool_mode,
        parser, stream, think, repetition, started_at, ended_at, outcome, turns, prompt_tokens, completion_tokens``
        (``stream`` 0 or 1; ``think`` ``default``, ``on`` or ``off``, ``default`` for runs recorded before it existed).
        """
        return self._frame(runs_frame_sql(self._columns["runs"]))

    def turns_frame(self) -> pd.DataFrame:
        """One row per turn in ledger order, with the loop's own labels (JSON text; see :meth:`newest_labels_frame`).
        Loads every turn: for notebooks; reports use :meth:`run_mode_counts` and :meth:`turn_latencies`.

        Columns: ``seq, run_id, turn, failure_modes, labels_version, finish_reason, prompt_tokens,
        completion_tokens, latency_ms, content_chars`` (reply length in characters, 0 when empty).
        """
        return self._frame(
            "SELECT seq, run_id, turn, failure_modes, classifier_version AS labels_version, finish_reason, prompt_tokens,"
            f" completion_tokens, latency_ms, {content_length_sql(self._has_blobs())} AS content_chars FROM turns ORDER BY seq"
        )

    def newest_labels_frame(self) -> pd.DataFrame:
        """The newest ``harness rescore`` labels of each re-labelled turn: ``run_id, turn, failure_modes, labels_version``."""
        return self._frame(
            "SELECT run_id, turn, failure_modes, classifier_version AS labels_version FROM labels"
            " WHERE seq IN (SELECT MAX(seq) FROM labels GROUP BY run_id, turn)"
        )

    def run_mode_counts(self) -> pd.DataFrame:
        """Per run × failure mode (newest labels) shown by >= 1 of its turns, aggregated in SQL (:data:`RUN_MODE_COUNTS`).

        Returns:
            Columns ``run_id``, ``mode``, ``turns_with_mode`` (count of the run's turns showing it; a turn whose labels
            name a mode twice counts twice), ``shortest_chars`` (length in characters of the shortest reply of those
            turns), ``shortest_seq`` (its ``turns.seq``, the earliest on a tie) and ``shortest_turn`` (its turn number); in
            no particular order.

        Raises:
            LedgerError: the file cannot be read, or a turn's labels are not JSON (the file was edited).
        """
        return self._frame(RUN_MODE_COUNTS.format(chars=content_length_sql(self._has_blobs())))

    def turn_latencies(self) -> tuple[pd.DataFrame, np.ndarray]:
        """Per run, its turns aggregated in SQL (:data:`RUN_TURN_TOTALS`), and every turn's latency in one float array
        (:data:`TURN_LATENCIES`, no Python object per turn), both read in one snapshot.

        Returns:
            ``(totals, latencies)``: ``totals`` has one row per run with turns, sorted by ``run_id``: ``run_id``,
            ``turns_recorded``, ``latencies_recorded`` (turns with a latency), ``turn_prompt_tokens``,
            ``turn_completion_tokens`` (tokens) and ``latency_ms`` (ms), sums; ``latencies`` (float64, ms) holds the
            first run's ``turns_recorded`` latencies, NaN (not recorded) first and then ascending, then the next run's.

        Raises:
            LedgerError: the file cannot be read.
        """
        import numpy as np
        import pandas as pd

        try:
            with self._lock:
                self._db.execute("BEGIN")
                try:
                    cursor = self._db.execute(RUN_TURN_TOTALS)
                    totals = pd.DataFrame.from_records(cursor.fetchall(), columns=[d[0] for d in cursor.description])
                    values = np.empty(int(totals["turns_recorded"].sum()) if len(totals) else 0, dtype=np.float64)
                    cursor, at = self._db.execute(TURN_LATENCIES), 0
                    while rows := cursor.fetchmany(65536):
                        values[at : at + len(rows)] = np.array(rows, dtype=np.float64).ravel()  # None reads as NaN
                        at += len(rows)
                finally:
                    self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        if totals.empty:
            totals = pd.DataFrame({c: pd.Series([], dtype=object if c == "run_id" else "int64") for c in
                                   ("run_id", "turns_recorded", "latencies_recorded", "turn_prompt_tokens",
                                    "turn_completion_tokens", "latency_ms")})  # fmt: skip
        return totals, values[:at]

    def export_run_rows(self) -> list[dict[str, Any]]:
        """One dict per run in start order with :data:`RUN_EXPORT_COLUMNS` (``harness export --runs``).

        ``outcome`` is ``unfinished`` for a run with no end row; ``turns``, ``prompt_tokens``, ``completion_tokens``
        (tokens) and ``latency_ms`` (ms, summed over turns) are the end row's totals, or the turns recorded so far;
        never null. ``checks_passed`` and ``checks_failed`` are lists of check names, ``failure_modes`` the sorted list
        of modes any turn showed (newest labels); ``requires_tool`` is True, False, or None (recorded before the flag);
        ``stream`` ``on``/``off``; ``think`` ``default``/``on``/``off``; ``base_url`` is the server's URL (for a spec
        listing replicas, the replica the run started on: :mod:`harness.replicas`); ``base_url``, ``final_answer``,
        ``error`` and ``ended_at`` may be None.

        Raises:
            LedgerError: the file cannot be read.
        """
        import json

        modes: dict[str, list[str]] = {}
        for run_id, mode in self.run_mode_counts()[["run_id", "mode"]].itertuples(index=False):
            modes.setdefault(run_id, []).append(str(mode))
        details = {d["run_id"]: d for d in self.run_details()}
        sql = (
            "SELECT r.run_id, r.identity, r.scenario, r.model, r.base_url, r.temperature, r.seed, r.tool_mode, r.parser,"
            f" {axis_sql(self._columns['runs'])}, r.repetition, r.started_at, e.ended_at, COALESCE(e.outcome, 'unfinished') AS outcome,"
            " COALESCE(e.turns, t.n, 0) AS turns, COALESCE(e.prompt_tokens, t.p, 0) AS prompt_tokens,"
            " COALESCE(e.completion_tokens, t.c, 0) AS completion_tokens, COALESCE(t.l, 0) AS latency_ms"
            " FROM runs r LEFT JOIN run_ends e USING (run_id) LEFT JOIN (SELECT run_id, COUNT(*) AS n, TOTAL(prompt_tokens) AS p,"
            " TOTAL(completion_tokens) AS c, TOTAL(latency_ms) AS l FROM turns GROUP BY run_id) t USING (run_id) ORDER BY r.seq"
        )  # fmt: skip
        try:
            with self._lock:
                cursor = self._db.execute(sql)
                names = [d[0] for d in cursor.description]
                rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        out = []
        for row in rows:
            d = details.get(row["run_id"], {})
            try:
                checks = json.loads(d["checks"]) if d.get("checks") else []
            except ValueError:
                checks = []
            checks = [c for c in checks if isinstance(c, dict)] if isinstance(checks, list) else []
            flag = d.get("requires_tool")
            row.update(
                stream="on" if row["stream"] else "off", requires_tool=None if flag is None else bool(flag),
                turns=int(row["turns"]), prompt_tokens=int(row["prompt_tokens"]), completion_tokens=int(row["completion_tokens"]),
                latency_ms=float(row["latency_ms"]), checks_passed=[str(c.get("check")) for c in checks if c.get("passed")],
                checks_failed=[str(c.get("check")) for c in checks if not c.get("passed")],
                failure_modes=sorted(modes.get(row["run_id"], [])), final_answer=d.get("final_answer"), error=d.get("error"),
            )  # fmt: skip
            out.append({c: row[c] for c in RUN_EXPORT_COLUMNS})
        return out

    def reply_calls(self, seqs: Sequence[int]) -> dict[int, Any]:
        """The structured tool calls of the given turns (by ``turns.seq``), JSON decoded as the server sent them
        (a list, usually), for turns that have any; others are left out."""
        import json

        if not seqs:
            return {}
        refs = ", blob_refs" if self._has_blobs() else ""
        sql = f"SELECT seq, tool_calls{refs} FROM turns WHERE seq IN ({','.join('?' * len(seqs))}) AND tool_calls IS NOT NULL"
        try:
            with self._lock:
                cursor = self._db.execute(sql, [int(s) for s in seqs])
                names = [d[0] for d in cursor.description]
                rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
                if self._has_blobs():
                    resolve_rows(self._db, "turns", rows)
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        out = {}
        for row in rows:
            try:
                calls = json.loads(row["tool_calls"])
            except (TypeError, ValueError):
                continue
            if calls:
                out[int(row["seq"])] = calls
        return out

    def run_details(self) -> list[dict[str, Any]]:
        """Per run in start order, what the summary frame leaves out (large payloads put back from blobs).

        Returns:
            One dict per run: ``run_id``; ``requires_tool`` (the scenario's flag as recorded in ``config``: 1, 0, or None
            for runs recorded before it was); ``checks`` (the done checks' JSON text ``[{"check", "passed", "detail"}]``,
            None while unfinished); ``final_answer``, ``error`` (text or None); ``breach`` (JSON text or None);
            ``ttft_ms`` (mean time to first token over the run's turns, ms) and ``decode_tps`` (mean decode rate,
            completion tokens per second), None where no turn recorded one.

        Raises:
            LedgerError: the file cannot be read.
        """
        sql = run_details_sql(self._columns["runs"], self._columns["turns"], self._columns["run_ends"])
        try:
            with self._lock:
                cursor = self._db.execute(sql)
                names = [d[0] for d in cursor.description]
                rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
                if self._has_blobs("run_ends"):
                    resolve_rows(self._db, "run_ends", rows, "blob_refs")
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        for row in rows:
            row.pop("blob_refs", None)
        return rows

    def _has_blobs(self, table: str = "turns") -> bool:
        return "blob_refs" in self._columns[table]  # since m005
