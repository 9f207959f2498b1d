"""Large payloads stored once: the ``blobs`` table (SHA-256 -> bytes) and the references rows hold.

A reply that writes a 1 MiB file used to hold that content three times in its ``turns`` row: in
the raw reply, in the structured tool calls and in the executed calls. Since migration
``m005_blobs``, when a row of ``turns``, ``run_ends`` or ``labels`` is appended, every string of
:data:`MIN_BLOB_CHARS` characters or more in its payload columns (:data:`BLOB_COLUMNS`) is stored
once in ``blobs`` under the SHA-256 of its UTF-8 bytes, and the row holds a reference instead:

* ``"\\ue000blob:<sha256>"`` stands for the blob's text;
* ``"\\ue000json:<sha256>"`` stands for an object or array that is exactly the JSON the blob's
  text parses to (an OpenAI-style server sends tool-call arguments as a JSON string; the loop
  records them parsed), so the parsed arguments cost no second copy.

Every string that starts with U+E000 is stored as a blob too, whatever its length, so in a row
that holds references every string value starting with U+E000 is one. The row's ``blob_refs``
column lists the keys it references (canonical JSON, sorted), or is NULL when it references none;
rows written before ``m005_blobs`` have no ``blob_refs`` and are read exactly as they are.

Tamper evidence: blobs carry no chain of their own. A row's ``row_hash`` covers its references and
its ``blob_refs``, and :func:`blobs_problem` checks that every listed blob exists and hashes to its
key, and that no blob is left that no row references. Reading a row back (:func:`resolve_rows`)
puts every payload back, giving the column text exactly as it would have been stored without
blobs, so nothing above the ledger package can tell the difference.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

from harness.canonical import canonical_json
from harness.errors import LedgerError

__all__ = ["BLOB_COLUMNS", "MIN_BLOB_CHARS", "blobs_problem", "content_length_sql", "externalize", "resolve_rows"]

MIN_BLOB_CHARS = 4096
"""Strings at least this long (in characters) are stored once, as a blob."""
_MARK = "\ue000"
_TEXT_REF = _MARK + "blob:"
_JSON_REF = _MARK + "json:"
_KEY_CHARS = 64

BLOB_COLUMNS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "turns": (frozenset({"raw_reply", "tool_calls", "recovered_calls", "executed_calls", "details"}),
              frozenset({"content", "reasoning"})),
    "run_ends": (frozenset({"checks"}), frozenset({"error", "final_answer"})),
    "labels": (frozenset({"recovered_calls", "details"}), frozenset()),
}  # fmt: skip
"""table -> (columns of JSON text, columns of plain text) whose payloads may be stored as blobs."""


def _key(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # JSON columns may hold lone surrogates; they come back as they were


class _Externalizer:
    """Replaces large (or U+E000-led) strings, and objects that a large string parses to, by references."""

    def __init__(self) -> None:
        self.parsed: dict[str, tuple[str, bytes]] = {}
        """canonical JSON of a transformed object -> (key, bytes) of the string it was parsed from."""

    def text(self, value: str) -> tuple[str, dict[str, bytes]]:
        if len(value) < MIN_BLOB_CHARS and not value.startswith(_MARK):
            return value, {}
        data = _bytes(value)
        key = _key(data)
        return _TEXT_REF + key, {key: data}

    def value(self, value: Any) -> tuple[Any, dict[str, bytes]]:
        """The value with references in it, and the blobs those references need (blobs of a replaced subtree are not kept)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            pairs = [self.value(item) for item in value]
            out: Any = [p[0] for p in pairs]
        elif isinstance(value, dict):
            items = {k: self.value(v) for k, v in value.items()}
            out, pairs = {k: p[0] for k, p in items.items()}, list(items.values())
        else:
            return value, {}
        if self.parsed:
            hit = self.parsed.get(canonical_json(out))
            if hit is not None:
                return _JSON_REF + hit[0], {hit[0]: hit[1]}
        used: dict[str, bytes] = {}
        for _, blobs in pairs:
            used.update(blobs)
        return out, used

    def learn(self, value: Any, seen: set[str]) -> None:
        """Note every large string in ``value`` that is the JSON text of an object or array."""
        if isinstance(value, list | dict):
            for item in value.values() if isinstance(value, dict) else value:
                self.learn(item, seen)
        elif isinstance(value, str) and len(value) >= MIN_BLOB_CHARS and value[:1] in "{[" and value not in seen:
            seen.add(value)
            try:
                parsed = json.loads(value)
                shape = canonical_json(_Externalizer().value(parsed)[0])  # references only, no candidates: no recursion
            except (ValueError, RecursionError):
                return
            data = _bytes(value)
            self.parsed.setdefault(shape, (_key(data), data))


