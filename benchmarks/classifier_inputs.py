"""The classifier's inputs in three groups, written to a JSON file that child processes of other code read.

Used by ``benchmarks/classifier_cost.py`` (time per call, this code against a baseline checkout) and
``benchmarks/labels_same.py`` (results byte for byte against a baseline checkout). Not a script.

Groups, each a list of :func:`harness.classifier.classify` keyword arguments
(``{"response", "tools", "history", "requires_tool"}``):

* ``matrix``: what the agent loop hands the classifier in ``benchmarks/matrix_scale.py``'s part 1:
  ``list_and_report`` replayed from its cassette (three structured tool calls, then a final answer), native
  tools, the history growing to 4 turns; captured from the real loop, one run.
* ``mix``: ``benchmarks/classifier_speed.py``'s realistic mix (its tools and 4-message history).
* ``corpus``: every reply of ``tests/corpus/entries/`` as ``harness classify`` (``classify_document``) reads it.

The loop hands the same tools list on every turn of a run, and the speed mix one list for every reply:
:func:`load_inputs` gives inputs that shared a tools list in the file one object again (the classifier caches the
tools' text by object identity).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GROUPS = ("matrix", "mix", "corpus")


def _module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def matrix_inputs(runs: int = 1) -> list[dict[str, Any]]:
    """The classifier's arguments on every turn of ``runs`` replayed ``list_and_report`` runs (4 turns each)."""
    from harness import loop

    captured: list[dict[str, Any]] = []
    classify = loop.classify

    def capturing(response, **kwargs):  # noqa: ANN001, ANN202 - the wrapped function's shape
        captured.append(copy.deepcopy({"response": response, **kwargs}))  # the loop appends to the history after the call
        return classify(response, **kwargs)

    loop.classify = capturing  # type: ignore[assignment]
    try:
        with tempfile.TemporaryDirectory() as folder:
            _module("matrix_scale").overhead(Path(folder), runs, quiet=True)
    finally:
        loop.classify = classify  # type: ignore[assignment]
    return captured


def mix_inputs() -> list[dict[str, Any]]:
    """``classifier_speed.py``'s mix: each reply kind with its tools and history."""
    speed = _module("classifier_speed")
    return [{"response": r, "tools": speed.TOOLS, "history": speed.HISTORY, "requires_tool": None} for r in speed.MIX.values()]


def corpus_inputs() -> list[dict[str, Any]]:
    """Every corpus entry's arguments, as ``classify_document`` derives them from the entry's document."""
    from harness.corpus import load_corpus

    out = []
    for entry in load_corpus(REPO / "tests" / "corpus" / "entries"):
        doc = entry.document()
        tools, messages, response = doc.get("tools"), doc.get("messages"), doc.get("response")
        out.append({"response": response if isinstance(response, dict) else {},
                    "tools": tools if isinstance(tools, list) else None,
                    "history": messages if isinstance(messages, list) else [],
                    "requires_tool": doc.get("requires_tool") if isinstance(doc.get("requires_tool"), bool) else None,
                    "id": entry.id})  # fmt: skip
    return out


def arguments(item: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :func:`harness.classifier.classify` in an input (its ``response`` and ``id`` aside)."""
    return {k: v for k, v in item.items() if k not in ("response", "id")}


def write_inputs(path: Path, matrix_runs: int = 1) -> dict[str, int]:
    """Write every group to ``path`` (JSON); returns ``{group: inputs}``."""
    groups = {"matrix": matrix_inputs(matrix_runs), "mix": mix_inputs(), "corpus": corpus_inputs()}
    path.write_text(json.dumps(groups, ensure_ascii=False), encoding="utf-8")
    return {name: len(items) for name, items in groups.items()}


def load_inputs(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The groups :func:`write_inputs` wrote; equal tools lists become one shared object in ``matrix`` and ``mix``
    (one run's turns, one mix), never across corpus entries."""
    groups = json.loads(path.read_text(encoding="utf-8"))
    for items in (groups["matrix"], groups["mix"]):
        shared: dict[str, Any] = {}
        for item in items:
            if item.get("tools") is not None:
                item["tools"] = shared.setdefault(json.dumps(item["tools"], sort_keys=True), item["tools"])
    return groups
