"""Call shapes: which parsed values and which pieces of text are tool-call attempts.

Recognizes call objects (standard ``{"name", "arguments"}`` and the nonstandard shapes listed
in docs/failure-modes.md), broken but call-like objects, pythonic ``name(arg=...)`` calls and
XML-style parameter calls, and returns each attempt in a text as a :class:`Cand` with its span.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.classifier.jsonscan import FAIL, literal, loads, pseudo_code, repair, scan_balanced, string_end
from harness.classifier.types import MAX_CANDIDATES, MAX_DEPTH, MAX_PYTHONIC_CHARS, MAX_REPAIR_CHARS, jsonable, short
from harness.classifier.validate import schema_properties, schema_types

__all__ = ["Cand", "RawCall", "payload_candidates", "remove_spans", "xml_spans"]

_ARG_KEYS = ("arguments", "parameters", "args", "params", "input", "tool_input", "action_input")
_NAME_KEYS = ("tool", "tool_name", "toolName", "function_name", "function", "action", "name")
_CALL_KEY_RE = re.compile(r"""["']?\b(?:name|tool|tool_name|toolName|function|function_name|action)\b["']?\s*:""")
_ARGS_KEY_RE = re.compile(r"""["']?\b(?:arguments|parameters|params|args|input|tool_input|action_input)\b["']?\s*:""")


@dataclass
class RawCall:
    """A call as written: its name, its arguments before normalization, and whether its keys are nonstandard."""

    name: str
    raw_args: Any
    nonstandard: bool


def _is_tool_definition(obj: Mapping[str, Any]) -> bool:
    """An OpenAI tool definition: ``{"type": "function", "function": {"name", "description"?, "parameters": <JSON Schema>}}``
    or the bare ``{"name", "description", "parameters": <schema>}``, whose parameters declare a schema."""
    fn = obj.get("function")
    spec: Mapping[str, Any] = fn if isinstance(fn, Mapping) else obj
    params = spec.get("parameters")
    return (
        isinstance(params, Mapping)
        and params.get("type") == "object"
        and isinstance(params.get("properties"), Mapping)
        and ("description" in spec or obj.get("type") == "function")
    )


def _call_from_obj(obj: Any, tool_names: frozenset[str], depth: int = 0) -> list[RawCall]:
    """Call objects found in a parsed JSON value (a call, a list of calls, a tool_calls wrapper)."""
    if depth > 3:
        return []
    if isinstance(obj, list):
        found: list[RawCall] = []
        for item in obj[:MAX_CANDIDATES]:
            if isinstance(item, Mapping):
                found.extend(_call_from_obj(item, tool_names, depth + 1))
        return found
    if not isinstance(obj, Mapping):
        return []
    if _is_tool_definition(obj):
        return []  # an echo of the offered tool schemas (the prompt's <tools> block), not a call
    wrapped = obj.get("tool_calls")
    if isinstance(wrapped, list):
        return [RawCall(c.name, c.raw_args, True) for c in _call_from_obj(wrapped, tool_names, depth + 1)]
    fn = obj.get("function")
    if isinstance(fn, Mapping) and isinstance(fn.get("name"), str) and fn.get("name"):
        raw = fn.get("arguments", fn.get("parameters"))
        return [RawCall(fn["name"], raw, True)]
    for key in _NAME_KEYS:
        name = obj.get(key)
        if not isinstance(name, str) or not name.strip():
            continue
        for akey in _ARG_KEYS:
            if akey in obj:
                standard = key == "name" and akey == "arguments"
                return [RawCall(name, obj[akey], not standard)]
        if name in tool_names:
            return [RawCall(name, None, key != "name")]
        return []
    if len(obj) == 1:
        ((key, value),) = obj.items()
        if isinstance(key, str) and key in tool_names and (value is None or isinstance(value, Mapping)):
            return [RawCall(key, value, True)]
    return []


def _call_like(text: str, tool_names: frozenset[str]) -> bool:
    """Whether unparseable text looks like an attempted call object."""
    head = text[:MAX_REPAIR_CHARS]
    if _CALL_KEY_RE.search(head) and (_ARGS_KEY_RE.search(head) or any(f'"{t}"' in head or f"'{t}'" in head for t in tool_names)):
        return True
    m = re.match(r"""\s*[{\[]\s*\{?\s*["']([\w.-]+)["']\s*:""", head)
    return bool(m and m.group(1) in tool_names)


# --------------------------------------------------------------------------- content payloads


@dataclass
class Cand:
    """One call attempt found in a piece of content: ``text[start:end]``, how it parsed, its calls.

    ``calls`` is empty for a broken call-like object (``method == "invalid"``); ``foreign``
    marks pythonic and XML-style calls; ``pseudo`` names code patterns found in the arguments.
    """

    start: int
    end: int
    method: str  # json_document | json_lines | brace_scan | python_literal | repair | pythonic | xml_parameters | invalid
    calls: list[RawCall]
    repaired: bool = False
    pseudo: list[str] = field(default_factory=list)
    excerpt: str = ""
    foreign: bool = False
    errors: list[str] = field(default_factory=list)


def _line_bounds(text: str, start: int, end: int) -> bool:
    ls = text.rfind("\n", 0, start) + 1
    le = text.find("\n", end)
    le = len(text) if le < 0 else le
    return not text[ls:start].strip() and not text[end:le].strip()


_REACT = re.compile(r"Action\s*:\s*([A-Za-z_][\w.-]*)\s*\n\s*Action\s+Input\s*:\s*$", re.I)


def _json_candidates(text: str, tool_names: frozenset[str]) -> list[Cand]:
    """Whole document, one-per-line and brace-scan candidates (with literal/repair fallbacks)."""
    cands: list[Cand] = []
    stripped = text.strip()
    if stripped and stripped[0] in "{[" and stripped[-1] in "}]":
        value = loads(stripped)
        if value is not FAIL:
            calls = _call_from_obj(value, tool_names)
            if calls:
                lead = text.find(stripped[0])
                return [Cand(lead, lead + len(stripped), "json_document", calls)]
    pos = 0
    attempts = 0
    n = len(text)
    while attempts < MAX_CANDIDATES * 2 and len(cands) < MAX_CANDIDATES:
        start = text.find("{", pos)
        if start < 0:
            break
        attempts += 1
        end, closed, depth = scan_balanced(text, start, n)
        span = text[start:end]
        if depth > MAX_DEPTH:
            if _call_like(span[:4096], tool_names):
                cands.append(Cand(start, end, "invalid", [], excerpt=short(span)))
            pos = end
            continue
        # a call inside a JSON array written inline: widen to the array when it is one
        value = loads(span) if closed else FAIL
        method = "json_lines" if _line_bounds(text, start, end) else "brace_scan"
        repaired = False
        if value is FAIL:
            value = literal(span) if closed else FAIL
            if value is not FAIL:
                method, repaired = "python_literal", True
        if value is FAIL:
            value = repair(span)
            if value is not FAIL:
                method, repaired = "repair", True
        if value is not FAIL:
            calls = _call_from_obj(value, tool_names)
            react = _REACT.search(text, max(0, start - 200), start) if not calls else None
            if react and isinstance(value, Mapping):
                calls = [RawCall(react.group(1), value, True)]
                start = react.start()
            if calls:
                pseudo = pseudo_code(span) if repaired else []
                cands.append(Cand(start, end, method, calls, repaired=repaired, pseudo=pseudo, excerpt=short(span)))
                pos = end
                continue
            if closed:
                pos = start + 1  # valid JSON data: a call may sit inside it
                continue
        elif _call_like(span, tool_names):
            cands.append(Cand(start, end, "invalid", [], pseudo=pseudo_code(span), excerpt=short(span)))
            pos = end
            continue
        pos = start + 1 if closed else end
    return cands


_PY_CALL = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\s*\(")
_PAST_TENSE = re.compile(r"\b(?:called|used|ran|invoked|executed|tried|via|with|using)\s*(?:the\s+)?`?$", re.I)


def _paren_end(text: str, open_pos: int, limit: int) -> int:
    depth = 0
    i = open_pos
    while i < limit:
        ch = text[i]
        if ch in "\"'":
            end = string_end(text, i, ch, allow_newline=False)
            if end < 0 or end >= limit:
                return -1
            i = end + 1
            continue
        if ch in "([{":
            depth += 1
            if depth > MAX_DEPTH:
                return -1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def _pythonic_candidates(
    text: str, taken: list[tuple[int, int]], tool_names: frozenset[str], schemas: Mapping[str, Any], wrapped: bool
) -> list[Cand]:
    """``name(arg=...)`` calls outside the ``taken`` spans (which grow by each call found)."""
    cands: list[Cand] = []
    matches = 0
    for m in _PY_CALL.finditer(text):
        matches += 1
        if matches > 4 * MAX_CANDIDATES or len(cands) >= MAX_CANDIDATES:
            break
        start = m.start()
        if any(a <= start < b for a, b in taken):
            continue
        name = m.group(1)
        offered = name in tool_names
        if not offered and "." in name:
            continue
        open_pos = m.end() - 1
        end = _paren_end(text, open_pos, min(len(text), start + MAX_PYTHONIC_CHARS))
        if end < 0:
            continue
        isolated = _line_bounds(text, start, end if text[end : end + 1] != ";" else end + 1)
        if not offered and text[start:end].strip() != text.strip().rstrip(";"):
            continue  # an unknown name counts only when the call is the whole payload
        src = text[start:end]
        try:
            node = ast.parse(src, mode="eval").body
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
        if not isinstance(node, ast.Call):
            continue
        if not offered and (node.args or not node.keywords):
            continue  # unknown names: keyword-only calls on their own line
        if offered and not isolated and not wrapped:
            line_start = text.rfind("\n", 0, start) + 1
            if not (node.args or node.keywords) or _PAST_TENSE.search(text[line_start:start]):
                continue  # "I used list_files() earlier" is prose, not a call
        args, errors = _pythonic_args(node, schema_properties(schemas.get(name)))
        cand = Cand(
            start,
            end,
            "pythonic",
            [RawCall(name, args, False)],
            pseudo=["function_call"] if errors else [],
            excerpt=short(src),
            foreign=True,
            errors=errors,
        )
        cands.append(cand)
        taken.append((start, end))
    return cands


def _pythonic_args(node: ast.Call, props: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The literal arguments of a parsed call (positional ones named after ``props``) and one error per code argument."""
    args: dict[str, Any] = {}
    errors: list[str] = []
    for index, arg in enumerate(node.args):
        key = props[index] if index < len(props) else f"arg{index}"
        value, ok = _literal_node(arg)
        if ok:
            args[key] = value
        else:
            errors.append(f"argument {key!r} is code, not a literal")
    for kw in node.keywords:
        if kw.arg is None:
            errors.append("**kwargs expansion is code, not a literal")
            continue
        value, ok = _literal_node(kw.value)
        if ok:
            args[kw.arg] = value
        else:
            errors.append(f"argument {kw.arg!r} is code, not a literal")
    return args, errors


def _literal_node(node: ast.AST) -> tuple[Any, bool]:
    try:
        return jsonable(ast.literal_eval(node)), True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None, False


_XML_OPEN = re.compile(r"<function=([^>\s]+)\s*>|<invoke\s+name\s*=\s*[\"']([^\"'>]+)[\"']\s*>", re.I)
_XML_CLOSE = re.compile(r"</\s*(?:function|invoke)\s*>", re.I)
_XML_PARAM = re.compile(r"<parameter(?:=([^>\s]+)|\s+name\s*=\s*[\"']([^\"'>]+)[\"'])\s*>", re.I)
_XML_PARAM_END = re.compile(r"</\s*parameter\s*>|<parameter[=\s]", re.I)


def xml_spans(text: str) -> list[tuple[int, int, int, int, str]]:
    """``(start, end, body_start, body_end, name)`` of XML-style calls."""
    spans: list[tuple[int, int, int, int, str]] = []
    pos = 0
    while len(spans) < MAX_CANDIDATES:
        m = _XML_OPEN.search(text, pos)
        if m is None:
            break
        close = _XML_CLOSE.search(text, m.end())
        nxt = _XML_OPEN.search(text, m.end())
        if close and (not nxt or close.start() < nxt.start()):
            spans.append((m.start(), close.end(), m.end(), close.start(), m.group(1) or m.group(2)))
            pos = close.end()
        else:
            end = nxt.start() if nxt else len(text)
            spans.append((m.start(), end, m.end(), end, m.group(1) or m.group(2)))
            pos = end
    return spans


def _xml_candidates(text: str, schemas: Mapping[str, Any]) -> list[Cand]:
    cands = []
    for start, end, body_start, body_end, name in xml_spans(text):
        args: dict[str, Any] = {}
        types = schema_types(schemas.get(name))
        pos = body_start
        for _ in range(MAX_CANDIDATES * 2):
            pm = _XML_PARAM.search(text, pos, body_end)
            if pm is None:
                break
            key = pm.group(1) or pm.group(2)
            em = _XML_PARAM_END.search(text, pm.end(), body_end)
            value_end = em.start() if em else body_end
            value = text[pm.end() : value_end]
            if value.startswith("\n"):
                value = value[1:]
            if value.endswith("\n"):
                value = value[:-1]
            if types.get(key) not in (None, "string"):
                parsed = loads(value.strip())
                args[key] = value if parsed is FAIL else parsed
            else:
                args[key] = value
            pos = em.end() if em and em.group().startswith("</") else value_end
        cands.append(
            Cand(start, end, "xml_parameters", [RawCall(name, args, False)], foreign=True, excerpt=short(text[start:end]))
        )
    return cands


def payload_candidates(text: str, tool_names: frozenset[str], schemas: Mapping[str, Any], *, wrapped: bool) -> list[Cand]:
    """Every call attempt in ``text``: XML-style, JSON (+ fallbacks), pythonic; by position.

    ``schemas`` is ``{tool name: parameters schema}``; ``wrapped`` says the text is the inside
    of a tag or fence (an offered pythonic name then counts anywhere, even in prose).
    """
    cands = _xml_candidates(text, schemas)
    taken = [(c.start, c.end) for c in cands]
    masked = text
    if taken:
        chars = list(text)
        for a, b in taken:
            chars[a:b] = " " * (b - a)
        masked = "".join(chars)
    for cand in _json_candidates(masked, tool_names):
        cands.append(cand)
        taken.append((cand.start, cand.end))
    cands.extend(_pythonic_candidates(masked, taken, tool_names, schemas, wrapped))
    cands.sort(key=lambda c: c.start)
    return cands


def remove_spans(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with each span replaced by a newline (overlapping spans merge)."""
    out = []
    pos = 0
    for a, b in sorted(spans):
        if a >= pos:
            out.append(text[pos:a])
            out.append("\n")
            pos = b
        else:
            pos = max(pos, b)
    out.append(text[pos:])
    return "".join(out)
