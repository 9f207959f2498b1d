"""The ledger: an append-only, hash-chained SQLite file holding every run and every turn.

Design
------
* One SQLite file (default ``results/ledger.sqlite``) in WAL mode. It is the only thing in
  the harness that writes results; reports only read it.
* Append-only is enforced by the database: every table has ``BEFORE UPDATE`` and
  ``BEFORE DELETE`` triggers that abort. A run's end is a new row in ``run_ends``; new
  classifier labels are new rows in ``labels``; nothing is ever edited in place.
* Each append is its own transaction (``BEGIN IMMEDIATE``), so a crash loses at most the
  turn in flight, and concurrent writers (threads or processes) serialize on SQLite's lock. Two group commits
  put several rows in one transaction: :meth:`Ledger.group` (every append inside it) and a turn row appended with
  ``defer`` (committed with the next commit: the loop defers quick turns, :data:`harness.loop.GROUP_COMMIT_S`).
* WAL checkpoints (copying committed pages into the main file, with a sync) run in a daemon thread of a writable
  ledger, not inside an append's commit: :mod:`harness.ledger.checkpoint`. A commit checkpoints inline only when the
  WAL passes :data:`~harness.ledger.checkpoint.INLINE_BOUND_PAGES` pages; :meth:`Ledger.close` ends the thread.
* Every chained table has ``prev_hash`` and ``row_hash``: ``row_hash = sha256(prev_hash +
  canonical JSON of the row's other columns)``, with rows chained per table in ``seq`` order.
  :meth:`Ledger.verify` recomputes the chains and names the first row that does not match,
  which catches a row edited, inserted or deleted with the triggers dropped; it also checks the
  schema text for text and the migration record (:mod:`harness.ledger.integrity`). Rows cut from
  the end, or a chain recomputed after an edit, need an outside anchor: :meth:`Ledger.head`
  (:mod:`harness.ledger.anchor`).
* The schema is created and upgraded by named migrations (:mod:`harness.ledger.migrations`),
  applied in order, each in one transaction with its record in ``_migrations``; every
  writable open migrates.
* This package is the only code that knows the tables: everything else reads through the
  named methods of :class:`Ledger`, which return typed rows with JSON decoded
  (:mod:`harness.ledger.records`) or, for reports, DataFrames.

Tables (all columns of JSON type hold canonical JSON text)::

    runs       one row when a run starts: what ran, on what, with which options
    turns      one row per model call: request hash, raw reply, calls, labels, tokens, timing
    run_ends   one row when a run ends: outcome, totals, breach, checks, final answer
    labels     re-classifications appended by ``harness rescore`` (newest wins in reports)
    attempts   one row per failed model-call attempt (infrastructure errors and their retries)
    attestations  one row per human review of a run: reviewer, notes, SHA-256 of the review frame
    blobs      each large payload of turns, run_ends and labels, once, by SHA-256 (:mod:`harness.ledger.blobs`)
    templates  each chat template a run's server reported, once, by SHA-256 (:mod:`harness.ledger.queries`)
    merge_sources, merge_rows  a merged ledger's inputs and where each row came from (:mod:`harness.ledger.merge`)
"""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.errors import LedgerError, LedgerSwapped
from harness.ledger.anchor import Anchor, LedgerHead, read_head
from harness.ledger.appends import (
    AppendPlan,
    PreparedRow,
    RowNotWritten,
    append_plan,
    prepare_row,
    turn_key,
    turn_written,
    write_rows,
)
from harness.ledger.blobs import resolve_rows
from harness.ledger.checkpoint import COMMITS_PER_CHECKPOINT, INLINE_BOUND_PAGES, Checkpointer
from harness.ledger.integrity import verify_ledger
from harness.ledger.migrations import CHAINED_TABLES
from harness.ledger.opening import close_writable, connect_readonly, connect_writable, file_id, swapped
from harness.ledger.queries import (
    export_sql,
    model_runs,
    store_template,
)
from harness.ledger.records import (
    Attempt,
    Attestation,
    IdentityHolder,
    Labels,
    RunEnd,
    RunStart,
    TurnRecord,
    VerifyResult,
    decode_labels,
    identity_holders,
    json_columns,
)
from harness.ledger.report_reads import ReportReads
from harness.ledger.run_reads import RunReads
from harness.ledger.schema_ops import SchemaOps
from harness.ledger.viewer_reads import ViewerReads

