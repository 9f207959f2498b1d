"""Whether this code records the same rows as a baseline checkout's, column by column, for the same replayed runs.

Run: ``python benchmarks/rows_same.py --baseline DIR`` (e.g. ``git worktree add /tmp/base HEAD``). Two child processes,
one importing the baseline's ``harness`` and one this code's, each record the same runs into a ledger of their own:
the peer task of ``benchmarks/peer_inspect.py`` (3 turns a run) and the matrix benchmark's 4-turn runs
(``benchmarks/matrix_scale.py``), replayed, jobs 1. Then every row of every chained table is compared in ``seq`` order,
every stored value as SQLite holds it (the text the hash chain covers), except what differs between any two runs:
run ids (also where a value quotes one), the ledger's file name (matrix_scale.py's is timed), timestamps, latencies, the process id and
host in ``config``, the git revision, and ``prev_hash``/``row_hash`` (they chain the run ids). Prints
``runs: 20/20 identical`` and the like per table, then the first differences; exits 1 when any row differs.

It reads the two ledgers' tables directly (read-only): the point is the stored bytes, not what the ledger's queries
make of them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SKIPPED = frozenset({"prev_hash", "row_hash", "run_id", "started_at", "ended_at", "latency_ms", "ttft_ms", "decode_tps",
                     "git_sha", "git_dirty", "recorded_at", "created_at"})  # fmt: skip
"""Columns that differ between any two recordings of the same runs (or chain what does)."""
_VOLATILE_CONFIG = ("pid", "host", "lock_byte")  # lock_byte: the byte of the run locks a run takes (random)


def _child(folder: Path, runs: int) -> None:
    """Record the runs with the code on ``sys.path`` (set by the parent) into ledgers under ``folder``."""
    code = os.environ["HARNESS_BENCH_CODE"]
    sys.path.insert(0, code)
    import harness.loop  # noqa: F401 - the code measured, imported before the benchmarks put theirs on the path

    sys.path.insert(1, str(REPO / "benchmarks"))
    import matrix_scale
    import peer_inspect

    peer_inspect.REPO = Path(code)
    (folder / "peer").mkdir()
    peer_inspect._harness_runs(runs, folder / "peer")
    (folder / "matrix").mkdir()
    matrix_scale.overhead(folder / "matrix", runs, quiet=True)
    assert sys.modules["harness"].__file__.startswith(code), sys.modules["harness"].__file__


def _rows(ledger: Path, folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Table -> its rows in ``seq`` order, the volatile columns dropped and run ids / the folder replaced by names."""
    db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' AND sql LIKE '%row_hash%'")]
    run_ids = [r[0] for r in db.execute("SELECT run_id FROM runs ORDER BY seq")]
    out: dict[str, list[dict[str, Any]]] = {}
    for table in sorted(tables):
        cursor = db.execute(f"SELECT * FROM {table} ORDER BY seq")
        names = [d[0] for d in cursor.description]
        rows = []
        for values in cursor:
            row = {n: v for n, v in zip(names, values, strict=True) if n not in SKIPPED}
            if "run_id" in names:
                row["run"] = run_ids.index(values[names.index("run_id")])
            for key, value in row.items():
                if isinstance(value, str):
                    for index, run_id in enumerate(run_ids):
                        value = value.replace(run_id, f"<run {index}>")
                    row[key] = value.replace(str(folder), "<folder>").replace(ledger.name, "<ledger>")
            if table == "runs" and row.get("config"):
                config = json.loads(row["config"])
                for key in _VOLATILE_CONFIG:
                    config.pop(key, None)
                row["config"] = config
            rows.append(row)
        out[table] = rows
    db.close()
    return out


def _record(code: Path, runs: int, folder: Path) -> dict[str, dict[str, list[dict[str, Any]]]]:
    env = {**os.environ, "HARNESS_BENCH_CODE": str(code)}
    subprocess.run([sys.executable, __file__, "--child", str(folder), "--runs", str(runs)], check=True, env=env)
    ledgers = {"peer": folder / "peer" / "ledger.sqlite", "matrix": next((folder / "matrix").glob("overhead*.sqlite"))}
    return {name: _rows(path, folder) for name, path in ledgers.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a checkout of the code to compare with")
    parser.add_argument("--runs", type=int, default=20, help="runs per task (default 20)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child, args.runs)
        return
    if args.baseline is None:
        parser.error("--baseline DIR is required")
    sides = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "work"  # one path for both: the replay cassette's path is in each run's identity
        for side, code in (("baseline", args.baseline.resolve()), ("this", REPO)):
            folder.mkdir()
            sides[side] = _record(code, args.runs, folder)
            shutil.rmtree(folder)
    differences = []
    for task, tables in sides["this"].items():
        for table, rows in tables.items():
            base = sides["baseline"][task].get(table, [])
            same = sum(a == b for a, b in zip(rows, base, strict=False))
            print(f"{task} {table}: {same}/{max(len(rows), len(base))} identical")
            for a, b in zip(rows, base, strict=False):
                if a != b:
                    differences.append(
                        f"{task} {table}: "
                        + ", ".join(f"{k}: {b.get(k)!r} -> {a.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
                    )
            if len(rows) != len(base):
                differences.append(f"{task} {table}: {len(base)} rows -> {len(rows)}")
    for line in differences[:10]:
        print(line[:2000])
    sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
