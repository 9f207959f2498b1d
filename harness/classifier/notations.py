"""Calls written in notations other than a JSON call object.

* pythonic ``name(arg=...)`` calls (also ``[name(...)]`` lists), parsed with ``ast``;
* vendor wrappers around JSON arguments, where the name sits in the markup: Llama 3.1's
  ``<function=name>{...}</function>``, gpt-oss's harmony header ``to=functions.name ...
  <|message|>{...}`` (raw, or with its special tokens stripped), Kimi's
  ``<|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}``, DeepSeek's
  ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>name`` + fenced JSON, and ``<name>x</name><arguments>{...}</arguments>``;
* a tool's name alone on a line followed by a JSON object of its arguments;
* arrow notation ``{tool => "name", args => {...}}``.

Each attempt is a :class:`~harness.classifier.types.Cand`: ``foreign`` when the call itself
is not JSON (pythonic, XML, name line, arrow), ``wrapper`` when vendor markup carries the name
around JSON arguments. Rules: docs/failure-modes.md.
"""

from __future__ import annotations

import ast
import heapq
import io
import re
import tokenize
from collections.abc import Mapping
from typing import Any

from harness.classifier.jsonscan import FAIL, close_cut_call, literal, loads, parse_call, repair, scan_balanced, string_end
from harness.classifier.types import (
    MAX_CANDIDATES,
    MAX_DEPTH,
    MAX_PYTHONIC_CHARS,
    MAX_REPAIR_CHARS,
    Cand,
    RawCall,
    jsonable,
    short,
)
from harness.classifier.validate import NO_PROPERTY, schema_properties

__all__ = [
    "call_expression",
    "code_pseudo",
    "key_value_candidates",
    "line_bounds",
    "pythonic_candidates",
    "vendor_candidates",
]


def line_bounds(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` is alone on its line(s)."""
    ls = text.rfind("\n", 0, start) + 1
    le = text.find("\n", end)
    le = len(text) if le < 0 else le
    return not text[ls:start].strip() and not text[end:le].strip()


def _json_value(text: str, start: int) -> tuple[Any, int, bool]:
    """The JSON (or Python-literal, or repaired) value opening at ``text[start]``: ``(value or FAIL, end, repaired)``."""
    end, closed, _depth = scan_balanced(text, start, len(text))
    span = text[start:end]
    value = loads(span) if closed else FAIL
    if value is not FAIL:
        return value, end, False
    value = literal(span) if closed and _PYTHONISH.search(span) else FAIL
    if value is FAIL:
        value = repair(span)
    return value, end, value is not FAIL


_PYTHONISH = re.compile(r"'|\b(?:True|False|None)\b")
"""What makes a literal Python rather than broken JSON: single quotes or Python's constants."""

# --------------------------------------------------------------------------- pythonic

_PY_CALL = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\s*\(")
_PAST_TENSE = re.compile(r"\b(?:called|used|ran|invoked|executed|tried|via|with|using)\s*(?:the\s+)?`?$", re.I)
_NOT_DOING = re.compile(
    r"\b(?:(?:not|never|didn't|did not|don't|do not|won't|will not|shouldn't|no need to)(?:\s+\w+){0,2}?\s+(?:call|run|use|invoke|need)"
    r"|don't need|do not need|you(?:'d| can| could| may| might| should| would)|if you|eg_|for example|such as|the format(?: is)?"
    r"|in the format|instead of|rather than|like this)\b",
    re.I,
)
"""Words of the call's own clause that make it a mention: negated ("I did not call"), addressed to the reader ("you can
call"), an example ("e.g.", "for example") or documentation ("the format is")."""
_CLAUSE_START = re.compile(r"[.!?:;,]\s|\n|\b(?:so|then|and|but)\s", re.I)
_OFFER_AFTER = re.compile(r"[^\n]{0,80}?\b(?:shall I|should I|would you like|do you want|want me to)\b", re.I)
_DOCUMENTED_AFTER = re.compile(
    r"`?[ \t]{0,3}(?:tool|function)\b|`?[ \t]{1,3}(?:returns|takes|accepts|gives|lists|reads|writes)\b", re.I
)
_DEFINITION = re.compile(r"\b(?:def|class|function|async\s+def|fn|func)\s+$")


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


def _whole_payload(text: str, src: str) -> bool:
    """Whether the call ``src`` is all of ``text`` (allowing ``[...]`` around it and a trailing ``;``)."""
    body = text.strip().rstrip(";").strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1].strip().rstrip(",")
    return src.strip() == body


