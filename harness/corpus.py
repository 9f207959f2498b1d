"""The real-output corpus: labelled replies read from files, and the classifier's agreement with them.

A corpus is a folder of JSON files, one reply each (format: ``tests/corpus/README.md``): the
reply, the tools and history it was produced with, the scenario's ``requires_tool`` flag, and
the failure modes a person assigned from ``docs/failure-modes.md`` without seeing the
classifier's output. :func:`agreement` classifies every reply and compares:

* **exact-set agreement**: the share of replies whose label set equals the corpus's exactly;
* **per mode**: precision = TP / (TP + FP) and recall = TP / (TP + FN) over replies, where a
  reply is a true positive for a mode when both carry it.

The corpus grows in batches (``batch`` in each entry, 1 when absent). The newest batch,
:data:`HELD_OUT_BATCH`, is held out: it is never read while changing the classifier, and its
figures are reported apart from the rest. When a newer batch is labelled, the held-out one is
opened (its blind figure recorded first) and the constant moves on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.classifier import FAILURE_MODES, classify_document
from harness.errors import UsageError

__all__ = ["HELD_OUT_BATCH", "SOURCE_KINDS", "Agreement", "CorpusEntry", "ModeScore", "agreement", "load_corpus"]

SOURCE_KINDS = ("issue", "recording", "constructed")

#: The batch never read while changing the classifier. Batch 1 (281 replies) was held out by
#: ``sha256(id) % 4 == 0`` until classifier 2.3.0, whose blind figure on that quarter the README
#: keeps; batch 2 was labelled after it.
HELD_OUT_BATCH = 7


@dataclass(frozen=True)
class CorpusEntry:
    """One labelled reply of the corpus.

    Attributes:
        id: unique id, also the file's stem.
        source: ``{"kind", "url", "where", "model", "server"}``; ``kind`` is one of :data:`SOURCE_KINDS`.
        tools: the tools offered (OpenAI shape), or None when not known.
        messages: the history before the reply.
        requires_tool: the scenario's flag, or None when not known.
        response: ``{"content", "tool_calls", "reasoning_content", "finish_reason"}``.
        labels: the failure modes the guide requires, sorted.
        labelled_by: who labelled it.
        held_out: in the held-out batch (``batch == HELD_OUT_BATCH``).
        batch: the labelling round the entry was added in (1, 2, ...).
        path: the file read.
    """

    id: str
    source: dict[str, Any]
    tools: list[Any] | None
    messages: list[Any]
    requires_tool: bool | None
    response: dict[str, Any]
    labels: tuple[str, ...]
    labelled_by: str
    held_out: bool
    batch: int
    path: Path

    def document(self) -> dict[str, Any]:
        """The entry as a ``harness classify`` input document."""
        doc: dict[str, Any] = {"tools": self.tools, "messages": self.messages, "response": self.response}
        if self.requires_tool is not None:
            doc["requires_tool"] = self.requires_tool
        return doc


def load_corpus(folder: str | Path) -> list[CorpusEntry]:
    """Read and check every ``*.json`` entry of a corpus folder, sorted by id.

    Raises:
        UsageError: the folder has no entries, a file is not valid JSON, or an entry breaks the
            format (missing field, unknown label, id not matching the file name, a ``batch`` that
            is not a positive integer, a ``held_out`` flag that disagrees with the batch, an
            issue without its URL).
    """
    files = sorted(Path(folder).glob("*.json"))
    if not files:
        raise UsageError(f"no corpus entries (*.json) in {folder}.")
    entries = [_entry(path) for path in files]
    return sorted(entries, key=lambda e: e.id)


def _entry(path: Path) -> CorpusEntry:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable JSON file ({exc}).") from exc
    problem = _problem(data, path)
    if problem:
        raise UsageError(f"{path}: {problem}.")
    return CorpusEntry(
        id=data["id"],
        source=data["source"],
        tools=data["tools"],
        messages=data["messages"],
        requires_tool=data["requires_tool"],
        response=data["response"],
        labels=tuple(sorted(data["labels"])),
        labelled_by=data["labelled_by"],
        held_out=data["held_out"],
        batch=data.get("batch", 1),
        path=path,
    )


def _problem(data: Any, path: Path) -> str | None:
    if not isinstance(data, dict):
        return "an entry must be a JSON object"
    missing = [k for k in ("id", "source", "tools", "messages", "requires_tool", "response", "labels", "labelled_by", "held_out")
               if k not in data]  # fmt: skip
    if missing:
        return f"missing field '{missing[0]}'"
    if data["id"] != path.stem:
        return f"id '{data['id']}' does not match the file name"
    source = data["source"]
    if not isinstance(source, dict) or source.get("kind") not in SOURCE_KINDS:
        return f"source.kind must be one of {', '.join(SOURCE_KINDS)}"
    if source["kind"] == "issue" and not str(source.get("url") or "").startswith("https://"):
        return "an issue entry needs source.url, the thread quoting the output"
    if not isinstance(data["labels"], list) or any(label not in FAILURE_MODES for label in data["labels"]):
        unknown = [x for x in data["labels"] if x not in FAILURE_MODES] if isinstance(data["labels"], list) else data["labels"]
        return f"labels must be failure-mode names from docs/failure-modes.md, got {unknown}"
    if not isinstance(data["labelled_by"], str) or not data["labelled_by"]:
        return "labelled_by must name who labelled the reply"
    batch = data.get("batch", 1)
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        return "batch must be a positive integer (the labelling round)"
    if data["held_out"] is not (batch == HELD_OUT_BATCH):
        return f"held_out must be {batch == HELD_OUT_BATCH} (batch {HELD_OUT_BATCH} is the held-out one)"
    if not isinstance(data["response"], dict):
        return "response must be an object"
    return None


@dataclass(frozen=True)
class ModeScore:
    """Agreement on one failure mode over a set of replies.

    Attributes:
        mode: the failure mode.
        tp: replies both the corpus and the classifier label with it.
        fp: replies only the classifier labels with it.
        fn: replies only the corpus labels with it.
    """

    mode: str
    tp: int
    fp: int
    fn: int

    @property
    def support(self) -> int:
        """Corpus positives (TP + FN)."""
        return self.tp + self.fn

    @property
    def precision(self) -> float:
        """TP / (TP + FP), in [0, 1]; 1.0 when the classifier never used the mode."""
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        """TP / (TP + FN), in [0, 1]; 1.0 when the corpus has no positive."""
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0


@dataclass(frozen=True)
class Agreement:
    """The classifier against a corpus (or a part of it).

    Attributes:
        replies: replies compared.
        exact: replies whose label sets are equal.
        modes: per failure mode, in canonical order; only modes that either side used.
        disagreements: ``(entry, corpus labels, classifier labels)`` for each reply that differs.
    """

    replies: int
    exact: int
    modes: list[ModeScore] = field(default_factory=list)
    disagreements: list[tuple[CorpusEntry, tuple[str, ...], tuple[str, ...]]] = field(default_factory=list)

    @property
    def exact_rate(self) -> float:
        """Exact-set agreement, in [0, 1]."""
        return self.exact / self.replies if self.replies else 1.0

    def mode(self, name: str) -> ModeScore:
        """The score of one mode (zeros when neither side used it)."""
        return next((m for m in self.modes if m.mode == name), ModeScore(name, 0, 0, 0))


def agreement(entries: Iterable[CorpusEntry], *, ignore: Iterable[str] = ()) -> Agreement:
    """Classify every entry's reply and compare its label set with the corpus's.

    Args:
        entries: corpus entries (e.g. all, or only the held-out ones).
        ignore: modes left out of both label sets (to score an older classifier that lacks them).

    Returns:
        The :class:`Agreement`.
    """
    counts: dict[str, list[int]] = {}
    replies = exact = 0
    disagreements = []
    skip = frozenset(ignore)
    for entry in entries:
        predicted = tuple(sorted(set(classify_document(entry.document())["failure_modes"]) - skip))
        labels = tuple(sorted(set(entry.labels) - skip))
        replies += 1
        if predicted == labels:
            exact += 1
        else:
            disagreements.append((entry, labels, predicted))
        for mode in set(predicted) | set(labels):
            tally = counts.setdefault(mode, [0, 0, 0])
            tally[0 if mode in predicted and mode in labels else 1 if mode in predicted else 2] += 1
    modes = [ModeScore(m, *counts[m]) for m in FAILURE_MODES if m in counts]
    return Agreement(replies, exact, modes, disagreements)
