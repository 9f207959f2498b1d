"""Declarative done checks: a scenario's machine-checked definition of done.

A check is a TOML table ``{type = "...", ...params}`` in a scenario's ``[[checks]]`` list.
It is validated when the scenario loads (:func:`validate_check`) and evaluated after the
loop ends (:func:`evaluate_checks`) on the sandbox folder, the fixture names, the files
the tools wrote, the final answer and the number of tool calls made.

Check types (see :data:`CHECK_TYPES` for the parameters of each):

==============================  ===============================================================
``file_exists``                 ``path`` exists in the sandbox
``file_contains``               ``path`` contains ``text`` (case-insensitive) or matches ``regex``
``file_names_all_fixtures``     ``path`` names every fixture file (by file name)
``file_names_only_existing``    every file-like name in ``path`` (``stem.ext``, ext of 2-5
                                letters/digits) is a file that exists in the sandbox
``file_states_count``           ``path`` states the number ``count`` (digits or English word)
``file_json_field``             ``path`` is valid JSON and the dotted ``field`` equals ``value``
``file_csv_value``              ``path`` is valid CSV with a header; the row whose ``key_column``
                                is ``key`` has ``column`` equal to ``value`` (case-insensitive)
``file_csv_values_in``          ``path`` is valid CSV with a header; every row's ``column`` is one
                                of ``allowed`` (case-insensitive); with ``rows``, there are exactly
                                that many data rows
``final_answer_contains``       the last reply's content contains ``text`` (case-insensitive)
``final_answer_not_contains``   ... does not contain ``text``
``only_files_written``          every file written by a tool is in ``allowed``
``no_tool_called``              the model made no tool call at all
``tool_call_count``             the loop executed at least ``min`` (and, with ``max``, at most
                                ``max``) tool calls, counting failed ones
==============================  ===============================================================

CSV header names are compared with surrounding spaces stripped (``ticket, category`` has the
columns ``ticket`` and ``category``).

A check that would decide nothing is refused at load time: an empty ``text`` or ``regex`` (in
every answer and every file), ``tool_call_count`` with ``min = 0`` and no ``max``, and a
``file_json_field`` ``value`` of ``nan`` or ``inf`` (equal to nothing, and no JSON).
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import regex

from harness.sandbox import NO_SUCH_FILE, is_within, open_plain, read_at_most, real_path_within

__all__ = ["CHECK_TYPES", "CheckContext", "CheckResult", "evaluate_checks", "validate_check"]

#: check type -> (required parameters with their expected Python types, optional parameters)
CHECK_TYPES: dict[str, tuple[dict[str, type | tuple[type, ...]], dict[str, type | tuple[type, ...]]]] = {
    "file_exists": ({"path": str}, {}),
    "file_contains": ({"path": str}, {"text": str, "regex": str}),
    "file_names_all_fixtures": ({"path": str}, {}),
    "file_names_only_existing": ({"path": str}, {}),
    "file_states_count": ({"path": str, "count": int}, {}),
    "file_json_field": ({"path": str, "field": str, "value": (str, int, float, bool)}, {}),
    "file_csv_value": ({"path": str, "key_column": str, "key": str, "column": str, "value": str}, {}),
    "file_csv_values_in": ({"path": str, "column": str, "allowed": list}, {"rows": int}),
    "final_answer_contains": ({"text": str}, {}),
    "final_answer_not_contains": ({"text": str}, {}),
    "only_files_written": ({"allowed": list}, {}),
    "no_tool_called": ({}, {}),
    "tool_call_count": ({"min": int}, {"max": int}),
}

_NUMBER_WORDS = "zero one two three four five six seven eight nine ten eleven twelve".split()
_FILE_NAME = re.compile(r"(?<![\w/.-])([\w-]+(?:\.[\w-]+)*\.[A-Za-z0-9]{2,5})(?![\w])")
_MAX_CHECK_BYTES = 1024 * 1024
REGEX_TIMEOUT_S = 2.0
"""Time budget of one ``file_contains`` regex search; a pathological pattern fails the check."""


@dataclass(frozen=True)
class CheckContext:
    """Everything a check may look at, gathered after the loop ends.

    Attributes:
        sandbox: the run's sandbox folder.
        fixtures: sandbox-relative fixture file names seeded before the run.
        files_written: sandbox-relative paths written by tools.
        final_answer: content of the last reply (or None).
        tool_calls_made: number of tool calls the loop executed.
        real: ``sandbox`` is a real path already (as :attr:`harness.tools.Sandbox.root` is), so it is not resolved again.
    """

    sandbox: Path
    fixtures: Sequence[str]
    files_written: Sequence[str]
    final_answer: str | None
    tool_calls_made: int
    real: bool = False


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict: ``check`` is the type, ``passed`` the verdict, ``detail`` why."""

    check: str
    passed: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict ``{"check", "passed", "detail"}``."""
        return {"check": self.check, "passed": self.passed, "detail": self.detail}


def validate_check(check: Any) -> str | None:
    """Return a description of what is wrong with one check table, or None when it is valid."""
    if not isinstance(check, Mapping):
        return "each [[checks]] entry must be a table"
    kind = check.get("type")
    if kind not in CHECK_TYPES:
        return f"check type {kind!r} is unknown; expected one of {', '.join(CHECK_TYPES)}"
    required, optional = CHECK_TYPES[kind]
    for key in required:
        if key not in check:
            return f"check {kind!r} needs the parameter {key!r}"
    for key, value in check.items():
        if key == "type":
            continue
        known = required.get(key) or optional.get(key)
        if known is None:
            return f"check {kind!r} has an unknown parameter {key!r}"
        expected = known
        typed = isinstance(value, expected) and not (expected is int and isinstance(value, bool))  # not narrowed on purpose
        if not typed:
            names = " or ".join(t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,)))
            return f"check {kind!r} parameter {key!r} must be of type {names}, got {type(value).__name__}"
        if expected is list and (not value or not all(isinstance(v, str) and v for v in value)):
            return f"check {kind!r} parameter {key!r} must be a non-empty list of non-empty strings"
        if expected is int and value < 0:
            return f"check {kind!r} parameter {key!r} must be 0 or more"
        if isinstance(value, float) and not math.isfinite(value):  # nan equals nothing; inf is no JSON a file can hold
            return f"check {kind!r} parameter {key!r} must be a finite number, got {value}"
    if "\x00" in str(check.get("path", "")):
        return f"check {kind!r} parameter 'path' must not contain NUL bytes"
    if kind == "file_contains" and ("text" in check) == ("regex" in check):
        return "check 'file_contains' needs exactly one of 'text' or 'regex'"
    if kind == "tool_call_count" and check.get("max", check["min"]) < check["min"]:
        return "check 'tool_call_count' parameter 'max' must be at least 'min'"
    vacuous = _vacuous(kind, check)
    if vacuous is not None:
        return vacuous
    if "regex" in check:
        try:
            regex.compile(check["regex"])
        except regex.error as exc:
            return f"check 'file_contains' regex does not compile: {exc}"
    return None


_EMPTY_TEXT = {
    "final_answer_contains": "every answer contains the empty text, so the check always passes",
    "final_answer_not_contains": "every answer contains the empty text, so the check never passes",
    "file_contains": "every file contains the empty text, so the check passes whenever the file exists",
}


def _vacuous(kind: str, check: Mapping[str, Any]) -> str | None:
    """Why a parameter makes a valid-looking check decide nothing (it always passes or never does), or None."""
    if check.get("text") == "" and kind in _EMPTY_TEXT:
        return f"check {kind!r} parameter 'text' is empty: {_EMPTY_TEXT[kind]}; give the text to look for"
    if check.get("regex") == "":
        return "check 'file_contains' parameter 'regex' is empty: it matches every file; give the pattern to look for"
    if kind == "tool_call_count" and check["min"] == 0 and "max" not in check:
        return "check 'tool_call_count' with 'min' = 0 and no 'max' always passes; raise 'min' or add 'max'"
    return None


def _read(ctx: CheckContext, rel: str) -> str | None:
    """The text of the sandbox file ``rel`` (``ctx.sandbox`` is a real path), or None when it is no regular file inside it.

    One open and one ``fstat`` (not a ``stat`` and then an open): non-blocking, so a FIFO is not waited on, and
    without following a symlink (the path is resolved: a symlink there now was swapped in since).
    """
    try:
        fd = _open_inside(ctx.sandbox, rel)
    except OSError as exc:
        if exc.errno in NO_SUCH_FILE:
            return None
        raise
    if fd is None:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        text = read_at_most(fd, _MAX_CHECK_BYTES, info.st_size)
        return text.decode("utf-8-sig", errors="replace")  # -sig: drop a byte-order mark
    finally:
        os.close(fd)


_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_inside(root: Path, rel: str) -> int | None:
    """Open the sandbox file ``rel`` for reading; None when it resolves to the root or outside it. A plain name
    (:func:`~harness.sandbox.plain_name`) is opened at once, unless a symlink is there (``ELOOP``): that and any other
    path are resolved first (:func:`~harness.tools.real_path_within`). Raises OSError as ``os.open`` does."""
    fd = open_plain(root, rel, _READ)
    if fd is not None:
        return fd
    path = real_path_within(root, rel)
    if path == root or not is_within(root, path):
        return None
    return os.open(path, _READ)


def _existing_names(root: Path) -> set[str]:
    """Lowercased names of every file below ``root``, as ``{p.name.lower() for p in root.rglob("*") if p.is_file()}``
    gives them (symlinked folders are not entered; a symlink to a file counts), walked with ``os.scandir``."""
    names: set[str] = set()
    folders = [str(root)]
    while folders:
        try:
            with os.scandir(folders.pop()) as entries:
                listed = list(entries)
        except PermissionError:  # as rglob: an unreadable folder is skipped
            continue
        for entry in listed:
            try:
                if entry.is_file():
                    names.add(entry.name.lower())
                elif entry.is_dir() and not entry.is_symlink():
                    folders.append(entry.path)
            except OSError:
                continue
    return names


_RUN_CHECKS = frozenset(
    {"final_answer_contains", "final_answer_not_contains", "only_files_written", "no_tool_called", "tool_call_count"}
)


def _evaluate(check: Mapping[str, Any], ctx: CheckContext, reads: dict[str, str | None]) -> tuple[bool, str]:
    kind = check["type"]
    if kind in _RUN_CHECKS:
        return _evaluate_run(check, ctx)
    if check["path"] not in reads:  # several checks on one file read it once (the run is over: it cannot change)
        reads[check["path"]] = _read(ctx, check["path"])
    text = reads[check["path"]]
    if text is None:
        return False, f"{check['path']} does not exist"
    if kind in ("file_csv_value", "file_csv_values_in"):
        return _evaluate_csv(check, text)
    return _evaluate_file(check, ctx, text)


def _evaluate_run(check: Mapping[str, Any], ctx: CheckContext) -> tuple[bool, str]:
    """Checks on the run itself: the final answer, the files written, the tool calls made."""
    kind = check["type"]
    if kind == "final_answer_contains":
        ok = check["text"].lower() in (ctx.final_answer or "").lower()
        return ok, f"final answer {'contains' if ok else 'does not contain'} {check['text']!r}"
    if kind == "final_answer_not_contains":
        ok = check["text"].lower() not in (ctx.final_answer or "").lower()
        return ok, f"final answer {'does not contain' if ok else 'contains'} {check['text']!r}"
    if kind == "only_files_written":
        extra = [p for p in ctx.files_written if p not in check["allowed"]]
        return not extra, f"unexpected files written: {extra}" if extra else "only allowed files were written"
    if kind == "no_tool_called":
        n = ctx.tool_calls_made
        return n == 0, f"{n} tool call(s) made"
    if kind == "tool_call_count":
        n, low, high = ctx.tool_calls_made, check["min"], check.get("max")
        ok = n >= low and (high is None or n <= high)
        wanted = f"at least {low}" if high is None else f"between {low} and {high}"
        return ok, f"{n} tool call(s) made" + ("" if ok else f", expected {wanted}")
    raise AssertionError(f"unvalidated check type {kind!r}")  # validate_check runs at load time


@functools.lru_cache(maxsize=1024)
def _name(path: str) -> str:
    """``Path(path).name``, remembered (the same fixture names come back on every run)."""
    return Path(path).name


def _evaluate_file(check: Mapping[str, Any], ctx: CheckContext, text: str) -> tuple[bool, str]:
    """Checks on one file's text (already read, at most 1 MiB)."""
    kind = check["type"]
    if kind == "file_exists":
        return True, f"{check['path']} exists"
    if kind == "file_contains":
        if "regex" in check:
            try:  # the third-party regex module: same syntax as re, but with a time budget
                ok = regex.search(check["regex"], text, timeout=REGEX_TIMEOUT_S) is not None
            except TimeoutError:
                return False, f"could not evaluate: /{check['regex']}/ ran longer than {REGEX_TIMEOUT_S:g} s"
            return ok, f"{'matches' if ok else 'does not match'} /{check['regex']}/"
        ok = check["text"].lower() in text.lower()
        return ok, f"{'contains' if ok else 'does not contain'} {check['text']!r}"
    if kind == "file_names_all_fixtures":
        lowered = text.lower()
        missing = [f for f in ctx.fixtures if _name(f).lower() not in lowered]
        return not missing, f"does not name {missing}" if missing else "names every fixture file"
    if kind == "file_names_only_existing":
        existing = _existing_names(ctx.sandbox)
        named = {m.group(1) for m in _FILE_NAME.finditer(text)}
        invented = sorted(n for n in named if _name(n).lower() not in existing)
        return not invented, f"names files that do not exist: {invented}" if invented else "names only existing files"
    if kind == "file_states_count":
        count = check["count"]
        patterns = [rf"(?<![\d.]){count}(?![\d]|\.\d)"]
        if 0 <= count < len(_NUMBER_WORDS):
            patterns.append(rf"\b{_NUMBER_WORDS[count]}\b")
        ok = any(re.search(p, text, re.IGNORECASE) for p in patterns)
        return ok, f"{'states' if ok else 'does not state'} the count {count}"
    if kind == "file_json_field":
        try:
            value: Any = json.loads(text)
        except ValueError:
            return False, f"{check['path']} is not valid JSON"
        for part in check["field"].split("."):
            if not isinstance(value, dict) or part not in value:
                return False, f"field {check['field']!r} is missing"
            value = value[part]
        expected = check["value"]
        # JSON types are compared strictly: true is not 1 and 0 is not false (Python's == says they are)
        ok = value == expected and isinstance(value, bool) == isinstance(expected, bool)
        return ok, f"{check['field']} = {json.dumps(value)[:80]}" + ("" if ok else f", expected {json.dumps(check['value'])}")
    raise AssertionError(f"unvalidated check type {check['type']!r}")  # validate_check runs at load time


