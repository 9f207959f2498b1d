"""The ledger: an append-only, hash-chained SQLite file holding every run and every turn.

Design
------
* One SQLite file (default ``results/ledger.sqlite``) in WAL mode. It is the only thing in
  the harness that writes results; reports only read it.
* Append-only is enforced by the database: every table has ``BEFORE UPDATE`` and
  ``BEFORE DELETE`` triggers that abort. A run's end is a new row in ``run_ends``; new
  classifier labels are new rows in ``labels``; nothing is ever edited in place.
* Each append is its own transaction (``BEGIN IMMEDIATE``), so a crash loses at most the
  turn in flight, and concurrent writers (threads or processes) serialize on SQLite's lock.
* Every chained table has ``prev_hash`` and ``row_hash``: ``row_hash = sha256(prev_hash +
  canonical JSON of the row's other columns)``, with rows chained per table in ``seq`` order.
  :meth:`Ledger.verify` recomputes the chains and names the first row that does not match,
  which catches a row edited, inserted or deleted with the triggers dropped. (Removing rows
  from the *end* of a table leaves a valid shorter chain; export the last hashes elsewhere
  if that matters to you.)
* The schema is created and upgraded by named migrations, applied in order, each in one
  transaction with its record in ``_migrations``; every open migrates.

Tables (all columns of JSON type hold canonical JSON text)::

    runs       one row when a run starts: what ran, on what, with which options
    turns      one row per model call: request hash, raw reply, calls, labels, tokens, timing
    run_ends   one row when a run ends: outcome, totals, breach, checks, final answer
    labels     re-classifications appended by ``harness rescore`` (newest wins in reports)
    attempts   one row per failed model-call attempt (infrastructure errors and their retries)
    attestations  one row per human review of a run: reviewer, notes, SHA-256 of the review frame
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.errors import LedgerError

__all__ = [
    "CHAINED_TABLES",
    "DEFAULT_LEDGER_PATH",
    "EXPORT_COLUMNS",
    "Ledger",
    "RunEnd",
    "RunStart",
    "TurnRecord",
    "VerifyResult",
    "canonical_json",
    "utc_now",
]

DEFAULT_LEDGER_PATH = Path("results") / "ledger.sqlite"
GENESIS_HASH = "0" * 64
CHAINED_TABLES = ("runs", "turns", "run_ends", "labels", "attestations", "attempts")
EXPORT_COLUMNS = (
    "run_id", "scenario", "model", "temperature", "tool_mode", "parser", "repetition", "turn",
    "failure_modes", "finish_reason", "prompt_tokens", "completion_tokens", "latency_ms", "outcome",
)  # fmt: skip


def utc_now() -> str:
    """Current UTC time as ISO 8601 text with offset and milliseconds, e.g. ``2026-11-30T02:30:00.123+00:00``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def canonical_json(value: Any) -> str:
    """Deterministic JSON text: sorted keys, no whitespace, non-ASCII kept.

    Used for every JSON column and for hashing, so equal values always give equal text. Lone
    surrogates (which UTF-8 cannot hold) are written as ``\\uXXXX`` escapes, which JSON decodes
    back to the same string.
    """
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_INT64 = (-(2**63), 2**63 - 1)


