"""Call shapes: which parsed values and which pieces of text are tool-call attempts.

Recognizes call objects (standard ``{"name", "arguments"}`` and the nonstandard shapes listed
in docs/failure-modes.md), broken but call-like objects, pythonic ``name(arg=...)`` calls and
ReAct ``Action:`` lines and a tool's name on a line before its JSON arguments, and returns each
attempt in a text as a :class:`~harness.classifier.types.Cand` with its span (other notations:
:mod:`harness.classifier.notations`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from harness.classifier.jsonscan import FAIL, literal, loads, pseudo_code, repair, scan_balanced
from harness.classifier.notations import (
    call_expression,
    code_pseudo,
    key_value_candidates,
    line_bounds,
    pythonic_candidates,
    vendor_candidates,
)
from harness.classifier.types import MAX_CANDIDATES, MAX_DEPTH, MAX_REPAIR_CHARS, Cand, RawCall, short
from harness.classifier.xmlstyle import arg_key_candidates, bracket_candidates, element_call, xml_candidates, xml_spans

__all__ = ["payload_candidates", "remove_spans", "wrapper_call", "xml_spans"]

_ARG_BASE = ("arguments", "parameters", "args", "params", "input", "inputs")
_PREFIXES = ("tool", "function", "action")
_ARG_KEYS = (
    _ARG_BASE
    + tuple(f"{p}_{b}" for p in _PREFIXES for b in _ARG_BASE)
    + tuple(f"{p}{b.capitalize()}" for p in _PREFIXES for b in _ARG_BASE)
)
"""Argument keys: the plain ones and their variants prefixed with what they name (``tool_arguments``,
``function_args``, ``toolInput``); the guide's lists are examples."""
_ARG_KIND = re.compile(r"[a-z]+_(?:params|parameters|args|arguments)")
"""An argument key prefixed with the kind of argument it holds (``path_params``, ``query_params`` beside ``body``:
Hermes-Function-Calling#17): the call's arguments are then all its fields but the name."""
_NAME_KEYS = ("tool", "function", "action") + tuple(f"{p}{s}" for p in _PREFIXES for s in ("_name", "Name")) + ("name",)
_CALL_KEY_RE = re.compile("""["'\u201c\u201d]?\\b(?P<key>""" + "|".join(_NAME_KEYS) + """)\\b["'\u201c\u201d]?\\s*:""")
_ARGS_KEY_RE = re.compile("""["'\u201c\u201d]?\\b(?P<key>""" + "|".join(_ARG_KEYS) + """)\\b["'\u201c\u201d]?\\s*:""")


def _is_tool_definition(obj: Mapping[str, Any]) -> bool:
    """A tool definition, offered or invented, not a call: ``{"type": "function", "function": {"name", "description", ...}}``
    (the description may sit beside ``function``),
    or a bare ``{"name", "description", "parameters": <schema>}`` (an empty schema too) / ``{"type": "function", "function":
    {..., "parameters": <schema>}}``."""
    fn = obj.get("function")
    spec: Mapping[str, Any] = fn if isinstance(fn, Mapping) else obj
    if isinstance(fn, Mapping) and obj.get("type") == "function" and ("description" in fn or "description" in obj):
        return True  # the typed wrapper with a tool's description, inside it or beside it
    params = spec.get("parameters")
    if not isinstance(params, Mapping) or not ("description" in spec or obj.get("type") == "function"):
        return False
    schema_like = params.get("type") == "object" and isinstance(params.get("properties"), Mapping)
    # the flat form however garbled: a described tool whose "parameters" is typed and declares properties or required
    garbled = "description" in spec and isinstance(params.get("type"), str) and ("properties" in params or "required" in params)
    return schema_like or garbled or (not params and "description" in spec)  # {"name", "description", "parameters": {}}


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
    for wrapper_key in ("function", "function_call"):
        fn = obj.get(wrapper_key)
        if not isinstance(fn, Mapping):
            continue
        # {"function": {"name", "arguments"}}; {"name": x, "function_call": {"args": {...}}} names the call outside
        name = fn.get("name") or (obj.get("name") if wrapper_key == "function_call" else None)
        if isinstance(name, str) and name:
            raw = next((fn[k] for k in _ARG_KEYS if k in fn), None)
            return [RawCall(name, raw, True)]
    action = _action_wrapper(obj)
    if action is not None:
        return [action]
    protocol = _protocol_call(obj, tool_names)
    if protocol is not None:
        return [protocol]
    for key in _NAME_KEYS:
        name = obj.get(key)
        if not isinstance(name, str) or not name.strip():
            continue
        kinds = [k for k in obj if isinstance(k, str) and k not in _ARG_KEYS and _ARG_KIND.fullmatch(k)]
        if kinds and not any(k in obj for k in _ARG_KEYS):
            return [RawCall(name, {k: v for k, v in obj.items() if k not in (key, "id", "type")}, True)]
        for akey in _ARG_KEYS:
            if akey in obj:
                if name not in tool_names and _is_data(obj, key, akey):
                    return []  # {"name": "Python: Current File", "args": [...], "program": ...}: a JSON document, not a call
                standard = key == "name" and akey == "arguments"
                return [RawCall(name, obj[akey], not standard)]
        if name in tool_names:  # {"name": "search", "query": "x"}: the other fields are the arguments
            flat = {k: v for k, v in obj.items() if k not in (key, "id", "type")} if "description" not in obj else {}
            return [RawCall(name, flat or None, key != "name" or bool(flat))]
        return []
    if len(obj) == 1:
        ((key, value),) = obj.items()
        if isinstance(key, str) and key in tool_names and (value is None or isinstance(value, Mapping)):
            return [RawCall(key, value, True)]
    return _vendor_call_inside(obj)


