"""Calls written as markup: XML-style parameters and GLM's key/value tags.

* ``<function=name><parameter=k>v</parameter></function>`` (Qwen3-Coder) and
  ``<invoke name="..."><parameter name="k">v</parameter></invoke>``; a ``<function=name>``
  whose body is JSON is a vendor wrapper around JSON arguments
  (:func:`~harness.classifier.notations.wrapped_json`);
* GLM-4.5's ``name<arg_key>k</arg_key><arg_value>v</arg_value>...`` (usually inside ``<tool_call>``).

Values are typed by the tool's schema where it gives a type other than string, otherwise kept
as their exact text. Each call is a ``foreign`` :class:`~harness.classifier.types.Cand`. Rules:
docs/failure-modes.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from harness.classifier.jsonscan import FAIL, loads
from harness.classifier.notations import wrapped_json
from harness.classifier.types import MAX_CANDIDATES, Cand, RawCall, short
from harness.classifier.validate import schema_types

__all__ = ["arg_key_candidates", "bracket_candidates", "element_call", "xml_candidates", "xml_spans"]

_XML_OPEN = re.compile(
    r"<function=([^>\s={]+)\s*(?:>|=(?=\s*\{))|<invoke\s+name\s*=\s*[\"']([^\"'>]+)[\"']\s*>"
    r"|<(?!invoke\b)([A-Za-z_][\w-]{0,40})\s+(?:name|tool|tool_name|function)\s*=\s*[\"']([^\"'>]+)[\"']\s*>(?=\s*<parameter[=\s])",
    re.I,
)
"""The opening of an XML-style call: Qwen3-Coder's ``<function=name>``, ``<invoke name=...>``, or any element that
names the tool by an attribute and holds ``<parameter>`` children (``<call_record tool="read">``): the call itself."""
_XML_CLOSE = re.compile(r"</\s*(?:function|invoke)\s*>", re.I)
_XML_STOP = re.compile(r"</\s*tool_call\s*>|<\s*tool_call\s*>", re.I)
_XML_PARAM = re.compile(r"<parameter(?:=([^>\s]+)|\s+name\s*=\s*[\"']([^\"'>]+)[\"'])\s*>", re.I)
_XML_PARAM_END = re.compile(r"</\s*parameter\s*>|<parameter[=\s]", re.I)


def xml_spans(text: str) -> list[tuple[int, int, int, int, str]]:
    """``(start, end, body_start, body_end, name)`` of XML-style calls; an unclosed one ends at the next call or wrapper tag."""
    spans: list[tuple[int, int, int, int, str]] = []
    pos = 0
    while len(spans) < MAX_CANDIDATES:
        m = _XML_OPEN.search(text, pos)
        if m is None:
            break
        closing = re.compile(rf"</\s*{re.escape(m.group(3))}\s*>", re.I) if m.group(3) else _XML_CLOSE
        close = closing.search(text, m.end())
        nxt = _XML_OPEN.search(text, m.end())
        stop = _XML_STOP.search(text, m.end())
        limit = min(x.start() for x in (nxt, stop) if x is not None) if (nxt or stop) else len(text)
        if close and close.start() < limit:
            spans.append((m.start(), close.end(), m.end(), close.start(), m.group(1) or m.group(2) or m.group(4)))
            pos = close.end()
        else:
            spans.append((m.start(), limit, m.end(), limit, m.group(1) or m.group(2) or m.group(4)))
            pos = limit
    return spans


def xml_candidates(text: str, schemas: Mapping[str, Any]) -> list[Cand]:
    """XML-style calls (``foreign``); a ``<function=name>`` whose body is JSON is a wrapper around JSON arguments."""
    cands = []
    for start, end, body_start, body_end, name in xml_spans(text):
        body = text[body_start:body_end]
        if body.lstrip().startswith("{") and not _XML_PARAM.search(body):
            cands.append(wrapped_json(text, start, end, body_start + body.index("{"), name, excerpt_end=end))
            continue
        types = schema_types(schemas.get(name))
        args = _xml_args(text, body_start, body_end, types) or _child_args(body, types)
        cands.append(
            Cand(start, end, "xml_parameters", [RawCall(name, args, False)], foreign=True, excerpt=short(text[start:end]))
        )
    return cands


def _xml_args(text: str, body_start: int, body_end: int, types: Mapping[str, Any]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    pos = body_start
    for _ in range(MAX_CANDIDATES * 2):
        pm = _XML_PARAM.search(text, pos, body_end)
        if pm is None:
            break
        key = pm.group(1) or pm.group(2)
        em = _XML_PARAM_END.search(text, pm.end(), body_end)
        value_end = em.start() if em else body_end
        value = text[pm.end() : value_end]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        if types.get(key) not in (None, "string"):
            parsed = loads(value.strip())
            args[key] = value if parsed is FAIL else parsed
        else:
            args[key] = value
        pos = em.end() if em and em.group().startswith("</") else value_end
    return args


def _child_args(body: str, types: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments written as child elements named by their key (``<invoke name="read_file"><path>a.rs</path>``, MiniMax
    M3's form once its namespace tokens are read as part of the tags: MiniMax-M3#31), when no ``<parameter>`` is."""
    pairs = zip(_CHILDREN_ONE.finditer(body), range(MAX_CANDIDATES * 2), strict=False)
    return {m.group(1): _typed(m.group(2).strip("\n"), types.get(m.group(1))) for m, _ in pairs}


