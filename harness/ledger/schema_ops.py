"""The ledger's schema operations: refusing a file that is not a (complete) ledger, migrating it, reading its migration
record; a base of :class:`harness.ledger.Ledger` (its connection, lock and transactions)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from harness.errors import LedgerError
from harness.ledger import migrations
from harness.ledger.integrity import migrations_edited
from harness.ledger.opening import not_writable

__all__ = ["SchemaOps"]

_T = TypeVar("_T")


class SchemaOps:
    """Schema checks and migrations of an open ledger; a base of :class:`harness.ledger.Ledger`."""

    path: Path
    _db: sqlite3.Connection
    _lock: threading.RLock

    if TYPE_CHECKING:  # provided by harness.ledger.Ledger

        def _transaction(self) -> AbstractContextManager[sqlite3.Connection]: ...

    def _check_tables(self, readonly: bool) -> None:
        """Refuse a file that is not a (complete) harness ledger; migrate a writable one."""
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and "_migrations" not in tables:
            if {"runs", "turns"} <= tables:
                raise LedgerError(f"{self.path} has no _migrations table (it was dropped); restore the ledger from a copy.")
            raise LedgerError(f"{self.path} is an SQLite file but not a harness ledger; pass another --ledger path.")
        if not readonly:
            self.migrate()
        elif not tables:
            raise LedgerError(f"{self.path} is empty, not a harness ledger; run `harness run` first.")
        present = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        missing = sorted({"runs", "turns", "run_ends", "labels"} - present)
        if missing and not migrations.applied(self._db):
            raise LedgerError(
                f"{self.path} is a ledger whose creation was cut short (no migration finished); "
                "`harness ledger migrate` or `harness run` finishes it."
            )
        if missing:
            raise LedgerError(
                f"{self.path} is not a complete harness ledger (table {missing[0]} is missing); restore it from a copy."
            )

    # -- schema ---------------------------------------------------------------------------------------
    def migrate(self) -> list[str]:
        """Apply pending migrations in order, each in one transaction with its record.

        Returns:
            Names of the migrations applied now (empty when up to date).

        Raises:
            LedgerError: SQLite refused a migration (a read-only file or folder, a full disk, a
                file locked by another program); nothing of that migration is applied. Or the last rows of
                ``_migrations`` were deleted while their changes stay (:func:`~harness.ledger.integrity.migrations_edited`,
                asked only when migrations are pending): nothing is applied, the file is left as it is.
        """
        with self._lock:
            try:
                unknown = migrations.unknown(self._db)
                if unknown:  # its schema may hold what this harness would write wrong or break: never write to it
                    raise LedgerError(newer_ledger_sentence(self.path, unknown))
                if migrations.pending(self._db) and (edit := self._edited_migrations()):
                    raise LedgerError(
                        f"the ledger {self.path} is not brought up to date: {edit}; restore it from a copy "
                        f"(`harness ledger verify --ledger {self.path}` names the same edit)."
                    )
                return migrations.apply(self._db, self._transaction)
            except sqlite3.Error as exc:
                raise LedgerError(
                    not_writable(self.path)
                    or f"cannot bring the ledger at {self.path} up to date ({exc}); close any other program using it and "
                    "retry, else restore it from a copy (verify, export and report read it as it is)."
                ) from exc

    def applied_migrations(self) -> list[str]:
        """Names of applied migrations, in order applied."""
        with self._lock:
            return self._read_migrations(migrations.applied)

    def pending_migrations(self) -> list[str]:
        """Names of migrations not applied yet (a read-only open of an older ledger has some; ``harness ledger migrate`` applies them)."""
        with self._lock:
            return self._read_migrations(migrations.pending)

    def _edited_migrations(self) -> str | None:
        """:func:`~harness.ledger.integrity.migrations_edited` on one snapshot: ``_migrations`` and the schema read in
        one read transaction, so a migration another process commits meanwhile (with its row) is seen whole or not at
        all (read apart, the older row count beside the newer schema looked like an edit: reviewer, 1 open in 160)."""
        self._db.execute("BEGIN")
        try:
            return migrations_edited(self._db, len(migrations.applied(self._db)))
        finally:
            self._db.execute("COMMIT")  # a read: nothing to write

    def newer_schema(self, to: str = "write to it") -> str | None:
        """Why this harness never writes to the ledger, in one sentence, or None: it lists a migration this harness does
        not know (a newer harness wrote it). ``harness run --dry-run`` says it as the real run would; ``to``: what the
        upgrade would let this command do (``harness ledger merge``: "merge it").

        Raises:
            LedgerError: ``_migrations`` cannot be read.
        """
        with self._lock:
            unknown = self._read_migrations(migrations.unknown)
        return newer_ledger_sentence(self.path, unknown, to) if unknown else None

    def _read_migrations(self, read: Callable[[sqlite3.Connection], _T]) -> _T:
        try:
            return read(self._db)
        except sqlite3.Error as exc:
            raise LedgerError(
                f"the _migrations table of {self.path} cannot be read ({exc}); it was edited: restore the ledger from a copy."
            ) from exc


def newer_ledger_sentence(path: Path, migration: str, to: str = "write to it") -> str:
    """Why the ledger at ``path``, listing ``migration`` that this harness does not know, is never written to (``to``:
    what upgrading harness lets the command do with it)."""
    return (f"the ledger {path} lists the migration {migration!r}, which this harness does not know: a newer harness wrote "
            f"it (or the table was edited); upgrade harness to {to}.")  # fmt: skip