def pythonic_candidates(  # noqa: PLR0913 - the text, its taken spans, the tools and two flags all shape the decision
    text: str,
    taken: list[tuple[int, int]],
    tool_names: frozenset[str],
    schemas: Mapping[str, Any],
    wrapped: bool,
    *,
    tools_known: bool,
) -> list[Cand]:
    """``name(arg=...)`` calls outside the ``taken`` spans (which grow by each call found).

    An offered name counts with arguments anywhere (not after "called"/"used"...), and with
    none when it stands alone on its line or ``wrapped`` is set; another name counts only as a
    keyword-only call that is the whole payload. ``def name(`` and the like are definitions.
    """
    cands: list[Cand] = []
    matches = 0
    inert: list[tuple[int, int]] | None = None if wrapped else []  # read on the first call that needs it
    payload_start = len(text) - len(text.lstrip().lstrip("[").lstrip())
    for m in _PY_CALL.finditer(text):
        start = m.start()
        if _dotted_tool(m.group(1), tool_names) not in tool_names and start != payload_start:
            continue  # another name counts only as the whole payload: `print(1)` lines cost nothing
        matches += 1
        if matches > 4 * MAX_CANDIDATES or len(cands) >= MAX_CANDIDATES:
            break
        if any(a <= start < b for a, b in taken):
            continue
        if inert is None:
            inert = _inert_spans(text)
        if any(a <= start < b for a, b in inert):
            continue  # inside a comment or a string literal of the code
        line_start = text.rfind("\n", 0, start) + 1
        if _DEFINITION.search(text[line_start:start]):
            continue  # `def list_tickets():` defines a function; it does not call the tool
        cand = _pythonic_at(text, m, line_start, tool_names, schemas, wrapped=wrapped, tools_known=tools_known)
        if cand is not None:
            cands.append(cand)
            taken.append((cand.start, cand.end))
    return cands


def _pythonic_at(  # noqa: PLR0913 - one candidate's context: the match, its line and the same flags as the caller
    text: str, m: re.Match[str], line_start: int, tool_names: frozenset[str], schemas: Mapping[str, Any], *, wrapped: bool,
    tools_known: bool,
) -> Cand | None:  # fmt: skip
    start, name = m.start(), m.group(1)
    name = _dotted_tool(name, tool_names)
    offered = name in tool_names
    if not offered and "." in name:
        return None
    end = _paren_end(text, m.end() - 1, min(len(text), start + MAX_PYTHONIC_CHARS))
    cut = end < 0 and offered and len(text) - start <= MAX_PYTHONIC_CHARS and (wrapped or _opens_line(text, line_start, start))
    src = close_cut_call(text[start:]) if cut else (text[start:end] if end >= 0 else None)
    if src is None:
        return None
    end = len(text) if cut else end
    if not offered and not _whole_payload(text, src):
        return None  # an unknown name counts only when the call is the whole payload
    node = parse_call(src)
    if node is None:
        return None
    if not offered and (node.args or not node.keywords):
        return None  # unknown names: keyword-only calls
    isolated = line_bounds(text, start, end if text[end : end + 1] != ";" else end + 1)
    has_args = bool(node.args or node.keywords)
    if offered and not isolated and not wrapped and (not has_args or _PAST_TENSE.search(text[line_start:start])):
        return None  # "I used list_files() earlier" is prose, not a call
    if offered and not isolated and not wrapped and _mentioned(text, start, end, line_start):
        return None  # "I did not call write_file(...)", "you can call read_file(...)", "`read_file(path)` returns..."
    if offered and not has_args and not isolated and not _statement(text, start, end, line_start):
        return None  # "Here I call list_files() for you" in a wrapper is prose
    args, errors = _pythonic_args(node, schema_properties(schemas[name]) if name in schemas else None)
    repaired = cut
    if not node.keywords and len(node.args) == 1 and isinstance(node.args[0], ast.Dict):
        value, ok = _literal_node(node.args[0])
        if not ok:  # list_files({path: '.'}): a JavaScript object, whose bare keys the narrow repair quotes
            value = repair(_source(node.args[0]))
            ok = repaired = isinstance(value, dict)
        if ok and isinstance(value, dict):
            args, errors = value, []  # read_file({"path": "a.txt"}): the dict is the arguments
    return Cand(start, end, "pythonic", [RawCall(name, args, False)], pseudo=code_pseudo(errors),
                excerpt=short(src), foreign=True, errors=errors, repaired=repaired)  # fmt: skip