_ARG_PAIR = re.compile(r"\s*<arg_key>\s*([^<\n]{1,128}?)\s*</arg_key>\s*<arg_value>")
_ARG_NAME = re.compile(r"(?<![\w.-])([A-Za-z_][\w.-]{0,127})[ \t]*\n?[ \t]*\Z")
_ARG_VALUE_END = "</arg_value>"


def arg_key_candidates(text: str, schemas: Mapping[str, Any]) -> list[Cand]:
    """GLM-style calls: a name, then ``<arg_key>k</arg_key><arg_value>v</arg_value>`` pairs (``foreign``).

    The name is the word just before the first pair; pairs without one are not a call. An
    unclosed last value runs to the end of the text. Linear: each pair is found once.
    """
    cands: list[Cand] = []
    pos = attempts = 0
    while len(cands) < MAX_CANDIDATES and attempts < MAX_CANDIDATES * 4 and (first := text.find("<arg_key>", pos)) >= 0:
        attempts += 1
        raw: dict[str, str] = {}
        end = first
        while len(raw) < MAX_CANDIDATES * 2 and (pair := _ARG_PAIR.match(text, end)):
            close = text.find(_ARG_VALUE_END, pair.end())
            raw[pair.group(1)] = text[pair.end() : close if close >= 0 else len(text)].strip("\n")
            end = close + len(_ARG_VALUE_END) if close >= 0 else len(text)
        named = _ARG_NAME.search(text, max(pos, first - 160), first) if raw else None
        if named:
            name = named.group(1)
            types = schema_types(schemas.get(name))
            args = {k: _typed(v, types.get(k)) for k, v in raw.items()}
            cands.append(Cand(named.start(1), end, "xml_parameters", [RawCall(name, args, False)], foreign=True,
                              excerpt=short(text[named.start(1) : end])))  # fmt: skip
        pos = max(end, first + len("<arg_key>"))
    return cands


def _typed(value: str, kind: Any) -> Any:
    """A value typed by its schema type when that is not string (``"3"`` for an integer is 3); else the text."""
    if kind in (None, "string"):
        return value
    parsed = loads(value.strip())
    return value if parsed is FAIL else parsed


_BRACKET_CALL = re.compile(
    r"\[[ \t]*(?:tool_call|tool_use|function_call)[ \t]*:[ \t]*([A-Za-z_][\w.-]{0,127})[ \t]+(?:for|with)[ \t]+([^\[\]\n]{1,500})\]",
    re.I,
)
_BRACKET_PAIR = re.compile(r"([A-Za-z_]\w{0,63})[ \t]*[=:]?[ \t]*(?:'([^'\n]*)'|\"([^\"\n]*)\")")


def bracket_candidates(text: str) -> list[Cand]:
    """A log-line call notation: ``[tool_call: read_file for absolute_path 'requirements.txt']`` (``foreign``): the
    bracket is the call itself, naming the tool and holding quoted key/value pairs; one without a pair is no call."""
    cands: list[Cand] = []
    for m, _ in zip(_BRACKET_CALL.finditer(text), range(MAX_CANDIDATES), strict=False):
        args = {p.group(1): p.group(2) if p.group(2) is not None else p.group(3) for p in _BRACKET_PAIR.finditer(m.group(2))}
        if args:
            raw = RawCall(m.group(1), args, False)
            cands.append(Cand(m.start(), m.end(), "xml_parameters", [raw], foreign=True, excerpt=short(m.group())))
    return cands


_ELEMENT = re.compile(r"<([A-Za-z_][\w.-]{0,127})>")
_CHILDREN = re.compile(r"(?:\s*+<([A-Za-z_][\w-]{0,63})>([^<]*+)</\1>)*+\s*+")
_NOT_TOOL = re.compile(r"(?:tool|function)[_-]?(?:calls?|uses?|results?|responses?|outputs?|code)|\w*think\w*", re.I)
"""Wrapper and reasoning elements, not tools named as elements."""


def element_call(text: str, tool_names: frozenset[str], *, tools_known: bool) -> list[Cand]:
    """The tag form: an element named like a tool that is the whole ``text`` (a reply, or a fence's or wrapper's body),
    empty or holding only parameter elements (``<list_memories></list_memories>``): a call in the model's own
    notation. With the tools known, only an offered name; else a function-like name (``_`` or camelCase), not an
    HTML element."""
    body = text.strip()
    m = _ELEMENT.match(body)
    if m is None or not body.endswith(f"</{m.group(1)}>"):
        return []
    name = m.group(1)
    like_tool = bool(re.search(r"_|[a-z][A-Z]", name)) and not _NOT_TOOL.fullmatch(name)
    if not (name in tool_names or (not tools_known and like_tool)):
        return []
    inner_end = len(body) - len(name) - 3
    children = _CHILDREN.match(body, m.end(), inner_end)
    if children is None or children.end() != inner_end:
        return []
    args = {c.group(1): c.group(2).strip() for c in _CHILDREN_ONE.finditer(body, m.end(), inner_end)}
    start = text.index(body[0])
    return [Cand(start, start + len(body), "tagged", [RawCall(name, args or None, False)], excerpt=short(body), foreign=True)]


_CHILDREN_ONE = re.compile(r"<([A-Za-z_][\w-]{0,63})>([^<]*+)</\1>")
