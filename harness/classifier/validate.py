"""Offered tools, structured calls and validation: unknown tool names and JSON Schema violations.

Reads the tool definitions (``{name: parameters schema}``), normalizes the server's own
``tool_calls`` and raw argument values into :class:`~harness.classifier.types.ToolCall`
arguments, and judges every call against the offered tools (the ``unknown_tool`` /
``schema_violation`` step). Validators are cached by schema text.
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import re
import warnings
from collections.abc import Mapping
from typing import Any

import jsonschema

from harness.classifier.jsonscan import FAIL, literal, loads, pseudo_code, repair, scan_balanced
from harness.classifier.schemakw import (
    BUDGET,
    BUDGETED_KEYWORDS,
    MAX_PATTERN_CHECKS,
    PATTERN_BUDGET_S,
    PatternBudget,
    PatternTimeout,
    budgeted_search,
)
from harness.classifier.types import (
    MAX_CANDIDATES,
    MAX_REPAIR_CHARS,
    UNPARSED_ARGUMENTS,
    BoundedMemo,
    ToolCall,
    content_key,
    get,
    is_listed,
    jsonable,
    short,
)

__all__ = [
    "MAX_PATTERN_CHECKS",
    "NO_PROPERTY",
    "PATTERN_BUDGET_S",
    "args_from_raw",
    "pairs_in",
    "shown_pairs",
    "mended_name",
    "offered_tools",
    "schema_properties",
    "schema_types",
    "MAX_STRUCTURED_CALLS",
    "structured_cap_step",
    "structured_calls",
    "structured_overflow",
    "validation_step",
]

_MAX_VALIDATION_ERRORS = 10
NO_PROPERTY = "is a positional argument with no property to fill"
"""The end of the error of a positional argument to a tool that declares no property (``arg0 is a positional ...``)."""
# --------------------------------------------------------------------------- schema helpers

_VALIDATORS: BoundedMemo[bytes, Any] = BoundedMemo(257)
_NOT_HELD = object()


def schema_properties(schema: Any) -> list[str]:
    """The string property names of an object schema, in declaration order (``[]`` otherwise)."""
    if (type(schema) is dict or isinstance(schema, Mapping)) and isinstance(schema.get("properties"), Mapping):
        return [k for k in schema["properties"] if isinstance(k, str)]
    return []


def schema_types(schema: Any) -> dict[str, Any]:
    """``{property: declared "type"}`` of an object schema (``{}`` otherwise)."""
    if not (isinstance(schema, Mapping) and isinstance(schema.get("properties"), Mapping)):
        return {}
    return {k: v.get("type") for k, v in schema["properties"].items() if isinstance(v, Mapping)}


@functools.cache
def _budgeted(cls: Any) -> Any:
    """``cls`` (a jsonschema validator class) extended with :data:`BUDGETED_KEYWORDS`, made once per class."""
    return jsonschema.validators.extend(cls, BUDGETED_KEYWORDS)


def _validator(schema: Any) -> Any:
    """A cached jsonschema validator, or ``None`` when the schema itself is invalid.

    Cached by ``marshal.dumps(schema, 2)``: exact built-in types only (a schema holding anything else is built afresh
    each time), and two schemas share a key only when they are equal in every type and key order, as the validator's
    verdicts and the order of its errors are (was the sorted JSON text, which gave a schema with a ``required`` tuple,
    one jsonschema refuses, the validator of the equal list's, or the reverse, and a schema its keys in another order
    the other's error order). A validator is built over a private deep copy of the schema, so a schema its owner
    edits in place afterwards changes no cached validator (one built over the caller's objects validated an equal
    schema's calls by the edited one, and the enum memo kept the old members of an enum list edited in place)."""
    if not isinstance(schema, (Mapping, bool)):
        return None
    key = content_key(schema, 2)  # version 2: no back-references, so one value has one key
    if key is not None:
        held = _VALIDATORS.get(key, _NOT_HELD)  # one read: another thread may empty the memo between two
        if held is not _NOT_HELD:
            return held
    try:
        json.dumps(schema, sort_keys=True, default=str)  # a schema JSON cannot write is not validated
    except (TypeError, ValueError, RecursionError):
        return None
    try:
        own = copy.deepcopy(schema)
    except Exception:  # noqa: BLE001 - an object deepcopy refuses: validated as given
        own = schema
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls = jsonschema.validators.validator_for(own, default=jsonschema.Draft202012Validator)
            cls.check_schema(own)
            validator = _budgeted(cls)(own)
    except Exception:  # noqa: BLE001 - any broken schema just disables validation for that tool
        validator = None
    if key is not None:
        _VALIDATORS.keep(key, validator)
    return validator


_EXTRAS_DECIDED_BY = ("additionalProperties", "unevaluatedProperties", "allOf", "anyOf", "oneOf", "dependencies",
                      "dependentSchemas", "if", "$ref")  # fmt: skip
"""Keywords with which a schema says itself what other arguments it allows: then only the schema judges them."""


_PLAIN_SCHEMA_KEYS = frozenset({"type", "properties", "required", "description", "title"})
_PLAIN_PROPERTY_KEYS = frozenset({"type", "description", "title", "default"})
_PLAIN_TYPES: dict[Any, type] = {"string": str, "boolean": bool}
"""JSON Schema types whose check is one ``isinstance`` (jsonschema's own type checker for them)."""


def _plainly_valid(schema: Any, arguments: dict) -> bool:
    """Whether ``arguments`` certainly pass a plain object schema (``type``, ``properties`` of string or boolean
    type, ``required``; annotations aside) and name no other property: then :func:`_schema_errors` finds nothing,
    so neither jsonschema nor the unexpected-argument check need run. False decides nothing (the full check runs)."""
    if type(schema) is not dict or schema.get("type") != "object" or not schema.keys() <= _PLAIN_SCHEMA_KEYS:
        return False
    props, required = schema.get("properties", {}), schema.get("required", [])
    if type(props) is not dict or type(required) is not list or not all(key in arguments for key in required):
        return False
    for spec in props.values():
        if type(spec) is not dict or not spec.keys() <= _PLAIN_PROPERTY_KEYS:
            return False
    for key, value in arguments.items():
        spec = props.get(key)  # a property's spec (a plain dict, checked above), or None for an argument not named
        kind = _PLAIN_TYPES.get(spec.get("type")) if spec is not None and type(spec.get("type")) is str else None
        if kind is None or not isinstance(value, kind):
            return False
    return True


def _schema_errors(schema: Any, arguments: dict) -> list[str]:
    if _plainly_valid(schema, arguments):
        return []  # what _checked_errors finds then (a test holds them equal)
    return _checked_errors(schema, arguments)


def _checked_errors(schema: Any, arguments: dict) -> list[str]:
    """The schema's errors for ``arguments``: jsonschema's, then each argument the schema does not name."""
    errors: list[str] = []
    validator = _validator(schema)
    if validator is not None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for err in validator.iter_errors(arguments):
                    where = "/".join(str(p) for p in err.absolute_path)
                    errors.append(short(f"{where + ': ' if where else ''}{err.message}"))
                    if len(errors) >= _MAX_VALIDATION_ERRORS:
                        break
        except Exception:  # noqa: BLE001 - the tool's schema is broken (an unresolvable $ref): not the model's fault
            return errors
    if (type(schema) is dict or isinstance(schema, Mapping)) and isinstance(schema.get("properties"), Mapping):
        if not any(k in schema for k in _EXTRAS_DECIDED_BY):
            props = schema["properties"]
            patterns = schema.get("patternProperties")
            patterns = [p for p in patterns if isinstance(p, str)] if isinstance(patterns, Mapping) else []
            for key in arguments:
                if key in props:
                    continue
                try:
                    if any(budgeted_search(p, key) for p in patterns):
                        continue
                except PatternTimeout as exc:
                    errors.append(short(str(exc)))
                    continue
                errors.append(short(f"unexpected argument {key!r}"))
    return errors


# --------------------------------------------------------------------------- tools, structured calls


def offered_tools(tools: Any) -> dict[str, Any]:
    """``{name: parameters schema}`` from OpenAI-style (or bare) tool definitions (at most the first 1,000).

    Not memoised: computing it costs about 0.6 µs for three tools, and a memo keyed by the list's identity returned
    stale schemas when a tool was edited in place (red team, on ``tools_text``'s memo). The schemas returned are
    the definitions' own objects: read them, never change them."""
    offered: dict[str, Any] = {}
    if not is_listed(tools):
        return offered
    for tool in list(tools)[:1000]:
        fn = tool.get("function") if type(tool) is dict else get(tool, "function")  # get() of a plain dict, inline
        spec = fn if type(fn) is dict or isinstance(fn, Mapping) else tool
        if type(spec) is dict:
            name = spec.get("name")
            if isinstance(name, str) and name:
                params = spec.get("parameters")
                offered[name] = params if params is not None else spec.get("input_schema")
            continue
        name = get(spec, "name")
        if isinstance(name, str) and name:
            params = get(spec, "parameters")
            offered[name] = params if params is not None else get(spec, "input_schema")
    return offered


def args_from_raw(raw: Any, *, structured: bool) -> tuple[dict, list[str], set[str]]:
    """Normalize raw arguments; returns ``(arguments, errors, modes)``.

    ``modes`` may hold ``"pseudo:<pattern>"`` entries (code found in arguments that are not
    valid JSON) besides failure-mode names.
    """
    modes: set[str] = set()
    if raw is None:
        return {}, [], modes
    if type(raw) is dict or isinstance(raw, Mapping):
        return jsonable(raw), [], modes
    if isinstance(raw, str):
        if not raw.strip():
            return {}, [], modes
        if not structured:
            modes.add("stringified_arguments")
        value = loads(raw)
        if isinstance(value, str):  # double-encoded
            modes.add("stringified_arguments")
            value = loads(value)
        if value is FAIL and structured:
            value = _after_junk(raw)
            if value is not FAIL:
                modes.add("repaired_json")
        if value is FAIL:
            whole = _whole_object(raw)
            junk = len(whole) < len(raw.strip())
            value = FAIL if junk else literal(raw)
            if value is FAIL and not junk:
                value = repair(raw)
            if isinstance(value, Mapping):
                modes.add("repaired_json")
            else:
                modes.add("invalid_json")
                modes.discard("stringified_arguments")
                if whole:  # "df.shape[0]" for a code-running tool is the code it wanted; text after an object is no argument
                    modes.update(f"pseudo:{p}" for p in pseudo_code(whole))
                return {}, [UNPARSED_ARGUMENTS], modes
        if isinstance(value, Mapping):
            return jsonable(value), [], modes
        return {}, [f"arguments are a JSON {type(value).__name__}, not an object"], modes
    return {}, [f"arguments are a {type(raw).__name__}, not an object"], modes


_SHOWN_PAIR = re.compile(r'"([\w-]{1,64})"\s*:\s*"((?:[^"\\\n]|\\.){0,2000})"')


def pairs_in(text: str) -> dict[str, str]:
    """The complete ``"key": "string"`` pairs a broken text shows (a call object that no repair parses)."""
    return {m.group(1): m.group(2) for m in _SHOWN_PAIR.finditer(text[:MAX_REPAIR_CHARS])}


def shown_pairs(raw: Any, errors: list[str]) -> dict[str, str]:
    """The complete ``"key": "string"`` pairs of an argument string that no repair parsed (``{}`` otherwise): a broken
    object's arguments are read by the pairs they show, as its keys are."""
    if UNPARSED_ARGUMENTS not in errors or not isinstance(raw, str):
        return {}
    return pairs_in(raw)


def _whole_object(raw: str) -> str:
    """The object or array an argument string opens with, up to its closing bracket (the whole stripped text when
    unclosed; ``""`` when it opens with something else). Text after a complete object (``{"city": "Berlin"}`` then
    junk) is not repaired, since no repair removes text (``invalid_json``)."""
    text = raw.strip()
    if text[:1] not in ("{", "["):
        return ""
    end, _closed, _depth = scan_balanced(text, 0, len(text))
    return text[:end]


def _after_junk(raw: str) -> Any:
    """A JSON object after a short junk prefix the server's parser left in an argument string
    (``'<|python_tag|>{"path": "."}'``, ``'functions.list_files:0 {...}'``), else :data:`FAIL`."""
    start = raw.find("{", 1, 200)
    if start < 0:
        return FAIL
    value = loads(raw[start:])
    return value if isinstance(value, Mapping) else FAIL


def mended_name(name: str, tool_names: frozenset[str]) -> str | None:
    """The offered name inside a name the server's parser visibly mangled: repeated
    (``get_weatherget_weather``, ``get_weather.get_weather``) or prefixed (``functions.get_weather``).

    Returns None when ``name`` is offered or no offered name explains it.
    """
    if name in tool_names or not name:
        return None
    for prefix in ("functions.", "function.", "tools.", "tool."):
        if name.startswith(prefix) and name[len(prefix) :] in tool_names:
            return name[len(prefix) :]
    for tool in tool_names:
        rest = name
        for sep in ("", ".", "_", " ", ","):
            parts = rest.split(sep) if sep else None
            if parts and len(parts) > 1 and all(p == tool for p in parts):
                return tool
        if len(name) % len(tool) == 0 and len(name) > len(tool) and tool * (len(name) // len(tool)) == name:
            return tool
    return None


MAX_STRUCTURED_CALLS = MAX_CANDIDATES * 4
"""Structured calls read from one reply (128); the loop answers each one past it as refused, unrun."""


def structured_calls(tool_calls: Any) -> tuple[list[ToolCall], set[str]]:
    """The server's own ``tool_calls`` (OpenAI or Ollama shape) as ``(calls, argument modes)``; the first
    :data:`MAX_STRUCTURED_CALLS` only (:func:`structured_overflow` gives the rest)."""
    calls: list[ToolCall] = []
    modes: set[str] = set()
    if not is_listed(tool_calls):
        return calls, modes
    for item in list(tool_calls)[:MAX_STRUCTURED_CALLS]:
        if type(item) is not dict and not isinstance(item, Mapping):
            continue
        plain = type(item) is dict
        fn = item.get("function") if plain else get(item, "function")  # get() of a plain dict, inline
        spec = fn if type(fn) is dict or isinstance(fn, Mapping) else item
        read = spec.get if type(spec) is dict else lambda key, spec=spec: get(spec, key)
        name = read("name")
        raw = read("arguments")
        if raw is None:
            raw = read("parameters")
        explicit_null = raw is None and isinstance(spec, Mapping) and ("arguments" in spec or "parameters" in spec)
        args, errors, arg_modes = args_from_raw(raw, structured=True)
        if explicit_null:
            errors = ["arguments are null, not an object"]
        modes |= arg_modes
        call_id = item.get("id") if plain else get(item, "id")
        calls.append(
            ToolCall(
                name=name if isinstance(name, str) else "",
                arguments=args,
                source="structured",
                id=call_id if isinstance(call_id, str) else None,
                valid=not errors,
                errors=errors,
                shown=shown_pairs(raw, errors),
            )
        )
    return calls, modes


def structured_overflow(tool_calls: Any) -> list[ToolCall]:
    """The structured calls past :data:`MAX_STRUCTURED_CALLS`, read like the others; never acted on.

    Returns:
        One :class:`ToolCall` per call object after the 128th, in order (``[]`` for at most 128).
    """
    if not is_listed(tool_calls):
        return []
    rest = list(tool_calls)[MAX_STRUCTURED_CALLS:]
    chunks = (structured_calls(rest[i : i + MAX_STRUCTURED_CALLS])[0] for i in range(0, len(rest), MAX_STRUCTURED_CALLS))
    return [call for chunk in chunks for call in chunk]


def structured_cap_step(tool_calls: Any) -> tuple[set[str], dict[str, Any]]:
    """``multiple_calls`` with the cap as its detail, when the reply holds more than :data:`MAX_STRUCTURED_CALLS` calls.

    The detail is ``{"structured_calls": total, "acted_on": 128, "refused": total - 128}`` (call objects only).
    """
    listed = is_listed(tool_calls)
    if not listed or len(tool_calls) <= MAX_STRUCTURED_CALLS:
        return set(), {}
    refused = sum(isinstance(item, Mapping) for item in list(tool_calls)[MAX_STRUCTURED_CALLS:])
    if not refused:
        return set(), {}
    total = sum(isinstance(item, Mapping) for item in tool_calls)
    return {"multiple_calls"}, {"multiple_calls": {"structured_calls": total, "acted_on": total - refused, "refused": refused}}


# --------------------------------------------------------------------------- the validation step


_MAX_FUZZY_NAMES = 200
"""Above this many offered tools, the nearest name is looked up by case only (difflib is quadratic per name)."""


def _nearest_name(name: str, tool_names: frozenset[str]) -> str | None:
    """The offered name a wrong one was meant to be: same name in another case, else the closest."""
    lower = {t.lower(): t for t in tool_names}
    nearest = lower.get(name.lower())
    if nearest is None and len(tool_names) <= _MAX_FUZZY_NAMES:
        close = difflib.get_close_matches(name[:200], sorted(tool_names), n=1, cutoff=0.6)
        nearest = close[0] if close else None
    return nearest


_SPECIAL_TOKEN = re.compile(r"<\|[^|<>\s]{1,40}\|>|<｜[^｜<>\s]{1,40}｜>|</?[A-Za-z_][\w:-]{0,40}/?>|\[/?[A-Z_]{3,20}\]")
"""A token of the chat or tool-call template (``<|channel|>``, ``<|constrain|>``, GLM's ``</arg_value>``, Mistral's
``[ARGS]``): no tool is offered under a name holding one (fw-ai python-sdk#119)."""


def _nameless(calls: list[ToolCall]) -> tuple[set[str], dict[str, Any]]:
    """``unknown_tool`` for calls with no name at all, or a name holding chat-template special tokens (harmony's header
    misread as the name, ``assistant<|channel|>analysis``), judged even when the offered tools are not known: no tool
    is offered under no name, nor under such a name."""
    nameless = [call for call in calls if not call.name or _SPECIAL_TOKEN.search(call.name[:400])]
    for call in nameless:
        call.valid = False
        call.errors.append(f"unknown tool {call.name!r}")
    return ({"unknown_tool"}, {"unknown_tool": {call.name: None for call in nameless}}) if nameless else (set(), {})


def validation_step(calls: list[ToolCall], tools: Any, offered: Mapping[str, Any]) -> tuple[set[str], dict[str, Any]]:
    """``unknown_tool`` and ``schema_violation``: judge every call against the offered tools.

    Marks each failing call ``valid = False`` and appends its messages to ``call.errors`` (the
    calls are mutated in place). Nothing is judged when ``tools`` is not a list of definitions
    (the offered tools are not known).

    Returns:
        ``(modes, evidence)``: evidence ``{"unknown_tool": {name: nearest offered name or None},
        "schema_violation": [{"tool", "message"}]}`` for the modes found, and ``"mended_names":
        {name: offered name}`` for structured calls whose name the server visibly mangled (the
        lenient parser calls the offered tool; see :func:`mended_name`).
    """
    modes: set[str] = set()
    evidence: dict[str, Any] = {}
    if not is_listed(tools):
        return _nameless(calls)  # the offered tools are not known: only a call with no name is judged
    tool_names = frozenset(offered)
    BUDGET.set(PatternBudget())  # this reply's pattern checks start afresh
    unknown: dict[str, str | None] = {}
    violations: list[dict[str, str]] = []
    for call in calls:
        if call.name not in tool_names:
            mended = mended_name(call.name, tool_names) if call.source == "structured" else None
            nearest = mended or _nearest_name(call.name, tool_names)
            unknown[call.name] = nearest
            call.valid = False
            call.errors.append(f"unknown tool {call.name!r}" + (f"; nearest offered: {nearest!r}" if nearest else ""))
            if mended:
                evidence.setdefault("mended_names", {})[call.name] = mended
            continue
        if UNPARSED_ARGUMENTS in call.errors:
            continue  # no repair parsed the arguments (invalid_json): there is nothing to hold against the schema
        errors = _schema_errors(offered[call.name], call.arguments)
        errors += [e for e in call.errors if e.endswith("not an object")]  # [1, 2], 7, null: the shape itself is wrong
        if not schema_properties(offered[call.name]):  # list_tickets([...]): a positional argument with no property to fill
            flagged = " ".join(errors)  # "unexpected argument 'arg0'" when the schema declares properties: {}
            errors += [e for e in call.errors if e.endswith(NO_PROPERTY) and repr(e.split()[0]) not in flagged]
        if errors:
            call.valid = False
            call.errors.extend(errors)
            violations.extend({"tool": call.name, "message": e} for e in errors)
    if unknown:
        modes.add("unknown_tool")
        evidence["unknown_tool"] = unknown
    if violations:
        modes.add("schema_violation")
        evidence["schema_violation"] = violations[: _MAX_VALIDATION_ERRORS * 4]
    return modes, evidence