def _vendor_call_inside(document: Mapping[str, Any]) -> list[RawCall]:
    """A call under a vendor's call key (:data:`_VENDOR_KEYS`) anywhere inside a document (a fenced imitation of a
    Gemini response whose ``candidates[0].content.parts[0].functionCall`` holds the call: js-genai#607). Breadth
    first over at most :data:`_MAX_NODES` nested objects and lists, so any document costs bounded work."""
    queue: list[Any] = list(document.values())
    for node in queue:
        if len(queue) > _MAX_NODES:
            break
        if isinstance(node, Mapping):
            if any(k in node for k in _VENDOR_KEYS) and (action := _action_wrapper(node)) is not None:
                return [action]
            queue.extend(v for v in node.values() if isinstance(v, (Mapping, list)))
        elif isinstance(node, list):
            queue.extend(v for v in node if isinstance(v, (Mapping, list)))
    return []


_MAX_NODES = 400


_ACTION_KEYS = ("action", "tool_call", "call", "function_call", "functionCall", "tool_use", "toolUse")
"""Keys that name an invocation, the vendors' own among them (Gemini's ``functionCall``, Anthropic's ``tool_use``):
a call object under one is a call at any depth of a document (js-genai#607)."""
_VENDOR_KEYS = _ACTION_KEYS[3:]


def _action_wrapper(obj: Mapping[str, Any]) -> RawCall | None:
    """A call object under a key that names an invocation (``{"thought": ..., "action": {"name": "kubectl",
    "command": "get pods"}}``): the wrapper says it is a call, so its name counts, tools known or not; its argument
    key holds the arguments, or else its other fields (not ``id``, ``type``) are them."""
    for key in _ACTION_KEYS:
        inner = obj.get(key)
        if not isinstance(inner, Mapping) or _is_tool_definition(inner):
            continue
        name = inner.get("name")
        if not isinstance(name, str) or not name.strip():
            continue
        raw = next((inner[k] for k in _ARG_KEYS if k in inner), None)
        if raw is None:
            raw = {k: v for k, v in inner.items() if k not in ("name", "id", "type")} or None
        return RawCall(name, raw, True)
    return None


