"""Re-scoring: re-classify every stored reply with the current classifier, append the labels.

The ledger keeps each turn's raw reply and enough of the run (system prompt, task, tool
schemas, executed calls and their outputs) to rebuild the exact messages each reply answered
(:func:`harness.loop.rebuild_history`; checked against the stored request hash). Improving the
classifier therefore never requires re-running models: ``harness rescore`` appends a
``labels`` row per turn carrying the new classifier version, and reports use the newest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from harness.classifier import CLASSIFIER_VERSION, classify
from harness.ledger import Ledger
from harness.loop import rebuild_history, request_hash

__all__ = ["RescoreResult", "rescore"]


@dataclass(frozen=True)
class RescoreResult:
    """What a rescore did.

    Attributes:
        turns: turns re-classified now.
        changed: of those, turns whose failure modes differ from their previous newest labels.
        skipped_current: turns whose newest labels already come from this classifier version.
        history_mismatch: turns whose rebuilt messages did not hash to the stored request hash
            (classified anyway; a sign the ledger predates a loop change).
        version: the classifier version used.
    """

    turns: int
    changed: int
    skipped_current: int
    history_mismatch: int
    version: str


def rescore(ledger: Ledger, *, force: bool = False) -> RescoreResult:
    """Re-classify every stored turn and append the new labels.

    Args:
        ledger: an open, writable ledger.
        force: re-classify even turns already labelled by the current classifier version.

    Returns:
        Counts of what was done.

    Raises:
        LedgerError: the ledger cannot be written.
    """
    done = changed = skipped = mismatched = 0
    for run in ledger.query("SELECT * FROM runs ORDER BY seq"):
        turns = ledger.turns(run["run_id"])
        if not turns:
            continue
        config: object = None
        try:
            config = json.loads(run["config"] or "{}")
            tools = config.get("tool_schemas", []) if isinstance(config, dict) else []
            histories = rebuild_history(run, turns)
        except (ValueError, KeyError, TypeError, AttributeError):
            # recorded without its prompts, or edited: classify without history (counted as a mismatch)
            tools, histories = (config.get("tool_schemas", []) if isinstance(config, dict) else []), [[] for _ in turns]
        for turn, history in zip(turns, histories, strict=True):
            if turn["labels_version"] == CLASSIFIER_VERSION and not force:
                skipped += 1
                continue
            if request_hash(history) != turn["request_hash"]:
                mismatched += 1
            response = {
                "content": turn["content"],
                "tool_calls": json.loads(turn["tool_calls"]) if turn["tool_calls"] else None,
                "finish_reason": turn["finish_reason"],
                "usage": {"prompt_tokens": turn["prompt_tokens"], "completion_tokens": turn["completion_tokens"]},
            }
            verdict = classify(response, tools=tools, history=history)
            ledger.record_labels(
                run_id=run["run_id"], turn=turn["turn"], classifier_version=verdict.classifier_version,
                failure_modes=verdict.failure_modes, recovered_calls=[c.to_dict() for c in verdict.recovered_calls],
                recovered_by=verdict.recovered_by, details=verdict.details,
            )  # fmt: skip
            done += 1
            changed += json.loads(turn["labels"]) != verdict.failure_modes
    return RescoreResult(done, changed, skipped, mismatched, CLASSIFIER_VERSION)