def _evaluate_csv(check: Mapping[str, Any], text: str) -> tuple[bool, str]:
    """``file_csv_value`` and ``file_csv_values_in`` on a file's text."""
    try:
        header, rows = _csv_rows(text)
    except csv.Error:
        return False, f"{check['path']} is not valid CSV"
    if check["type"] == "file_csv_values_in":
        column, allowed = check["column"], [a.lower() for a in check["allowed"]]
        if column not in header:
            return False, f"no column {column!r} in the header {header}"
        short = [i for i, row in enumerate(rows, start=2) if column not in row]
        if short:
            return False, f"line {short[0]} has no {column} value (fewer cells than the header)"
        bad = [str(row.get(column) or "").strip() for row in rows]
        bad = [v for v in bad if v.lower() not in allowed]
        if bad:
            return False, f"{column} values not in {check['allowed']}: {bad}"
        if "rows" in check and len(rows) != check["rows"]:
            return False, f"{len(rows)} data row(s), expected {check['rows']}"
        return True, f"{len(rows)} data row(s), every {column} in {check['allowed']}"
    for row in rows:  # file_csv_value
        if str(row.get(check["key_column"], "")).strip().lower() == check["key"].lower():
            got = str(row.get(check["column"]) or "").strip()
            ok = got.lower() == check["value"].lower()
            return ok, f"{check['key']}: {check['column']} = {got!r}" + ("" if ok else f", expected {check['value']!r}")
    return False, f"no row with {check['key_column']} = {check['key']!r}"