def _storable(value: Any, declared: str) -> Any:
    """The value exactly as SQLite will store and return it in a column of the declared type.

    Hashing this (not the Python value) keeps the chain verifiable whatever a model or server sent:
    TEXT columns get text, booleans become integers, integers beyond 64 bits become text, and
    strings that UTF-8 cannot hold (lone surrogates) get backslash escapes.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        value = int(value)
    if declared == "TEXT" and not isinstance(value, str):
        value = str(value)
    if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
        value = str(value)
    if isinstance(value, float) and value != value:
        return None  # SQLite stores NaN as NULL
    if isinstance(value, str):
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


@dataclass(frozen=True)
class RunStart:
    """What a run is, written when it starts (table ``runs``)."""

    run_id: str
    """Unique id of this run (uuid4 hex)."""
    identity: str
    """Deterministic hash of everything that can change the model's output (see :mod:`harness.runner`)."""
    scenario: str
    """Scenario name."""
    scenario_path: str
    """Absolute path of the scenario file at run time."""
    scenario_hash: str
    """SHA-256 of the scenario file's bytes."""
    model: str
    """Model spec string, e.g. ``embedded:smollm2-135m``."""
    backend: str
    """Backend kind: ollama, openai, embedded, replay."""
    base_url: str | None
    """Server base URL, if any."""
    server_version: str | None
    """Server version as reported, if any."""
    model_digest: str | None
    """Model weights digest as reported (Ollama digest, GGUF sha256), if any."""
    temperature: float
    """Sampling temperature."""
    seed: int
    """Sampling seed sent to the server."""
    max_tokens: int
    """Completion-token cap per reply."""
    num_ctx: int
    """Context length in tokens."""
    tool_mode: str
    """``native`` or ``prompt``."""
    parser: str
    """Parser policy: ``strict`` or ``lenient``."""
    repetition: int
    """Repetition index within the cell, from 0."""
    turn_limit: int
    """Breaker: maximum model calls."""
    token_limit: int
    """Breaker: maximum accumulated tokens (prompt + completion)."""
    harness_version: str
    """Harness package version."""
    git_sha: str | None
    """Git commit of the harness checkout, if known."""
    git_dirty: bool | None
    """Whether that checkout had uncommitted changes."""
    sandbox: str
    """Path of the run's sandbox folder."""
    started_at: str = field(default_factory=utc_now)
    """UTC start time, ISO 8601 with offset."""
    config: dict[str, Any] = field(default_factory=dict)
    """Everything else worth keeping (system prompt hash, tool names, parallelism)."""


@dataclass(frozen=True)
class TurnRecord:
    """One model call and what the loop did with it (table ``turns``)."""

    run_id: str
    """The run this turn belongs to."""
    turn: int
    """Turn number, from 1."""
    request_hash: str
    """SHA-256 of the canonical JSON of the request messages."""
    raw_reply: Any
    """The server's raw JSON body, verbatim."""
    content: str | None
    """Reply text."""
    tool_calls: Any
    """Structured tool calls exactly as the server returned them (or null)."""
    recovered_calls: list[dict[str, Any]]
    """Calls recovered from content by the classifier's lenient pass."""
    executed_calls: list[dict[str, Any]]
    """Calls the loop executed under its parser policy, with their outputs."""
    failure_modes: list[str]
    """Canonical failure-mode names for this reply."""
    recovered_by: str | None
    """The recovery step that produced the recovered calls, if any."""
    classifier_version: str
    """Version of the classifier that produced the labels."""
    finish_reason: str | None
    """As reported by the server."""
    prompt_tokens: int | None
    """Prompt tokens reported by the server."""
    completion_tokens: int | None
    """Completion tokens reported by the server."""
    latency_ms: float | None
    """Wall-clock latency of the model call, ms; for a cache hit (``--cache``), the latency measured when the reply was recorded."""
    started_at: str
    """UTC time the request was sent."""
    ended_at: str
    """UTC time the turn (including tool execution) finished."""
    details: dict[str, Any] = field(default_factory=dict)
    """Classifier evidence (nearest tool names, schema errors, ...)."""


@dataclass(frozen=True)
class RunEnd:
    """How a run ended (table ``run_ends``); written once, after the last turn."""

    run_id: str
    """The run that ended."""
    outcome: str
    """``pass``, ``task_failed``, ``turn_limit``, ``token_limit``, ``infra_error`` or ``interrupted``."""
    turns: int
    """Model calls made."""
    prompt_tokens: int
    """Prompt tokens summed over turns."""
    completion_tokens: int
    """Completion tokens summed over turns."""
    breach: dict[str, Any] | None
    """Breaker trip: ``{"kind", "limit", "observed"}``, or null."""
    error: str | None
    """Infrastructure error message, or null."""
    checks: list[dict[str, Any]]
    """Done-check results: ``[{"check", "passed", "detail"}]``."""
    final_answer: str | None
    """Content of the last reply."""
    escape_attempts: list[str]
    """Paths refused for pointing outside the sandbox."""
    files_written: list[str]
    """Sandbox-relative paths written by tools."""
    ended_at: str = field(default_factory=utc_now)
    """UTC end time."""


