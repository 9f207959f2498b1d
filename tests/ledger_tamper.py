"""Tampering with a real ledger file the way a forger would, with plain sqlite3 (tests and benchmarks).

Each function edits the file behind the harness's back and covers its tracks as far as the kind of
forgery allows: the append-only triggers are put back text for text, and the careful variants also
fix SQLite's row counter or recompute the hash chain with the harness's own hash function.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from harness.ledger.chain import GENESIS_HASH, row_hash

CHAINED = ("runs", "turns", "run_ends", "labels", "attestations", "attempts")


def tamper(path: Path, *statements: str, fix_counters: bool = False) -> None:
    """Run ``statements`` with every trigger dropped, then put each trigger back exactly as it was."""
    db = sqlite3.connect(path)
    triggers = db.execute("SELECT name, tbl_name, sql FROM sqlite_master WHERE type='trigger'").fetchall()
    for name, _, _ in triggers:
        db.execute(f"DROP TRIGGER {name}")
    for sql in statements:
        db.execute(sql)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    for _, table, sql in triggers:
        if table in tables:  # a dropped table's triggers went with it
            db.execute(sql)
    if fix_counters:
        for table in CHAINED:
            db.execute(f"UPDATE sqlite_sequence SET seq = (SELECT COALESCE(MAX(seq), 0) FROM {table}) WHERE name = ?", (table,))
    db.commit()
    db.close()


def rechain(path: Path, table: str) -> None:
    """Recompute ``prev_hash``/``row_hash`` of every row of ``table`` (a fresh ledger: every row hashes every column)."""
    db = sqlite3.connect(path)
    names = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
    hashed = [c for c in names if c not in ("seq", "prev_hash", "row_hash")]
    rows = db.execute(f"SELECT {', '.join(names)} FROM {table} ORDER BY seq").fetchall()
    db.close()
    prev = GENESIS_HASH
    updates = []
    for row in rows:
        values = dict(zip(names, row, strict=True))
        digest = row_hash(prev, hashed, tuple(values[c] for c in hashed))
        updates.append(f"UPDATE {table} SET prev_hash = '{prev}', row_hash = '{digest}' WHERE seq = {values['seq']}")
        prev = digest
    tamper(path, *updates)


def last_run_id(path: Path) -> str:
    """The run id of the newest ``runs`` row."""
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT run_id FROM runs ORDER BY seq DESC LIMIT 1").fetchone()[0]
    finally:
        db.close()


def delete_last_run(path: Path, *, fix_counters: bool) -> None:
    """Remove every row of the newest run from every table."""
    run_id = last_run_id(path)
    tamper(path, *(f"DELETE FROM {t} WHERE run_id = '{run_id}'" for t in CHAINED), fix_counters=fix_counters)
