"""Re-scoring: re-classify every stored reply with the current classifier, append the labels.

The ledger keeps each turn's raw reply and enough of the run (system prompt, task, tool
schemas, executed calls and their outputs) to rebuild the exact messages each reply answered
(:func:`harness.tool_protocol.rebuild_history`; checked against the stored request hash). Improving the
classifier therefore never requires re-running models (a streamed reply is re-assembled from its stored raw chunks): ``harness rescore`` appends a
``labels`` row per turn carrying the new classifier version, and reports use the newest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.backends.streaming import rederive, response_of
from harness.classifier import CLASSIFIER_VERSION, classify
from harness.ledger import Labels, Ledger, RunRow, TurnRecord, TurnRow
from harness.tool_protocol import rebuild_history, refusal_text, request_hash

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
    for run in ledger.runs():
        turns = ledger.turns(run.run_id)
        if not turns:
            continue
        tools, histories = _tools_and_histories(run, turns)
        config = run.start.config
        requires_tool = config.get("requires_tool") if isinstance(config, dict) else None  # None: recorded before the flag
        for turn, history in zip(turns, histories, strict=True):
            if turn.labels_version == CLASSIFIER_VERSION and not force:
                skipped += 1
                continue
            record = turn.record
            if request_hash(history) != record.request_hash:
                mismatched += 1
            response, problems = _response(record, run.start.backend)
            verdict = classify(response, tools=tools, history=history, requires_tool=requires_tool,
                               server_rejection=refusal_text(record.server_rejection), stream_problems=problems)  # fmt: skip
            ledger.record_labels(
                Labels(
                    run_id=run.run_id, turn=record.turn, classifier_version=verdict.classifier_version,
                    failure_modes=verdict.failure_modes, recovered_calls=[c.to_dict() for c in verdict.recovered_calls],
                    recovered_by=verdict.recovered_by, details=verdict.details,
                )
            )  # fmt: skip
            done += 1
            changed += turn.labels != verdict.failure_modes
    return RescoreResult(done, changed, skipped, mismatched, CLASSIFIER_VERSION)


def _response(record: TurnRecord, backend: str) -> tuple[dict[str, Any], list[str]]:
    """The classifier's ``response`` and ``stream_problems`` for a stored turn: a streamed turn's reply is re-derived
    from its raw chunks (:func:`harness.backends.streaming.rederive`), any other is read as stored."""
    if record.stream_chunks is not None:
        got = rederive(record.stream_chunks, backend)
        response = response_of(got)
        if record.server_rejection is not None:  # as the backend returned it: no calls, the text the error quoted
            response.update(tool_calls=None, content=record.content)
        return response, got.problems
    response = {
        "content": record.content,
        "tool_calls": record.tool_calls,
        "finish_reason": record.finish_reason,
        "usage": {"prompt_tokens": record.prompt_tokens, "completion_tokens": record.completion_tokens},
        "reasoning_content": record.reasoning,
    }
    return response, []


def _tools_and_histories(run: RunRow, turns: list[TurnRow]) -> tuple[Any, list[list[dict[str, Any]]]]:
    """The run's offered tools and each turn's rebuilt request messages.

    A run recorded without its prompts (or edited) is classified without history, which
    counts as a request-hash mismatch.
    """
    config = run.start.config
    tools = config.get("tool_schemas", []) if isinstance(config, dict) else []
    try:
        histories = rebuild_history(config["system_prompt"], config["task"], run.start.tool_mode,
                                    [(t.record.content, t.record.executed_calls) for t in turns])  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError):
        histories = [[] for _ in turns]
    return tools, histories
