"""The ledger's reads of runs, turns, attempts and attestations, as the loop, the runner, rescore, review and export
use them (:class:`RunReads`, a base of :class:`harness.ledger.Ledger`; every read goes through its one read path,
:meth:`~harness.ledger.Ledger._query`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from harness.ledger.queries import NEWEST_LABELS, RUN_END_COLUMNS, SCORED_SQL
from harness.ledger.records import Attempt, Attestation, RunRow, TurnRecord, TurnRow, decode, run_row, turn_row

__all__ = ["RunReads"]


class RunReads:
    """Reads of whole runs and their rows; a base of :class:`harness.ledger.Ledger`."""

    _columns: dict[str, list[str]]

    if TYPE_CHECKING:  # provided by harness.ledger.Ledger

        def _query(
            self, sql: str, params: Sequence[Any] = (), payloads: str = "", refs: str = "blob_refs"
        ) -> list[dict[str, Any]]: ...

        def _has_blobs(self, table: str = "turns") -> bool: ...

    def _run_rows(self, where: str = "", params: Sequence[Any] = (), limit: int | None = None) -> list[RunRow]:
        refs = ", e.blob_refs AS end_blob_refs" if self._has_blobs("run_ends") else ""
        sql = f"SELECT r.*, {RUN_END_COLUMNS}{refs} FROM runs r LEFT JOIN run_ends e USING (run_id) {where} ORDER BY r.seq"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [run_row(row) for row in self._query(sql, params, payloads="run_ends", refs="end_blob_refs")]

    def runs(self) -> list[RunRow]:
        """Every run with its end row (None for unfinished runs), in start order."""
        return self._run_rows()

    def runs_matching(self, run_id: str, *, limit: int = 2) -> list[RunRow]:
        """The run with this exact id, else up to ``limit`` runs whose id starts with it (start order)."""
        exact = self._run_rows("WHERE r.run_id = ?", (run_id,))
        if exact or not run_id:
            return exact
        prefix = run_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        return self._run_rows("WHERE r.run_id LIKE ? ESCAPE '\\'", (prefix,), limit=limit)

    def turns(self, run_id: str | None = None) -> list[TurnRow]:
        """Turns (of one run, or all) with their newest labels, in ledger order."""
        where, params = ("WHERE t.run_id = ?", (run_id,)) if run_id else ("", ())
        rows = self._query(
            "SELECT t.*, COALESCE(l.failure_modes, t.failure_modes) AS newest_labels,"
            " COALESCE(l.classifier_version, t.classifier_version) AS labels_version"
            f" FROM turns t LEFT JOIN {NEWEST_LABELS} l USING (run_id, turn) {where} ORDER BY t.seq",
            params,
            payloads="turns",
        )
        return [turn_row(row) for row in rows]

    def turn_totals(self, run_id: str) -> tuple[int, int, int] | None:
        """``(turns, prompt_tokens, completion_tokens)`` recorded so far for a run, or None when the run was never started."""
        if not self._query("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)):
            return None
        row = self._query(
            "SELECT COUNT(*) AS n, COALESCE(SUM(prompt_tokens), 0) AS p, COALESCE(SUM(completion_tokens), 0) AS c"
            " FROM turns WHERE run_id = ?",
            (run_id,),
        )[0]
        return int(row["n"]), int(row["p"]), int(row["c"])

    def finished_identities(self) -> dict[str, int]:
        """Run identities with a finished, scored outcome (see :func:`harness.vocab.is_scored`).

        Returns:
            identity -> number of such runs (more than 1 would mean a duplicate).
        """
        rows = self._query(
            "SELECT r.identity, COUNT(*) AS n FROM runs r JOIN run_ends e USING (run_id)"
            f" WHERE e.outcome IN {SCORED_SQL} GROUP BY r.identity"
        )
        return {row["identity"]: row["n"] for row in rows}

    def cached_turn(self, identity: str, request_hash: str) -> TurnRecord | None:
        """The newest recorded turn of a run with this identity that answered this exact request."""
        rows = self._query(
            "SELECT t.* FROM turns t JOIN runs r USING (run_id) WHERE t.request_hash = ? AND r.identity = ?"
            " ORDER BY t.seq DESC LIMIT 1",
            (request_hash, identity),
            payloads="turns",
        )
        return decode(TurnRecord, rows[0], table="turns") if rows else None

    def attempts(self, run_id: str | None = None) -> list[Attempt]:
        """Failed model-call attempts (of one run, or all), in ledger order; ``[]`` for a ledger older than the table."""
        if not self._columns["attempts"]:
            return []
        where, params = ("WHERE run_id = ?", (run_id,)) if run_id else ("", ())
        return [
            decode(Attempt, row, table="attempts") for row in self._query(f"SELECT * FROM attempts {where} ORDER BY seq", params)
        ]

    def attestations(self, run_id: str) -> list[Attestation]:
        """A run's attestations, oldest first; ``[]`` for a ledger older than the table."""
        if not self._columns["attestations"]:
            return []
        rows = self._query("SELECT * FROM attestations WHERE run_id = ? ORDER BY seq", (run_id,))
        return [decode(Attestation, row, table="attestations") for row in rows]
