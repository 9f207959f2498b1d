"""JSON scanning and narrow repair: find bracketed values, parse them, repair the defects we name.

Everything is bounded and linear (nothing recurses on input structure). :data:`FAIL` is the
"did not parse" sentinel every parser here returns instead of raising. Why our own repair and
not the ``json-repair`` package: see docs/failure-modes.md.
"""

from __future__ import annotations

import ast
import bisect
import json
import re
import warnings
from typing import Any

from harness.classifier.types import MAX_REPAIR_CHARS, jsonable

__all__ = ["FAIL", "close_cut_call", "literal", "loads", "parse_call", "pseudo_code", "repair", "scan_balanced", "string_end"]

#: Returned by :func:`loads`, :func:`literal` and :func:`repair` when the text does not parse.
FAIL = object()
_SCAN_TOKEN = re.compile(r"[{}\[\]\"']")


class _QuoteIndex:
    """Where a text's unescaped quotes and its newlines are: built once per text in one pass.

    A quote is escaped when an odd run of backslashes precedes it; that run never reaches back
    past another quote, so whether a quote closes a string does not depend on where the string
    opened, and every :func:`string_end` lookup is a binary search. Callers that retry a scan
    from each apostrophe of an unclosed string therefore stay linear overall.
    """

    def __init__(self, text: str) -> None:
        self.quotes: dict[str, list[int]] = {'"': [], "'": []}
        for match in _QUOTE_RUN.finditer(text):
            if len(match.group(1)) % 2 == 0:
                self.quotes[match.group(2)].append(match.end() - 1)
        self.newlines = [m.start() for m in _NEWLINE.finditer(text)]


_QUOTE_RUN = re.compile(r"(\\*)([\"'])")
_NEWLINE = re.compile(r"\n")


_RECENT: list[tuple[str, _QuoteIndex]] = []
"""The last few texts indexed, matched by identity: an equality-keyed cache would compare a long
text character by character on every lookup once an equal copy of it had been cached."""


def _quote_index(text: str) -> _QuoteIndex:
    for cached, index in list(_RECENT):  # a copy: other threads may classify at the same time
        if cached is text:
            return index
    index = _QuoteIndex(text)
    _RECENT[:] = [(text, index), *_RECENT[:3]]
    return index


def string_end(text: str, start: int, quote: str, allow_newline: bool = True) -> int:
    """Index of the quote closing the string opened at ``text[start]`` (a quote), or -1 (backslash-aware).

    ``O(log n)`` after a one-pass index of the text (:class:`_QuoteIndex`), so scanning a text
    that retries from every apostrophe stays linear.
    """
    index = _quote_index(text)
    positions = index.quotes[quote]
    at = bisect.bisect_right(positions, start)
    if at == len(positions):
        return -1
    k = positions[at]
    if not allow_newline:
        nl = bisect.bisect_right(index.newlines, start)
        if nl < len(index.newlines) and index.newlines[nl] < k:
            return -1
    return k


def scan_balanced(text: str, start: int, limit: int) -> tuple[int, bool, int]:
    """Scan a bracketed value starting at ``text[start]`` (``{`` or ``[`` or ``(``-free).

    Returns:
        ``(end, closed, max_depth)``: ``end`` is one past the closing bracket (or ``limit``
        when unclosed).
    """
    depth = 0
    max_depth = 0
    i = start
    while i < limit:
        m = _SCAN_TOKEN.search(text, i, limit)
        if m is None:
            return limit, False, max_depth
        ch = m.group()
        pos = m.start()
        if ch == '"' or ch == "'":
            end = string_end(text, pos, ch, allow_newline=(ch == '"'))
            if end < 0 or end >= limit:
                if ch == '"':
                    return limit, False, max_depth
                i = pos + 1  # a lone apostrophe is just a character
                continue
            i = end + 1
            continue
        if ch in "{[":
            depth += 1
            max_depth = max(max_depth, depth)
        else:
            depth -= 1
            if depth <= 0:
                return pos + 1, True, max_depth
        i = pos + 1
    return limit, False, max_depth


