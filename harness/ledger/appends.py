"""How a row is appended to a chained table: its plan (statements, hashed columns), its preparation (stored values,
blobs, hash payload: no SQLite needed, so made before the write lock) and its write (chained after its table's head).

:class:`~harness.ledger.store.Ledger` is the only caller: it writes a prepared row at once in its own transaction, or
keeps it for the next commit (a deferred turn row, ``record_turn(..., defer=True)``), so the chain is computed when the
row is written, never before.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.ledger.blobs import BLOB_COLUMNS, externalize
from harness.ledger.chain import GENESIS_HASH, chained_hash, row_payload, storable_row

__all__ = ["AppendPlan", "PreparedRow", "RowNotWritten", "append_plan", "prepare_row", "turn_key", "turn_written", "write_rows"]


@dataclass(frozen=True, eq=False)
class AppendPlan:
    """How rows are appended to one table: its name, the chain head query, the insert, the hashed columns in table order,
    and whether its large payloads go to ``blobs``. Compared and hashed by identity (one per table and open ledger)."""

    table: str
    head_sql: str
    insert_sql: str
    hashed: list[str]
    blobs: bool


def append_plan(table: str, columns: Sequence[str]) -> AppendPlan:
    """The plan of appends to ``table``, whose columns are ``columns`` in table order (``PRAGMA table_info``)."""
    columns = [c for c in columns if c not in ("seq", "row_hash")]
    hashed = [c for c in columns if c != "prev_hash"]
    return AppendPlan(
        table=table,
        head_sql=f"SELECT row_hash FROM {table} ORDER BY seq DESC LIMIT 1",
        insert_sql=f"INSERT INTO {table} (prev_hash, {', '.join(hashed)}, row_hash) VALUES ({', '.join('?' * (len(hashed) + 2))})",
        hashed=hashed,
        blobs=table in BLOB_COLUMNS and "blob_refs" in columns,  # since m005: each large payload stored once
    )


@dataclass(frozen=True)
class PreparedRow:
    """A row ready to append but for its chain: its table's plan, hashed values (in ``plan.hashed`` order), hash payload
    (:func:`~harness.ledger.chain.row_payload`) and blobs (SHA-256 hex -> bytes)."""

    plan: AppendPlan
    values: tuple[Any, ...]
    payload: str
    blobs: dict[str, bytes]


def prepare_row(plan: AppendPlan, declared: Mapping[str, str], values: Mapping[str, Any]) -> PreparedRow:
    """``values`` (column -> value, as :func:`~harness.ledger.records.json_columns` gives them) as they will be stored
    (``declared``: column -> declared type), large payloads moved to blobs, and the text the row's hash covers."""
    stored = storable_row(values, declared)
    blobs: dict[str, bytes] = {}
    if plan.blobs:
        stored, blobs = externalize(plan.table, stored)
    hashed_row = tuple(map(stored.get, plan.hashed))  # None for a column the record lacks
    return PreparedRow(plan, hashed_row, row_payload(plan.hashed, hashed_row), blobs)


class RowNotWritten(Exception):
    """:func:`write_rows` could not write ``rows[index]``; ``cause`` is SQLite's error (the rows before it were written
    in the caller's transaction, which the caller rolls back)."""

    def __init__(self, index: int, cause: sqlite3.Error) -> None:
        super().__init__(f"row {index}: {cause}")
        self.index, self.cause = index, cause


def write_rows(db: sqlite3.Connection, rows: Sequence[PreparedRow]) -> None:
    """Insert ``rows`` in order inside the caller's write transaction, each chained after its table's head (read once
    per table: the transaction holds the write lock, so the head is the row this call inserted last).

    Raises:
        RowNotWritten: a row could not be written (the caller rolls the transaction back).
    """
    heads: dict[AppendPlan, str] = {}
    for index, row in enumerate(rows):
        plan = row.plan
        try:
            prev = heads.get(plan)
            if prev is None:
                last = db.execute(plan.head_sql).fetchone()
                prev = last[0] if last else GENESIS_HASH
            if row.blobs:
                db.executemany("INSERT OR IGNORE INTO blobs (sha256, data) VALUES (?, ?)", row.blobs.items())
            heads[plan] = chained_hash(prev, row.payload)
            db.execute(plan.insert_sql, (prev, *row.values, heads[plan]))
        except sqlite3.Error as exc:
            raise RowNotWritten(index, exc) from exc


def turn_key(row: PreparedRow) -> tuple[Any, Any]:
    """``(run_id, turn)`` of a prepared turn row: what makes it unique in ``turns``."""
    hashed = row.plan.hashed
    return row.values[hashed.index("run_id")], row.values[hashed.index("turn")]


def turn_written(db: sqlite3.Connection, row: PreparedRow) -> bool:
    """Whether a turn of ``row``'s run and number is in the ledger now: after an interrupt that came as the row's
    transaction ended (a Ctrl-C just after its COMMIT), the one exact way to tell whether it committed. False when it
    cannot be read."""
    try:
        return db.execute("SELECT 1 FROM turns WHERE run_id = ? AND turn = ?", turn_key(row)).fetchone() is not None
    except sqlite3.Error:
        return False