_TOOL_NAMESPACES = frozenset({"functions", "function", "default_api", "tools", "tool", "api"})


def _dotted_tool(name: str, tool_names: frozenset[str]) -> str:
    """The offered tool a dotted name calls (``functions.read_file``, ``default_api.read_file``,
    Llama's ``get_weather.call``), else the name unchanged (``re.search`` is not the tool ``search``)."""
    if "." not in name or name in tool_names:
        return name
    namespace, _, rest = name.partition(".")
    if namespace in _TOOL_NAMESPACES and rest in tool_names:
        return rest
    if name.endswith(".call") and name[: -len(".call")] in tool_names:
        return name[: -len(".call")]
    return name


def call_expression(src: str, schemas: Mapping[str, Any]) -> tuple[str, dict[str, Any], list[str]] | None:
    """``(name, arguments, errors)`` of one call expression written alone (``json_spec_list_keys(data)``
    as a ReAct action), or None when ``src`` is not one; a code argument is kept as its source text
    with an error for it (as in :func:`pythonic_candidates`)."""
    if len(src) > MAX_PYTHONIC_CHARS or not _PY_CALL.match(src):
        return None
    node = parse_call(src)
    if node is None or not isinstance(node.func, (ast.Name, ast.Attribute)):
        return None
    name = _source(node.func)
    args, errors = _pythonic_args(node, schema_properties(schemas[name]) if name in schemas else None)
    return name, args, errors


def _mentioned(text: str, start: int, end: int, line_start: int) -> bool:
    """Whether a call written in prose is only mentioned, not attempted: quoted, documented ("the
    `read_file(path)` tool returns..."), offered as a question ("I can run x(...) next. Shall I?"),
    or negated, addressed to the reader or given as an example in its own clause."""
    before, after = text[start - 1 : start], text[end : end + 1]
    if before in "\"'" and before and after == before:
        return True  # quoted: "write_file(...)"
    if _DOCUMENTED_AFTER.match(text, end) or _OFFER_AFTER.match(text, end):
        return True
    window = max(line_start, start - 300)
    head = text[window:start].replace("e.g.", "eg_ ").replace("i.e.", "ie_ ")  # same length: positions hold
    clause = max((m.end() for m in _CLAUSE_START.finditer(head)), default=0)
    return _NOT_DOING.search(head, clause) is not None


def _inert_spans(code: str) -> list[tuple[int, int]]:
    """Comments and string literals of Python code (a call written there is not run); ``[]`` for text
    that is not Python (``I'll run: list_files(...)`` in a plain fence is not a string literal)."""
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    spans: list[tuple[int, int]] = []
    lines = [0]
    for line in code.splitlines(keepends=True):
        lines.append(lines[-1] + len(line))
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type in (tokenize.COMMENT, tokenize.STRING):
                (r0, c0), (r1, c1) = tok.start, tok.end
                spans.append((lines[r0 - 1] + c0, lines[r1 - 1] + c1))
    except (tokenize.TokenError, IndentationError, SyntaxError, IndexError):
        pass  # not Python: the spans found so far
    return spans


def _opens_line(text: str, line_start: int, start: int) -> bool:
    """Whether a call cut by the end of the text starts its line as a statement would, not in a sentence."""
    return _STATEMENT_HEAD.fullmatch(text[line_start:start].strip()) is not None


def _statement(text: str, start: int, end: int, line_start: int) -> bool:
    """Whether the call is a statement, an assignment's value or an argument of other code (``list(list_tickets())``)."""
    before = text[line_start:start].strip()
    after_end = text.find("\n", end)
    after = text[end : len(text) if after_end < 0 else after_end].strip()
    nested = before.endswith(("(", ","))  # an invocation inside other code is a call attempt
    return nested or (not before or _STATEMENT_HEAD.fullmatch(before) is not None) and after in ("", ";", ")", "]")