__all__ = ["DEFAULT_LEDGER_PATH", "EXPORT_COLUMNS", "ClaimPolicy", "Ledger", "decode_labels"]

DEFAULT_LEDGER_PATH = Path("results") / "ledger.sqlite"
EXPORT_COLUMNS = (
    "run_id", "scenario", "model", "temperature", "seed", "tool_mode", "parser", "think", "repetition", "turn",
    "failure_modes", "finish_reason", "prompt_tokens", "completion_tokens", "latency_ms", "outcome", "stream", "ttft_ms",
    "decode_tps",
)  # fmt: skip

ClaimPolicy = Callable[[Sequence[IdentityHolder]], bool]
"""Decides whether a run may start, given the runs already recorded under its identity (True: start it)."""


class Ledger(SchemaOps, RunReads, ReportReads, ViewerReads):
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
        self._grouped = False  # inside group(): appends share its one transaction
        self._pending: list[PreparedRow] = []  # turn rows deferred to the next commit (record_turn's defer), in order
        self._ended_here: set[str] = set()  # runs end_from_turns ended for them: their late turns are refused
        self._db = connect_readonly(self.path) if readonly else connect_writable(self.path)
        self._file = None if readonly else file_id(self.path)  # the file opened: start_run checks the path still names it
        try:
            self._check_tables(readonly)
            info = {t: list(self._db.execute(f"PRAGMA table_info({t})")) for t in CHAINED_TABLES}
        except sqlite3.Error as exc:
            self._db.close()
            raise LedgerError(
                f"{self.path} is not a readable SQLite ledger ({exc}); pass another --ledger path or restore the file."
            ) from exc
        except LedgerError:
            self._db.close()
            raise
        self._checkpointer: Checkpointer | None = None
        self._until_checkpoint = -1  # appends until the checkpoint thread is woken; never 0 when read-only
        if not readonly:
            self._db.execute(f"PRAGMA wal_autocheckpoint={INLINE_BOUND_PAGES}")
            self._checkpointer = Checkpointer(Path(os.path.realpath(self.path)), self._file)
            weakref.finalize(self, self._checkpointer.release)  # a ledger dropped unclosed ends its thread too
            self._until_checkpoint = COMMITS_PER_CHECKPOINT
        self._columns = {t: [r[1] for r in rows] for t, rows in info.items()}
        self._types = {t: {r[1]: (r[2] or "").upper() for r in rows} for t, rows in info.items()}
        self._plans: dict[str, AppendPlan] = {}

    @contextmanager
    def group(self) -> Iterator[None]:
        """Commit every append made inside as one transaction (a group commit), in the calling thread.

        Nothing inside is durable until the block ends; an exception inside rolls all of it back. A writer that
        acknowledges a row only after its group ends (:mod:`harness.executors.processes`) thus loses at most the rows
        of the group in flight. Other threads' appends wait for the group to end. Nested groups join the outer one.

        Raises:
            LedgerError: the group cannot be committed.
        """
        with self._lock:
            if self._grouped:
                yield
                return
            self.flush()  # rows deferred before the group are not the group's: they never roll back with it
            try:
                self._db.execute("BEGIN IMMEDIATE")
                self._grouped = True
                try:
                    yield
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise LedgerError(f"could not commit to the ledger {self.path}: {exc}.") from exc
            finally:
                self._grouped = False

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._grouped:
                yield self._db  # the group's transaction: it commits or rolls back
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # not after a COMMIT that returned (a Ctrl-C just after it, say)
                    self._db.execute("ROLLBACK")
                raise

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The connection for a read, under the lock, with the deferred turn rows committed first: a read through the
        ledger sees every row appended to it."""
        with self._lock:
            if self._pending:
                self.flush()
            yield self._db

    # -- appends --------------------------------------------------------------------------------------
    def _append(self, table: str, values: dict[str, Any], guard: Callable[[sqlite3.Connection], bool] | None = None,
                *, defer: bool = False) -> bool:  # fmt: skip
        plan = self._plans.get(table)
        if plan is None:
            plan = self._plans[table] = append_plan(table, self._columns[table])
        row = prepare_row(plan, self._types[table], values)  # none of this needs SQLite: made before the lock
        with self._lock:
            if self._ended_here and table == "turns" and values.get("run_id") in self._ended_here:
                raise LedgerError(f"run {values['run_id']} was ended for it before its turn {values.get('turn')} came; "
                                  "the turn is not recorded (its end row says so).")  # fmt: skip
            if defer and not self._grouped and self._file is not None:  # writable and open: else it fails at once
                self._pending.append(row)
                return True
            return self._commit(table, row, guard)

    def flush(self) -> None:
        """Commit the turn rows deferred so far (:meth:`record_turn` with ``defer``), in one transaction; none: nothing.

        Raises:
            LedgerError: they cannot be committed (they stay deferred, for the next commit).
        """
        with self._lock:
            if self._pending and not self._grouped:
                self._commit("turns")

    def _commit(
        self, table: str, row: PreparedRow | None = None, guard: Callable[[sqlite3.Connection], bool] | None = None
    ) -> bool:
        """Write the deferred rows, then ``row`` unless ``guard`` (called inside the same write transaction: no race)
        refuses it, in one transaction (inside :meth:`group`, the group's); the deferred rows stay deferred on failure."""
        pending, self._pending = self._pending, []
        try:
            with self._transaction() as db:
                appended = guard is None or guard(db)
                write_rows(db, [*pending, row] if row is not None and appended else pending)
        except BaseException as exc:
            cause = exc.cause if isinstance(exc, RowNotWritten) else exc
            # a deferred row SQLite refuses for what it holds (a turn recorded twice) never commits: dropped, said once
            bad = exc.index if isinstance(exc, RowNotWritten) and isinstance(cause, sqlite3.IntegrityError) else None
            refused = isinstance(exc, (RowNotWritten, sqlite3.Error))  # rolled back; else written if an interrupt came
            if pending and (refused or not turn_written(self._db, pending[0])):  # just after the COMMIT
                self._pending[:0] = [r for i, r in enumerate(pending) if i != bad]  # empty inside a group (see group())
                if bad is not None and bad < len(pending):
                    run_id, turn = turn_key(pending[bad])
                    raise LedgerError(f"could not append to the ledger {self.path}: the turn {turn} of run {run_id}, "
                                      f"deferred, was refused ({cause}); it is dropped.") from cause  # fmt: skip
            if isinstance(cause, sqlite3.Error):
                raise LedgerError(f"could not append to the ledger {self.path} ({table}): {cause}.") from cause
            raise
        self._until_checkpoint -= 1
        if not self._until_checkpoint:
            self._until_checkpoint = COMMITS_PER_CHECKPOINT
            self._checkpointer.wake()  # type: ignore[union-attr]  # writable: it exists
        return appended

    def start_run(self, record: RunStart, *, claim: ClaimPolicy | None = None) -> bool:
        """Append a run's start row (one transaction).

        Args:
            record: the run.
            claim: when given, called inside the same write transaction with every run already
                recorded under ``record.identity``; the row is appended only if it returns True.
                So two matrices on one ledger never run an identity twice, whatever the policy
                (the runner's decides what "taken" means).

        Returns:
            True when the row was appended; False when ``claim`` refused.

        Raises:
            LedgerSwapped: the ledger's path no longer names the file this object opened (it was moved, replaced or
                deleted since: one ``stat`` per start row); nothing is written.
            LedgerError: the ledger cannot be written.
        """
        if self._file is not None and (problem := swapped(self.path, self._file)):
            raise LedgerSwapped(problem)
        guard = None
        if claim is not None:
            policy = claim

            def guard(db: sqlite3.Connection) -> bool:
                return policy(identity_holders(db, record.identity))

        return self._append("runs", json_columns(record), guard=guard)

    def record_turn(self, record: TurnRecord, *, defer: bool = False) -> None:
        """Append one turn: one transaction, or with ``defer`` a group commit.

        Args:
            record: the turn.
            defer: commit the row with the ledger's next commit (the next row of another kind, any run's, a turn
                appended without ``defer``, :meth:`flush`, a read or :meth:`close`) instead of at once. The loop defers
                the turns of model calls that took under :data:`harness.loop.GROUP_COMMIT_S`: a fast server's turns are
                committed with their run's end row at the latest, in one transaction; a crash loses them with the run,
                which resume runs again. Inside :meth:`group` the row joins the group.

        Raises:
            LedgerError: the row (or the deferred rows before it) cannot be committed: deferred rows then stay
                deferred, but for one SQLite refuses for what the ledger holds (a turn recorded twice), which is dropped
                and named; or its run was ended by :meth:`end_from_turns` (the turn came too late).
        """
        self._append("turns", json_columns(record), defer=defer)

    def end_run(self, record: RunEnd) -> None:
        """Append a run's end row (one transaction). Raises LedgerError if the run already ended."""
        self._append("run_ends", json_columns(record))

    def end_from_turns(self, run_id: str, outcome: str, error: str) -> RunEnd | None:
        """Append the end row of a run that cannot end itself (its worker is gone or stuck): the totals of the turns
        recorded for it (deferred ones included), no checks, no answer; a turn of it that comes later is refused
        (LedgerError), so the row counts exactly the run's turns. Totals and row are read and written under one hold of
        the ledger's lock.

        Returns:
            The row appended, or None when the run was never started (nothing appended).

        Raises:
            LedgerError: the ledger cannot be written, or the run already ended.
        """
        with self._lock:
            totals = self.turn_totals(run_id)
            if totals is None:
                return None
            turns, prompt, completion = totals
            end = RunEnd(run_id=run_id, outcome=outcome, turns=turns, prompt_tokens=prompt, completion_tokens=completion,
                         breach=None, error=error, checks=[], final_answer=None, escape_attempts=[], files_written=[])  # fmt: skip
            self.end_run(end)
            self._ended_here.add(run_id)
            return end

    def record_labels(self, record: Labels) -> None:
        """Append a re-classification of one stored turn (``harness rescore``)."""
        self._append("labels", json_columns(record))

    def record_attestation(self, record: Attestation) -> None:
        """Append a reviewer's attestation of one run's review frame (``harness attest``)."""
        self._append("attestations", json_columns(record))

    def record_template(self, text: str) -> str:
        """Store a chat template once (``templates``, keyed by the SHA-256 of its UTF-8 bytes); its key (hex)."""
        try:
            with self._transaction() as db:
                return store_template(db, text)
        except sqlite3.Error as exc:
            raise LedgerError(f"could not append to the ledger {self.path} (templates): {exc}.") from exc

    def model_runs(self) -> list[dict[str, Any]]:
        """What the report's model header needs, once per distinct configuration of runs (:func:`harness.ledger.queries.model_runs`)."""
        with self._reading():
            tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            return model_runs(self._db, "templates" in tables, "manifest_digest" in self._columns["runs"])

    def record_attempt(self, record: Attempt) -> None:
        """Append one failed model-call attempt."""
        self._append("attempts", json_columns(record))

    # -- reads ----------------------------------------------------------------------------------------
    def _query(self, sql: str, params: Sequence[Any] = (), payloads: str = "", refs: str = "blob_refs") -> list[dict[str, Any]]:
        """Run one read query; rows as dicts, with the large payloads of table ``payloads`` (blobs) put back. Deferred
        turn rows are committed first, so a read sees every row appended."""
        try:
            with self._reading():
                cursor = self._db.execute(sql, tuple(params))
                names = [d[0] for d in cursor.description or ()]
                rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
                if payloads:
                    resolve_rows(self._db, payloads, rows, refs)
                return rows
        except sqlite3.Error as exc:
            raise LedgerError(
                f"could not read the ledger {self.path} ({exc}); run `harness ledger verify --ledger {self.path}`."
            ) from exc

    def export_rows(self) -> Iterator[dict[str, Any]]:
        """One dict per turn with :data:`EXPORT_COLUMNS` (newest labels; the run's outcome on every turn; ``stream``
        ``on``/``off`` and ``think`` ``default``/``on``/``off`` as the reports write them)."""
        for row in self._query(export_sql(self._columns["runs"], self._columns["turns"])):
            row["failure_modes"] = decode_labels(row["failure_modes"], row)
            row["stream"] = "on" if row["stream"] else "off"
            yield row

    def row_counts(self) -> dict[str, int]:
        """Rows per chained table (tables an older ledger lacks count 0)."""
        return {t: self._query(f"SELECT COUNT(*) AS n FROM {t}")[0]["n"] if self._columns[t] else 0 for t in CHAINED_TABLES}

    def chain_head(self, table: str = "runs") -> str | None:
        """``row_hash`` of the newest row of a chained table (identifies its content), or None when empty."""
        if table not in CHAINED_TABLES:
            raise ValueError(f"{table!r} is not a chained table")
        rows = self._query(f"SELECT row_hash FROM {table} ORDER BY seq DESC LIMIT 1")
        return rows[0]["row_hash"] if rows else None

    # -- reads for reports: runs_frame, mode_reads, turn_latencies, ... (ReportReads) --------------------
    def reply_texts(self, seqs: Sequence[int]) -> dict[int, str]:
        """Reply text of the given turns (by ``turns.seq``); null content reads as ``""``."""
        if not seqs:
            return {}
        marks = ",".join("?" * len(seqs))
        refs = ", blob_refs" if self._has_blobs("turns") else ""
        rows = self._query(f"SELECT seq, content{refs} FROM turns WHERE seq IN ({marks})", [int(s) for s in seqs], "turns")
        return {int(r["seq"]): r["content"] or "" for r in rows}

    # -- integrity ------------------------------------------------------------------------------------
    def verify(self, anchor: Anchor | None = None) -> VerifyResult:
        """Check the migration record, the schema (every trigger's full SQL), every hash chain and row counter.

        Args:
            anchor: an earlier :meth:`head` read back with :func:`~harness.ledger.anchor.parse_anchor`; the
                ledger must still extend it (the same first rows of every table; more rows after are fine).

        Returns:
            :class:`~harness.ledger.records.VerifyResult`; ``problem`` names the first failure, e.g.
            ``"turns row seq=12 (run 3f2a..., turn 4): row_hash does not match its content"``.
        """
        with self._reading():
            return verify_ledger(self._db, self._columns, anchor)

    def head(self) -> LedgerHead:
        """Row counts and head hashes of every table now: ``head().anchor`` is the line to keep outside the ledger.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        try:
            with self._reading():
                return read_head(self._db)
        except sqlite3.Error as exc:
            raise LedgerError(f"could not read the ledger {self.path} ({exc}); run `harness ledger verify`.") from exc

    def close(self) -> None:
        """Commit the deferred turn rows, stop the checkpoint thread, then close the connection (idempotent; one
        ``stat`` of the path: a file moved meanwhile gets every row, :func:`~harness.ledger.opening.close_writable`).

        Raises:
            LedgerError: the deferred turn rows could not be committed (the connection is closed all the same).
        """
        try:
            self.flush()
        finally:
            self._close()

    def _close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
        with self._lock:
            self._pending = []
            opened, self._file = self._file, None
            if opened is None:
                self._db.close()
            else:  # the rows are in the file opened, also when it was moved since
                close_writable(self._db, self.path, opened)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
