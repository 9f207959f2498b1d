"""A merged ledger's provenance, checked: its rows still are its inputs' rows, and an input's anchor can be checked here.

``harness ledger merge`` (:mod:`harness.ledger.merge`) writes, beside the rows it carries, one ``merge_sources``
row per input (file name, head when merged, its ``_migrations`` and ``_added_columns`` rows) and one ``merge_rows``
row per row of each input's chained tables: the row's ``seq`` and ``row_hash`` in the input, and its ``seq`` in the
merged file (NULL for a row the merge left out: a run that lost to another run of its identity, or an input's own
merge tables). From these, :func:`merge_problem` recomputes every input's chains:

* a carried row's input hash is ``sha256(previous input hash + canonical JSON of its columns)``, computed from the
  merged row's content with the input's column history, exactly as :mod:`harness.ledger.chain` computed it in the
  input; a left-out row's hash is taken as recorded (the file does not hold its content) and only links the chain;
* each input's chain of each table ends at the head recorded for it, and its side tables hash to their recorded heads;
* the carried rows are exactly the merged file's first rows of each table (``seq`` 1 to *n*, one origin each); rows
  after them were appended to the merged ledger later (a rescore, an attestation, a resumed run).

So an anchor taken on an input (:mod:`harness.ledger.anchor`) can be checked against the merged file
(:func:`anchored_input`): the input's first rows up to the anchor hash to the anchored digest, and every one of them
the merged file carries has the content the input had. What it cannot show: the content of left-out rows.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from harness.ledger.anchor import SIDE_TABLES, Anchor, LedgerHead, side_head
from harness.ledger.chain import GENESIS_HASH, row_hash
from harness.ledger.migrations import CHAINED_TABLES

__all__ = ["MERGE_TABLES", "anchored_input", "hashed_columns", "merge_problem"]

MERGE_TABLES = ("merge_sources", "merge_rows")
"""The provenance tables of a merged ledger (never carried from an input)."""
_CHAIN = ("seq", "prev_hash", "row_hash")


def hashed_columns(columns: Sequence[str], source_seq: int, added: Mapping[str, int]) -> list[str]:
    """The columns an input hashed for its row ``source_seq``: all but the chain's own, less the columns a later
    migration added (``added``: column -> last ``seq`` written without it, from the input's ``_added_columns``)."""
    return [c for c in columns if c not in _CHAIN and source_seq > added.get(c, -1)]


def _sources(db: sqlite3.Connection) -> list[tuple[int, str, dict[str, Any], dict[str, list[list[Any]]]]]:
    rows = db.execute("SELECT source, file, head, side_rows FROM merge_sources ORDER BY seq").fetchall()
    return [(int(s), str(f), json.loads(h), json.loads(r)) for s, f, h, r in rows]


def _added(side_rows: Mapping[str, list[list[Any]]]) -> dict[str, dict[str, int]]:
    added: dict[str, dict[str, int]] = {}
    for table, column, last in side_rows.get("_added_columns", []):
        added.setdefault(str(table), {})[str(column)] = int(last)
    return added


def _input_chain(db: sqlite3.Connection, source: int, table: str, added: Mapping[str, int]) -> tuple[int, str] | str:
    """``(rows, head)`` of one input's chain of ``table`` recomputed from the merged file, or the sentence of a problem."""
    columns = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
    cursor = db.execute(
        f"SELECT m.source_seq, m.source_row_hash, m.merged_seq, t.* FROM merge_rows m LEFT JOIN {table} t"
        " ON t.seq = m.merged_seq WHERE m.source = ? AND m.table_name = ? ORDER BY m.source_seq",
        (source, table),
    )
    prev, count = GENESIS_HASH, 0
    newest_added, every = max(added.values(), default=-1), hashed_columns(columns, 0, {})
    for source_seq, recorded, merged_seq, *row in cursor:
        count += 1
        if merged_seq is not None:
            if row[0] is None:
                return f"merge_rows names {table} row seq={merged_seq}, which is missing (it was removed)"
            values = dict(zip(columns, row, strict=True))
            names = every if source_seq > newest_added else hashed_columns(columns, int(source_seq), added)
            if row_hash(prev, names, tuple(values[c] for c in names)) != recorded:
                return f"{table} row seq={merged_seq} no longer has the content its input had (it was edited after the merge)"
        prev = str(recorded)
    return count, prev


def _carried_problem(db: sqlite3.Connection, table: str) -> str | None:
    """The carried rows of ``table`` must be its rows ``seq`` 1 to n, each with one origin."""
    n, distinct, low, high = db.execute(
        "SELECT COUNT(*), COUNT(DISTINCT merged_seq), MIN(merged_seq), MAX(merged_seq) FROM merge_rows"
        " WHERE table_name = ? AND merged_seq IS NOT NULL",
        (table,),
    ).fetchone()
    if n and (n != distinct or low != 1 or high != n):
        return f"the origins recorded for {table} do not name its first {n} rows once each (merge_rows was edited)"
    return None


def _source_problem(db: sqlite3.Connection, source: int, head: Mapping[str, Any], side_rows: Mapping[str, Any]) -> str | None:
    tables = head.get("tables", {})
    added = _added(side_rows)
    for table in CHAINED_TABLES:
        chain = _input_chain(db, source, table, added.get(table, {}))
        if isinstance(chain, str):
            return chain
        want = tables.get(table, {"rows": 0, "head": GENESIS_HASH})
        if chain != (want["rows"], want["head"]):
            return f"the origins recorded for {table} of merged input {source} no longer end at that input's head (merge_rows was edited)"
    for table in SIDE_TABLES:
        rows = side_rows.get(table, [])
        want = tables.get(table)
        if (want or {}).get("rows", 0) != len(rows) or (rows and side_head(rows) != want["head"]):
            return (
                f"the {table} rows recorded for merged input {source} do not hash to its recorded head (merge_sources was edited)"
            )
    return None


def merge_problem(db: sqlite3.Connection) -> str | None:
    """Check a merged ledger's provenance (see the module docstring); None for a ledger never merged.

    Args:
        db: an open ledger connection whose own chains were verified.

    Returns:
        One sentence naming the first problem, or None.

    Raises:
        sqlite3.Error: the file cannot be read.
    """
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='merge_sources'").fetchone():
        return None
    try:
        sources = _sources(db)
    except (ValueError, TypeError):
        return "a merge_sources row does not hold the JSON the merge wrote (it was edited)"
    for source, _file, head, side_rows in sources:
        try:
            problem = _source_problem(db, source, head, side_rows)
        except (ValueError, TypeError, KeyError, AttributeError):
            problem = f"the merge_sources row of merged input {source} does not hold the JSON the merge wrote (it was edited)"
        if problem:
            return problem
    for table in CHAINED_TABLES:
        problem = _carried_problem(db, table)
        if problem:
            return problem
    return None


def _input_head(db: sqlite3.Connection, source: int, side_rows: Mapping[str, Any], rows: Mapping[str, int]) -> LedgerHead | None:
    heads: dict[str, str] = {}
    for table, n in rows.items():
        if not n:
            continue
        if table in SIDE_TABLES:
            recorded = side_rows.get(table, [])
            if len(recorded) < n:
                return None
            heads[table] = side_head(recorded[:n])
        elif table in CHAINED_TABLES:
            found = db.execute(
                "SELECT source_row_hash FROM merge_rows WHERE source = ? AND table_name = ? ORDER BY source_seq LIMIT 1 OFFSET ?",
                (source, table, n - 1),
            ).fetchone()
            if found is None:
                return None
            heads[table] = str(found[0])
        else:
            return None
    return LedgerHead({t: n for t, n in rows.items() if n}, heads)


def anchored_input(db: sqlite3.Connection, anchor: Anchor) -> str | None:
    """The file name of the merged input that extends ``anchor``, or None (no input does, or the ledger was never merged).

    Call it after :func:`merge_problem` found nothing, so the recorded input chains are the inputs' own.

    Raises:
        sqlite3.Error: the file cannot be read.
    """
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='merge_sources'").fetchone():
        return None
    for source, file, _head, side_rows in _sources(db):
        head = _input_head(db, source, side_rows, anchor.rows)
        if head is None or head.digest != anchor.digest:
            continue
        if all(head.heads.get(t) == h for t, h in anchor.heads.items()):
            return file
    return None