_SERVICE_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def _protocol_call(obj: Mapping[str, Any], tool_names: frozenset[str]) -> RawCall | None:
    """A protocol's own request object, tools known or not (``nonstandard_keys``): JSON-RPC's ``{"jsonrpc", "method",
    "params"}`` (MCP's ``tools/call`` names the tool in its params), Home Assistant's ``{"service": "turn_off",
    "target_device": ...}`` (the other fields are the arguments).

    A ``service`` must look like a service name (``turn_off``, ``light.turn_off``), and an object naming an offered
    tool under a name key is that call instead (``{"action": "search", "service": "google_search"}``)."""
    method, params = obj.get("method"), obj.get("params")
    if "jsonrpc" in obj and isinstance(method, str) and method.strip():
        if method == "tools/call" and isinstance(params, Mapping) and isinstance(params.get("name"), str):
            return RawCall(params["name"], params.get("arguments"), True)  # MCP: the tool is named in the params
        return RawCall(method, params, True)
    service = obj.get("service")
    if not isinstance(service, str) or not _SERVICE_NAME.fullmatch(service):
        return None
    if not (service in tool_names or "_" in service or "." in service):
        return None  # {"service": "Netflix", "price": 10} is data
    if any(isinstance(obj.get(k), str) and obj[k] in tool_names for k in _NAME_KEYS):
        return None
    args = {k: v for k, v in obj.items() if k not in ("service", "id", "type")}
    return RawCall(service, args or None, True)


_DEFINITION_LIKE = re.compile(
    r"""["']type["']\s*:\s*["']function["']\s*,\s*["']function["']\s*:\s*\{"""
    r"""|["']description["']\s*:[^{}]*["']parameters["']\s*:\s*\{\s*(?:\}|["'](?:type|properties)["'])"""
)
"""A tool definition, even broken: the typed wrapper, or a description beside a parameters schema (a call's
arguments may hold a "description" too)."""


_JSONRPC_REQUEST = re.compile(
    r"""["']jsonrpc["']\s*:[^{}]{0,40}["']method["']\s*:|["']method["']\s*:[^{}]{0,200}["']jsonrpc["']\s*:"""
)


def _is_data(obj: Mapping[str, Any], name_key: str, args_key: str) -> bool:
    """Whether an object naming a tool that was not offered is a JSON document rather than a call: its
    "arguments" are not an object or a string, and it has fields of its own (a launch configuration, a
    container spec). A call to an invented tool (``{"name": "fs:read_file", "arguments": {...}}``) is a call."""
    args = obj[args_key]
    own_fields = set(obj) - {name_key, args_key, "id", "type"}
    return not (args is None or isinstance(args, (Mapping, str))) and bool(own_fields)


def _call_like(text: str, tool_names: frozenset[str]) -> bool:
    """Whether unparseable text looks like an attempted call object (a broken tool definition does not)."""
    head = text[:MAX_REPAIR_CHARS]
    if _DEFINITION_LIKE.search(head[:400]):
        return False
    if _JSONRPC_REQUEST.search(head[:400]):
        return True  # a broken JSON-RPC request: a protocol's call object
    if _CALL_KEY_RE.search(head) and (_ARGS_KEY_RE.search(head) or any(f'"{t}"' in head or f"'{t}'" in head for t in tool_names)):
        return True
    m = _FIRST_NAME_KEY.match(head)
    return bool(m and m.group(1) in tool_names)


_FIRST_KEY = re.compile("""\\s*+(?:\\[\\s*+)?\\{\\s*+["'\u201c\u201d]?([\\w-]+)["'\u201c\u201d]?\\s*:""")
_FIRST_NAME_KEY = re.compile(r"""\s*+[{\[]\s*+(?:\{\s*+)?["']([\w.-]+)["']\s*:""")
"""The first key of a (broken) object or list of objects; possessive whitespace runs, so a long run of
blanks with no key after it is passed once (``{`` then 100 KB of spaces took seconds per match)."""


def _nonstandard_keys(text: str) -> bool:
    """Whether a broken call-like object shows keys other than ``name``/``arguments``: its first name or argument key,
    or a first key of another kind (``{“id”: 0, “name”: ...}``; ``type`` aside, as in a parsed call)."""
    head = text[:MAX_REPAIR_CHARS]
    name_key, args_key = _CALL_KEY_RE.search(head), _ARGS_KEY_RE.search(head)
    first = _FIRST_KEY.match(head)
    if first and first.group(1) not in ("type", *_NAME_KEYS, *_ARG_KEYS):
        return True
    return bool((name_key and name_key.group("key") != "name") or (args_key and args_key.group("key") != "arguments"))


# --------------------------------------------------------------------------- content payloads

