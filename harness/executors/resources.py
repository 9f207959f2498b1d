"""``--ray-resources``: what one Ray actor of a model needs (parsed without importing Ray)."""

from __future__ import annotations

from collections.abc import Mapping

from harness.errors import UsageError

__all__ = ["DEFAULT_ACTORS", "DEFAULT_RESOURCES", "parse_ray_resources"]

DEFAULT_ACTORS = 2
"""Ray actors per model endpoint when ``--workers`` is not given."""
DEFAULT_RESOURCES: Mapping[str, float] = {"CPU": 0.5}
"""An actor's resources when ``--ray-resources`` names none for its model: half a CPU (its runs mostly wait)."""


def parse_ray_resources(values: list[str], models: list[str]) -> dict[str, dict[str, float]]:
    """``--ray-resources MODEL_SPEC=NAME:AMOUNT`` (repeatable) -> model spec -> resource name -> amount.

    Raises:
        UsageError: a value is malformed, names a model the matrix does not have, or an amount is not positive.
    """
    resources: dict[str, dict[str, float]] = {}
    for value in values:
        model, _, resource = value.rpartition("=")
        name, _, amount = resource.rpartition(":")
        try:
            number = float(amount)
        except ValueError:
            number = 0.0
        if not model or not name or not number > 0:
            raise UsageError(f"--ray-resources {value!r}: write MODEL_SPEC=NAME:AMOUNT, e.g. embedded:smollm2-135m=GPU:1.")
        if model not in models:
            raise UsageError(f"--ray-resources {value!r}: the matrix has no model {model!r}.")
        resources.setdefault(model, {})[name] = number
    return resources
