"""What the hash chains cannot see from inside a row: the schema, the migration record, and rows cut off the end.

The chains (:mod:`harness.ledger.chain`) prove each table's rows against each other. These checks
cover the rest of the file:

* :func:`schema_problem`: every table, index and trigger is exactly, text for text, what the
  applied migrations create (:func:`~harness.ledger.migrations.reference_schema`), and nothing
  else exists. This catches an append-only trigger replaced by a no-op of the same name or moved
  to another event, a column added or retyped, and a ``_migrations`` row removed while its
  objects stay (named as that edit when the schema is exactly what more migrations create).
* :func:`migrations_problem`: ``_migrations`` lists registered migrations only, in their order,
  with no gap, each with a UTC timestamp, never going back in time.
* :func:`storage_problem`: SQLite's ``integrity_check`` (an index swapped under an unchanged
  schema) and no BLOB cell in a chained table (it would hash like the text it reads as);
* :func:`sequence_problem`: SQLite's own ``sqlite_sequence`` still counts as many rows as each
  chained table holds, so deleting the last rows without also editing that counter is caught.

None of these can catch a forger who rewrites the whole file consistently (re-chaining, cutting
rows and the counter): that needs an outside anchor (:mod:`harness.ledger.anchor`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from harness.ledger import migrations
from harness.ledger.anchor import Anchor, anchor_problem
from harness.ledger.blobs import BLOB_COLUMNS, blobs_problem
from harness.ledger.chain import verify_chains
from harness.ledger.merge_origin import anchored_input, merge_problem
from harness.ledger.migrations import CHAINED_TABLES
from harness.ledger.queries import template_key
from harness.ledger.records import VerifyResult

__all__ = [
    "migrations_edited",
    "migrations_problem",
    "schema_problem",
    "sequence_problem",
    "storage_problem",
    "templates_problem",
    "verify_ledger",
]

_KINDS = {"table": "table", "index": "index", "trigger": "trigger", "view": "view"}


def migrations_problem(db: sqlite3.Connection) -> str | None:
    """Check the ``_migrations`` rows against the migrations this harness registers.

    Returns:
        One sentence naming the first problem (an unknown, repeated, missing or out-of-order
        migration, or a timestamp that is not ISO 8601 UTC or goes back in time), or None.

    Raises:
        sqlite3.Error: ``_migrations`` does not have its columns (the caller reports the schema first).
    """
    known = [name for name, _ in migrations.MIGRATIONS]
    rows = db.execute("SELECT name, applied_at FROM _migrations ORDER BY rowid").fetchall()
    previous = None
    for i, (name, applied_at) in enumerate(rows):
        if name not in known:
            return (
                f"_migrations lists {name!r}, a migration this harness does not know (the table was edited, or a newer "
                "harness wrote this ledger: upgrade harness)"
            )
        if i >= len(known) or known[i] != name:
            return (
                f"_migrations lists {name!r} where {known[i] if i < len(known) else 'nothing'!r} belongs (the table was edited)"
            )
        stamp = _utc(applied_at)
        if stamp is None:
            return f"_migrations row {name!r} has the timestamp {applied_at!r}, not ISO 8601 UTC (the table was edited)"
        if previous is not None and stamp < previous:
            return f"_migrations row {name!r} was applied before the migration listed above it (the table was edited)"
        previous = stamp
    return None


def _utc(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return None
    return stamp if stamp.utcoffset() is not None and not stamp.utcoffset() else None


def schema_problem(db: sqlite3.Connection, applied_count: int) -> str | None:
    """Compare every object in ``sqlite_master`` with what the first ``applied_count`` migrations create.

    When they differ but the schema is exactly what more migrations create (the last rows of ``_migrations`` were
    deleted while their changes stay), the sentence names that instead of the object the schema seems to have too
    many or too few of; only then are the later migrations' schemas built (in memory, a few milliseconds each).

    Returns:
        One sentence naming the migrations missing from ``_migrations`` whose changes are there, else the first object
        that is missing, unexpected or has other SQL, or None.
    """
    actual = {(t, n): sql for t, n, sql in db.execute("SELECT type, name, sql FROM sqlite_master")}
    problem = _schema_difference(actual, migrations.reference_schema(applied_count))
    if problem is None:
        return None
    return _edited(actual, applied_count) or problem


def migrations_edited(db: sqlite3.Connection, applied_count: int) -> str | None:
    """The sentence :func:`schema_problem` gives when the last rows of ``_migrations`` were deleted while their changes
    stay (``the _migrations table was edited (m013_... is missing from it, but its changes are there)``), else None.

    A writable open asks this before it applies pending migrations (which would re-apply and record them, hiding the
    edit from verify); a ledger made by an older migration set, whose schema is what its ``_migrations`` rows create,
    gets None and migrates. Any other difference also gets None here: verify names it.
    """
    actual = {(t, n): sql for t, n, sql in db.execute("SELECT type, name, sql FROM sqlite_master")}
    if not actual or _schema_difference(actual, migrations.reference_schema(applied_count)) is None:
        return None  # a new file (no schema yet: nothing to compare, and the later schemas go unbuilt) or a true one
    return _edited(actual, applied_count)


def _edited(actual: Mapping[tuple[str, str], str | None], applied_count: int) -> str | None:
    """The edit when ``actual`` is exactly what more than ``applied_count`` migrations create, else None."""
    for count in range(applied_count + 1, len(migrations.MIGRATIONS) + 1):
        if _schema_difference(actual, migrations.reference_schema(count)) is None:
            return f"the _migrations table was edited ({_missing(applied_count, count)})"
    return None


def _missing(applied_count: int, count: int) -> str:
    """``m013_x is missing from it, but its changes are there`` for the registered migrations ``applied_count:count``."""
    names = [name for name, _ in migrations.MIGRATIONS[applied_count:count]]
    if len(names) == 1:
        return f"{names[0]} is missing from it, but its changes are there"
    listed = " and ".join(names) if len(names) == 2 else f"{names[0]} to {names[-1]} ({len(names)} migrations)"
    return f"{listed} are missing from it, but their changes are there"


def _schema_difference(
    actual: Mapping[tuple[str, str], str | None], expected: Mapping[tuple[str, str], str | None]
) -> str | None:
    """The first object of ``expected`` missing from ``actual`` or with other SQL, else the first one added, or None."""
    for (kind, name), sql in sorted(expected.items()):
        if (kind, name) not in actual:
            return f"the {'append-only trigger' if kind == 'trigger' else _KINDS.get(kind, kind)} {name} is missing"
        if actual[(kind, name)] != sql:
            if kind == "trigger":
                return f"the trigger {name} is not the one the harness creates (its SQL was changed, so it may not refuse edits)"
            return f"the {_KINDS.get(kind, kind)} {name} is not the one the harness creates (its SQL was changed)"
    for kind, name in sorted(set(actual) - set(expected)):
        return f"the {_KINDS.get(kind, kind)} {name} is not part of a harness ledger (it was added)"
    return None


def sequence_problem(db: sqlite3.Connection, tables: Iterable[str]) -> str | None:
    """Check that SQLite's AUTOINCREMENT counter of each chained table still matches its last row.

    A row deleted from the end of a table leaves ``sqlite_sequence`` ahead of the last ``seq``
    unless the counter was edited too.

    Returns:
        One sentence naming the first table whose rows were cut, or None.
    """
    counters = dict(db.execute("SELECT name, seq FROM sqlite_sequence").fetchall())
    for table in tables:
        last = db.execute(f"SELECT MAX(seq) FROM {table}").fetchone()[0] or 0
        counter = counters.get(table, 0)
        if counter != last:
            return (
                f"SQLite's row counter for {table} says seq {counter} was written but the last row is seq {last} "
                "(rows were removed from the end, or the counter was edited)"
            )
    return None


def storage_problem(db: sqlite3.Connection, columns: Mapping[str, Sequence[str]]) -> str | None:
    """SQLite's own structure check, and no binary value where the chains hash text.

    ``PRAGMA integrity_check`` catches an index that no longer matches its table (root pages
    swapped with ``writable_schema``: the schema text is unchanged, but lookups by identity then
    miss finished runs). A BLOB cell in a chained table would hash like the text ``"b'...'"`` it
    reads as, so no chained column may hold one (large payloads live in ``blobs``).

    Returns:
        One sentence naming the first problem, or None.
    """
    report = [row[0] for row in db.execute("PRAGMA integrity_check(3)").fetchall()]
    if report != ["ok"]:
        return f"SQLite's integrity check fails ({'; '.join(str(r) for r in report)}): an index or page was altered"
    for table, cols in columns.items():
        if not cols:
            continue
        where = " OR ".join(f"typeof({c}) = 'blob'" for c in cols)
        row = db.execute(f"SELECT seq FROM {table} WHERE {where} LIMIT 1").fetchone()
        if row is not None:
            return f"{table} row seq={row[0]} holds a binary value where the ledger writes text (it was altered)"
    return None


def templates_problem(db: sqlite3.Connection) -> str | None:
    """A stored chat template whose text no longer hashes to its key (``templates``, since ``m009_templates``), or None.

    Runs name their template by key in their chained ``config``, so the text is covered once it matches its key.
    """
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='templates'").fetchone():
        return None
    stored = set()
    for key, text in db.execute("SELECT sha256, text FROM templates ORDER BY sha256"):
        if not isinstance(text, str) or template_key(text) != key:
            return f"the chat template stored under {str(key)[:16]} does not hash to its key (it was altered)"
        stored.add(key)
    for seq, config in db.execute("SELECT seq, config FROM runs ORDER BY seq"):
        try:
            facts = json.loads(config).get("provenance") if config else None
        except (ValueError, AttributeError):
            continue  # the chain check covers the config text itself
        key = facts.get("template_sha256") if isinstance(facts, dict) else None
        if isinstance(key, str) and key not in stored:
            return f"runs row seq={seq} names the chat template {key[:16]}, which is not stored (it was deleted)"
    return None


def verify_ledger(db: sqlite3.Connection, columns: Mapping[str, Sequence[str]], anchor: Anchor | None = None) -> VerifyResult:
    """Every check in order: the migration record, the schema, every chain, the row counters, the blobs, the templates,
    a merged ledger's provenance (:func:`~harness.ledger.merge_origin.merge_problem`), then the anchor: the ledger must
    extend it, or, in a merged ledger, one of its inputs must (``anchored_input`` names that input).

    Args:
        db: an open ledger connection.
        columns: chained table -> its columns in table order (empty for a table an older ledger lacks).
        anchor: from :func:`~harness.ledger.anchor.parse_anchor`; None checks what the file alone can show.

    Returns:
        The :class:`~harness.ledger.records.VerifyResult`; ``problem`` is one sentence naming the first failure.
    """
    try:
        problem = migrations_problem(db)
        applied = len(migrations.applied(db))
        problem = problem or schema_problem(db, applied) or storage_problem(db, columns)
        if problem:
            return VerifyResult(False, 0, problem)
        result = verify_chains(db, columns, fully_migrated=applied == len(migrations.MIGRATIONS))
        if not result.ok:
            return result
        problem = sequence_problem(db, [t for t in CHAINED_TABLES if columns[t]])
        problem = problem or blobs_problem(db, [t for t in BLOB_COLUMNS if "blob_refs" in columns.get(t, ())])
        problem = problem or templates_problem(db) or merge_problem(db)
        anchored = None
        if problem is None and anchor is not None:
            problem = anchor_problem(db, anchor)
            anchored = anchored_input(db, anchor) if problem else None  # an anchor taken on a merged input
            problem = None if anchored else problem
    except sqlite3.Error as exc:
        return VerifyResult(False, 0, f"the ledger cannot be read as a harness ledger ({exc})")
    return VerifyResult(problem is None, result.rows, problem, anchored)