def loads(text: str) -> Any:
    """``json.loads(text)``, or :data:`FAIL` when it does not parse (never raises)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError, MemoryError):
        return FAIL


def literal(text: str) -> Any:
    """A dict or list written as a Python literal (JSON-ready), or :data:`FAIL`."""
    if len(text) > MAX_REPAIR_CHARS:
        return FAIL
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return FAIL
    if not isinstance(value, (dict, list)):
        return FAIL
    return jsonable(value)


_REPAIR_TOKEN = re.compile(r"\"|'|[{}\[\],:]|[A-Za-z_$][\w$]*|\s+|[^\"'{}\[\],:A-Za-z_$\s]+")
_PY_CONST = {"True": "true", "False": "false", "None": "null"}


def _sq_to_json(inner: str) -> str:
    inner = inner.replace("\\'", "'")
    inner = re.sub(r'(?<!\\)"', '\\"', inner)
    return '"' + inner.replace("\n", "\\n") + '"'


def _close(parts: list[str], open_stack: list[str]) -> Any:
    """Parse repaired ``parts`` after dropping a trailing comma and closing ``open_stack``."""
    body = "".join(parts).rstrip()
    while body.endswith(","):
        body = body[:-1].rstrip()
    if body.endswith(":"):
        body += " null"
    return loads(body + "".join(reversed(open_stack)))


def repair(text: str) -> Any:  # long: one tokenizer loop whose state (out, stack, commas) does not split well
    """Narrow JSON repair; returns the parsed value or :data:`FAIL`.

    Closes unclosed strings and brackets, drops trailing commas, quotes bare keys, turns single
    quotes into double quotes and ``True/False/None`` into JSON; a truncated tail is cut back
    to the last comma. Texts over :data:`~harness.classifier.types.MAX_REPAIR_CHARS` fail.
    """
    if len(text) > MAX_REPAIR_CHARS:
        return FAIL
    out: list[str] = []
    stack: list[str] = []
    commas: list[tuple[int, int]] = []  # (len(out) before the comma, stack depth)
    i = 0
    n = len(text)
    truncated = False
    while i < n:
        m = _REPAIR_TOKEN.match(text, i)
        if m is None:  # pragma: no cover - the token regex matches every character
            return FAIL
        tok = m.group()
        if tok == '"' or tok == "'":
            end = string_end(text, i, tok)
            if end < 0:
                body = text[i + 1 :]
                if body.endswith("\\"):
                    body = body[:-1]
                out.append(_sq_to_json(body) if tok == "'" else '"' + body.replace("\n", "\\n") + '"')
                truncated = True
                break
            body = text[i + 1 : end]
            out.append(_sq_to_json(body) if tok == "'" else '"' + body.replace("\n", "\\n") + '"')
            i = end + 1
            continue
        if tok in "{[":
            stack.append("}" if tok == "{" else "]")
            out.append(tok)
        elif tok in "}]":
            # drop a trailing comma before a closer
            while out and out[-1].isspace():
                out.pop()
            if out and out[-1] == ",":
                out.pop()
            if stack:
                out.append(stack.pop())
            if not stack:
                i = m.end()
                break
        elif tok == ",":
            commas.append((len(out), len(stack)))
            out.append(tok)
        elif tok in _PY_CONST:
            out.append(_PY_CONST[tok])
        elif tok[0].isalpha() or tok[0] in "_$":
            rest = text[m.end() : m.end() + 64].lstrip()
            if rest.startswith(":") and tok not in ("true", "false", "null"):
                out.append('"' + tok + '"')  # bare key
            else:
                out.append(tok)
        else:
            out.append(tok)
        i = m.end()
    else:
        truncated = bool(stack)

    value = _close(out, stack)
    if value is FAIL and truncated and commas:
        cut, depth = commas[-1]
        # the stack at the comma was the first `depth` openers of the current stack
        value = _close(out[:cut], stack[:depth])
    return value


_CALL_TOKEN = re.compile(r"[\"'()\[\]{},]")
_CLOSERS = {"(": ")", "[": "]", "{": "}"}


def close_cut_call(src: str) -> str | None:
    """A call expression cut at the end of the text (``list_tickets([{"id", "123", "title", "Printer``), closed the
    way :func:`repair` closes JSON: its open string, then its brackets, a trailing comma dropped, and when that does
    not parse, the cut tail cut back to the last comma. None when nothing was left open or it still does not parse
    as Python. Linear in ``src``."""
    stack: list[str] = []
    commas: list[tuple[int, int]] = []  # (position, depth)
    open_string = ""
    i = 0
    while (m := _CALL_TOKEN.search(src, i)) is not None:
        ch, pos = m.group(), m.start()
        if ch in "\"'":
            end = string_end(src, pos, ch, allow_newline=False)
            if end < 0:
                open_string = ch  # the string runs to the cut
                break
            i = end + 1
            continue
        if ch in _CLOSERS:
            stack.append(_CLOSERS[ch])
        elif ch == ",":
            commas.append((pos, len(stack)))
        elif not stack or stack.pop() != ch:
            return None  # a closer that closes nothing open: not one cut call
        i = pos + 1
    if not stack:
        return None
    closed = _closed_python(src + open_string, stack)
    if closed is None and commas:
        at, depth = commas[-1]
        closed = _closed_python(src[:at], stack[:depth])
    return closed


def _closed_python(body: str, stack: list[str]) -> str | None:
    body = body.rstrip()
    body = body[:-1].rstrip() if body.endswith(",") else body
    body = body + " None" if body.endswith(":") else body
    closed = body + "".join(reversed(stack))
    try:
        ast.parse(closed, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    return closed


_CODE_PLACEHOLDER = "\x00"
_PSEUDO_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("concatenation", re.compile(r"\x00\s*\+|\+\s*\x00|[\w\])]\s*\+\s*[\w(\[]")),
    ("function_call", re.compile(r"[A-Za-z_]\w*\s*\(")),
    ("template_literal", re.compile(r"`")),
    ("f_string", re.compile(r"(?<![\w])[fF][rR]?\x00")),
    (
        "bare_identifier",
        re.compile(r"[:\[,]\s*(?!(?:true|false|null|True|False|None)\b)[A-Za-z_][\w.]*(?=\s*[,}\]\[]|\s*$)"),
    ),
)


def _skeleton(text: str) -> str:
    """The text with string literals blanked to a placeholder (bounded, linear)."""
    text = text[:MAX_REPAIR_CHARS]
    out = []
    i = 0
    n = len(text)
    while i < n:
        q1 = text.find('"', i)
        q2 = text.find("'", i)
        cands = [q for q in (q1, q2) if q >= 0]
        if not cands:
            out.append(text[i:])
            break
        q = min(cands)
        out.append(text[i:q])
        end = string_end(text, q, text[q], allow_newline=(text[q] == '"'))
        if end < 0:
            if text[q] == "'":
                out.append("'")
                i = q + 1
                continue
            out.append(_CODE_PLACEHOLDER)
            break
        out.append(_CODE_PLACEHOLDER)
        i = end + 1
    return "".join(out)


def pseudo_code(text: str) -> list[str]:
    """Names of the code patterns (``concatenation``, ``function_call``...) outside string literals."""
    skel = _skeleton(text)
    return [name for name, pattern in _PSEUDO_PATTERNS if pattern.search(skel)]


_COLON_ARG = re.compile(r"([(,][ \t]*)([A-Za-z_]\w*)[ \t]*:(?![:=])")


def parse_call(src: str) -> ast.Call | None:
    """The call expression ``src``; named arguments written with a colon (Swift, C#: ``f(location:"Paris")``) are
    that notation's keyword arguments, read like ``location="Paris"``."""
    for attempt in (src, _COLON_ARG.sub(r"\1\2=", src) if ":" in src else None):
        try:
            node = ast.parse(attempt, mode="eval").body if attempt else None
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
        return node if isinstance(node, ast.Call) else None
    return None
