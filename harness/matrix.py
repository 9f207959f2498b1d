"""The matrix: the axes a scenario is run over, a scenario's defaults, and the CLI's overrides.

A scenario file declares its default axes in ``[matrix]`` (:class:`Matrix`); the CLI flags
(:class:`MatrixOverrides`) replace any axis for every scenario (:meth:`Matrix.merge`). Both are
checked by the one set of value rules here (:func:`value_problem`), so a TOML file and a flag
refuse the same values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from harness.backends import parse_model_spec
from harness.errors import UsageError
from harness.vocab import DEFAULT_THINK, PARSER_POLICIES, THINK_SETTINGS, TOOL_MODES, ParserPolicy, Think, ToolMode

__all__ = ["AXES", "DEFAULT_MODEL", "MAX_REPEATS", "MAX_SEED", "Matrix", "MatrixOverrides", "expected_value", "value_problem"]

DEFAULT_MODEL = "embedded:smollm2-135m"
MAX_SEED = 2**31 - 1
"""Seeds are sent as ``seed + repetition``; both stay well inside every server's integer range."""
MAX_REPEATS = 10_000

AXES = ("models", "temperatures", "repeats", "seeds", "tool_modes", "parsers", "think", "streams")
"""The matrix axes, as named in a scenario's ``[matrix]`` table."""
_FLAGS = {"models": "--model", "temperatures": "--temperature", "repeats": "--repeats", "seeds": "--seed",
          "tool_modes": "--tool-mode", "parsers": "--parser", "think": "--think", "streams": "--stream"}  # fmt: skip