_STATEMENT_HEAD = re.compile(r"(?:(?:let|const|var|val|auto)[ \t]+)?(?:[\w.\[\], ]+=[ \t]*)?(?:return[ \t]*)?(?:await)?|\[")
"""What may stand before a call that is a statement: an assignment (``let w = ``, ``files = ``), ``return``, ``await``."""


def _pythonic_args(node: ast.Call, props: list[str] | None) -> tuple[dict[str, Any], list[str]]:
    """The arguments of a parsed call (positional ones named after ``props``, the tool's properties, or None when it
    is not offered) and one error per code argument and per positional argument to an offered tool that declares no
    property.

    A code argument is kept as its source text: it was given, so it is not a missing argument.
    """
    args: dict[str, Any] = {}
    errors: list[str] = []
    names = props or []
    named = [(names[i] if i < len(names) else f"arg{i}", arg) for i, arg in enumerate(node.args)]
    for kw in node.keywords:
        if kw.arg is None:
            errors.append("**kwargs expansion is code, not a literal")
        else:
            named.append((kw.arg, kw.value))
    errors += [f"{key} {NO_PROPERTY}" for key, _arg in named[: len(node.args)] if props == []]  # offered, no property
    for key, arg in named:
        value, ok = _literal_node(arg)
        args[key] = value if ok else _partial_literal(arg, 0)
        if not ok:
            errors.append(f"argument {key!r} is code, not a literal")
    return args, errors


def code_pseudo(errors: list[str]) -> list[str]:
    """``["function_call"]`` when an argument of a call expression is code (an error of :func:`_pythonic_args` says so)."""
    return ["function_call"] if any(e.endswith("not a literal") for e in errors) else []


def _partial_literal(node: ast.AST, depth: int) -> Any:
    """A code argument's value: a dict or list display keeps its shape (so the schema still judges its type), with
    each part that is code kept as its source text (``{"k": key_fact}`` is ``{"k": "key_fact"}``)."""
    value, ok = _literal_node(node)
    if ok:
        return value
    if depth < MAX_DEPTH and isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        return {
            str(_partial_literal(k, depth + 1)): _partial_literal(v, depth + 1)
            for k, v in zip(node.keys, node.values, strict=True)
            if k is not None
        }
    if depth < MAX_DEPTH and isinstance(node, (ast.List, ast.Tuple)):
        return [_partial_literal(v, depth + 1) for v in node.elts]
    return _source(node)


def _source(node: ast.AST) -> str:
    try:
        return ast.unparse(node)[:MAX_PYTHONIC_CHARS]
    except (ValueError, RecursionError):
        return "<code>"


def _literal_node(node: ast.AST) -> tuple[Any, bool]:
    try:
        return jsonable(ast.literal_eval(node)), True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None, False


def wrapped_json(text: str, start: int, end: int, json_start: int, name: str, *, excerpt_end: int) -> Cand:
    """A call whose name sits in vendor markup around a JSON object of arguments (``wrapper``)."""
    value, json_end, repaired = _json_value(text, json_start)
    rest = text[json_end:end]
    junk = bool(re.sub(r"<[^>]*>|<\|[^|]*\|>|<｜[^｜]*｜>|```|\s", "", rest))  # anything but markup after the object
    if value is FAIL or junk:
        return Cand(start, max(end, json_end), "invalid", [], excerpt=short(text[start:excerpt_end]), wrapper=True)
    return Cand(start, max(end, json_end), "tagged", [RawCall(name, value, False)], repaired=repaired,
                excerpt=short(text[start:excerpt_end]), wrapper=True)  # fmt: skip


# --------------------------------------------------------------------------- vendor headers