def _needs_work(text: Any) -> bool:
    return isinstance(text, str) and (len(text) >= MIN_BLOB_CHARS or _MARK in text)


def externalize(table: str, values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Store a row's large payloads once: its column values with references, and the blobs to insert.

    Args:
        table: a table of :data:`BLOB_COLUMNS`.
        values: column -> value as SQLite will store it (JSON columns hold canonical JSON text).

    Returns:
        ``(values, blobs)``: the values with ``blob_refs`` set (a sorted JSON list of keys, or None
        when nothing was stored as a blob, in which case every other value is unchanged), and
        key (hex SHA-256) -> bytes (UTF-8) of each blob the row references.
    """
    json_cols, text_cols = BLOB_COLUMNS[table]
    out = dict(values)
    out["blob_refs"] = None
    work = [c for c in sorted(json_cols | text_cols) if _needs_work(values.get(c))]
    if not work:
        return out, {}
    parsed: dict[str, Any] = {}
    for column in work:
        if column in json_cols:
            try:
                parsed[column] = json.loads(values[column])
            except ValueError:
                continue  # not JSON (never written so by the harness): kept as it is
    walker = _Externalizer()
    seen: set[str] = set()
    for value in parsed.values():
        walker.learn(value, seen)
    blobs: dict[str, bytes] = {}
    for column in work:
        if column in parsed:
            new, used = walker.value(parsed[column])
            if used:
                out[column] = canonical_json(new)
        elif column in text_cols:
            out[column], used = walker.text(values[column])
        else:
            continue
        blobs.update(used)
    out["blob_refs"] = canonical_json(sorted(blobs)) if blobs else None
    return out, blobs


def _fetch(db: sqlite3.Connection, keys: Iterable[str]) -> dict[str, bytes]:
    wanted = sorted(set(keys))
    found: dict[str, bytes] = {}
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        marks = ",".join("?" * len(chunk))
        found.update(db.execute(f"SELECT sha256, data FROM blobs WHERE sha256 IN ({marks})", chunk).fetchall())
    return found


def _where(table: str, row: Mapping[str, Any]) -> str:
    return f"the {table} row of run {row.get('run_id')}" + (f", turn {row['turn']}" if "turn" in row else "")


def _restore(value: Any, blobs: Mapping[str, bytes]) -> Any:
    if isinstance(value, str) and value.startswith(_MARK):
        key = value[len(_TEXT_REF) :]
        if len(key) != _KEY_CHARS or value[: len(_TEXT_REF)] not in (_TEXT_REF, _JSON_REF) or key not in blobs:
            raise KeyError(value[:80])
        text = blobs[key].decode("utf-8", "surrogatepass")
        return text if value.startswith(_TEXT_REF) else json.loads(text)
    if isinstance(value, list):
        return [_restore(item, blobs) for item in value]
    if isinstance(value, dict):
        return {k: _restore(v, blobs) for k, v in value.items()}
    return value


def resolve_rows(db: sqlite3.Connection, table: str, rows: list[dict[str, Any]], refs: str = "blob_refs") -> None:
    """Put every stored payload back into rows read from ``table``, in place: each column's text as stored before blobs.

    Args:
        db: the ledger connection.
        table: a table of :data:`BLOB_COLUMNS` whose payload columns the rows hold under their own names.
        rows: column -> value dicts; rows without ``refs`` (or with NULL there) are left as they are.
        refs: the name the rows give that table's ``blob_refs`` column.

    Raises:
        LedgerError: a row references a blob that is missing or not text (the file was edited).
    """
    listed = [row for row in rows if row.get(refs) is not None]
    if not listed:
        return
    json_cols, text_cols = BLOB_COLUMNS[table]
    try:
        blobs = _fetch(db, (key for row in listed for key in json.loads(row[refs])))
    except (ValueError, TypeError) as exc:
        raise LedgerError(f"{_where(table, listed[0])} has a blob_refs that is not a list; run `harness ledger verify`.") from exc
    for row in listed:
        try:
            for column in json_cols | text_cols:
                value = row.get(column)
                if not isinstance(value, str):
                    continue
                if column in text_cols:
                    row[column] = _restore(value, blobs)
                elif _MARK in value:
                    try:
                        tree = json.loads(value)
                    except ValueError:
                        continue  # left for the record decoder to name
                    row[column] = canonical_json(_restore(tree, blobs))
        except (KeyError, UnicodeDecodeError, ValueError) as exc:
            raise LedgerError(
                f"{_where(table, row)} references a stored payload that is missing or damaged; run `harness ledger verify`."
            ) from exc


def content_length_sql(has_blobs: bool) -> str:
    """SQL for a ``turns`` row's reply length in characters (0 when NULL), reading a blob's length where the row holds a reference."""
    if not has_blobs:
        return "COALESCE(length(content), 0)"
    return (
        "COALESCE(CASE WHEN blob_refs IS NOT NULL AND substr(content, 1, 1) = char(57344)"
        f" THEN (SELECT length(CAST(data AS TEXT)) FROM blobs WHERE sha256 = substr(content, {len(_TEXT_REF) + 1}))"
        " ELSE length(content) END, 0)"
    )


def blobs_problem(db: sqlite3.Connection, tables: Iterable[str]) -> str | None:
    """Check the blobs against the rows that reference them, in one read transaction.

    Args:
        db: an open ledger connection (autocommit) whose chains were verified.
        tables: the tables of :data:`BLOB_COLUMNS` that have a ``blob_refs`` column.

    Returns:
        One sentence naming the first problem (a ``blob_refs`` that is not a list of keys, a referenced
        blob missing, a blob whose bytes do not hash to its key, a blob no row references), or None.
        None too for a ledger older than the ``blobs`` table.

    Raises:
        sqlite3.Error: the file cannot be read.
    """
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='blobs'").fetchone():
        return None
    own = not db.in_transaction  # a caller's read transaction (a merge's input) is one snapshot already
    if own:
        db.execute("BEGIN")  # one snapshot: a run appending meanwhile adds its row and its blobs together
    try:
        return _blobs_problem(db, tables)
    finally:
        if own:
            db.execute("COMMIT")


def _blobs_problem(db: sqlite3.Connection, tables: Iterable[str]) -> str | None:
    referenced: dict[str, str] = {}
    for table in tables:
        for seq, text in db.execute(f"SELECT seq, blob_refs FROM {table} WHERE blob_refs IS NOT NULL ORDER BY seq"):
            try:
                keys = json.loads(text)
            except (TypeError, ValueError):
                keys = None
            if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
                return f"{table} row seq={seq} has a blob_refs that is not a list of keys (the row was edited)"
            for key in keys:
                referenced.setdefault(key, f"{table} row seq={seq}")
    present: set[str] = set()
    for key, data in db.execute("SELECT sha256, data FROM blobs ORDER BY rowid"):
        if not isinstance(data, bytes) or _key(data) != key:
            return f"the blob {str(key)[:16]}... does not hash to its key (its bytes were edited)"
        if key not in referenced:
            return f"the blob {key[:16]}... is referenced by no row (it was added, or the row that referenced it was removed)"
        present.add(key)
    for key, where in referenced.items():
        if key not in present:
            return f"{where} references the blob {key[:16]}..., which is missing (it was removed)"
    return None
