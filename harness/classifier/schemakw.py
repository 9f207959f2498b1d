"""JSON Schema keywords re-implemented with a time budget: ``pattern``, ``patternProperties`` and
``additionalProperties`` run their regexes with the ``regex`` module under :data:`PATTERN_BUDGET_S`
(jsonschema uses ``re``, which cannot be stopped); ``uniqueItems`` and ``enum`` compare canonical JSON
in a set. Used by :mod:`harness.classifier.validate`.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import regex
from jsonschema.exceptions import ValidationError

from harness.classifier.types import short

__all__ = [
    "BUDGET",
    "BUDGETED_KEYWORDS",
    "MAX_PATTERN_CHECKS",
    "PATTERN_BUDGET_S",
    "PatternBudget",
    "PatternTimeout",
    "budgeted_search",
]

PATTERN_BUDGET_S = 0.05
"""Time budget of one JSON-Schema ``pattern``/``patternProperties`` match; a pathological pattern
(``^(a|aa)+$``) is reported as a timed-out check instead of hanging the classifier."""
MAX_PATTERN_CHECKS = 2_000
"""Pattern matches per reply; further checks are skipped (one per key or array item would otherwise add up)."""


@dataclass
class PatternBudget:
    """What one reply's validation has spent: after a timed-out match, the others are not run."""

    checks: int = 0
    timed_out: bool = False


BUDGET: contextvars.ContextVar[PatternBudget] = contextvars.ContextVar("pattern_budget")


class PatternTimeout(Exception):
    def __init__(self, pattern: str) -> None:
        super().__init__(f"pattern {pattern[:80]!r} could not be checked within {PATTERN_BUDGET_S:g} s (timed out)")


def budgeted_search(pattern: str, text: str) -> bool:
    """``re.search`` semantics with the ``regex`` module and a time budget.

    Raises:
        PatternTimeout: the match ran past :data:`PATTERN_BUDGET_S`, or an earlier match of
            this reply did (so a reply costs at most one budget, however many keys or items).
    """
    budget = BUDGET.get(None) or PatternBudget()
    if budget.timed_out:
        raise PatternTimeout(pattern)
    budget.checks += 1
    if budget.checks > MAX_PATTERN_CHECKS:
        return True  # not checked: counts as a match, so no label rests on it
    try:
        return regex.search(pattern, text, timeout=PATTERN_BUDGET_S) is not None
    except TimeoutError:
        budget.timed_out = True
        raise PatternTimeout(pattern) from None
    except (regex.error, RecursionError, TypeError):
        return False


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "string"):
        return
    try:
        if not budgeted_search(pattern, instance):
            yield ValidationError(f"{instance!r} does not match {pattern!r}")
    except PatternTimeout as exc:
        yield ValidationError(str(exc))


def _pattern_properties(validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            try:
                matched = budgeted_search(pattern, key)
            except PatternTimeout as exc:
                yield ValidationError(str(exc))
                continue
            if matched:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    properties, patterns = schema.get("properties", {}), list(schema.get("patternProperties", {}))
    extras = []
    for key in instance:
        if key in properties:
            continue
        try:
            if any(budgeted_search(p, key) for p in patterns):
                continue
        except PatternTimeout as exc:
            yield ValidationError(str(exc))
            continue
        extras.append(key)
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        yield ValidationError(
            f"Additional properties are not allowed ({', '.join(repr(e) for e in sorted(extras, key=str))} unexpected)"
        )


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Any:
    """``uniqueItems`` in linear time: items compared by canonical JSON (jsonschema compares unhashable items pairwise)."""
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[str] = set()
    for item in instance:
        key = _canonical_value(item)
        if key in seen:
            yield ValidationError(f"{short(repr(instance), 80)} has non-unique elements")
            return
        seen.add(key)


def _enum(validator: Any, enums: Any, instance: Any, schema: Any) -> Any:
    """``enum`` by canonical JSON (a set lookup, not a scan of every member per value)."""
    if not isinstance(enums, list):
        return
    if _canonical_value(instance) not in _enum_set(enums):
        yield ValidationError(f"{short(repr(instance), 80)} is not one of {short(repr(enums), 80)}")


_ENUM_SETS: dict[int, tuple[list[Any], frozenset[str]]] = {}


def _enum_set(enums: list[Any]) -> frozenset[str]:
    cached = _ENUM_SETS.get(id(enums))
    if cached is not None and cached[0] is enums:
        return cached[1]
    members = frozenset(_canonical_value(e) for e in enums)
    if len(_ENUM_SETS) > 256:
        _ENUM_SETS.clear()
    _ENUM_SETS[id(enums)] = (enums, members)  # keeps the list alive, so its id stays its own
    return members


def _canonical_value(value: Any) -> str:
    """JSON Schema equality as a string: 1 == 1.0, true != 1, key order ignored."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, Mapping):
        return "{" + ",".join(sorted(f"{json.dumps(str(k))}:{_canonical_value(v)}" for k, v in value.items())) + "}"
    elif isinstance(value, list):
        return "[" + ",".join(_canonical_value(v) for v in value) + "]"
    return json.dumps(value, sort_keys=True, default=str)


BUDGETED_KEYWORDS = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
    "enum": _enum,
}
"""jsonschema keywords that run a regex, re-implemented with a time budget (jsonschema uses ``re``, which cannot be stopped)."""