@dataclass(frozen=True)
class VerifyResult:
    """Result of :meth:`Ledger.verify`.

    Attributes:
        ok: True when every chain and the triggers check out.
        rows: rows checked, all tables.
        problem: one sentence naming the first bad row (table and seq), or None.
    """

    ok: bool
    rows: int
    problem: str | None = None


_MIGRATIONS: list[tuple[str, Callable[[sqlite3.Connection], None]]] = []


def _migration(fn: Callable[[sqlite3.Connection], None]) -> Callable[[sqlite3.Connection], None]:
    if any(name == fn.__name__ for name, _ in _MIGRATIONS):
        raise RuntimeError(f"duplicate migration name {fn.__name__}")
    _MIGRATIONS.append((fn.__name__, fn))
    return fn


def _append_only_triggers(db: sqlite3.Connection, table: str) -> None:
    for action in ("UPDATE", "DELETE"):
        db.execute(
            f"CREATE TRIGGER IF NOT EXISTS {table}_no_{action.lower()} BEFORE {action} ON {table} "
            f"BEGIN SELECT RAISE(ABORT, 'the ledger is append-only: {action} on {table} refused'); END"
        )


_CHAIN_COLS = "prev_hash TEXT NOT NULL, row_hash TEXT NOT NULL"


@_migration
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


@_migration
def m002_attestations(db: sqlite3.Connection) -> None:
    """Create attestations (``harness attest``): who reviewed which run's frame, append-only."""
    db.execute(f"""CREATE TABLE attestations (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL REFERENCES runs(run_id), reviewer TEXT NOT NULL,
        notes TEXT, frame_sha256 TEXT NOT NULL, attested_at TEXT NOT NULL, {_CHAIN_COLS})""")
    db.execute("CREATE INDEX attestations_run ON attestations(run_id)")
    _append_only_triggers(db, "attestations")


@_migration
def m003_attempts(db: sqlite3.Connection) -> None:
    """Record failed model-call attempts; index request hashes for the opt-in reply cache."""
    db.execute(f"""CREATE TABLE attempts (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, turn INTEGER NOT NULL, attempt INTEGER NOT NULL,
        error_type TEXT NOT NULL, error TEXT NOT NULL, status_code INTEGER, retry_in_ms REAL, at TEXT NOT NULL,
        {_CHAIN_COLS})""")
    db.execute("CREATE INDEX attempts_run ON attempts(run_id)")
    db.execute("CREATE INDEX turns_request ON turns(request_hash)")
    _append_only_triggers(db, "attempts")


def _json_columns(record: Any) -> dict[str, Any]:
    values = {f.name: getattr(record, f.name) for f in fields(record)}  # shallow: no recursion into model data
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, (dict, list)) or key in {"raw_reply", "tool_calls", "breach"}:
            out[key] = None if value is None else canonical_json(value)
        elif isinstance(value, bool):
            out[key] = int(value)
        else:
            out[key] = value
    return out


def _row_hash(prev_hash: str, columns: list[str], row: tuple[Any, ...]) -> str:
    payload = canonical_json([[c, v] for c, v in zip(columns, row, strict=True)])
    return hashlib.sha256((prev_hash + payload).encode("utf-8")).hexdigest()


_NEWEST_LABELS = (
    "(SELECT run_id, turn, failure_modes, classifier_version FROM labels"
    " WHERE seq IN (SELECT MAX(seq) FROM labels GROUP BY run_id, turn))"
)
"""The newest re-classification of each turn (a subquery to LEFT JOIN on run_id, turn)."""


def _identity_taken(db: sqlite3.Connection, identity: str) -> bool:
    rows = db.execute(
        "SELECT r.config, e.outcome FROM runs r LEFT JOIN run_ends e USING (run_id) WHERE r.identity = ?", (identity,)
    ).fetchall()
    for config_text, outcome in rows:
        if outcome is not None:
            if outcome not in ("infra_error", "interrupted"):
                return True
            continue
        try:
            config = json.loads(config_text or "{}")
            if config.get("host") == socket.gethostname() and _process_alive(int(config["pid"])):
                return True  # in flight in another matrix (or another thread of this one)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # an unfinished run without owner facts: a crashed run, free to redo
    return False


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    return pid > 0


