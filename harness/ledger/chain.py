"""The hash chain: what each row's ``row_hash`` covers, and the check that recomputes every chain.

``row_hash = sha256(prev_hash + canonical JSON of [[column, value], ...])`` over the row's
other columns in table order, with the value exactly as SQLite stores it (:func:`storable`),
and rows chained per table in ``seq`` order from :data:`GENESIS_HASH`. A column a migration
adds later (listed in ``_added_columns``) is hashed only for rows written after it existed.
:func:`verify_chains`
names the first row that does not match, which catches a row edited, inserted or deleted with
the append-only triggers dropped. (Removing rows from the *end* of a table leaves a valid
shorter chain; export the last hashes elsewhere if that matters to you.)
"""

from __future__ import annotations

import hashlib
import math
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from harness.canonical import canonical_json
from harness.ledger.migrations import CHAINED_TABLES, added_columns
from harness.ledger.records import VerifyResult

__all__ = ["GENESIS_HASH", "chained_hash", "row_hash", "row_payload", "storable", "storable_row", "verify_chains"]

GENESIS_HASH = "0" * 64
"""The ``prev_hash`` of each table's first row."""

_INT64 = (-(2**63), 2**63 - 1)


def storable(value: Any, declared: str) -> Any:
    """The value exactly as SQLite will store and return it in a column of the declared type.

    Hashing this (not the Python value) keeps the chain verifiable whatever a model or server sent:
    TEXT columns get text, booleans become integers, integers beyond 64 bits become text (REAL in INTEGER and REAL
    columns, as SQLite converts them: a server may send ``prompt_tokens`` of 2**63), REAL
    columns get floats and INTEGER columns integral floats as integers (SQLite's type affinity),
    zero loses its sign, and strings that UTF-8 cannot hold (lone surrogates) get backslash escapes.
    """
    kind = type(value)
    if kind is str:  # the usual cases first, as _stored_as gives them (a test holds them equal)
        return value if value.isascii() else value.encode("utf-8", "backslashreplace").decode("utf-8")
    if kind is int and declared != "TEXT" and declared != "REAL" and _INT64[0] <= value <= _INT64[1]:
        return value
    return _stored_as(value, declared)


def storable_row(values: Mapping[str, Any], declared: Mapping[str, str]) -> dict[str, Any]:
    """Every value of a row as :func:`storable` gives it (``declared``: column -> declared type; a column missing there
    is taken as untyped); ``None`` and ASCII text, most of a row, pass without a call."""
    out = {}
    for key, value in values.items():
        out[key] = value if value is None or (type(value) is str and value.isascii()) else storable(value, declared.get(key, ""))
    return out


def _stored_as(value: Any, declared: str) -> Any:
    """:func:`storable` for any value."""
    if value is None:
        return None
    if isinstance(value, bool):
        value = int(value)
    if declared == "TEXT" and not isinstance(value, str):
        value = str(value)
    if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
        if declared in ("INTEGER", "REAL"):  # SQLite reads the integer's text as a number: REAL (inf past a double)
            try:
                return float(value)
            except OverflowError:
                return math.inf if value > 0 else -math.inf
        value = str(value)
    if isinstance(value, float) and value != value:
        return None  # SQLite stores NaN as NULL
    if declared == "REAL" and isinstance(value, int):
        value = float(value)  # REAL affinity: 0 comes back as 0.0
    if isinstance(value, float) and value == 0:
        value = 0.0 if declared == "REAL" else 0  # SQLite does not keep the sign of zero
    if declared == "INTEGER" and isinstance(value, float) and value.is_integer() and _INT64[0] <= value <= _INT64[1]:
        value = int(value)  # INTEGER affinity: 5.0 comes back as 5
    if isinstance(value, str):
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def row_payload(columns: Sequence[str], row: tuple[Any, ...]) -> str:
    """The text a row's hash covers after its ``prev_hash``: canonical JSON of ``[[column, value], ...]``.

    It does not depend on the chain, so an appender makes it before taking the write lock.
    """
    return canonical_json([[c, v] for c, v in zip(columns, row, strict=True)])


def chained_hash(prev_hash: str, payload: str) -> str:
    """``row_hash`` of a row whose :func:`row_payload` is ``payload``, chained after ``prev_hash`` (64 hex digits)."""
    return hashlib.sha256((prev_hash + payload).encode("utf-8")).hexdigest()


def row_hash(prev_hash: str, columns: Sequence[str], row: tuple[Any, ...]) -> str:
    """``sha256(prev_hash + canonical JSON of [[column, value], ...])`` (64 hex digits), values as :func:`storable` gives them."""
    return chained_hash(prev_hash, row_payload(columns, row))


def verify_chains(db: sqlite3.Connection, columns: Mapping[str, Sequence[str]], *, fully_migrated: bool) -> VerifyResult:
    """Recompute every chained table's hashes in ``seq`` order and check its append-only triggers.

    Args:
        db: an open connection.
        columns: table -> its columns in table order (empty for a table an older ledger lacks).
        fully_migrated: every migration is applied, so a missing table is damage, not age.

    Returns:
        The :class:`~harness.ledger.records.VerifyResult`.
    """
    triggers = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='trigger'")}
    try:
        added = added_columns(db)
    except (TypeError, ValueError):
        return VerifyResult(False, 0, "the column history _added_columns was edited (a last_seq_without that is not a number)")
    checked = 0
    for table in CHAINED_TABLES:
        names = list(columns[table])
        if not names:  # an older ledger opened read-only: its migration has not run yet
            if fully_migrated:
                return VerifyResult(False, checked, f"the table {table} is missing")
            continue
        hashed_cols = [c for c in names if c not in ("seq", "prev_hash", "row_hash")]
        later = added.get(table, {})  # columns a migration added: rows written before it hash without them
        prev = GENESIS_HASH
        for row in db.execute(f"SELECT {', '.join(names)} FROM {table} ORDER BY seq"):
            checked += 1
            values = dict(zip(names, row, strict=True))
            where = f"{table} row seq={values['seq']}" + (
                (f" (run {values['run_id']}" + (f", turn {values['turn']})" if "turn" in values else ")"))
                if "run_id" in values
                else ""
            )
            if values["prev_hash"] != prev:
                return VerifyResult(
                    False,
                    checked,
                    f"{where}: prev_hash does not match the previous row (a row was removed, inserted or reordered)",
                )
            cols = [c for c in hashed_cols if values["seq"] > later.get(c, -1)] if later else hashed_cols
            if any(values[c] is not None for c in hashed_cols if c not in cols):  # written before the column existed
                return VerifyResult(False, checked, f"{where}: row_hash does not match its content (the row was edited)")
            if values["row_hash"] != row_hash(prev, cols, tuple(values[c] for c in cols)):
                return VerifyResult(False, checked, f"{where}: row_hash does not match its content (the row was edited)")
            prev = values["row_hash"]
        for action in ("update", "delete"):
            if f"{table}_no_{action}" not in triggers:
                return VerifyResult(False, checked, f"the append-only trigger {table}_no_{action} is missing")
    return VerifyResult(True, checked, None)