_REACT_ACTION = re.compile(r"^[ \t]*Action[ \t]*:[ \t]*(?P<name>[^\n]*?)[ \t]*$", re.I | re.M)
_REACT_INPUT = re.compile(r"[ \t]*+(?:\n[ \t]*+)?Action[ \t]++Input[ \t]*+:[ \t]*+", re.I)
_REACT_NEXT = re.compile(r"^[ \t]*(?:Observation|Thought|Action|Final[ \t]+Answer|Answer)[ \t]*:", re.I | re.M)
_NAME_LINE = re.compile(r"(?:^|(?<=[^\w\s]))[ \t]*(?P<name>[A-Za-z_][\w.-]*)[ \t]*:?[ \t]*\n[ \t]*\Z")
_CURLY = re.compile("[\u201c\u201d\u2018\u2019]")


def _unfenced(body: str) -> str:
    """``body`` without a Markdown fence around it (its opening line and a closing fence), in linear time."""
    fence = body[:3]
    if fence not in ("```", "~~~"):
        return body
    _opening, _, inner = body.partition("\n")
    inner = inner.rstrip()
    return inner[:-3].rstrip() if inner.endswith(fence) else inner


def _react_candidates(text: str, schemas: Mapping[str, Any]) -> list[Cand]:
    """ReAct calls: an ``Action:`` line naming a tool, with or without an ``Action Input:`` after it.

    A JSON (or Python-literal, or repairable) input is the arguments; any other input is one
    string argument ``{"input": text}``; no input means no arguments. An action written as a
    call expression (``Action: list_keys(data)``) is that call, in a foreign notation.
    """
    cands: list[Cand] = []
    for m in _REACT_ACTION.finditer(text):
        name = m.group("name").strip().strip("`'\"")
        if not name or len(cands) >= MAX_CANDIDATES:
            continue
        expression = call_expression(name, schemas) if name.endswith(")") else None
        if expression is not None:
            called, args, errors = expression
            cands.append(Cand(m.start(), m.end(), "react", [RawCall(called, args, True)], excerpt=short(m.group().strip()),
                              foreign=True, react=True, errors=errors, pseudo=code_pseudo(errors)))  # fmt: skip
            continue
        end, raw_args, repaired, broken = m.end(), None, False, False
        follow = _REACT_INPUT.match(text, m.end())
        if follow is not None:
            stop = _REACT_NEXT.search(text, follow.end())
            body_end = stop.start() if stop else len(text)
            body = text[follow.end() : body_end].strip()
            end = body_end if body else follow.end()
            body = _unfenced(body)  # Action Input: ```json {...}```: the fence is notation too
            if body[:1] and body[0] in "{[":
                value, _json_end, repaired = _parse_value(body)
                broken, raw_args = value is FAIL, (None if value is FAIL else value)
            elif body:
                raw_args = {"input": body}
        calls = [] if broken else [RawCall(name, raw_args, True)]
        cands.append(Cand(m.start(), end, "invalid" if broken else "react", calls, repaired=repaired,
                          excerpt=short(text[m.start() : end]), react=True))  # fmt: skip
    return cands


def _parse_value(span: str) -> tuple[Any, str, bool]:
    """``(value or FAIL, method, repaired)`` of a bracketed span: strict JSON, a Python literal, then the narrow repair."""
    value = loads(span)
    if value is not FAIL:
        return value, "json", False
    if _PYTHONISH.search(span):
        value = literal(span)
        if value is not FAIL:
            return value, "python_literal", True
    value = repair(span) if not _CURLY.search(span) else FAIL
    return value, "repair", value is not FAIL


_PYTHONISH = re.compile(r"'|\b(?:True|False|None)\b")
_CUT_KEY = re.compile(r",\s*[\"']?[\w-]*\s*\Z")
"""An object cut after a comma, in its next key: what the repair cuts back is the call's arguments."""


