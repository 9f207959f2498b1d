"""Writing a merged ledger: the kept runs' rows chained anew, their blobs and templates, and where each row came from.

Called by :func:`harness.ledger.merge.merge_ledgers` on a new, migrated file once every check passed; see that
module for the rules and :mod:`harness.ledger.merge_origin` for what the provenance rows prove. Everything is
written in one transaction, streaming each input's rows in ``seq`` order (memory grows with the blob keys and the
kept run ids, not with the rows).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.canonical import canonical_json
from harness.ledger.anchor import LedgerHead
from harness.ledger.blobs import BLOB_COLUMNS
from harness.ledger.chain import GENESIS_HASH, row_hash
from harness.ledger.merge_origin import MERGE_TABLES, hashed_columns
from harness.ledger.migrations import CHAINED_TABLES
from harness.ledger.opening import connect_writable
from harness.ledger.records import utc_now

__all__ = ["MergeSource", "write_merged"]

_BATCH = 2000


@dataclass
class MergeSource:
    """One input ledger, opened read-only and checked.

    Attributes:
        index: its number in the merge (1 for the first input named).
        path: the file as named.
        db: a read-only connection to it (closed by the merge).
        head: its head when merged.
        side_rows: its ``_migrations`` and ``_added_columns`` rows, each a list of column values, in insertion order.
        columns: chained table -> its columns in table order.
        runs: runs it holds.
    """

    index: int
    path: Path
    db: sqlite3.Connection
    head: LedgerHead
    side_rows: dict[str, list[list[Any]]]
    columns: dict[str, list[str]]
    runs: int


class _Chain:
    """Appends rows to one table of the new file, chaining them, in batches."""

    def __init__(self, db: sqlite3.Connection, table: str) -> None:
        self.db, self.table = db, table
        self.columns = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
        self.hashed = hashed_columns(self.columns, 0, {})  # a new file: no column was added after a row
        self.prev, self.seq = GENESIS_HASH, 0
        self.pending: list[tuple[Any, ...]] = []
        marks = ", ".join("?" * len(self.columns))
        self.sql = f"INSERT INTO {table} ({', '.join(self.columns)}) VALUES ({marks})"

    def add(self, values: dict[str, Any]) -> int:
        """Append one row (``values``: column -> value as stored); its ``seq`` in the new file."""
        self.seq += 1
        digest = row_hash(self.prev, self.hashed, tuple(values.get(c) for c in self.hashed))
        full = {**values, "seq": self.seq, "prev_hash": self.prev, "row_hash": digest}
        self.pending.append(tuple(full.get(c) for c in self.columns))
        self.prev = digest
        if len(self.pending) >= _BATCH:
            self.flush()
        return self.seq

    def flush(self) -> None:
        self.db.executemany(self.sql, self.pending)
        self.pending = []


def write_merged(path: Path, sources: list[MergeSource], kept: dict[int, set[str]]) -> None:
    """Write the merge into the new, migrated, empty ledger at ``path`` (one transaction).

    Args:
        path: the new file.
        sources: the checked inputs, in the order named.
        kept: input index -> the run ids it contributes.

    Raises:
        sqlite3.Error, LedgerError: the file cannot be written.
    """
    db = connect_writable(path)
    try:
        db.execute("BEGIN IMMEDIATE")
        origins = _Chain(db, "merge_rows")
        _write_sources(db, sources, kept)
        for table in CHAINED_TABLES:
            if table in MERGE_TABLES:
                for source in sources:  # an input's own provenance: recorded, never carried
                    for source_seq, digest in source.db.execute(f"SELECT seq, row_hash FROM {table} ORDER BY seq"):
                        origins.add({"source": source.index, "table_name": table, "source_seq": source_seq,
                                     "source_row_hash": digest, "merged_seq": None})  # fmt: skip
                continue
            _copy_table(db, table, sources, kept, origins)
        origins.flush()
        for source in sources:
            templates = source.db.execute("SELECT sha256, text FROM templates").fetchall()
            db.executemany("INSERT OR IGNORE INTO templates (sha256, text) VALUES (?, ?)", templates)
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    finally:
        db.close()


def _write_sources(db: sqlite3.Connection, sources: list[MergeSource], kept: dict[int, set[str]]) -> None:
    chain = _Chain(db, "merge_sources")
    now = utc_now()
    for source in sources:
        chain.add({"source": source.index, "file": source.path.name, "head": canonical_json(source.head.as_json()),
                   "side_rows": canonical_json(source.side_rows), "runs_kept": len(kept[source.index]), "merged_at": now})  # fmt: skip
    chain.flush()


def _rows(source: MergeSource, table: str) -> Iterator[dict[str, Any]]:
    columns = source.columns[table]
    for row in source.db.execute(f"SELECT * FROM {table} ORDER BY seq"):
        yield dict(zip(columns, row, strict=True))


def _copy_table(
    db: sqlite3.Connection, table: str, sources: list[MergeSource], kept: dict[int, set[str]], origins: _Chain
) -> None:
    """Carry the kept runs' rows of one table, input by input, recording every input row's origin."""
    chain = _Chain(db, table)
    has_blobs = table in BLOB_COLUMNS and "blob_refs" in chain.columns
    for source in sources:
        if source.columns[table] != chain.columns:
            raise sqlite3.DatabaseError(f"{source.path} has other {table} columns than this harness writes")
        mine, keys = kept[source.index], set()
        for values in _rows(source, table):
            merged = None
            if values["run_id"] in mine:
                merged = chain.add(values)
                if has_blobs and values.get("blob_refs"):
                    keys.update(json.loads(values["blob_refs"]))
            origins.add({"source": source.index, "table_name": table, "source_seq": values["seq"],
                         "source_row_hash": values["row_hash"], "merged_seq": merged})  # fmt: skip
        _copy_blobs(db, source, sorted(keys))
    chain.flush()


def _copy_blobs(db: sqlite3.Connection, source: MergeSource, keys: list[str]) -> None:
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        found = source.db.execute(f"SELECT sha256, data FROM blobs WHERE sha256 IN ({','.join('?' * len(chunk))})", chunk)
        db.executemany("INSERT OR IGNORE INTO blobs (sha256, data) VALUES (?, ?)", found.fetchall())