_HEADERS = (
    # gpt-oss harmony: "<|start|>assistant<|channel|>commentary to=functions.x <|constrain|>json<|message|>{...}<|call|>",
    # also with the special tokens stripped: "commentary to=functions.x json{...}"
    re.compile(
        r"(?:<\|start\|>\s*assistant\s*)?(?:(?:<\|channel\|>\s*)?(?:commentary|analysis)\s+to=(?:functions\.)?|to=functions\.)"
        r"(?P<name>[^\s<{]+(?:\s[^\s<{|]+){0,3}?)\s*(?:<\|constrain\|>\s*)?(?:json)?\s*(?:<\|message\|>)?\s*(?=[{\"])"
    ),  # fmt: skip
    # Kimi K2: "<|tool_call_begin|>functions.x:0<|tool_call_argument_begin|>{...}<|tool_call_end|>"
    re.compile(
        r"(?:<\|tool_calls_section_begin\|>\s*)?<\|tool_call_begin\|>\s*(?:functions\.)?(?P<name>[\w.-]+)(?::\d+)?\s*"
        r"<\|tool_call_argument_begin\|>\s*(?=[{\"])"
    ),  # fmt: skip
    # DeepSeek V3/R1: "<｜tool▁call▁begin｜>function<｜tool▁sep｜>x\n```json\n{...}\n```<｜tool▁call▁end｜>"
    re.compile(
        r"(?:<｜tool▁calls▁begin｜>\s*)?<｜tool▁call▁begin｜>\s*\w*\s*<｜tool▁sep｜>\s*(?P<name>[\w.-]+)\s*(?:```(?:json)?\s*)?(?=\{)"
    ),
    # Mistral (v11+): "[TOOL_CALLS]x[ARGS]{...}" (also with a [CALL_ID]...)
    re.compile(r"(?:\[TOOL_CALLS\]\s*)?(?<![\w.-])(?P<name>[\w.-]{1,128}+)\s*(?:\[CALL_ID\]\s*\w+\s*)?\[ARGS\]\s*(?=\{)"),
    # "<function_call><name>x</name><arguments>{...}</arguments>" and the like
    re.compile(r"<name>\s*(?P<name>[\w.-]+)\s*</name>\s*(?:<(?:arguments|parameters|args)>\s*)?(?=\{)"),
)
_HEADER_NEEDLES = ("to=", "<|tool_call_begin|>", "<｜tool▁sep｜>", "[ARGS]", "<name>")
"""For each of :data:`_HEADERS`, a literal that every match contains."""
_HEADER_END = re.compile(r"\s*(?:```\s*)?(?:<\|call\|>|<\|tool_call_end\|>|<\|tool_calls_section_end\|>|<｜tool▁call▁end｜>"
                         r"|<｜tool▁calls▁end｜>|</(?:arguments|parameters|args)>)*")  # fmt: skip
_KEY_VALUE = re.compile(
    r"^[ \t]*(?P<name>[A-Za-z_][\w.-]*)(?P<args>(?:[ \t]+[A-Za-z_]\w*=(?>\"[^\"\n]*\"|'[^'\n]*'|[^\s\"']\S*))++)[ \t]*$", re.M
)
_KEY_VALUE_ARG = re.compile(r"(?<!\w)([A-Za-z_]\w*+)=(?:\"([^\"\n]*)\"|'([^'\n]*)'|([^\s\"']\S*))")
_SELF_CLOSING = re.compile(
    r"^[ \t]*<(?P<name>[A-Za-z_][\w.-]*)(?P<args>(?:[ \t]+[A-Za-z_]\w*=(?:\"[^\"\n]*\"|'[^'\n]*'))*)[ \t]*/>[ \t]*$", re.M
)


def key_value_candidates(text: str, tool_names: frozenset[str], *, tools_known: bool) -> list[Cand]:
    """A tool's name followed by ``key="value"`` pairs on one line (``read_file file="a.txt"``), or a
    self-closing tag on its own line (``<get_location/>``, ``<read_file path="a.txt"/>``): the model's own notation.

    The name must be offered, or (tools not known) look like a function name (``read_file``).
    """
    cands: list[Cand] = []
    for m in heapq.merge(_KEY_VALUE.finditer(text), _SELF_CLOSING.finditer(text), key=lambda m: m.start()):
        name = m.group("name")
        if len(cands) >= MAX_CANDIDATES or not (name in tool_names or (not tools_known and "_" in name)):
            continue
        args = {a.group(1): next(v for v in a.groups()[1:] if v is not None) for a in _KEY_VALUE_ARG.finditer(m.group("args"))}
        cands.append(
            Cand(
                m.start("name"),
                m.end(),
                "tagged",
                [RawCall(m.group("name"), args, False)],
                excerpt=short(m.group()),
                foreign=True,
            )
        )
    return cands


