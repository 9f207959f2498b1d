"""The ledger's records: what is written (one dataclass per table) and what is read back.

Write records (:class:`RunStart`, :class:`TurnRecord`, :class:`RunEnd`) are frozen dataclasses
whose fields are the table's columns; dict and list fields (and ``raw_reply``, ``tool_calls``,
``breach``) are stored as :func:`~harness.canonical.canonical_json` text. Read rows
(:class:`RunRow`, :class:`TurnRow`, :class:`Attempt`, :class:`Attestation`) give the same
records back with every JSON column decoded, so no reader parses JSON itself.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from harness.canonical import canonical_json
from harness.errors import LedgerError
from harness.ledger.packing import pack_chunks, unpack_chunks

__all__ = [
    "Attempt",
    "Attestation",
    "IdentityHolder",
    "Labels",
    "RunEnd",
    "RunRow",
    "RunStart",
    "TurnRecord",
    "TurnRow",
    "VerifyResult",
    "decode_labels",
    "identity_holders",
    "iso_utc",
    "record_fields",
    "run_row",
    "turn_row",
    "utc_now",
]


def utc_now() -> str:
    """Current UTC time as ISO 8601 text with offset and milliseconds, e.g. ``2026-11-30T02:30:00.123+00:00``: the text
    of ``datetime.now(UTC).isoformat(timespec="milliseconds")``, up to the second formatted once a second (:func:`iso_utc`)."""
    return iso_utc(time.time_ns())


_SECOND: list[tuple[int, str]] = [(-1, "")]  # the last second formatted and its text, replaced as one pair


def iso_utc(ns: int) -> str:
    """The ISO 8601 text of ``ns`` nanoseconds after the Unix epoch (UTC, milliseconds truncated as ``datetime`` truncates
    them: ``datetime.now`` floors the clock to microseconds, ``isoformat`` those to milliseconds)."""
    second, text = _SECOND[0]
    if ns // 1_000_000_000 != second:
        second = ns // 1_000_000_000
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _SECOND[0] = (second, text)
    return f"{text}.{ns // 1_000_000 % 1000:03d}+00:00"


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
    """SHA-256 of the model file (the embedded model's GGUF, a replay cassette), if known."""
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
    """Everything else worth keeping (system prompt, tool schemas, parallelism, ``request_settings``: what each
    request sent beyond messages and sampling options, e.g. ``{"truncate": false}`` or ``{"parallel_tool_calls": true}``)."""
    think: str | None = None
    """Thinking setting: ``default``, ``on`` or ``off`` (None: recorded before the setting existed, i.e. ``default``)."""
    manifest_digest: str | None = None
    """Ollama's manifest digest (``sha256:<hex>`` from ``/api/tags``: names the model as served, not a hash of the weights)."""
    """Everything else worth keeping (system prompt hash, tool names, parallelism)."""
    stream: bool = False
    """Whether replies were requested streamed (``--stream on``); runs recorded before ``m008_streaming`` read False."""


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
    reasoning: str | None = None
    """Reasoning text the server returned beside the content (``reasoning_content``, ``thinking``), or null."""
    server_rejection: dict[str, Any] | None = None
    """Set when the server's tool-call parser refused the reply: ``{"server", "status", "error"}``; ``raw_reply`` is then
    the error body and ``content`` the model's text it quoted (or null)."""
    timings: dict[str, Any] | None = None
    """The server's own timing of the reply (llama.cpp's ``timings``: ``prompt_n``, ``prompt_ms``, ``prompt_per_second``,
    ``predicted_n``, ``predicted_ms``, ``predicted_per_second``, ...), or null when it reports none."""
    stream_chunks: list[dict[str, Any]] | None = None
    """A streamed reply's raw chunks, ``[{"t": ms since the request, "data": text}]`` (stored zlib-compressed), from
    which the reply is re-derived (:func:`harness.backends.streaming.assemble`); null when not streamed."""
    ttft_ms: float | None = None
    """Time to first token, ms: measured on a stream, else from the server's own timings; null when unknown."""
    decode_tps: float | None = None
    """Decode rate, completion tokens per second (measured on a stream, else the server's timings); null when unknown."""


@dataclass(frozen=True)
class RunEnd:
    """How a run ended (table ``run_ends``); written once, after the last turn."""

    run_id: str
    """The run that ended."""
    outcome: str
    """One of :data:`harness.vocab.OUTCOMES`: ``pass``, ``task_failed``, ``turn_limit``, ``token_limit``, ``infra_error``,
    ``interrupted`` or ``context_overflow``."""
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
    """Done-check results: ``[{"check", "passed", "detail"}]`` (failed: :func:`harness.ledger.queries.check_failed`)."""
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
        anchored_input: for a merged ledger checked against an anchor taken on one of its inputs, that input's file
            name (:func:`harness.ledger.merge_origin.anchored_input`); None otherwise.
    """

    ok: bool
    rows: int
    problem: str | None = None
    anchored_input: str | None = None


@dataclass(frozen=True)
class RunRow:
    """A run as read back: its start row, its end row (None while unfinished) and its ledger position.

    Example::

        for run in ledger.runs():
            print(run.run_id, run.start.model, run.outcome or "unfinished")
    """

    seq: int
    """Position of the start row in the ``runs`` table (start order)."""
    start: RunStart
    """The start row, JSON decoded (``config`` is a dict)."""
    end: RunEnd | None
    """The end row, JSON decoded, or None when the run has not ended."""

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.start.run_id

    @property
    def outcome(self) -> str | None:
        """The run's outcome, or None when it has not ended."""
        return None if self.end is None else self.end.outcome


@dataclass(frozen=True)
class TurnRow:
    """A turn as read back, with its newest labels (a ``harness rescore`` row overrides the loop's)."""

    seq: int
    """Position in the ``turns`` table (ledger order)."""
    record: TurnRecord
    """The turn as the loop wrote it, JSON decoded."""
    labels: list[str]
    """The newest failure-mode labels: the latest ``labels`` row's, else ``record.failure_modes``."""
    labels_version: str
    """The classifier version that produced ``labels``."""


@dataclass(frozen=True)
class Attempt:
    """One failed model-call attempt (table ``attempts``), written by the loop and read back as is."""

    run_id: str
    """The run the call was for."""
    turn: int
    """The turn the call was for, from 1."""
    attempt: int
    """Attempt number, from 1."""
    error_type: str
    """The error's class name, e.g. ``BackendTimeout``."""
    error: str
    """The error message."""
    status_code: int | None
    """HTTP status, when there was one."""
    retry_in_ms: float | None
    """Backoff before the next attempt, ms; None when this was the last attempt."""
    at: str = field(default_factory=utc_now)
    """UTC time of the failure."""


@dataclass(frozen=True)
class Attestation:
    """One reviewer's attestation of a run's review frame (table ``attestations``)."""

    run_id: str
    """The reviewed run."""
    reviewer: str
    """Who reviewed it."""
    notes: str | None
    """Free text, or None."""
    frame_sha256: str
    """SHA-256 (hex) of the canonical review frame the reviewer saw."""
    attested_at: str = field(default_factory=utc_now)
    """UTC time of the attestation."""


@dataclass(frozen=True)
class Labels:
    """A re-classification of one stored turn (table ``labels``, appended by ``harness rescore``)."""

    run_id: str
    """The run of the turn."""
    turn: int
    """The turn, from 1."""
    classifier_version: str
    """The classifier version that produced these labels."""
    failure_modes: list[str]
    """Canonical failure-mode names."""
    recovered_calls: list[dict[str, Any]]
    """Calls recovered from the content (``ToolCall.to_dict()`` each)."""
    recovered_by: str | None
    """The recovery step that produced them, if any."""
    details: dict[str, Any]
    """Classifier evidence."""
    labelled_at: str = field(default_factory=utc_now)
    """UTC time of the re-classification."""


@dataclass(frozen=True)
class IdentityHolder:
    """A run already recorded under some identity, as a claim policy sees it (see ``Ledger.start_run``)."""

    run_id: str
    """The recorded run."""
    config: dict[str, Any]
    """Its ``config`` (owner facts such as ``pid``, ``host`` and the ``lock`` file it held), or ``{}`` when unreadable."""
    outcome: str | None
    """Its outcome, or None while it has no end row."""


def identity_holders(db: sqlite3.Connection, identity: str) -> list[IdentityHolder]:
    """Every run recorded under ``identity``, oldest first, as a claim policy sees it (``config`` ``{}`` when unreadable)."""
    rows = db.execute(
        "SELECT r.run_id, r.config, e.outcome FROM runs r LEFT JOIN run_ends e USING (run_id) WHERE r.identity = ? ORDER BY r.seq",
        (identity,),
    ).fetchall()
    holders = []
    for run_id, config_text, outcome in rows:
        try:
            config = json.loads(config_text or "{}")
        except ValueError:
            config = {}
        holders.append(IdentityHolder(run_id, config if isinstance(config, dict) else {}, outcome))
    return holders


def record_fields(cls: type) -> list[str]:
    """Field names of a ledger record dataclass, in order (used by tests and docs)."""
    return [f.name for f in fields(cls)]


_JSON_FIELDS = frozenset(
    {"config", "raw_reply", "tool_calls", "recovered_calls", "executed_calls", "failure_modes", "details", "breach", "checks"}
    | {"escape_attempts", "files_written", "server_rejection", "timings"}
)
"""Columns holding canonical JSON text, decoded on read."""

_EMPTY_LIST_FIELDS = frozenset(
    {"recovered_calls", "executed_calls", "failure_modes", "checks", "escape_attempts", "files_written"}
)
_EMPTY_DICT_FIELDS = frozenset({"config", "details"})

_R = TypeVar("_R")


_ALWAYS_JSON = frozenset({"raw_reply", "tool_calls", "breach", "stream_chunks"})
"""Fields never stored as they are, whatever their value (a string too): JSON text, or packed ``stream_chunks``."""
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
"""A record dataclass -> its field names in order (``dataclasses.fields`` walks the class on every call)."""


def json_columns(record: Any) -> dict[str, Any]:
    """A write record's fields as column values: JSON text for dicts and lists (shallow), integers for booleans."""
    names = _FIELD_NAMES.get(type(record))
    if names is None:
        names = _FIELD_NAMES.setdefault(type(record), tuple(f.name for f in fields(record)))
    out: dict[str, Any] = {}
    for key in names:  # shallow: no recursion into model data
        value = getattr(record, key)
        if value is None or (type(value) is str and key not in _ALWAYS_JSON):
            out[key] = value
        elif key == "stream_chunks":
            out[key] = pack_chunks(value)
        elif not value and (type(value) is list or type(value) is dict):
            out[key] = "[]" if type(value) is list else "{}"  # canonical_json of the most common payloads (no calls, no labels)
        elif isinstance(value, (dict, list)) or key in _ALWAYS_JSON:
            out[key] = canonical_json(value)
        elif isinstance(value, bool):
            out[key] = int(value)
        else:
            out[key] = value
    return out


_LIST_ITEM_TYPES: dict[str, type] = {
    "recovered_calls": dict, "executed_calls": dict, "checks": dict,
    "failure_modes": str, "escape_attempts": str, "files_written": str,
}  # fmt: skip


def _well_shaped(name: str, value: Any) -> bool:
    """Whether a decoded JSON column has the shape its record field promises."""
    if name in _LIST_ITEM_TYPES:
        return isinstance(value, list) and all(isinstance(item, _LIST_ITEM_TYPES[name]) for item in value)
    if name in _EMPTY_DICT_FIELDS:
        return isinstance(value, dict)
    if name in ("breach", "server_rejection", "timings"):
        return value is None or isinstance(value, dict)
    return True


def decode(cls: type[_R], row: Mapping[str, Any], *, table: str) -> _R:
    """Build a record from a row's columns, decoding JSON columns and ``git_dirty``.

    Args:
        cls: a record dataclass whose fields are columns of ``row``.
        row: column name -> stored value.
        table: the table read, named in the error.

    Raises:
        LedgerError: a JSON column holds text that is not JSON, or JSON of the wrong shape (a
            list where an object belongs, a call that is not an object): the file was edited.
    """
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        value = row.get(f.name)
        if isinstance(value, bytes):  # the ledger writes no binary cell here: the file was edited
            where = f"run {row.get('run_id')}" + (f", turn {row['turn']}" if "turn" in row else "")
            raise LedgerError(f"the {table} row of {where} has a binary {f.name}; run `harness ledger verify`.")
        if f.name in _JSON_FIELDS and isinstance(value, str):
            try:
                value = json.loads(value)
            except (ValueError, RecursionError) as exc:  # nested past Python's stack: an edited row too
                where = f"run {row.get('run_id')}" + (f", turn {row['turn']}" if "turn" in row else "")
                raise LedgerError(
                    f"the {table} row of {where} has a {f.name} that is not JSON; run `harness ledger verify`."
                ) from exc
            if not _well_shaped(f.name, value):
                where = f"run {row.get('run_id')}" + (f", turn {row['turn']}" if "turn" in row else "")
                raise LedgerError(f"the {table} row of {where} has a {f.name} of the wrong shape; run `harness ledger verify`.")
        elif value is None and f.name in _EMPTY_LIST_FIELDS | _EMPTY_DICT_FIELDS:
            value = [] if f.name in _EMPTY_LIST_FIELDS else {}  # a NULL column of an older or edited row
        elif f.name == "git_dirty" and value is not None:
            value = bool(value)
        elif f.name == "stream":
            value = bool(value)  # NULL: recorded before the column, when nothing was streamed
        elif f.name == "stream_chunks" and value is not None:
            value = unpack_chunks(value, row, table)
        values[f.name] = value
    return cls(**values)


def run_row(row: dict[str, Any]) -> RunRow:
    """A ``runs`` row joined with its ``run_ends`` columns (``end_seq`` None: unfinished) as a :class:`RunRow`."""
    start = decode(RunStart, row, table="runs")
    if row["end_seq"] is None:
        return RunRow(row["seq"], start, None)
    end_values = {**row, "turns": row["end_turns"], "prompt_tokens": row["end_prompt_tokens"],
                  "completion_tokens": row["end_completion_tokens"]}  # fmt: skip
    return RunRow(row["seq"], start, decode(RunEnd, end_values, table="run_ends"))


def turn_row(row: dict[str, Any]) -> TurnRow:
    """A ``turns`` row with ``newest_labels`` and ``labels_version`` as a :class:`TurnRow`."""
    record = decode(TurnRecord, row, table="turns")
    labels = decode_labels(row["newest_labels"], row)
    return TurnRow(row["seq"], record, labels, row["labels_version"])


def decode_labels(text: str, row: dict[str, Any]) -> list[str]:
    """A ``failure_modes`` JSON column as a list of names.

    Raises:
        LedgerError: the text is not JSON (the file was edited).
    """
    try:
        labels = json.loads(text)
    except (TypeError, ValueError) as exc:
        where = f" of run {row.get('run_id')}, turn {row.get('turn')}" if row else ""
        raise LedgerError(f"the failure modes{where} are not JSON; run `harness ledger verify`.") from exc
    return [m for m in labels if isinstance(m, str)] if isinstance(labels, list) else []
