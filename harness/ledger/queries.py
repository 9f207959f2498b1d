"""SQL text shared by the ledger's reads, and the chat templates stored once each (``templates``, since
``m009_templates``).

A run records the facts its model's server reported (:mod:`harness.backends.server_facts`) in its ``config`` under
``provenance``, with the template replaced by ``template_sha256``; the template text is stored once in ``templates``
under the SHA-256 of its UTF-8 bytes, however many runs use it.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from harness.vocab import SCORED_OUTCOMES

__all__ = [
    "CHECK_FAILED_SQL", "CHECK_NAME_SQL", "NEWEST_LABELS", "RUN_END_COLUMNS", "SCORED_SQL", "axis_sql", "check_failed",
    "check_items_sql", "export_sql", "model_runs", "runs_frame_sql", "store_template", "template_key",
]  # fmt: skip

SCORED_SQL = "(" + ", ".join(f"'{o}'" for o in SCORED_OUTCOMES) + ")"
RUN_END_COLUMNS = (
    "e.seq AS end_seq, e.outcome, e.turns AS end_turns, e.prompt_tokens AS end_prompt_tokens,"
    " e.completion_tokens AS end_completion_tokens, e.breach, e.error, e.checks, e.final_answer, e.escape_attempts,"
    " e.files_written, e.ended_at"
)
"""The end columns of a run read together with its start row (renamed where ``runs`` has a column of the same name)."""
NEWEST_LABELS = (
    "(SELECT run_id, turn, failure_modes, classifier_version FROM labels"
    " WHERE seq IN (SELECT MAX(seq) FROM labels GROUP BY run_id, turn))"
)
"""The newest re-classification of each turn (a subquery to LEFT JOIN on run_id, turn)."""


def check_failed(check: Mapping[str, Any]) -> bool:
    """Whether a stored done check (an item of ``run_ends.checks``, :attr:`harness.ledger.RunEnd.checks`) failed: the
    one rule of every reader (viewer, report, review, console), with :data:`CHECK_FAILED_SQL` its twin in SQL.

    A check passed only when its ``passed`` is JSON ``true`` (what :class:`harness.checks.CheckResult` writes); any
    other value (``false``, ``0``, ``1``, ``"false"``, ``"true"``, ``null``, missing: a ledger edited by hand) counts as
    failed, so no verdict the harness did not write shows as a pass. An item that is not an object is no check.
    """
    return check.get("passed") is not True


CHECK_FAILED_SQL = "(CASE WHEN j.type = 'object' THEN json_type(j.value, '$.passed') IS NOT 'true' ELSE 0 END)"
""":func:`check_failed` of the item ``j`` of :func:`check_items_sql` (1 or 0; an item that is not an object: 0)."""

CHECK_NAME_SQL = "COALESCE('' || CASE WHEN j.type = 'object' THEN json_extract(j.value, '$.check') END, 'None')"
"""The ``check`` name of the item ``j`` of :func:`check_items_sql` as plain text (``None`` when it has none, as Python's
``str`` of a missing name reads; ``'' ||`` drops the JSON subtype, so a name that is an object is its JSON text in the
cells as in the filter), so the run list's cells, filter and choices compare the same strings. ``json_extract`` is
never asked of an item that is not an object (on a string item it fails the whole query as malformed JSON)."""


def check_items_sql(column: str) -> str:
    """``json_each`` over the done checks in the SQL expression ``column`` (``run_ends.checks``), as ``j``: the items of
    a JSON array; none for NULL, text that is not JSON or JSON that is not an array (an edited ledger)."""
    return f"json_each(CASE WHEN json_valid({column}) AND json_type({column}) = 'array' THEN {column} ELSE '[]' END) j"


def axis_sql(run_columns: Sequence[str]) -> str:
    """``stream`` (0 or 1) and ``think`` (``default``/``on``/``off``) of a run as SQL columns over ``runs r``: runs
    recorded before ``m008_streaming`` read 0 (not streamed), before ``m007_wire_settings`` (or with NULL) ``default``."""
    stream = "COALESCE(r.stream, 0)" if "stream" in run_columns else "0"
    think = "COALESCE(r.think, 'default')" if "think" in run_columns else "'default'"
    return f"{stream} AS stream, {think} AS think"


def runs_frame_sql(run_columns: Sequence[str]) -> str:
    """The query behind :meth:`harness.ledger.Ledger.runs_frame`."""
    return (
        "SELECT r.run_id, r.identity, r.scenario, r.scenario_path, r.scenario_hash, r.model, r.temperature, r.seed,"
        f" r.tool_mode, r.parser, {axis_sql(run_columns)}, r.repetition, r.started_at, e.ended_at, e.outcome, e.turns,"
        " e.prompt_tokens, e.completion_tokens FROM runs r LEFT JOIN run_ends e USING (run_id) ORDER BY r.seq"
    )


def export_sql(run_columns: Sequence[str], turn_columns: Sequence[str]) -> str:
    """The query behind :meth:`harness.ledger.Ledger.export_rows` (timings NULL before ``m008_streaming``)."""
    timing = "t.ttft_ms, t.decode_tps" if "ttft_ms" in turn_columns else "NULL AS ttft_ms, NULL AS decode_tps"
    return (
        "SELECT t.run_id, r.scenario, r.model, r.temperature, r.seed, r.tool_mode, r.parser, r.repetition, t.turn,"
        " COALESCE(l.failure_modes, t.failure_modes) AS failure_modes, t.finish_reason, t.prompt_tokens,"
        f" t.completion_tokens, t.latency_ms, e.outcome, {axis_sql(run_columns)}, {timing}"
        " FROM turns t JOIN runs r USING (run_id) LEFT JOIN run_ends e USING (run_id)"
        f" LEFT JOIN {NEWEST_LABELS} l USING (run_id, turn) ORDER BY t.seq"
    )


def template_key(text: str) -> str:
    """The key a template is stored under: the SHA-256 (hex) of its UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def store_template(db: sqlite3.Connection, text: str) -> str:
    """Insert a template unless it is stored already (inside the caller's transaction).

    Returns:
        Its key (:func:`template_key`).
    """
    # a lone surrogate (a server's "\\ud800") cannot be SQLite text: stored as its escape, and keyed as stored
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    key = template_key(text)
    db.execute("INSERT OR IGNORE INTO templates (sha256, text) VALUES (?, ?)", (key, text))
    return key