_ARROW = re.compile(r"\{\s*tool\s*=>\s*[\"']([\w.-]+)[\"']")


_LEADING_NAME = re.compile(r"\A\s*+(?P<name>[A-Za-z_][\w.-]{0,127}+)[ \t]*(?=\{)")


def vendor_candidates(text: str, *, wrapped: bool = False) -> list[Cand]:
    """Vendor headers around JSON arguments, arrow-notation calls, and (``wrapped``) a name glued to the JSON object
    at the start of a wrapper (Mistral's ``[TOOL_CALLS]x{...}`` with its ``[ARGS]`` dropped), by position."""
    cands: list[Cand] = []
    for needle, pattern in zip((*_HEADER_NEEDLES, ""), (*_HEADERS, _LEADING_NAME), strict=True):
        if needle not in text or (not needle and not wrapped):  # a literal every match holds: most replies skip the regex
            continue
        pos = 0
        while len(cands) < MAX_CANDIDATES:
            m = pattern.search(text, pos)
            if m is None:
                break
            json_start = m.end()
            if text[json_start] == '"':  # a stringified argument object: keep it a string
                end = string_end(text, json_start, '"')
                end = len(text) if end < 0 else end + 1
                cand = Cand(m.start(), end, "tagged", [RawCall(m.group("name"), loads(text[json_start:end]), False)],
                            excerpt=short(text[m.start() : end]), wrapper=True)  # fmt: skip
            else:
                _value, json_end, _ = _json_value(text, json_start)
                if pattern is _LEADING_NAME and not isinstance(_value, dict):
                    break  # `function {name} {...}` in a fence is code, not a name glued to arguments
                tail = _HEADER_END.match(text, json_end)
                end = tail.end() if tail else json_end
                cand = wrapped_json(text, m.start(), end, json_start, m.group("name"), excerpt_end=end)
            cands.append(cand)
            pos = max(cand.end, m.end() + 1)
    pos = 0
    while len(cands) < MAX_CANDIDATES and (m := _ARROW.search(text, pos)):
        end, _closed, _depth = scan_balanced(text, m.start(), min(len(text), m.start() + MAX_REPAIR_CHARS))
        cands.append(
            Cand(m.start(), end, "tagged", [RawCall(m.group(1), None, True)], excerpt=short(text[m.start() : end]), foreign=True)
        )
        pos = max(end, m.end())  # the next arrow call starts after this one: each character is scanned once
    cands += _gemma_candidates(text, MAX_CANDIDATES - len(cands))
    return sorted(cands, key=lambda c: c.start)


_GEMMA_CALL = re.compile(r"(?<![\w.:-])call:(?P<name>[A-Za-z_][\w.-]*)[ \t]*(?=\{)")
_GEMMA_QUOTE = '<|"|>'
"""Gemma 4's string delimiter inside its call syntax (``{location:<|"|>Paris<|"|>}``)."""


def _gemma_candidates(text: str, room: int) -> list[Cand]:
    """Gemma 4's own call syntax ``call:name{key:value}`` (inside ``<|tool_call>`` ... ``<tool_call|>``, or left bare
    when a server stripped the markers): a call in a vendor's syntax (``foreign``); its bare keys are a repair."""
    cands: list[Cand] = []
    pos = 0
    while "call:" in text and len(cands) < room and (m := _GEMMA_CALL.search(text, pos)):
        end, closed, _depth = scan_balanced(text, m.end(), min(len(text), m.end() + MAX_REPAIR_CHARS))
        body = text[m.end() : end].replace(_GEMMA_QUOTE, '"')
        value = loads(body) if closed else FAIL
        repaired = value is FAIL
        value = repair(body) if repaired else value
        excerpt = short(text[m.start() : end])
        if isinstance(value, Mapping):
            cands.append(Cand(m.start(), end, "tagged", [RawCall(m.group("name"), value, False)], repaired=repaired,
                              excerpt=excerpt, foreign=True))  # fmt: skip
        else:
            cands.append(Cand(m.start(), end, "invalid", [], excerpt=excerpt, foreign=True))
        pos = max(end, m.end() + 1)
    return cands