def _integer(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _temperature(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf  # also refuses NaN


_RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "models": ("a model spec string", lambda v: isinstance(v, str) and bool(v)),
    "temperatures": ("a finite number >= 0", _temperature),
    "repeats": (f"an integer from 1 to {MAX_REPEATS}", lambda v: _integer(v, 1, MAX_REPEATS)),
    "seeds": (f"an integer from 0 to {MAX_SEED}", lambda v: _integer(v, 0, MAX_SEED)),
    "tool_modes": (f"one of {', '.join(TOOL_MODES)}", lambda v: v in TOOL_MODES),
    "parsers": (f"one of {', '.join(PARSER_POLICIES)}", lambda v: v in PARSER_POLICIES),
    "think": (f"one of {', '.join(THINK_SETTINGS)}", lambda v: v in THINK_SETTINGS),
    "streams": ("true or false", lambda v: isinstance(v, bool)),
}


def expected_value(axis: str) -> str:
    """What one value of an axis must be, e.g. ``"a finite number >= 0"`` for ``temperatures``."""
    return _RULES[axis][0]


def value_problem(axis: str, value: Any) -> str | None:
    """Check one value of one axis (``repeats`` is a single value; the others are list items).

    Args:
        axis: one of :data:`AXES`.
        value: the value as given (any type).

    Returns:
        None when the value is allowed, else what was expected, e.g. ``"a finite number >= 0"``.
        Model specs are only checked to be non-empty strings here; :func:`harness.backends.parse_model_spec`
        checks their form.
    """
    expected, allowed = _RULES[axis]
    return None if allowed(value) else expected


@dataclass(frozen=True)
class Matrix:
    """A scenario's matrix axes; CLI flags override any of them (:meth:`merge`).

    Attributes:
        models: model spec strings.
        temperatures: sampling temperatures.
        repeats: repetitions per cell (>= 1).
        seeds: base seeds (an axis); repetition ``r`` is sent seed ``base + r``, so repeats
            are independent samples that are still reproducible.
        tool_modes: ``native`` and/or ``prompt``.
        parsers: ``strict`` and/or ``lenient``.
        think: ``default``, ``on`` and/or ``off``: whether the request asks the model to think
            (``default`` says nothing; see :data:`harness.vocab.Think`).
        streams: ``False`` (one complete reply per request) and/or ``True`` (streamed chunks, assembled).
    """

    models: tuple[str, ...] = (DEFAULT_MODEL,)
    temperatures: tuple[float, ...] = (0.0,)
    repeats: int = 1
    seeds: tuple[int, ...] = (0,)
    tool_modes: tuple[ToolMode, ...] = ("native",)
    parsers: tuple[ParserPolicy, ...] = ("lenient",)
    think: tuple[Think, ...] = (DEFAULT_THINK,)
    streams: tuple[bool, ...] = (False,)

    def merge(self, overrides: MatrixOverrides) -> Matrix:
        """This matrix with every axis the overrides set replaced.

        Raises:
            UsageError: an override value breaks :func:`value_problem` or a model spec is malformed.
        """
        overrides.check()
        changes: dict[str, Any] = {}
        for f in fields(overrides):
            value = getattr(overrides, f.name)
            if value is None or (f.name != "repeats" and not value):
                continue
            changes[f.name] = (
                value if f.name == "repeats" else tuple(float(v) for v in value) if f.name == "temperatures" else tuple(value)
            )
        merged = replace(self, **changes)
        merged.check_seeds()
        return merged

    def check_seeds(self) -> None:
        """Refuse base seeds whose repetitions overlap: two cells sending one seed are one sample counted twice.

        Raises:
            UsageError: e.g. base seeds 0 and 1 with 2 repeats both send seed 1; or the last repetition of the highest
                seed would send a seed above :data:`MAX_SEED`.
        """
        ordered = sorted(self.seeds)
        if ordered and ordered[-1] + self.repeats - 1 > MAX_SEED:
            raise UsageError(
                f"the base seed {ordered[-1]} with {self.repeats} repeats sends seed {ordered[-1] + self.repeats - 1}, "
                f"above {MAX_SEED} (repetition r sends seed + r); use a base seed of at most {MAX_SEED - self.repeats + 1}."
            )
        for low, high in zip(ordered, ordered[1:], strict=False):
            if high - low < self.repeats:
                raise UsageError(
                    f"the base seeds {low} and {high} with {self.repeats} repeats both send seed {high} (repetition r "
                    f"sends seed + r); space the seeds at least the repeats apart, e.g. {low} and {low + self.repeats}."
                )

    @property
    def size(self) -> int:
        """Planned runs of one scenario: the product of every axis' length and the repeats."""
        axes = (self.models, self.temperatures, self.seeds, self.tool_modes, self.parsers, self.think, self.streams)
        return self.repeats * math.prod(len(axis) for axis in axes)


@dataclass(frozen=True)
class MatrixOverrides:
    """Axes given on the command line; ``None`` (or an empty list) keeps the scenario's own axis.

    The fields are :class:`Matrix`'s, each optional: a typed overlay rather than a dict, so a
    misspelt axis fails at construction.

    Attributes:
        models: model spec strings.
        temperatures: sampling temperatures.
        repeats: repetitions per cell.
        seeds: base seeds.
        tool_modes: ``native`` / ``prompt``.
        parsers: ``strict`` / ``lenient``.
        think: ``default`` / ``on`` / ``off``.
        streams: ``False`` / ``True`` (``--stream off`` / ``on``).
    """

    models: Sequence[str] | None = None
    temperatures: Sequence[float] | None = None
    repeats: int | None = None
    seeds: Sequence[int] | None = None
    tool_modes: Sequence[ToolMode] | None = None
    parsers: Sequence[ParserPolicy] | None = None
    think: Sequence[Think] | None = None
    streams: Sequence[bool] | None = None

    def check(self) -> None:
        """Check every value given, with the same rules as a scenario's ``[matrix]`` table.

        Raises:
            UsageError: one sentence naming the flag, e.g. ``--temperature must be a finite number >= 0, got nan.``;
                or a malformed model spec.
        """
        for axis in AXES:
            given = getattr(self, axis)
            values = [] if given is None else [given] if axis == "repeats" else list(given)
            for value in values:
                problem = value_problem(axis, value)
                if problem is not None:
                    raise UsageError(f"{_FLAGS[axis]} must be {problem}, got {value!r}.")
                if axis == "models":
                    parse_model_spec(value)