class Ledger:
    """An open ledger file. Thread-safe: appends serialize on a lock and SQLite's write lock.

    Args:
        path: SQLite file; created (with parent folders) if missing, migrated on open.
        readonly: open without creating or migrating (reports, verify, export).

    Raises:
        LedgerError: the file cannot be created, is not an SQLite database, or is not a
            harness ledger.

    Example::

        with Ledger("results/ledger.sqlite") as ledger:
            ledger.start_run(run_start)
            ledger.record_turn(turn)
            ledger.end_run(run_end)
    """

    def __init__(self, path: str | Path = DEFAULT_LEDGER_PATH, *, readonly: bool = False):
        self.path = Path(path)
        self._lock = threading.RLock()
        try:
            if readonly:
                if not self.path.is_file():
                    raise LedgerError(f"no ledger at {self.path}; run `harness run` first or pass --ledger PATH.")
                self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False, isolation_level=None)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=30000")
            tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{self.path} is not a readable SQLite ledger ({exc}); pass another --ledger path or restore the file.") from exc
        except OSError as exc:
            raise LedgerError(f"cannot open the ledger at {self.path}: {exc.strerror or exc}.") from exc
        if tables and "_migrations" not in tables:
            raise LedgerError(f"{self.path} is an SQLite file but not a harness ledger; pass another --ledger path.")
        if not readonly:
            self.migrate()
        elif not tables:
            raise LedgerError(f"{self.path} is empty, not a harness ledger; run `harness run` first.")
        present = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        missing = sorted({"runs", "turns", "run_ends", "labels"} - present)
        if missing:
            raise LedgerError(f"{self.path} is not a complete harness ledger (table {missing[0]} is missing); restore it from a copy.")
        info = {t: list(self._db.execute(f"PRAGMA table_info({t})")) for t in CHAINED_TABLES}
        self._columns = {t: [r[1] for r in rows] for t, rows in info.items()}
        self._types = {t: {r[1]: (r[2] or "").upper() for r in rows} for t, rows in info.items()}

    # -- schema ---------------------------------------------------------------------------------------
    def migrate(self) -> list[str]:
        """Apply pending migrations in order, each in one transaction with its record.

        Returns:
            Names of the migrations applied now (empty when up to date).
        """
        with self._lock:
            self._db.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
            done = {r[0] for r in self._db.execute("SELECT name FROM _migrations")}
            applied = []
            for name, fn in _MIGRATIONS:
                if name in done:
                    continue
                with self._transaction():
                    if self._db.execute("SELECT 1 FROM _migrations WHERE name=?", (name,)).fetchone():
                        continue  # another process applied it meanwhile
                    fn(self._db)
                    self._db.execute("INSERT INTO _migrations VALUES (?, ?)", (name, utc_now()))
                applied.append(name)
            return applied

    def applied_migrations(self) -> list[str]:
        """Names of applied migrations, in order applied."""
        return [r[0] for r in self._db.execute("SELECT name FROM _migrations ORDER BY rowid")]

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")

    # -- appends --------------------------------------------------------------------------------------
    def _append(self, table: str, values: dict[str, Any], guard: Callable[[sqlite3.Connection], bool] | None = None) -> bool:
        columns = [c for c in self._columns[table] if c not in ("seq", "row_hash")]
        try:
            with self._transaction() as db:
                if guard is not None and not guard(db):
                    return False  # checked and refused inside the same write transaction: no race
                last = db.execute(f"SELECT row_hash FROM {table} ORDER BY seq DESC LIMIT 1").fetchone()
                types = self._types[table]
                values = {k: _storable(v, types.get(k, "")) for k, v in values.items()}
                values["prev_hash"] = last[0] if last else GENESIS_HASH
                row = tuple(values.get(c) for c in columns)
                hashed_cols = [c for c in columns if c != "prev_hash"]
                hashed_row = tuple(values.get(c) for c in hashed_cols)
                row_hash = _row_hash(values["prev_hash"], hashed_cols, hashed_row)
                db.execute(
                    f"INSERT INTO {table} ({', '.join(columns)}, row_hash) VALUES ({', '.join('?' * (len(columns) + 1))})",
                    (*row, row_hash),
                )
        except sqlite3.Error as exc:
            raise LedgerError(f"could not append to the ledger {self.path} ({table}): {exc}.") from exc
        return True

    def start_run(self, record: RunStart, *, claim: bool = False) -> bool:
        """Append a run's start row (one transaction).

        Args:
            record: the run.
            claim: only start it if no other run holds its identity: one that finished with an
                outcome other than ``infra_error``/``interrupted``, or one still unfinished in a
                live process on this host (``config["pid"]``, ``config["host"]``). Checked in the
                same write transaction, so two matrices on one ledger never run an identity twice.

        Returns:
            True when the row was appended; False when ``claim`` found the identity taken.
        """
        return self._append("runs", _json_columns(record), guard=(lambda db: not _identity_taken(db, record.identity)) if claim else None)

    def record_turn(self, record: TurnRecord) -> None:
        """Append one turn (one transaction): a crash loses at most the turn in flight."""
        self._append("turns", _json_columns(record))

    def end_run(self, record: RunEnd) -> None:
        """Append a run's end row (one transaction). Raises LedgerError if the run already ended."""
        self._append("run_ends", _json_columns(record))

    def record_labels(self, *, run_id: str, turn: int, classifier_version: str, failure_modes: list[str],
                      recovered_calls: list[dict[str, Any]], recovered_by: str | None, details: dict[str, Any]) -> None:  # fmt: skip
        """Append a re-classification of one stored turn (``harness rescore``)."""
        self._append("labels", {
            "run_id": run_id, "turn": turn, "classifier_version": classifier_version,
            "failure_modes": canonical_json(failure_modes), "recovered_calls": canonical_json(recovered_calls),
            "recovered_by": recovered_by, "details": canonical_json(details), "labelled_at": utc_now(),
        })  # fmt: skip

    def record_attestation(self, *, run_id: str, reviewer: str, notes: str | None, frame_sha256: str) -> None:
        """Append a reviewer's attestation of one run's review frame (``harness attest``).

        Args:
            run_id: the reviewed run.
            reviewer: who reviewed it.
            notes: free text, or None.
            frame_sha256: SHA-256 (hex) of the canonical review frame the reviewer saw.
        """
        self._append("attestations", {
            "run_id": run_id, "reviewer": reviewer, "notes": notes, "frame_sha256": frame_sha256, "attested_at": utc_now(),
        })  # fmt: skip

    def record_attempt(self, *, run_id: str, turn: int, attempt: int, error_type: str, error: str,
                       status_code: int | None, retry_in_ms: float | None) -> None:  # fmt: skip
        """Append one failed model-call attempt (``turn`` is the turn it was for, from 1)."""
        self._append("attempts", {
            "run_id": run_id, "turn": turn, "attempt": attempt, "error_type": error_type, "error": error,
            "status_code": status_code, "retry_in_ms": retry_in_ms, "at": utc_now(),
        })  # fmt: skip

    # -- reads ----------------------------------------------------------------------------------------
    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Run a read-only SQL query and return rows as dicts."""
        with self._lock:
            cursor = self._db.execute(sql, params)
            names = [d[0] for d in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def runs(self) -> list[dict[str, Any]]:
        """Every run joined with its end row (end columns are None for unfinished runs), in start order."""
        return self.query(
            "SELECT r.*, e.outcome, e.turns, e.prompt_tokens, e.completion_tokens, e.breach, e.error, e.checks,"
            " e.final_answer, e.escape_attempts, e.files_written, e.ended_at"
            " FROM runs r LEFT JOIN run_ends e USING (run_id) ORDER BY r.seq"
        )

    def turns(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Turns with their newest labels (a rescore's row overrides the loop-time labels), in order."""
        where, params = ("WHERE t.run_id = ?", (run_id,)) if run_id else ("", ())
        return self.query(
            "SELECT t.*, COALESCE(l.failure_modes, t.failure_modes) AS labels,"
            " COALESCE(l.classifier_version, t.classifier_version) AS labels_version"
            f" FROM turns t LEFT JOIN {_NEWEST_LABELS} l USING (run_id, turn) {where} ORDER BY t.seq",
            params,
        )

    def finished_identities(self) -> dict[str, int]:
        """Run identities with a finished outcome that counts (not ``infra_error``/``interrupted``).

        Returns:
            identity -> number of such runs (more than 1 would mean a duplicate).
        """
        rows = self.query(
            "SELECT r.identity, COUNT(*) AS n FROM runs r JOIN run_ends e USING (run_id)"
            " WHERE e.outcome NOT IN ('infra_error', 'interrupted') GROUP BY r.identity"
        )
        return {row["identity"]: row["n"] for row in rows}

    def cached_turn(self, identity: str, request_hash: str) -> dict[str, Any] | None:
        """The newest recorded turn of a run with this identity that answered this exact request."""
        rows = self.query(
            "SELECT t.raw_reply, t.content, t.tool_calls, t.finish_reason, t.prompt_tokens, t.completion_tokens,"
            " t.latency_ms FROM turns t JOIN runs r USING (run_id) WHERE t.request_hash = ? AND r.identity = ?"
            " ORDER BY t.seq DESC LIMIT 1",
            (request_hash, identity),
        )
        return rows[0] if rows else None

    def export_rows(self) -> Iterator[dict[str, Any]]:
        """One dict per turn with :data:`EXPORT_COLUMNS` (newest labels; the run's outcome on every turn)."""
        rows = self.query(
            "SELECT t.run_id, r.scenario, r.model, r.temperature, r.tool_mode, r.parser, r.repetition, t.turn,"
            " COALESCE(l.failure_modes, t.failure_modes) AS failure_modes, t.finish_reason, t.prompt_tokens,"
            " t.completion_tokens, t.latency_ms, e.outcome"
            " FROM turns t JOIN runs r USING (run_id) LEFT JOIN run_ends e USING (run_id)"
            f" LEFT JOIN {_NEWEST_LABELS} l USING (run_id, turn) ORDER BY t.seq"
        )
        for row in rows:
            row["failure_modes"] = json.loads(row["failure_modes"])
            yield row

    # -- integrity ------------------------------------------------------------------------------------
    def verify(self) -> VerifyResult:
        """Recompute every hash chain and check the append-only triggers are in place.

        Returns:
            :class:`VerifyResult`; ``problem`` names the first bad row, e.g.
            ``"turns row seq=12 (run 3f2a..., turn 4): row_hash does not match its content"``.
        """
        with self._lock:
            triggers = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='trigger'")}
            checked = 0
            fully_migrated = {name for name, _ in _MIGRATIONS} <= set(self.applied_migrations())
            for table in CHAINED_TABLES:
                columns = self._columns[table]
                if not columns:  # an older ledger opened read-only: its migration has not run yet
                    if fully_migrated:
                        return VerifyResult(False, checked, f"the table {table} is missing")
                    continue
                hashed_cols = [c for c in columns if c not in ("seq", "prev_hash", "row_hash")]
                prev = GENESIS_HASH
                for row in self._db.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY seq"):
                    checked += 1
                    values = dict(zip(columns, row, strict=True))
                    where = f"{table} row seq={values['seq']}" + (f" (run {values['run_id']}" + (f", turn {values['turn']})" if "turn" in values else ")"))
                    if values["prev_hash"] != prev:
                        return VerifyResult(False, checked, f"{where}: prev_hash does not match the previous row (a row was removed, inserted or reordered)")
                    expected = _row_hash(prev, hashed_cols, tuple(values[c] for c in hashed_cols))
                    if values["row_hash"] != expected:
                        return VerifyResult(False, checked, f"{where}: row_hash does not match its content (the row was edited)")
                    prev = values["row_hash"]
                for action in ("update", "delete"):
                    if f"{table}_no_{action}" not in triggers:
                        return VerifyResult(False, checked, f"the append-only trigger {table}_no_{action} is missing")
            return VerifyResult(True, checked, None)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def record_fields(cls: type) -> list[str]:
    """Field names of a ledger record dataclass, in order (used by tests and docs)."""
    return [f.name for f in fields(cls)]
