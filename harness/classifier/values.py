"""The values a text states: temperatures with their unit, numbers, and the sky a weather word describes.

Pure helpers for the fabrication rules in :mod:`harness.classifier.behaviour` (docs/failure-modes.md,
``fabricated_tool_result`` rule 3): what a reply states is compared with what the tools returned.
"""

from __future__ import annotations

import ast
import json
import math
import re

from harness.classifier.types import MAX_REPAIR_CHARS

__all__ = [
    "TEMPERATURE",
    "bare_numbers",
    "norm",
    "numbers",
    "result_value",
    "sky",
    "temperature_given",
    "temperature_spans",
    "temperatures",
]

_SKY_FAMILIES = {"sun": "clear", "clear": "clear", "cloud": "cloud", "overcast": "cloud", "rain": "rain", "drizzl": "rain",
                 "shower": "rain", "snow": "snow", "fog": "fog", "storm": "storm", "thunderstorm": "storm"}  # fmt: skip


def sky(condition: str) -> str | None:
    """The sky a condition word describes (``rainy``, ``raining`` and ``light drizzle`` are all ``rain``), or None
    for words that are not the sky (wind, humidity, "pleasant"), which a tool's condition cannot contradict."""
    for stem, family in _SKY_FAMILIES.items():
        if stem in condition.lower():
            return family
    return None


TEMPERATURE = re.compile(
    r"(?<![\d.])(?P<n2>-?\d++(?:\.\d++)?+)(?P<unit>\s*+(?:°\s*[CF]?|º\s*[CF]?|℃|℉|degrees?(?:\s+(?:celsius|fahrenheit|[CF]))?\b"
    r"|deg\b|[CF]\b))",
    re.I,
)
"""A temperature written with its unit (``17°C``, ``62 F``, ``21 degrees``, ``17C``): the one temperature vocabulary."""
_KEYED = re.compile(r"(?<!\w)(?P<key>\w*temp\w*)[\"']?\s*[:=]\s*[\"']?(?P<n1>-?\d++(?:\.\d++)?+)|" + TEMPERATURE.pattern, re.I)
"""A temperature after a key naming one (``"temperature_c": 17``, a Python repr's ``'temperature_c': 17``), or written
with its unit."""
_RESULT_TAG = re.compile(r"</?tool_response>")
_CONTAINER = re.compile(r"\s*[\[{]")
_JSON_STARTS = frozenset('{["-0123456789tfnNI')
"""The first characters of JSON values (``NaN`` and ``Infinity`` too: Python's json reads them)."""


def result_value(text: str) -> object | None:
    """The value a tool's result holds, read as JSON or, failing that, as a Python literal (a tool written in Python
    that returns ``str(dict)``: ``{'temperature_c': 17}``, ``['a.txt', 'b.txt']``); ``None`` when it is neither (plain
    text, an error line). Only a container (``{`` or ``[`` first) is read as a literal; ``ast.literal_eval`` parses
    literals and runs nothing. ``<tool_response>`` tags around the body are dropped first."""
    body = _RESULT_TAG.sub("", text[:MAX_REPAIR_CHARS]).strip()
    if body[:1] not in _JSON_STARTS:  # no JSON value starts so ("wrote 49 bytes"): json.loads would only raise
        return None  # nor does a container: that needs "{" or "[" first
    try:
        return json.loads(body)
    except ValueError:
        pass
    if not _CONTAINER.match(body):
        return None
    try:
        return ast.literal_eval(body)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def temperature_spans(text: str, *, keyed: bool = False) -> list[re.Match[str]]:
    """Where ``text`` states a temperature: with its unit, and with ``keyed`` also after a key naming one."""
    pattern = _KEYED if keyed else TEMPERATURE
    return [m for m, _ in zip(pattern.finditer(text[:MAX_REPAIR_CHARS]), range(1000), strict=False)]


def temperatures(text: str) -> list[tuple[float, str | None]]:
    """The temperatures ``text`` states, as ``(value, "C" | "F" | None)``: a number after a key naming a
    temperature (``"temperature_c": 17``) or before a temperature unit (``17°C``, ``62 F``)."""
    found: list[tuple[float, str | None]] = []
    for m in temperature_spans(text, keyed=True):
        if m.group("n1") is not None:
            key = m.group("key").lower()
            unit = "F" if key.endswith(("_f", "fahrenheit")) else "C" if key.endswith(("_c", "celsius")) else None
            found.append((float(m.group("n1")), unit))
        else:
            found.append((float(m.group("n2")), _unit(m.group("unit"))))
    return found


def _unit(text: str) -> str | None:
    text = text.upper()
    return "F" if "F" in text or "℉" in text else "C" if "C" in text or "℃" in text else None


def temperature_given(value: str, given: list[tuple[float, str | None]]) -> bool:
    """Whether a stated temperature is one ``given`` holds: the same number, that number rounded to
    fewer digits, or its °C/°F conversion rounded; a reply more precise than the tool is not a rounding."""
    stated = temperatures(value)
    if not stated:
        return False
    number, unit = stated[0]
    for value_given, unit_given in given:
        same_unit = unit is None or unit_given is None or unit == unit_given
        candidates = [value_given] if same_unit else []
        if unit and unit_given and unit != unit_given:
            candidates.append(value_given * 9 / 5 + 32 if unit == "F" else (value_given - 32) * 5 / 9)
        if any(math.isclose(number, c) or number in (round(c), round(c, 1)) for c in candidates):
            return True
    return False


def bare_numbers(text: str) -> set[float]:
    """Numbers written with no unit, currency, sign or date/time around them (``"humidity": 65``,
    ``humidity 65,``): the values a reply may restate with a unit of its own."""
    text = text[:MAX_REPAIR_CHARS]
    found = re.findall(r"(?<![\w.$€£#:/-])\d++(?:,\d{3})*+(?:\.\d+)?+(?![.,]\d|\s*[A-Za-z%°$€£]|[:/-]\d)", text)
    return {float(n.replace(",", "")) for n in found[:2000]}


def numbers(text: str) -> set[float]:
    """The numbers written in ``text`` (thousands separators dropped); dates are not numbers."""
    text = re.sub(r"\d{4}-\d{2}-\d{2}", " ", text[:MAX_REPAIR_CHARS])
    return {float(n.replace(",", "")) for n in re.findall(r"(?<![\w.])\d[\d,]*(?:\.\d+)?", text)[:2000]}


def norm(value: str) -> str:
    return re.sub(r"[\s,]", "", value.lower())
