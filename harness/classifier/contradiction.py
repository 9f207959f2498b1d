"""``fabricated_tool_result`` rule 3: after a tool answered, names and values in the reply (or in its
call arguments) that no tool result, prompt or tool definition holds, or that contradict what a tool
returned (docs/failure-modes.md). The value comparisons are :mod:`harness.classifier.values`'."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import TypeVar

from harness.classifier.content import ContentResult
from harness.classifier.heuristics import FILE_TOKEN, History, path_values, string_values
from harness.classifier.readings import unhedged
from harness.classifier.types import MAX_REPAIR_CHARS, ToolCall
from harness.classifier.values import (
    TEMPERATURE,
    bare_numbers,
    norm,
    numbers,
    result_value,
    sky,
    temperature_given,
    temperatures,
)

__all__ = ["CONDITION", "COUNT", "contradictions"]

CONDITION = re.compile(
    r"\b(?:sunny|cloudy|overcast|rain(?:y|ing)?|drizzl(?:e|ing)|snow(?:y|ing)?|clear sk(?:y|ies)|fog(?:gy)?|windy|storm(?:y|s)?"
    r"|thunderstorms?|pleasant|humid(?:ity)?|breez(?:e|y)|showers?|partly cloudy|mild)\b",
    re.I,
)
_VALUE = re.compile(
    r"(?<![\w.])(?:\d{4}-\d{2}-\d{2}|(?:EUR|USD|GBP|€|\$|£)\s?\d[\d,]*(?:\.\d+)?|\d[\d,]*(?:\.\d+)?\s?(?:EUR|USD|GBP|€|%|km/h|mph)"
    r"|-?\d+(?:\.\d+)?\s?(?:°\s*[CF]?|℃|℉))",
    re.I,
)
_DIGIT = re.compile(r"\d")
"""What every :data:`_VALUE` match holds (each of its forms has a digit): a text without one states no value."""
_COUNT_WORD = r"(\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
_COUNT_SOURCE = (
    rf"(?:^|[.!?:]\s+|\b(?:there(?:'s| is| are| were| was)|shows?|lists?|listed|contains?|holds?|has|have|had|found|total:?"
    rf"|in total,?|all)\s+)(?:only\s+|exactly\s+|just\s+)?{_COUNT_WORD}\s+files?\b"
    rf"(?!\s+(?:are|is|were|was|have|has)\s+(?!present|there|listed|found|in\b))"
    rf"|\b{_COUNT_WORD}\s+files?\s+(?:in total|in (?:the|this|that) (?:current |working )?(?:directory|folder)|were (?:found|listed)"
    rf"|are (?:there|present|listed))\b"
)
_COUNT_START = r"(?=[.!?:]|\b[tslchfiaoejn\d])"
"""Where a :data:`COUNT` match can start: at ``[.!?:]``, or at a word's start that is the first letter of one of its
words (``there``, ``shows``, ``lists``, ``contains``, ``holds``, ``found``, ``in total``, ``all``, ``only``,
``exactly``, ``just``, a number word) or a digit (a ``^`` start is a word's start too: a number follows). Zero-width:
it changes no match, it only spares the other positions (a test holds it equal to the pattern without it)."""
COUNT = re.compile(rf"{_COUNT_START}(?:{_COUNT_SOURCE})", re.I | re.M)
"""A stated total of files ("There are 3 files", "3 files in the directory"), not a part of them ("2 files are Markdown")."""
_NUMBER_WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())}


def contradictions(claims: str, content: ContentResult, calls: list[ToolCall], past: History, tools: object) -> list[str]:
    """Names and values in the reply or its call arguments that no tool result, prompt or definition holds (rule 3).

    The sentences are checked whole first; only when something is found are the hedged ones
    dropped and the check repeated (most final answers repeat what the tools said, so the
    costlier sentence split is rarely needed).
    """
    found = _unexplained(claims, content, calls, past, tools)
    return _unexplained(unhedged(claims), content, calls, past, tools) if found else []


def _unexplained(claims: str, content: ContentResult, calls: list[ToolCall], past: History, tools: object) -> list[str]:  # noqa: PLR0913 - the claims and what explains them
    """Rule 3 on the given claims: see :func:`_contradictions`."""
    texts = [claims] + [v for call in calls for v in string_values(call.arguments, skip_paths=True)]
    if not any(texts):
        return []  # every check reads a name, value, sky, count or key in the texts: empty ones state none
    known = past.known(tools)
    own_paths = {value.replace("\\", "/").rsplit("/", 1)[-1].lower() for call in calls for _k, value in path_values(call)}
    found: list[str] = []
    seen: set[str] = set()
    results = "\n".join(past.tool_results)
    result_values: frozenset[str] | None = None
    known_norm = ""
    result_numbers: frozenset[float] = frozenset()
    result_temps: tuple[tuple[float, str | None], ...] = ()
    for text in texts:
        for m in FILE_TOKEN.finditer(text[:MAX_REPAIR_CHARS]):
            token = m.group(1).lower()
            if token not in seen and token not in own_paths and token not in known:
                seen.add(token)
                found.append(m.group(1))
        for m in _VALUE.finditer(text[:MAX_REPAIR_CHARS]) if _DIGIT.search(text, 0, MAX_REPAIR_CHARS) else ():
            value, normal = m.group(), norm(m.group())
            if value in seen:
                continue
            if len(seen) >= _MAX_VALUES:
                break  # bounded: a reply that states thousands of distinct values has been judged by then
            seen.add(value)
            if result_values is None:  # only replies that state values pay for reading the results' values
                result_values, result_numbers, result_temps = _result_values(results)
                known_norm = norm(known)
            temperature = TEMPERATURE.fullmatch(value.strip())
            if temperature and temperature_given(value, list(result_temps)):
                continue
            if not temperature and numbers(value) & result_numbers:
                continue  # the tool's number with a unit or a format of its own ("65%" for humidity 65, "4250" for 4,250.00)
            dated = bool(re.fullmatch(r"\d{4}-\d{2}-\d{2}", value))
            if dated and not any(re.fullmatch(r"\d{4}-\d{2}-\d{2}", v) for v in result_values):
                continue  # a date about nothing the tools handle (no result holds one) stays general knowledge
            measured = bool(temperature or dated)
            if (result_values or measured) and normal not in result_values and normal not in known_norm:
                found.append(f"value: {value}")
    conditions = _skies(results)
    stated = {f for c in CONDITION.findall(claims) if (f := sky(c))} if conditions else set()
    if conditions and stated - conditions:
        found.append(f"condition: {sorted(stated - conditions)[0]} (the tool said {', '.join(sorted(conditions))})")
    found += _count_mismatch(texts, past)
    found += _keyed_mismatch(texts, past)
    return found


def _memo(function: Callable[[str], _T]) -> Callable[[str], _T]:
    """``function`` of a text, memoized for texts of at most :data:`MAX_REPAIR_CHARS` characters (one tool result's
    cap), :data:`_MEMO` of them: a str key, so a hit is what ``function`` gives; at most a few MB held. ``.memo`` is
    the cache (``memo.cache_clear()`` empties it)."""
    memo = functools.lru_cache(maxsize=_MEMO)(function)

    def read(text: str) -> _T:
        return memo(text) if len(text) <= MAX_REPAIR_CHARS else function(text)

    read.memo = memo  # type: ignore[attr-defined]
    return read


_MEMO = 64
"""Entries of each memo of the tool results' text below."""
_T = TypeVar("_T")


@_memo
def _result_values(results: str) -> tuple[frozenset[str], frozenset[float], tuple[tuple[float, str | None], ...]]:
    """The values (normalized), bare numbers and temperatures the tool results' text states."""
    return frozenset(norm(v) for v in _VALUE.findall(results)), frozenset(bare_numbers(results)), tuple(temperatures(results))


@_memo
def _skies(results: str) -> frozenset[str]:
    """The skies the weather words of the tool results' text describe."""
    return frozenset(f for c in CONDITION.findall(results) if (f := sky(c)))


@_memo
def _result_pairs(text: str) -> tuple[tuple[str, str], ...]:
    """The ``(key, value)`` scalars of one tool result (:func:`_scalars`), key lower-cased with spaces for
    underscores and value as lower-case text, in order."""
    return tuple((key.lower().replace("_", " "), str(v).lower()) for key, v in _scalars(result_value(text)))


@_memo
def _listing_length(text: str) -> int | None:
    """The number of names in a tool result that is a listing (a JSON list of strings, or an object whose one value is
    one), else None."""
    value = result_value(text)
    if isinstance(value, dict) and len(value) == 1:  # {"files": [...]}
        value = next(iter(value.values()))
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return len(value)
    return None


def _scalars(value: object, key: str = "", depth: int = 0) -> list[tuple[str, object]]:
    """The ``(key, value)`` pairs of a tool's result (JSON or a Python literal) whose value is a number or a one-word string."""
    if depth > 4:
        return []
    if isinstance(value, dict):
        return [p for k, v in list(value.items())[:100] for p in _scalars(v, str(k), depth + 1)]
    if isinstance(value, list):
        return [p for v in value[:100] for p in _scalars(v, key, depth + 1)]
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        or isinstance(value, str)
        and re.fullmatch(r"[\w.-]{1,30}", value)
    )
    return [(key, value)] if key and ok else []


