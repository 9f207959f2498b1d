"""The outside anchor: one line naming every chain's row count and a digest of their heads.

No file can prove from inside itself that rows were not cut from its end, or that an edited row's
chain was not recomputed with the same hash function. A :class:`LedgerHead` kept outside the
ledger (a lab notebook, a commit message, a signed file) can: ``harness ledger verify --anchor``
recomputes the hash of each table's first *n* rows, for the *n* the anchor recorded, and compares
the digest. Rows appended after the anchor are fine; any row up to it removed or changed is not.

The line looks like ``hl1:_migrations=4,run_ends=2,runs=2,turns=6:<sha256 hex>``: the format
version, the row count of each non-empty table (sorted by name), and
``sha256(canonical JSON of [[table, rows, head], ...])`` where ``head`` is the ``row_hash`` of the
table's last counted row (in ``seq`` order). ``_migrations`` and ``_added_columns`` carry no hash
columns, so their head is computed here: ``sha256(previous head + canonical JSON of the row)`` over
rows in insertion order, from :data:`~harness.ledger.chain.GENESIS_HASH`.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.canonical import canonical_json
from harness.errors import LedgerError
from harness.ledger.chain import GENESIS_HASH
from harness.ledger.migrations import CHAINED_TABLES

__all__ = ["ANCHOR_VERSION", "SIDE_TABLES", "Anchor", "LedgerHead", "anchor_problem", "parse_anchor", "read_head", "side_head"]

ANCHOR_VERSION = "hl1"
"""Prefix of every anchor line; a later format gets a new one."""
SIDE_TABLES = ("_migrations", "_added_columns")
"""Append-only tables without hash columns, hashed in insertion order by this module."""
_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,63}"
_TOKEN = re.compile(rf"\b{ANCHOR_VERSION}:((?:{_NAME}=\d{{1,18}}(?:,{_NAME}=\d{{1,18}})*)?):([0-9a-f]{{64}})\b")
_MAX_ANCHOR_FILE = 1 << 20


@dataclass(frozen=True)
class LedgerHead:
    """Row counts and head hashes of a ledger's tables at one moment.

    Attributes:
        rows: table -> rows counted (tables with 0 rows are left out of the line and the digest).
        heads: table -> hex SHA-256 hash of its last counted row.
    """

    rows: dict[str, int]
    heads: dict[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        """Hex SHA-256 of ``[[table, rows, head], ...]`` over the non-empty tables sorted by name."""
        parts = [[t, n, self.heads[t]] for t, n in sorted(self.rows.items()) if n]
        return hashlib.sha256(canonical_json(parts).encode("utf-8")).hexdigest()

    @property
    def anchor(self) -> str:
        """The one-line anchor, e.g. ``hl1:runs=2,turns=6:9f86d0...`` (64 hex digits at the end)."""
        counts = ",".join(f"{t}={n}" for t, n in sorted(self.rows.items()) if n)
        return f"{ANCHOR_VERSION}:{counts}:{self.digest}"

    def as_json(self) -> dict[str, Any]:
        """``{"anchor": line, "tables": {table: {"rows": n, "head": hex}}}`` (non-empty tables only)."""
        return {
            "anchor": self.anchor,
            "tables": {t: {"rows": n, "head": self.heads[t]} for t, n in sorted(self.rows.items()) if n},
        }


def _tables(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def side_head(rows: Iterable[Sequence[Any]]) -> str:
    """The head of a side table's rows (each a sequence of its column values, in insertion order): ``sha256(previous
    head + canonical JSON of the row)`` from :data:`~harness.ledger.chain.GENESIS_HASH`."""
    head = GENESIS_HASH
    for row in rows:
        head = hashlib.sha256((head + canonical_json(list(row))).encode("utf-8")).hexdigest()
    return head


def _side_head(db: sqlite3.Connection, table: str, rows: int) -> str:
    return side_head(db.execute(f"SELECT * FROM {table} ORDER BY rowid LIMIT ?", (rows,)))


def read_head(db: sqlite3.Connection, rows: Mapping[str, int] | None = None) -> LedgerHead:
    """The head of every chained and side table, now or at the given row counts.

    Args:
        db: an open ledger connection.
        rows: table -> rows to count (an anchor's counts); None for every table's current count.

    Returns:
        The :class:`LedgerHead`.

    Raises:
        LedgerError: a table has fewer rows than asked for (its last rows were removed), or is missing.
        sqlite3.Error: the file cannot be read.
    """
    present = _tables(db)
    if rows is None:
        rows = {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in (*CHAINED_TABLES, *SIDE_TABLES) if t in present}
    counted: dict[str, int] = {}
    heads: dict[str, str] = {}
    for table, n in rows.items():
        if not n:
            continue
        have = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] if table in present else 0
        if have < n:
            raise LedgerError(f"{table} has {have} rows, fewer than the {n} the anchor recorded (rows were removed)")
        if table in SIDE_TABLES or table not in CHAINED_TABLES:
            heads[table] = _side_head(db, table, n)
        else:
            heads[table] = db.execute(f"SELECT row_hash FROM {table} ORDER BY seq LIMIT 1 OFFSET ?", (n - 1,)).fetchone()[0]
        counted[table] = n
    return LedgerHead(counted, heads)


@dataclass(frozen=True)
class Anchor:
    """An anchor read back: what a ledger must still extend.

    Attributes:
        rows: table -> anchored row count.
        heads: table -> anchored head hash, when the JSON form gave it (names the table that differs).
        digest: the anchored digest (hex SHA-256).
    """

    rows: dict[str, int]
    heads: dict[str, str]
    digest: str


def parse_anchor(text: str) -> Anchor:
    """Read an anchor given as its line, a file holding the line, or the JSON that ``harness ledger head --json`` prints.

    Returns:
        The :class:`Anchor`.

    Raises:
        LedgerError: neither the text nor the file it names holds an anchor line.
    """
    source = text.strip()
    path = Path(source)
    try:
        if len(source) < 4096 and path.is_file():
            with path.open("rb") as handle:
                source = handle.read(_MAX_ANCHOR_FILE).decode("utf-8", "replace")
    except OSError as exc:
        raise LedgerError(f"cannot read the anchor file {text}: {exc.strerror or exc}.") from exc
    match = _TOKEN.search(source)
    if match is None:
        raise LedgerError(
            f"--anchor {text[:80]!r} is not a ledger head ({ANCHOR_VERSION}:...) nor a file holding one; "
            "pass the line `harness ledger head` printed."
        )
    rows = {name: int(n) for name, n in (part.split("=") for part in match.group(1).split(",") if part)}
    heads: dict[str, str] = {}
    try:
        tables = json.loads(source).get("tables", {})
        heads = {t: str(v["head"]) for t, v in tables.items() if t in rows and v.get("rows") == rows[t]}
    except (ValueError, AttributeError, TypeError, KeyError):
        pass
    return Anchor(rows, heads, match.group(2))


def anchor_problem(db: sqlite3.Connection, anchor: Anchor) -> str | None:
    """Whether the ledger still extends the anchor: its first rows hash to the anchored heads.

    Args:
        db: an open ledger connection whose chains were verified.
        anchor: from :func:`parse_anchor`.

    Returns:
        One sentence naming what no longer matches, or None when the ledger extends the anchor.

    Raises:
        sqlite3.Error: the file cannot be read.
    """
    try:
        now = read_head(db, anchor.rows)
    except LedgerError as exc:
        return str(exc)
    for table, head in sorted(anchor.heads.items()):
        if now.heads.get(table) != head:
            return (
                f"the first {anchor.rows[table]} rows of {table} no longer hash to the anchored head "
                "(a row up to the anchor was edited and the chain recomputed)"
            )
    if now.digest != anchor.digest:
        return (
            "the rows up to the anchor no longer hash to its digest (a row up to the anchor was edited and the chain "
            "recomputed, or the anchor was mistyped)"
        )
    return None