def _csv_rows(text: str) -> tuple[list[str], list[dict[str, str]]]:
    """Parse CSV with a header row: the stripped header names and one dict per non-empty data row.

    A row shorter than the header lacks the missing keys (it is not padded).

    Raises:
        csv.Error: the text is not CSV the ``csv`` module can read.
    """
    reader = csv.reader(io.StringIO(text))
    header = [name.strip() for name in next(reader, [])]
    return header, [dict(zip(header, row, strict=False)) for row in reader if any(cell.strip() for cell in row)]


def evaluate_checks(checks: Sequence[Mapping[str, Any]], ctx: CheckContext) -> list[CheckResult]:
    """Evaluate validated checks in order; never raises on anything the model produced.

    Args:
        checks: check tables, already accepted by :func:`validate_check`.
        ctx: the sandbox and run facts.

    Returns:
        One :class:`CheckResult` per check, in order.
    """
    results = []
    if not ctx.real:
        ctx = replace(ctx, sandbox=Path(os.path.realpath(ctx.sandbox)), real=True)
    reads: dict[str, str | None] = {}
    for check in checks:
        try:
            passed, detail = _evaluate(check, ctx, reads)
        except (OSError, ValueError, RecursionError) as exc:  # ValueError covers UnicodeError
            passed, detail = False, f"could not evaluate: {exc}"
        results.append(CheckResult(check["type"], passed, detail))
    return results