_FILLER = r"(?:(?:about|around|approximately|roughly|nearly|almost|currently|now|only|just|a|an|the|very|quite|mostly|partly|light|heavy)\s+)*"


def _keyed_mismatch(texts: list[str], past: History) -> list[str]:
    """A value the reply gives for a key a tool returned ("humidity is 80" when it returned 65): numbers
    that differ (beyond rounding), one-word strings that differ. Only keys with one value in all the results."""
    pairs: dict[str, set[str]] = {}
    for index in range(max(0, len(past.tool_results) - 8), len(past.tool_results)):
        for key, v in _result_pairs(past.tool_results[index]):
            pairs.setdefault(key, set()).add(v)
    text = "\n".join(texts)[:MAX_REPAIR_CHARS]
    lowered = text.lower() if text.isascii() else None  # ASCII: a key matches case-insensitively only where it is lowered
    for key, values in list(pairs.items())[:100]:
        if len(values) != 1 or len(key) < 3 or (lowered is not None and key.isascii() and key.lower() not in lowered):
            continue
        given = next(iter(values))
        m = re.search(rf"\b{re.escape(key)}\b(?:\s+(?:is|was|of|at)|\s*[:=])\s+{_FILLER}[\"']?([\w.-]+)", text, re.I)
        near = text[m.start(1) : m.start(1) + 40].lower() if m else ""
        if m and given not in near and _differs(m.group(1).lower().rstrip("."), given):
            return [f"value: {key} {m.group(1)} (the tool said {given})"]
    return []


def _differs(stated: str, given: str) -> bool:
    try:
        a, b = float(stated), float(given)
    except ValueError:
        return not re.fullmatch(r"[\d.-]+", stated) and not re.fullmatch(r"[\d.-]+", given) and stated != given
    return abs(a - b) >= 1 and round(b) != a


_MAX_VALUES = 500
"""Distinct names and values of one reply checked against the tool results (each check reads the results' values)."""


def _count_mismatch(texts: list[str], past: History) -> list[str]:
    """A stated number of files that differs from the length of the last listing a tool returned."""
    counts = [m for text in texts if "file" in text.lower() for m in COUNT.finditer(text)]
    if not counts:
        return []
    listed = next((n for text in reversed(past.tool_results) if (n := _listing_length(text)) is not None), None)
    if listed is None:
        return []
    for m in counts:
        word = next(g for g in m.groups() if g).lower()
        number = int(word) if word.isdigit() else _NUMBER_WORDS.get(word)
        if number is not None and number != listed:
            return [f"count: {m.group()} (the listing held {listed})"]
    return []