def model_runs(db: sqlite3.Connection, has_templates: bool, has_manifest: bool) -> list[dict[str, Any]]:
    """One dict per distinct (model, backend, digest, tool mode, config) of the runs, in the order of each one's newest
    run (what a report's model header reads from every run, decoded once per configuration): ``model``, ``backend``, ``digest`` (the model file's, else
    Ollama's manifest digest, else None), ``tool_mode``, ``provenance`` (the ``config`` entry, ``{}`` when the run
    recorded none), ``warmup_ms`` (ms or None) and ``template`` (the stored text, or None)."""
    manifest = "r.manifest_digest" if has_manifest else "NULL"
    rows = db.execute(
        f"SELECT r.model, r.backend, COALESCE(r.model_digest, {manifest}) AS digest, r.tool_mode, r.config FROM runs r"
        " GROUP BY 1, 2, 3, 4, 5 ORDER BY MAX(r.seq)"
    ).fetchall()
    texts: dict[str, str] = {}
    if has_templates:
        texts = {k: t for k, t in db.execute("SELECT sha256, text FROM templates")}
    out = []
    for model, backend, digest, tool_mode, config_text in rows:
        try:
            config = json.loads(config_text) if config_text else {}
        except ValueError:
            config = {}
        config = config if isinstance(config, dict) else {}
        found = config.get("provenance")
        facts: dict[str, Any] = found if isinstance(found, dict) else {}
        warmup = config.get("warmup_ms")
        out.append({"model": model, "backend": backend, "digest": digest, "tool_mode": tool_mode, "provenance": facts,
                    "warmup_ms": float(warmup) if isinstance(warmup, (int, float)) and not isinstance(warmup, bool) else None,
                    "template": texts.get(str(facts.get("template_sha256")))})  # fmt: skip
    return out
