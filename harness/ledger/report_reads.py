"""The ledger's reads for reports: one row per run with its turns aggregated in SQL, failure-mode counts per run,
and the turns' latencies as one compact array (:class:`ReportReads`, a base of :class:`harness.ledger.Ledger`).

A report of 1,000,000 turns must not hold a Python object per turn, so every sum and count over turns is a
``GROUP BY`` in SQLite (:data:`RUN_TURN_TOTALS`, :data:`MODE_TEXT_COUNTS`). Order statistics (a run's median
latency, a group's p50/p95) need the values themselves: SQLite's window functions took 5-7 s on a million turns,
so :meth:`ReportReads.turn_latencies` streams the one ``latency_ms`` column, sorted within each run, into a float
array (8 bytes a turn).
Labels: a ``labels`` row for a turn (``harness rescore``) overrides the turn's own, newest first, as in
:meth:`harness.ledger.Ledger.turns`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import LedgerError
from harness.ledger.blobs import content_length_sql, resolve_rows
from harness.ledger.migrations import INDEXED_REPLY_CHARS
from harness.ledger.queries import NEWEST_LABELS, axis_sql, check_failed, runs_frame_sql
from harness.ledger.records import decode_labels

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

__all__ = [
    "MODE_TEXT_COUNTS", "MODE_TEXT_REFS", "MODE_TEXT_SHORTEST", "RELABELLED_TURNS", "RUN_EXPORT_COLUMNS", "RUN_TURN_TOTALS",
    "TURN_LATENCIES", "ReportReads", "run_details_sql",
]  # fmt: skip

RUN_EXPORT_COLUMNS = (
    "run_id", "identity", "scenario", "model", "base_url", "temperature", "seed", "tool_mode", "parser", "think", "stream", "repetition",
    "requires_tool", "started_at", "ended_at", "outcome", "turns", "prompt_tokens", "completion_tokens", "latency_ms",
    "checks_passed", "checks_failed", "failure_modes", "final_answer", "error",
)  # fmt: skip
"""The fields of ``harness export --runs``, one record per run (:meth:`ReportReads.export_run_rows`)."""

RUN_TURN_TOTALS = (
    "SELECT run_id, COUNT(*) AS turns_recorded, COUNT(latency_ms) AS latencies_recorded,"
    " TOTAL(prompt_tokens) AS turn_prompt_tokens, TOTAL(completion_tokens) AS turn_completion_tokens,"
    " TOTAL(latency_ms) AS latency_ms FROM turns GROUP BY run_id ORDER BY run_id"
)
"""Per run with turns, by ``run_id``: rows in ``turns``, those with a latency, their prompt and completion tokens
(sums; NULL counts 0) and latency (ms, sum; NULL counts 0)."""
TURN_LATENCIES = "SELECT COALESCE(latency_ms, 9e999) FROM turns ORDER BY run_id, latency_ms"
"""Every turn's latency, by ``run_id`` and, within a run, ascending (not recorded first, read as +inf: a measured
duration is finite; without ``None`` a million values fill a float array in 0.34 s of CPU instead of 0.48 s)."""
_OWN_LABELS = " AND NOT EXISTS (SELECT 1 FROM labels l WHERE l.run_id = turns.run_id AND l.turn = turns.turn)"
MODE_TEXT_COUNTS = (
    "SELECT failure_modes, run_id, COUNT(*) FROM turns WHERE failure_modes <> '[]'{own} GROUP BY failure_modes, run_id"
)
"""Per labels text (the ``failure_modes`` JSON as stored) and run: the run's turns labelled with it. ``{own}`` is empty,
or leaves out re-labelled turns when ``labels`` has rows (:data:`RELABELLED_TURNS` reads those). With
``m012_mode_index`` this reads the partial index alone; the modes are decoded once per distinct text, in Python
(this replaced a ``json_each`` over every labelled turn: on the 1,000,000-turn benchmark ledger the failure-mode
reads took 2.1 s of CPU that way, 0.85 s now)."""
MODE_TEXT_SHORTEST = (
    "SELECT failure_modes, MIN(({chars}) * 4294967296 + seq), run_id, turn FROM turns"
    " WHERE failure_modes <> '[]' AND ({chars}) >= 0{own} GROUP BY failure_modes"
)
"""Per labels text, its shortest reply that is not a blob reference: ``chars × 2^32 + seq`` (one integer, ties: the
earliest; SQLite caps a text at 2^31 - 1 characters, so it fits 64 bits while ``seq`` < 2^32), and that turn's run and
turn number (bare columns of the ``MIN`` row, SQLite's documented min/max rule). ``{chars}`` is
:data:`harness.ledger.migrations.INDEXED_REPLY_CHARS` (or the plain length before ``m005_blobs``)."""
MODE_TEXT_REFS = (
    "SELECT failure_modes, ({exact}) * 4294967296 + seq, run_id, turn FROM turns"
    " WHERE failure_modes <> '[]' AND ({chars}) < 0{own}"
)
"""The labelled turns whose reply is a blob reference, with the blob's length (``{exact}``: :func:`content_length_sql`)."""
RELABELLED_TURNS = (
    "SELECT l.failure_modes, ({exact}) * 4294967296 + t.seq, t.run_id, t.turn"
    f" FROM {NEWEST_LABELS} l JOIN turns t USING (run_id, turn)"
)
"""Each re-labelled turn (``harness rescore``): its newest labels, packed length and ``seq``, run and turn number."""


def run_details_sql(run_columns: Sequence[str], turn_columns: Sequence[str], end_columns: Sequence[str]) -> str:
    """The query behind :meth:`ReportReads.run_details` (timings NULL before ``m008_streaming``, no blobs before ``m005``)."""
    timing = (
        "LEFT JOIN (SELECT run_id, AVG(ttft_ms) AS ttft_ms, AVG(decode_tps) AS decode_tps FROM turns"
        " WHERE ttft_ms IS NOT NULL OR decode_tps IS NOT NULL GROUP BY run_id) t USING (run_id)"
        if "ttft_ms" in turn_columns
        else ""
    )
    columns = "t.ttft_ms, t.decode_tps" if timing else "NULL AS ttft_ms, NULL AS decode_tps"
    refs = "e.blob_refs" if "blob_refs" in end_columns else "NULL"
    return (
        "SELECT r.run_id, CASE WHEN json_valid(r.config) THEN json_extract(r.config, '$.requires_tool') END AS requires_tool,"
        f" e.checks, e.final_answer, e.error, e.breach, {refs} AS blob_refs, {columns}"
        f" FROM runs r LEFT JOIN run_ends e USING (run_id) {timing} ORDER BY r.seq"
    )


class ReportReads:
    """The reads reports make (pandas and numpy imported on first use); a base of :class:`harness.ledger.Ledger`."""

    path: Path
    _db: sqlite3.Connection
    _columns: dict[str, list[str]]

    if TYPE_CHECKING:  # provided by harness.ledger.Ledger

        def _reading(self) -> AbstractContextManager[sqlite3.Connection]:
            """The connection under the ledger's lock, its deferred turn rows committed first."""
            ...

    def _fail(self, exc: BaseException) -> LedgerError:
        return LedgerError(f"could not read the ledger {self.path} ({exc}); run `harness ledger verify --ledger {self.path}`.")

    def _frame(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        import pandas as pd

        try:
            with self._reading():
                return pd.read_sql(sql, self._db, params=tuple(params))
        except (sqlite3.Error, pd.errors.DatabaseError) as exc:
            raise self._fail(exc) from exc

    def runs_frame(self) -> pd.DataFrame:
        """One row per run in start order: its start columns a report needs and its end columns (NaN/None if unfinished).

        Columns: ``run_id, identity, scenario, scenario_path, scenario_hash, model, temperature, seed, tool_mode,
        parser, stream, think, repetition, started_at, ended_at, outcome, turns, prompt_tokens, completion_tokens``
        (``stream`` 0 or 1; ``think`` ``default``, ``on`` or ``off``, ``default`` for runs recorded before it existed).
        """
        return self._frame(runs_frame_sql(self._columns["runs"]))

    def turns_frame(self) -> pd.DataFrame:
        """One row per turn in ledger order, with the loop's own labels (JSON text; see :meth:`newest_labels_frame`).
        Loads every turn: for notebooks; reports use :meth:`mode_reads` and :meth:`turn_latencies`.

        Columns: ``seq, run_id, turn, failure_modes, labels_version, finish_reason, prompt_tokens,
        completion_tokens, latency_ms, content_chars`` (reply length in characters, 0 when empty).
        """
        return self._frame(
            "SELECT seq, run_id, turn, failure_modes, classifier_version AS labels_version, finish_reason, prompt_tokens,"
            f" completion_tokens, latency_ms, {content_length_sql(self._has_blobs())} AS content_chars FROM turns ORDER BY seq"
        )

    def newest_labels_frame(self) -> pd.DataFrame:
        """The newest ``harness rescore`` labels of each re-labelled turn: ``run_id, turn, failure_modes, labels_version``."""
        return self._frame(
            "SELECT run_id, turn, failure_modes, classifier_version AS labels_version FROM labels"
            " WHERE seq IN (SELECT MAX(seq) FROM labels GROUP BY run_id, turn)"
        )

    def run_mode_counts(self) -> pd.DataFrame:
        """Per run × failure mode (newest labels) shown by >= 1 of its turns: the first frame of :meth:`mode_reads`."""
        return self.mode_reads(examples=False)[0]

    def mode_reads(self, *, examples: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Per run × failure mode the turns showing it, and per mode its shortest reply (newest labels), in one snapshot:
        turns counted per labels text in SQL (:data:`MODE_TEXT_COUNTS`, :data:`MODE_TEXT_SHORTEST`,
        :data:`MODE_TEXT_REFS`), each distinct text decoded once here, re-labelled turns read one by one
        (:data:`RELABELLED_TURNS`).

        Args:
            examples: False skips the shortest replies (``examples`` then has no rows): for callers that need only the
                counts (``harness export --runs``).

        Returns:
            ``(counts, examples)``. ``counts``: ``run_id``, ``mode``, ``turns_with_mode`` (the run's turns showing it; a
            turn whose labels name a mode twice counts twice), one row per run × mode shown, in no particular order.
            ``examples``: per mode shown by any turn, sorted by mode: ``mode``, ``chars`` (length in characters of the
            shortest reply showing it), ``seq`` (its ``turns.seq``, the earliest on a tie), ``run_id`` and ``turn``.

        Raises:
            LedgerError: the file cannot be read, or a turn's labels are not JSON (the file was edited).
        """
        exact = content_length_sql(self._has_blobs())
        chars = INDEXED_REPLY_CHARS if self._has_blobs() else exact
        try:
            with self._reading():
                self._db.execute("BEGIN")
                try:
                    own = _OWN_LABELS if self._db.execute("SELECT EXISTS (SELECT 1 FROM labels)").fetchone()[0] else ""
                    counted = self._db.execute(MODE_TEXT_COUNTS.format(own=own)).fetchall()
                    shortest = self._db.execute(MODE_TEXT_SHORTEST.format(chars=chars, own=own)).fetchall() if examples else []
                    if examples and self._has_blobs():
                        shortest += self._db.execute(MODE_TEXT_REFS.format(exact=exact, chars=chars, own=own)).fetchall()
                    relabelled = (
                        self._db.execute(RELABELLED_TURNS.format(exact=exact if examples else "0")).fetchall() if own else []
                    )
                finally:
                    self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        return _mode_counts(counted, relabelled), _mode_examples([*shortest, *relabelled] if examples else [])

    def turn_latencies(self) -> tuple[pd.DataFrame, np.ndarray]:
        """Per run, its turns aggregated in SQL (:data:`RUN_TURN_TOTALS`), and every turn's latency in one float array
        (:data:`TURN_LATENCIES`, no Python object per turn), both read in one snapshot.

        Returns:
            ``(totals, latencies)``: ``totals`` has one row per run with turns, sorted by ``run_id``: ``run_id``,
            ``turns_recorded``, ``latencies_recorded`` (turns with a latency), ``turn_prompt_tokens``,
            ``turn_completion_tokens`` (tokens) and ``latency_ms`` (ms), sums; ``latencies`` (float64, ms) holds the
            first run's ``turns_recorded`` latencies, NaN (not recorded) first and then ascending, then the next run's.

        Raises:
            LedgerError: the file cannot be read.
        """
        import numpy as np
        import pandas as pd

        try:
            with self._reading():
                self._db.execute("BEGIN")
                try:
                    cursor = self._db.execute(RUN_TURN_TOTALS)
                    totals = pd.DataFrame.from_records(cursor.fetchall(), columns=[d[0] for d in cursor.description])
                    count = int(totals["turns_recorded"].sum()) if len(totals) else 0
                    values = np.fromiter(chain.from_iterable(self._db.execute(TURN_LATENCIES)), np.float64, count)
                    values[values == np.inf] = np.nan  # not recorded (NULL, read as +inf: see TURN_LATENCIES)
                finally:
                    self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        if totals.empty:
            totals = pd.DataFrame({c: pd.Series([], dtype=object if c == "run_id" else "int64") for c in
                                   ("run_id", "turns_recorded", "latencies_recorded", "turn_prompt_tokens",
                                    "turn_completion_tokens", "latency_ms")})  # fmt: skip
        return totals, values

    def export_run_rows(self) -> list[dict[str, Any]]:
        """One dict per run in start order with :data:`RUN_EXPORT_COLUMNS` (``harness export --runs``).

        ``outcome`` is ``unfinished`` for a run with no end row; ``turns``, ``prompt_tokens``, ``completion_tokens``
        (tokens) and ``latency_ms`` (ms, summed over turns) are the end row's totals, or the turns recorded so far;
        never null. ``checks_passed`` and ``checks_failed`` are lists of check names, ``failure_modes`` the sorted list
        of modes any turn showed (newest labels); ``requires_tool`` is True, False, or None (recorded before the flag);
        ``stream`` ``on``/``off``; ``think`` ``default``/``on``/``off``; ``base_url`` is the server's URL (for a spec
        listing replicas, the replica the run started on: :mod:`harness.replicas`); ``base_url``, ``final_answer``,
        ``error`` and ``ended_at`` may be None.

        Raises:
            LedgerError: the file cannot be read.
        """
        import json

        modes: dict[str, list[str]] = {}
        for run_id, mode in self.run_mode_counts()[["run_id", "mode"]].itertuples(index=False):
            modes.setdefault(run_id, []).append(str(mode))
        details = {d["run_id"]: d for d in self.run_details()}
        sql = (
            "SELECT r.run_id, r.identity, r.scenario, r.model, r.base_url, r.temperature, r.seed, r.tool_mode, r.parser,"
            f" {axis_sql(self._columns['runs'])}, r.repetition, r.started_at, e.ended_at, COALESCE(e.outcome, 'unfinished') AS outcome,"
            " COALESCE(e.turns, t.n, 0) AS turns, COALESCE(e.prompt_tokens, t.p, 0) AS prompt_tokens,"
            " COALESCE(e.completion_tokens, t.c, 0) AS completion_tokens, COALESCE(t.l, 0) AS latency_ms"
            " FROM runs r LEFT JOIN run_ends e USING (run_id) LEFT JOIN (SELECT run_id, COUNT(*) AS n, TOTAL(prompt_tokens) AS p,"
            " TOTAL(completion_tokens) AS c, TOTAL(latency_ms) AS l FROM turns GROUP BY run_id) t USING (run_id) ORDER BY r.seq"
        )  # fmt: skip
        try:
            with self._reading():
                cursor = self._db.execute(sql)
                names = [d[0] for d in cursor.description]
                rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        out = []
        for row in rows:
            d = details.get(row["run_id"], {})
            try:
                checks = json.loads(d["checks"]) if d.get("checks") else []
            except (ValueError, RecursionError):  # an edited ledger: not JSON, or nested past Python's stack
                checks = []
            checks = [c for c in checks if isinstance(c, dict)] if isinstance(checks, list) else []
            flag = d.get("requires_tool")
            row.update(
                stream="on" if row["stream"] else "off", requires_tool=None if flag is None else bool(flag),
                turns=int(row["turns"]), prompt_tokens=int(row["prompt_tokens"]), completion_tokens=int(row["completion_tokens"]),
                latency_ms=float(row["latency_ms"]), checks_passed=[str(c.get("check")) for c in checks if not check_failed(c)],
                checks_failed=[str(c.get("check")) for c in checks if check_failed(c)],
                failure_modes=sorted(modes.get(row["run_id"], [])), final_answer=d.get("final_answer"), error=d.get("error"),
            )  # fmt: skip
            out.append({c: row[c] for c in RUN_EXPORT_COLUMNS})
        return out

    def reply_calls(self, seqs: Sequence[int]) -> dict[int, Any]:
        """The structured tool calls of the given turns (by ``turns.seq``), JSON decoded as the server sent them
        (a list, usually), for turns that have any; others are left out."""
        import json

        if not seqs:
            return {}
        refs = ", blob_refs" if self._has_blobs() else ""
        sql = f"SELECT seq, tool_calls{refs} FROM turns WHERE seq IN ({','.join('?' * len(seqs))}) AND tool_calls IS NOT NULL"
        try:
            with self._reading():
                cursor = self._db.execute(sql, [int(s) for s in seqs])
                names = [d[0] for d in cursor.description]
                rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
                if self._has_blobs():
                    resolve_rows(self._db, "turns", rows)
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        out = {}
        for row in rows:
            try:
                calls = json.loads(row["tool_calls"])
            except (TypeError, ValueError):
                continue
            if calls:
                out[int(row["seq"])] = calls
        return out

    def run_details(self) -> list[dict[str, Any]]:
        """Per run in start order, what the summary frame leaves out (large payloads put back from blobs).

        Returns:
            One dict per run: ``run_id``; ``requires_tool`` (the scenario's flag as recorded in ``config``: 1, 0, or None
            for runs recorded before it was); ``checks`` (the done checks' JSON text ``[{"check", "passed", "detail"}]``,
            None while unfinished); ``final_answer``, ``error`` (text or None); ``breach`` (JSON text or None);
            ``ttft_ms`` (mean time to first token over the run's turns, ms) and ``decode_tps`` (mean decode rate,
            completion tokens per second), None where no turn recorded one.

        Raises:
            LedgerError: the file cannot be read.
        """
        columns = self.run_detail_columns()
        return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]

    def run_detail_columns(self) -> dict[str, list[Any]]:
        """:meth:`run_details` as columns: each key of its dicts -> one value per run, in start order (no dict per run:
        on 125,000 runs that was 0.3 s of a report's CPU).

        Raises:
            LedgerError: the file cannot be read, or a stored payload is missing.
        """
        sql = run_details_sql(self._columns["runs"], self._columns["turns"], self._columns["run_ends"])
        try:
            with self._reading():
                cursor = self._db.execute(sql)
                names = [d[0] for d in cursor.description]
                rows = cursor.fetchall()
                refs = names.index("blob_refs")
                listed = [i for i, row in enumerate(rows) if row[refs] is not None]
                if listed:  # only rows with payloads in blobs become dicts, to be put back
                    resolved = [dict(zip(names, rows[i], strict=True)) for i in listed]
                    resolve_rows(self._db, "run_ends", resolved, "blob_refs")
                    for i, row in zip(listed, resolved, strict=True):
                        rows[i] = tuple(row[name] for name in names)
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        columns = {name: list(values) for name, values in zip(names, zip(*rows, strict=True), strict=True)} if rows else {}
        columns = {name: columns.get(name, []) for name in names if name != "blob_refs"}
        return columns

    def _has_blobs(self, table: str = "turns") -> bool:
        return "blob_refs" in self._columns[table]  # since m005


def _mode_counts(counted: list[tuple[str, str, int]], relabelled: list[tuple[str, int, str, int]]) -> pd.DataFrame:
    """Per run × mode, the turns showing it: ``counted`` (labels text, run, turns) and one turn per ``relabelled`` row."""
    import numpy as np
    import pandas as pd

    texts = np.array([r[0] for r in counted] + [r[0] for r in relabelled], dtype=object)
    runs = np.array([r[1] for r in counted] + [r[2] for r in relabelled], dtype=object)
    turns = np.array([r[2] for r in counted] + [1] * len(relabelled), dtype=np.int64)
    text_codes, text_uniques = pd.factorize(texts)
    decoded = [decode_labels(str(text), {}) for text in text_uniques]
    names = sorted({m for modes in decoded for m in modes})
    number = {m: i for i, m in enumerate(names)}
    rows: list[np.ndarray] = []
    modes: list[np.ndarray] = []
    for code, labels in enumerate(decoded):
        where = np.flatnonzero(text_codes == code) if labels else np.empty(0, dtype=np.int64)
        for mode in labels:  # a text naming a mode twice counts its turns twice, as json_each did
            rows.append(where)
            modes.append(np.full(len(where), number[mode], dtype=np.int64))
    if not rows:
        return pd.DataFrame({"run_id": pd.Series([], dtype=object), "mode": pd.Series([], dtype=object),
                             "turns_with_mode": pd.Series([], dtype="int64")})  # fmt: skip
    at = np.concatenate(rows)
    run_codes, run_uniques = pd.factorize(runs[at])
    keys, inverse = np.unique(run_codes.astype(np.int64) * len(names) + np.concatenate(modes), return_inverse=True)
    return pd.DataFrame({
        "run_id": np.asarray(run_uniques, dtype=object)[keys // len(names)],
        "mode": np.array(names, dtype=object)[keys % len(names)],
        "turns_with_mode": np.bincount(inverse, weights=turns[at]).astype("int64"),
    })  # fmt: skip


def _mode_examples(candidates: list[tuple[str, int, str, int]]) -> pd.DataFrame:
    """Per mode, the smallest packed ``chars × 2^32 + seq`` of the candidates (labels text, packed, run, turn)."""
    import pandas as pd

    per_text: dict[str, tuple[int, str, int]] = {}
    for text, packed, run_id, turn in candidates:
        if text not in per_text or packed < per_text[text][0]:
            per_text[text] = (int(packed), run_id, int(turn))
    best: dict[str, tuple[int, str, int]] = {}
    for text, found in per_text.items():
        for mode in decode_labels(text, {}):
            if mode not in best or found[0] < best[mode][0]:
                best[mode] = found
    modes = sorted(best)
    return pd.DataFrame({
        "mode": pd.Series(modes, dtype=object), "chars": pd.Series([best[m][0] >> 32 for m in modes], dtype="int64"),
        "seq": pd.Series([best[m][0] & 4294967295 for m in modes], dtype="int64"),
        "run_id": pd.Series([best[m][1] for m in modes], dtype=object), "turn": pd.Series([best[m][2] for m in modes], dtype="int64"),
    })  # fmt: skip