def _json_candidates(text: str, tool_names: frozenset[str], *, wrapped: bool, tools_known: bool) -> list[Cand]:
    """Whole document, one-per-line and brace-scan candidates (with literal/repair fallbacks)."""
    whole = _whole_document(text, tool_names, wrapped=wrapped)
    if whole is not None:
        return [whole]
    cands: list[Cand] = []
    pos = 0
    attempts = 0
    while attempts < MAX_CANDIDATES * 2 and len(cands) < MAX_CANDIDATES:
        start = text.find("{", pos)
        if start < 0:
            break
        attempts += 1
        cand, pos = _brace_candidate(text, start, tool_names, tools_known=tools_known)
        if cand is not None:
            cands.append(cand)
    return cands


def _whole_document(text: str, tool_names: frozenset[str], *, wrapped: bool) -> Cand | None:
    """The whole text as one JSON value holding calls; inside a tag or fence also after repair (an unclosed ``[``)."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "{[":
        return None
    lead = text.find(stripped[0])
    if stripped[-1] in "}]":
        value = loads(stripped)
        if value is not FAIL:
            calls = _call_from_obj(value, tool_names)
            return Cand(lead, lead + len(stripped), "json_document", calls, excerpt=short(stripped)) if calls else None
    if wrapped:
        end, closed, _depth = scan_balanced(stripped, 0, len(stripped))
        if closed and loads(stripped[:end]) is not FAIL:
            return None  # a whole object with text after it: the brace scan reads it as written, unrepaired
        value, _method, repaired = _parse_value(stripped)
        calls = _call_from_obj(value, tool_names) if value is not FAIL else []
        if calls and repaired:
            return Cand(lead, lead + len(stripped), "repair", calls, repaired=True, excerpt=short(stripped))
    return None


def _brace_candidate(text: str, start: int, tool_names: frozenset[str], *, tools_known: bool) -> tuple[Cand | None, int]:
    """The attempt opening at ``text[start] == "{"`` (or None) and where the scan goes on."""
    end, closed, depth = scan_balanced(text, start, len(text))
    span = text[start:end]
    if depth > MAX_DEPTH:
        return (Cand(start, end, "invalid", [], excerpt=short(span)) if _call_like(span[:4096], tool_names) else None), end
    value, method, repaired = _parse_value(span) if closed else (FAIL, "", False)
    if value is FAIL and not closed:
        value = repair(span)
        method, repaired = "repair", value is not FAIL
    if value is FAIL:
        if _call_like(span, tool_names):
            return Cand(start, end, "invalid", [], pseudo=pseudo_code(span), excerpt=short(span),
                        nonstandard=_nonstandard_keys(span)), end  # fmt: skip
        return None, (start + 1 if closed else end)
    method = method if repaired else ("json_lines" if line_bounds(text, start, end) else "brace_scan")
    calls = _call_from_obj(value, tool_names)
    if calls and not closed and all(c.raw_args is None for c in calls) and _CUT_KEY.search(span):
        # {"name": "get_weather", "  cut by the token limit: the repair would drop the arguments, not recover them
        return Cand(start, end, "invalid", [], excerpt=short(span), nonstandard=_nonstandard_keys(span)), end
    foreign = False
    if not calls and isinstance(value, Mapping):
        named = _NAME_LINE.search(text, max(0, start - 120), start)
        if named and (named.group("name") in tool_names or (not tools_known and _identifier_like(named.group("name")))):
            calls, foreign, start = [RawCall(named.group("name"), value, False)], True, named.start("name")
    if not calls and isinstance(value, Mapping) and _is_tool_definition(value):
        return None, end  # a tool definition: its "function" part is the definition too, not a call inside it
    if not calls:
        return None, (start + 1 if closed else end)  # valid JSON data: a call may sit inside it
    pseudo = pseudo_code(span) if repaired else []
    return Cand(start, end, method, calls, repaired=repaired, pseudo=pseudo, excerpt=short(span), foreign=foreign), end


def wrapper_call(inner: str, attr_name: str | None) -> list[Cand]:
    """The call a call wrapper holds when no call shape was found in it: with the tool named in the wrapper's
    attribute (``<tool_call name="x">{"k": "v"}</tool_call>``), the JSON object is its arguments; else an object
    ``{"name": ..., <other fields>}`` (the flat form) is a call whatever the tools are, the other fields its
    arguments (``nonstandard_keys``)."""
    start = inner.find("{")
    if start < 0 or inner[:start].strip():
        return _wrapped_pairs(inner)
    end, _closed, _depth = scan_balanced(inner, start, len(inner))
    value = loads(inner[start:end])
    if not isinstance(value, Mapping) or _is_tool_definition(value):
        return []
    span = short(inner[start:end])
    if attr_name:
        return [Cand(start, end, "json_document", [RawCall(attr_name, dict(value), False)], excerpt=span)]
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return []
    flat = {k: v for k, v in value.items() if k not in ("name", "id", "type")}
    return [Cand(start, end, "json_document", [RawCall(name, flat or None, True)], excerpt=span)]


_WRAPPED_PAIRS = re.compile(
    r"\A\s*+(?P<name>[A-Za-z_][\w.-]{0,127}+)(?P<args>(?:[ \t]+[A-Za-z_]\w*+=(?>\"[^\"\n]*+\"|'[^'\n]*+'|[^\s\"'/>]\S*+))++)"
    r"[ \t]*+/?>?\s*+\Z"
)
_PAIR = re.compile(r"(?<!\w)([A-Za-z_]\w*+)=(?:\"([^\"\n]*)\"|'([^'\n]*)'|([^\s\"'/>]\S*))")


def _wrapped_pairs(inner: str) -> list[Cand]:
    """Inside a call wrapper, an identifier followed by ``key="value"`` pairs, self-closing ``/>`` or not, as the whole
    body (``<tool_call>exec tool="exec" command="ls -la" />``): that call whatever the tools are, since the wrapper
    makes it a call (openclaw#33258); a notation of the model's own (``foreign``)."""
    m = _WRAPPED_PAIRS.match(inner[:MAX_REPAIR_CHARS])
    if m is None:
        return []
    args = {a.group(1): next(v for v in a.groups()[1:] if v is not None) for a in _PAIR.finditer(m.group("args"))}
    raw = RawCall(m.group("name"), args, False)
    return [Cand(m.start("name"), m.end(), "tagged", [raw], excerpt=short(m.group().strip()), foreign=True)]


def _identifier_like(name: str) -> bool:
    """A function-like name (``get_weather``, ``getWeather``), not an ordinary word, for text whose tools are unknown."""
    return "_" in name or "." in name or bool(re.search(r"[a-z][A-Z]", name))


def payload_candidates(
    text: str, tool_names: frozenset[str], schemas: Mapping[str, Any], *, wrapped: bool, tools_known: bool = True
) -> list[Cand]:
    """Every call attempt in ``text``, by position: vendor headers, XML-style, ReAct, JSON (+ fallbacks), pythonic.

    ``schemas`` is ``{tool name: parameters schema}``; ``wrapped`` says the text is the inside
    of a tag or fence (an offered pythonic name then counts anywhere, even in prose);
    ``tools_known`` says whether the offered tools are known (a bare name line then needs an
    offered name).
    """
    cands = vendor_candidates(text, wrapped=wrapped)
    cands += [c for c in xml_candidates(text, schemas) if not any(o.start <= c.start < o.end for o in cands)]
    cands += [c for c in arg_key_candidates(text, schemas) if not any(o.start <= c.start < o.end for o in cands)]
    cands += [c for c in bracket_candidates(text) if not any(o.start <= c.start < o.end for o in cands)]
    cands += [c for c in _react_candidates(text, schemas) if not any(o.start <= c.start < o.end for o in cands)]
    cands += [
        c
        for c in key_value_candidates(text, tool_names, tools_known=tools_known)
        if not any(o.start <= c.start < o.end for o in cands)
    ]
    taken = [(c.start, c.end) for c in cands]
    masked = _mask(text, taken)
    for cand in _json_candidates(masked, tool_names, wrapped=wrapped, tools_known=tools_known):
        cands.append(cand)
        taken.append((cand.start, cand.end))
    cands.extend(pythonic_candidates(masked, taken, tool_names, schemas, wrapped, tools_known=tools_known))
    if not cands:
        cands = element_call(text, tool_names, tools_known=tools_known)
    cands.sort(key=lambda c: c.start)
    return cands


def _mask(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with the spans blanked to spaces (same length, so positions stay valid)."""
    if not spans:
        return text
    chars = list(text)
    for a, b in spans:
        chars[a:b] = " " * (b - a)
    return "".join(chars)


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
