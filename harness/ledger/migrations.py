"""The ledger's schema: named migrations applied in order, each in one transaction with its record.

Each migration is a function ``mNNN_description(db)`` registered with :func:`migration`;
names are unique and applied ones are recorded in ``_migrations`` (append-only, like every
table). :func:`apply` runs the pending ones; :func:`pending` and :func:`applied` only read, so a
read-only open can say "run ``harness ledger migrate``" (the guarantees of
``sqlite_utils.Migrations``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager

from harness.ledger.records import utc_now

__all__ = [
    "CHAINED_TABLES",
    "INDEXED_REPLY_CHARS",
    "MIGRATIONS",
    "added_columns",
    "applied",
    "apply",
    "migration",
    "pending",
    "reference_schema",
    "unknown",
]

CHAINED_TABLES = ("runs", "turns", "run_ends", "labels", "attestations", "attempts", "merge_sources", "merge_rows")
"""Every table whose rows carry ``prev_hash``/``row_hash``, in verification order (the last two hold only a merged
ledger's provenance: :mod:`harness.ledger.merge`)."""

Migration = Callable[[sqlite3.Connection], None]
MIGRATIONS: list[tuple[str, Migration]] = []
"""``(name, function)`` in the order they apply."""


def migration(fn: Migration) -> Migration:
    """Register a migration; its function name is its name.

    Raises:
        RuntimeError: the name is already registered.
    """
    if any(name == fn.__name__ for name, _ in MIGRATIONS):
        raise RuntimeError(f"duplicate migration name {fn.__name__}")
    MIGRATIONS.append((fn.__name__, fn))
    return fn


def _append_only_triggers(db: sqlite3.Connection, table: str) -> None:
    for action in ("UPDATE", "DELETE"):
        db.execute(
            f"CREATE TRIGGER IF NOT EXISTS {table}_no_{action.lower()} BEFORE {action} ON {table} "
            f"BEGIN SELECT RAISE(ABORT, 'the ledger is append-only: {action} on {table} refused'); END"
        )


_CHAIN_COLS = "prev_hash TEXT NOT NULL, row_hash TEXT NOT NULL"


@migration
def m001_initial(db: sqlite3.Connection) -> None:
    """Create runs, turns, run_ends and labels with append-only triggers."""
    db.execute(f"""CREATE TABLE runs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL UNIQUE, identity TEXT NOT NULL,
        scenario TEXT NOT NULL, scenario_path TEXT, scenario_hash TEXT NOT NULL,
        model TEXT NOT NULL, backend TEXT NOT NULL, base_url TEXT, server_version TEXT, model_digest TEXT,
        temperature REAL NOT NULL, seed INTEGER NOT NULL, max_tokens INTEGER, num_ctx INTEGER,
        tool_mode TEXT NOT NULL, parser TEXT NOT NULL, repetition INTEGER NOT NULL,
        turn_limit INTEGER, token_limit INTEGER, harness_version TEXT NOT NULL, git_sha TEXT, git_dirty INTEGER,
        sandbox TEXT, started_at TEXT NOT NULL, config TEXT, {_CHAIN_COLS})""")
    db.execute(f"""CREATE TABLE turns (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL REFERENCES runs(run_id), turn INTEGER NOT NULL,
        request_hash TEXT NOT NULL, raw_reply TEXT, content TEXT, tool_calls TEXT, recovered_calls TEXT,
        executed_calls TEXT, failure_modes TEXT NOT NULL, recovered_by TEXT, classifier_version TEXT NOT NULL,
        finish_reason TEXT, prompt_tokens INTEGER, completion_tokens INTEGER, latency_ms REAL,
        started_at TEXT NOT NULL, ended_at TEXT NOT NULL, details TEXT, {_CHAIN_COLS},
        UNIQUE (run_id, turn))""")
    db.execute(f"""CREATE TABLE run_ends (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL UNIQUE REFERENCES runs(run_id),
        outcome TEXT NOT NULL, turns INTEGER NOT NULL, prompt_tokens INTEGER, completion_tokens INTEGER,
        breach TEXT, error TEXT, checks TEXT, final_answer TEXT, escape_attempts TEXT, files_written TEXT,
        ended_at TEXT NOT NULL, {_CHAIN_COLS})""")
    db.execute(f"""CREATE TABLE labels (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, turn INTEGER NOT NULL,
        classifier_version TEXT NOT NULL, failure_modes TEXT NOT NULL, recovered_calls TEXT,
        recovered_by TEXT, details TEXT, labelled_at TEXT NOT NULL, {_CHAIN_COLS})""")
    db.execute("CREATE INDEX turns_run ON turns(run_id)")
    db.execute("CREATE INDEX labels_run_turn ON labels(run_id, turn)")
    db.execute("CREATE INDEX runs_identity ON runs(identity)")
    for table in ("runs", "turns", "run_ends", "labels", "_migrations"):
        _append_only_triggers(db, table)


@migration
def m002_attestations(db: sqlite3.Connection) -> None:
    """Create attestations (``harness attest``): who reviewed which run's frame, append-only."""
    db.execute(f"""CREATE TABLE attestations (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL REFERENCES runs(run_id), reviewer TEXT NOT NULL,
        notes TEXT, frame_sha256 TEXT NOT NULL, attested_at TEXT NOT NULL, {_CHAIN_COLS})""")
    db.execute("CREATE INDEX attestations_run ON attestations(run_id)")
    _append_only_triggers(db, "attestations")


@migration
def m003_attempts(db: sqlite3.Connection) -> None:
    """Record failed model-call attempts; index request hashes for the opt-in reply cache."""
    db.execute(f"""CREATE TABLE attempts (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, turn INTEGER NOT NULL, attempt INTEGER NOT NULL,
        error_type TEXT NOT NULL, error TEXT NOT NULL, status_code INTEGER, retry_in_ms REAL, at TEXT NOT NULL,
        {_CHAIN_COLS})""")
    db.execute("CREATE INDEX attempts_run ON attempts(run_id)")
    db.execute("CREATE INDEX turns_request ON turns(request_hash)")
    _append_only_triggers(db, "attempts")


@migration
def m004_turn_reasoning(db: sqlite3.Connection) -> None:
    """Record the reasoning text servers return beside the content (``turns.reasoning``).

    A column added to a chained table is listed in ``_added_columns`` with the last ``seq``
    written without it, so the hash chain of older rows still verifies (see
    :mod:`harness.ledger.chain`).
    """
    db.execute(
        "CREATE TABLE IF NOT EXISTS _added_columns (table_name TEXT NOT NULL, column_name TEXT NOT NULL,"
        " last_seq_without INTEGER NOT NULL, PRIMARY KEY (table_name, column_name))"
    )
    _append_only_triggers(db, "_added_columns")
    db.execute("ALTER TABLE turns ADD COLUMN reasoning TEXT")
    db.execute("INSERT INTO _added_columns SELECT 'turns', 'reasoning', COALESCE(MAX(seq), 0) FROM turns")


@migration
def m005_blobs(db: sqlite3.Connection) -> None:
    """Store each large payload once: ``blobs`` (SHA-256 hex -> bytes, append-only) and ``blob_refs`` on
    ``turns``, ``run_ends`` and ``labels`` (the keys a row references; see :mod:`harness.ledger.blobs`).

    Rows written before stay as they are: ``blob_refs`` is listed in ``_added_columns``, so their
    hashes still verify.
    """
    db.execute("CREATE TABLE blobs (sha256 TEXT PRIMARY KEY, data BLOB NOT NULL)")
    _append_only_triggers(db, "blobs")
    for table in ("turns", "run_ends", "labels"):
        db.execute(f"ALTER TABLE {table} ADD COLUMN blob_refs TEXT")
        db.execute(f"INSERT INTO _added_columns SELECT '{table}', 'blob_refs', COALESCE(MAX(seq), 0) FROM {table}")


@migration
def m006_turn_server_rejection(db: sqlite3.Connection) -> None:
    """Record the server's refusal of a reply (``turns.server_rejection``: ``{"server", "status", "error"}``), the
    model turn behind ``server_rejected_call``; listed in ``_added_columns`` like ``m004``."""
    db.execute("ALTER TABLE turns ADD COLUMN server_rejection TEXT")
    db.execute("INSERT INTO _added_columns SELECT 'turns', 'server_rejection', COALESCE(MAX(seq), 0) FROM turns")


@migration
def m007_wire_settings(db: sqlite3.Connection) -> None:
    """Record the thinking setting of each run (``runs.think``: ``default``, ``on`` or ``off``), Ollama's manifest
    digest under its own name (``runs.manifest_digest``), and the server's own timing of each reply
    (``turns.timings``: llama.cpp's ``timings`` numbers); each listed in ``_added_columns`` like ``m004``.
    Runs recorded before carry NULL: they sent no ``think`` (the ``default`` setting)."""
    for table, column in (("runs", "think"), ("runs", "manifest_digest"), ("turns", "timings")):
        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")
        db.execute(f"INSERT INTO _added_columns SELECT '{table}', '{column}', COALESCE(MAX(seq), 0) FROM {table}")


@migration
def m008_streaming(db: sqlite3.Connection) -> None:
    """Streaming as a matrix axis: ``runs.stream`` (1 when replies were streamed; NULL in older rows means not),
    ``turns.stream_chunks`` (a streamed reply's raw chunks, compressed), ``turns.ttft_ms`` and ``turns.decode_tps``;
    listed in ``_added_columns`` like ``m004``."""
    db.execute("ALTER TABLE runs ADD COLUMN stream INTEGER")
    db.execute("INSERT INTO _added_columns SELECT 'runs', 'stream', COALESCE(MAX(seq), 0) FROM runs")
    for column, kind in (("stream_chunks", "TEXT"), ("ttft_ms", "REAL"), ("decode_tps", "REAL")):
        db.execute(f"ALTER TABLE turns ADD COLUMN {column} {kind}")
        db.execute(f"INSERT INTO _added_columns SELECT 'turns', '{column}', COALESCE(MAX(seq), 0) FROM turns")


@migration
def m009_templates(db: sqlite3.Connection) -> None:
    """Store each chat template a run's server reported once: ``templates`` (SHA-256 hex of the UTF-8 text -> text,
    append-only); runs name theirs in ``config.provenance.template_sha256`` (:mod:`harness.ledger.queries`)."""
    db.execute("CREATE TABLE templates (sha256 TEXT PRIMARY KEY, text TEXT NOT NULL)")
    _append_only_triggers(db, "templates")


@migration
def m010_report_index(db: sqlite3.Connection) -> None:
    """A covering index on the ``turns`` columns every report aggregates per run (``run_id``, then ``latency_ms``,
    ``prompt_tokens``, ``completion_tokens``, ``ttft_ms``, ``decode_tps``): the per-run totals, the latencies sorted
    within each run and the timing means read this index in ``run_id`` order with no sort
    (:mod:`harness.ledger.report_reads`; 58 MB, 7% of a 1,000,000-turn ledger, built in about 2 s). An index adds no
    row and changes none: the chains and ``row_hash`` values stay as they are. Ledgers opened read-only before this
    migration is applied give the same reports, sorting instead."""
    db.execute("CREATE INDEX turns_report ON turns(run_id, latency_ms, prompt_tokens, completion_tokens, ttft_ms, decode_tps)")


@migration
def m011_merge_provenance(db: sqlite3.Connection) -> None:
    """Where a merged ledger's rows came from (``harness ledger merge``, :mod:`harness.ledger.merge`), append-only and
    chained like the data: ``merge_sources`` holds one row per input ledger (its file name, its head when merged, and
    its ``_migrations``/``_added_columns`` rows as JSON, so its chains can be recomputed), ``merge_rows`` one row per
    row of each input's chained tables (its ``seq`` and ``row_hash`` there, and its ``seq`` here, NULL when the merge
    left it out). Both stay empty in a ledger that was never merged."""
    db.execute(f"""CREATE TABLE merge_sources (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, source INTEGER NOT NULL UNIQUE, file TEXT NOT NULL, head TEXT NOT NULL,
        side_rows TEXT NOT NULL, runs_kept INTEGER NOT NULL, merged_at TEXT NOT NULL, {_CHAIN_COLS})""")
    db.execute(f"""CREATE TABLE merge_rows (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, source INTEGER NOT NULL, table_name TEXT NOT NULL,
        source_seq INTEGER NOT NULL, source_row_hash TEXT NOT NULL, merged_seq INTEGER, {_CHAIN_COLS})""")
    db.execute("CREATE INDEX merge_rows_source ON merge_rows(source, table_name, source_seq)")
    for table in ("merge_sources", "merge_rows"):
        _append_only_triggers(db, table)


INDEXED_REPLY_CHARS = (
    "CASE WHEN blob_refs IS NOT NULL AND substr(content, 1, 1) = char(57344) THEN -1 ELSE COALESCE(length(content), 0) END"
)
"""A turn's reply length in characters, or -1 where ``content`` holds a blob reference (its length is the blob's): the
expression ``m012_mode_index`` indexes, written the same way in the queries that read it (SQLite matches it as text)."""


@migration
def m012_mode_index(db: sqlite3.Connection) -> None:
    """A partial covering index on the turns that show a failure mode (``failure_modes <> '[]'``): their labels text,
    ``run_id``, reply length (:data:`INDEXED_REPLY_CHARS`) and turn number. A report counts each run's turns per
    labels text and finds each text's shortest reply from this index alone, without reading the turns' rows
    (:mod:`harness.ledger.report_reads`; 29 MB on the 1,000,000-turn benchmark ledger, where 36% of turns show a
    mode). Like every index it adds no row and changes none: the chains and ``row_hash`` values stay as they are; a
    ledger opened read-only before it is applied gives the same reports, scanning the table instead."""
    db.execute(
        f"CREATE INDEX turns_modes ON turns(failure_modes, run_id, ({INDEXED_REPLY_CHARS}), turn) WHERE failure_modes <> '[]'"
    )


@migration
def m013_drop_turns_run(db: sqlite3.Connection) -> None:
    """Drop ``turns_run`` (``turns(run_id)``): ``turns_report`` (``m010``) and the ``UNIQUE (run_id, turn)`` index
    begin with ``run_id`` too, so every read by run still searches an index (``tests/test_ledger.py`` holds the query
    plans), and each turn's append writes one B-tree fewer. A run's turns read in ``seq`` order are now sorted after
    the search (a run has a few turns). Like every index, it held no chained row: the chains and ``row_hash`` values
    stay as they are."""
    db.execute("DROP INDEX IF EXISTS turns_run")


_MIGRATIONS_TABLE = "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"


def reference_schema(count: int) -> dict[tuple[str, str], str | None]:
    """The schema the first ``count`` registered migrations create, built by running them on an in-memory database.

    Returns:
        ``(type, name) -> sql`` for every object in ``sqlite_master`` (``sql`` is None for SQLite's own indexes),
        exactly as SQLite stores it, so a ledger's schema can be compared with it text for text.
    """
    mem = sqlite3.connect(":memory:", isolation_level=None)
    try:
        mem.execute(_MIGRATIONS_TABLE)
        for _name, fn in MIGRATIONS[:count]:
            fn(mem)
        return {(t, n): sql for t, n, sql in mem.execute("SELECT type, name, sql FROM sqlite_master")}
    finally:
        mem.close()


def added_columns(db: sqlite3.Connection) -> dict[str, dict[str, int]]:
    """Columns added to chained tables after their creation: table -> column -> last ``seq`` written without it.

    Raises:
        ValueError, TypeError: a ``last_seq_without`` is not a number (the table was edited).
    """
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='_added_columns'").fetchone():
        return {}
    added: dict[str, dict[str, int]] = {}
    for table, column, last_seq in db.execute("SELECT table_name, column_name, last_seq_without FROM _added_columns"):
        added.setdefault(table, {})[column] = int(last_seq)
    return added


def applied(db: sqlite3.Connection) -> list[str]:
    """Names of applied migrations, in the order applied (``[]`` for a blank file)."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='_migrations'").fetchone():
        return []
    return [r[0] for r in db.execute("SELECT name FROM _migrations ORDER BY rowid")]


def unknown(db: sqlite3.Connection) -> str | None:
    """The first applied migration this harness does not register (a newer harness wrote the ledger), or ``None``."""
    known = {name for name, _ in MIGRATIONS}
    return next((name for name in applied(db) if name not in known), None)


def pending(db: sqlite3.Connection) -> list[str]:
    """Names of registered migrations not applied yet, in order (reads only)."""
    done = set(applied(db))
    return [name for name, _ in MIGRATIONS if name not in done]


def apply(db: sqlite3.Connection, transaction: Callable[[], AbstractContextManager[object]]) -> list[str]:
    """Apply pending migrations in order, each with its ``_migrations`` record in one transaction.

    Args:
        db: a writable connection.
        transaction: opens one write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``).

    Returns:
        Names of the migrations applied now (empty when up to date).
    """
    done = set(applied(db))
    now: list[str] = []
    for name, fn in MIGRATIONS:
        if name in done:
            continue
        with transaction():
            db.execute(_MIGRATIONS_TABLE)  # inside the first migration's transaction: a kill leaves nothing half-made
            if db.execute("SELECT 1 FROM _migrations WHERE name=?", (name,)).fetchone():
                continue  # another process applied it meanwhile
            fn(db)
            db.execute("INSERT INTO _migrations VALUES (?, ?)", (name, utc_now()))
        now.append(name)
    return now
