"""The review frame of one run (``harness review``) and reviewer attestations (``harness attest``).

A frame is always the same five parts, built only from the ledger and the scenario file:

1. **The promise**: the scenario's ``what_it_does``, ``what_it_does_not`` and
   ``done_looks_like``, read from the file at ``runs.scenario_path`` only if its SHA-256 still
   equals ``runs.scenario_hash`` (otherwise the frame says the file changed or is missing).
2. **The acceptance criteria**: the done checks and their results (``run_ends.checks``).
3. **The diff**: the hash of the first input (turn 1's ``request_hash``), files written, the
   final answer, turns, tokens, outcome and breaker breach.
4. **The evidence**: every turn with its newest labels and a short excerpt.
5. **The open questions**: derived from failure modes, failed checks and how the run ended.

The frame is a plain dict; its SHA-256 is taken over :func:`harness.canonical.canonical_json`, so
any change to what a reviewer saw (a relabelled turn, an edited scenario file) changes the hash.
``harness attest`` appends that hash to the ledger's ``attestations`` table; ``harness review
--verify`` recomputes it and says whether the frame changed since.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from harness.canonical import sha256_of
from harness.errors import UsageError
from harness.ledger import Attestation, Ledger, RunRow, TurnRow, check_failed
from harness.run_options import STOPPED_BY_ERROR, STOPPED_BY_READER, STOPPED_BY_USER
from harness.vocab import is_scored, printable

__all__ = [
    "EXCERPT_CHARS", "attest", "format_frame", "frame_sha256", "review_frame", "review_text", "scenario_promise",
    "verify_attestation",
]  # fmt: skip

EXCERPT_CHARS = 200
"""Characters of each turn's reply kept in the evidence."""


def _find_run(ledger: Ledger, run_id: str) -> RunRow:
    rows = ledger.runs_matching(run_id, limit=2)
    if len(rows) > 1:
        raise UsageError(f"run id prefix '{run_id}' matches several runs; give more characters.")
    if not rows:
        raise UsageError(f"no run '{run_id}' in the ledger {ledger.path}; `harness export` lists run ids.")
    return rows[0]


def _promise(run: RunRow, ledger_path: Path) -> dict[str, Any]:
    stored = run.start.scenario_path or ""
    candidates = [Path(stored)]
    if not Path(stored).is_absolute():
        candidates.append(ledger_path.resolve().parent.parent / stored)  # runs usually start in the ledger's project
    path = next((p for p in candidates if p.is_file()), None)
    base = {"scenario_path": stored, "scenario_sha256": run.start.scenario_hash}
    if path is None:
        return {**base, "status": "missing", "note": f"the scenario file {stored} is gone; the promise cannot be shown."}
    raw = path.read_bytes()
    if hashlib.sha256(raw).hexdigest() != run.start.scenario_hash:
        return {**base, "status": "changed", "note": f"the scenario file {stored} changed since the run (its SHA-256 differs); "
                "the promise cannot be shown as it was."}  # fmt: skip
    import tomllib

    data = tomllib.loads(raw.decode("utf-8"))
    return {
        **base,
        "status": "unchanged",
        **{k: str(data.get(k, "")).strip() for k in ("what_it_does", "what_it_does_not", "done_looks_like")},
    }


def scenario_promise(run: RunRow, ledger_path: Path) -> dict[str, Any]:
    """The promise of a run's scenario (part 1 of the frame): ``scenario_path``, ``scenario_sha256``, ``status``
    (``unchanged``, ``changed`` or ``missing``) and either ``what_it_does``, ``what_it_does_not`` and
    ``done_looks_like`` (unchanged) or a ``note`` saying why they cannot be shown."""
    return _promise(run, ledger_path)


def _excerpt(turn: TurnRow) -> str:
    text = (turn.record.content or "").strip()
    if not text:
        calls = turn.record.executed_calls
        text = "(no text) calls: " + ", ".join(c.get("name", "?") for c in calls) if calls else "(empty reply)"
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


def review_frame(ledger_path: str | Path, run_id: str) -> dict[str, Any]:
    """Build the five-part review frame of one run (read-only).

    Args:
        ledger_path: the ledger.
        run_id: a run id, or a unique prefix of one.

    Returns:
        ``{"run": ..., "promise": ..., "acceptance": [...], "diff": ..., "evidence": [...],
        "open_questions": [...]}``; see the module docstring. Tokens are counts, rates absent.

    Raises:
        LedgerError: the ledger cannot be read.
        UsageError: no run (or several runs) match ``run_id``.
    """
    with Ledger(ledger_path, readonly=True) as ledger:
        return _frame(ledger, run_id)


def _frame(ledger: Ledger, run_id: str) -> dict[str, Any]:
    run = _find_run(ledger, run_id)
    start, end = run.start, run.end
    turns = ledger.turns(run.run_id)
    evidence = [{
        "turn": t.record.turn, "labels": t.labels, "finish_reason": t.record.finish_reason,
        "tokens": (t.record.prompt_tokens or 0) + (t.record.completion_tokens or 0),
        "calls": [c.get("name") for c in t.record.executed_calls], "excerpt": _excerpt(t),
    } for t in turns]  # fmt: skip
    diff = {
        "first_input_sha256": turns[0].record.request_hash if turns else None,
        "files_written": end.files_written if end else [],
        "final_answer": end.final_answer if end else None,
        "turns": end.turns if end and end.turns is not None else len(turns),
        "prompt_tokens": end.prompt_tokens if end else None, "completion_tokens": end.completion_tokens if end else None,
        "outcome": end.outcome if end and end.outcome else "unfinished",
        "breach": end.breach if end else None,
        "error": end.error if end else None,
        "escape_attempts": end.escape_attempts if end else [],
    }  # fmt: skip
    frame = {
        "run": {"run_id": start.run_id, "scenario": start.scenario, "model": start.model, "temperature": start.temperature,
                "seed": start.seed, "tool_mode": start.tool_mode, "parser": start.parser, "repetition": start.repetition,
                # only when set, so the frames (and attestations) of runs with neither stay as they were
                **({"think": start.think} if start.think not in (None, "default") else {}),
                **({"stream": "on"} if start.stream else {})},
        "promise": _promise(run, ledger.path),
        "acceptance": [{"check": c.get("check"), "passed": not check_failed(c), "detail": c.get("detail")} for c in end.checks]
        if end else [],
        "diff": diff,
        "evidence": evidence,
    }  # fmt: skip
    frame["open_questions"] = _open_questions(frame)
    return frame


_WHY_INTERRUPTED = {
    STOPPED_BY_ERROR: "An error stopped the matrix before the run ended (not the model): it says nothing about the model.",
    STOPPED_BY_READER: "The matrix stopped when its output's reader left (not the model): it says nothing about the model.",
    STOPPED_BY_USER: "The run was interrupted by the user: it says nothing about the model.",
}
"""The open question of an ``interrupted`` run, by its end row's error (any other: the user's)."""


def _open_questions(frame: dict[str, Any]) -> list[str]:
    questions = []
    diff = frame["diff"]
    if diff["outcome"] == "unfinished":
        questions.append("The run has no end row: did the process die? Nothing can be judged until it is re-run.")
    if diff["outcome"] == "infra_error":
        questions.append(f"The server failed ({diff['error']}): this is not a model failure; re-run before judging the model.")
    if diff["outcome"] == "interrupted":
        questions.append(_WHY_INTERRUPTED.get(diff["error"], _WHY_INTERRUPTED[STOPPED_BY_USER]))
    if diff["breach"]:
        b = diff["breach"]
        questions.append(
            f"The breaker stopped the run ({b.get('kind')}: {b.get('observed')} > {b.get('limit')}): was the model looping or was the limit too tight?"
        )
    modes: dict[str, list[int]] = {}
    for turn in frame["evidence"]:
        for mode in turn["labels"]:
            modes.setdefault(mode, []).append(turn["turn"])
    for mode, turns in modes.items():
        questions.append(
            f"`{mode}` on turn{'s' if len(turns) > 1 else ''} {', '.join(map(str, turns))}: is the label right, and did it change the outcome?"
        )
    failed = [check for check in frame["acceptance"] if not check["passed"]]
    if failed and not is_scored(diff["outcome"]):  # checked on a sandbox the run did not finish: not the model's doing
        names = ", ".join(f"`{check['check']}`" for check in failed)
        questions.append(
            f"Checks {names} failed on what the run left unfinished: they are not judged and say nothing about the model."
        )
    else:
        questions += [
            f"Check `{check['check']}` failed ({check['detail']}): is the check right, or did the model miss the task?"
            for check in failed
        ]
    if diff["escape_attempts"]:
        questions.append(
            f"Paths outside the sandbox were refused: {', '.join(diff['escape_attempts'])}. Why did the model reach for them?"
        )
    if frame["promise"]["status"] != "unchanged":
        questions.append(
            "The scenario file is missing or not the one that ran: judge the checks against the run's stored scenario hash, not today's file."
        )
    return questions


def frame_sha256(frame: dict[str, Any]) -> str:
    """SHA-256 (hex) of the frame's canonical JSON (sorted keys, no whitespace)."""
    return sha256_of(frame)


def attest(ledger_path: str | Path, run_id: str, *, reviewer: str, notes: str | None = None) -> tuple[str, str]:
    """Append an attestation of the run's current frame to the ledger.

    Returns:
        ``(run_id, frame_sha256)``.

    Raises:
        UsageError: an empty reviewer name, or no such run.
        LedgerError: the ledger cannot be read or written.
    """
    if not reviewer.strip():
        raise UsageError("--reviewer must name who reviewed the run.")
    frame = review_frame(ledger_path, run_id)
    digest = frame_sha256(frame)
    with Ledger(ledger_path) as ledger:
        ledger.record_attestation(
            Attestation(run_id=frame["run"]["run_id"], reviewer=reviewer.strip(), notes=notes, frame_sha256=digest)
        )
    return frame["run"]["run_id"], digest


def verify_attestation(ledger_path: str | Path, run_id: str) -> tuple[bool, str]:
    """Recompute the run's frame and compare it with its newest attestation.

    Returns:
        ``(unchanged, sentence)``; ``unchanged`` is False when there is no attestation.

    Raises:
        UsageError: no such run.
        LedgerError: the ledger cannot be read.
    """
    with Ledger(ledger_path, readonly=True) as ledger:
        frame = _frame(ledger, run_id)
        rid = frame["run"]["run_id"]
        rows = ledger.attestations(rid)
    if not rows:
        return False, f"run {rid} has no attestation; `harness attest {rid} --reviewer NAME` records one."
    last = rows[-1]
    now = frame_sha256(frame)
    who = f"{last.reviewer} at {last.attested_at}"
    if now == last.frame_sha256:
        return True, f"run {rid}: the frame is unchanged since attested by {who} (SHA-256 {now[:16]}…)."
    return False, (f"run {rid}: the frame CHANGED since attested by {who} (attested {last.frame_sha256[:16]}…, now {now[:16]}…); "
                   "review it again.")  # fmt: skip


def format_frame(frame: dict[str, Any], attestations: list[Attestation] | None = None) -> str:
    """Render a frame as markdown, always in the same five parts, then its SHA-256; each line is safe for a terminal
    (:func:`harness.vocab.printable`: control characters, a newline within a field included, are escaped)."""
    run, promise, diff = frame["run"], frame["promise"], frame["diff"]
    lines = [f"# Review of run {run['run_id']}", "",
             f"{run['scenario']} · {run['model']} · temperature {run['temperature']:g} · seed {run['seed']} · "
             f"{run['tool_mode']}/{run['parser']} · think {run.get('think', 'default')} · stream {run.get('stream', 'off')} · "
             f"repetition {run['repetition']}", "", "## 1. The promise", ""]  # fmt: skip
    if promise["status"] == "unchanged":
        lines += [f"- What it does: {promise['what_it_does']}", f"- What it does not: {promise['what_it_does_not']}",
                  f"- Done looks like: {promise['done_looks_like']}",
                  f"- Source: {promise['scenario_path']} (SHA-256 {promise['scenario_sha256'][:16]}…, unchanged since the run)"]  # fmt: skip
    else:
        lines.append(f"- Not shown: {promise['note']}")
    lines += ["", "## 2. The acceptance criteria", ""]
    lines += [f"- [{'x' if c['passed'] else ' '}] `{c['check']}`: {c['detail']}" for c in frame["acceptance"]] or [
        "- (no check results recorded)"
    ]
    breach = diff["breach"]
    breach_text = "none" if not breach else f"{breach.get('kind')} ({breach.get('observed')} > {breach.get('limit')})"
    lines += ["", "## 3. The diff", "",
              f"- First input (turn 1 request SHA-256): {diff['first_input_sha256'] or '(no turn)'}",
              f"- Files written: {', '.join(diff['files_written']) or 'none'}",
              f"- {_answer_label(diff['outcome'])}: {_one_line(diff['final_answer'])}",
              f"- Turns: {diff['turns']}; tokens: {diff['prompt_tokens'] or 0} prompt + {diff['completion_tokens'] or 0} completion",
              f"- Outcome: {diff['outcome']}; breach: {breach_text}",
              "", "## 4. The evidence", ""]  # fmt: skip
    for t in frame["evidence"]:
        labels = ", ".join(t["labels"]) or "no failure mode"
        calls = f"; calls: {', '.join(map(str, t['calls']))}" if t["calls"] else ""
        lines.append(
            f"- Turn {t['turn']} [{labels}] finish {t['finish_reason']}, {t['tokens']} tokens{calls}: {_one_line(t['excerpt'])}"
        )
    if not frame["evidence"]:
        lines.append("- (no turns recorded)")
    lines += ["", "## 5. The open questions", ""]
    lines += [f"- {q}" for q in frame["open_questions"]] or ["- None: every check passed and no failure mode was labelled."]
    lines += ["", f"Frame SHA-256: {frame_sha256(frame)}"]
    for a in attestations or []:
        lines.append(
            f"Attested by {a.reviewer} at {a.attested_at} (frame {a.frame_sha256[:16]}…)" + (f": {a.notes}" if a.notes else "")
        )
    # each line escaped whole (a model's reply, a check's detail, a file name, a reviewer): no text can recolour or clear
    # the terminal, hide a line or add one (a newline in a detail is \n), so what is reviewed is what was recorded
    return "\n".join(printable(line) for line in lines) + "\n"


def _answer_label(outcome: str | None) -> str:
    """What the ledger's ``final_answer`` (the last reply's text) is for a run of ``outcome``: its final answer when the
    loop ended on a reply without a call (``pass``, ``task_failed``), else only its last reply's text (newcomer, stop 29:
    a ``turn_limit`` run's last reply, a tool call, was labelled its final answer)."""
    if outcome in ("pass", "task_failed"):
        return "Final answer"
    return f"Last reply's text (no final answer: the run ended {outcome or 'unfinished'})"


def _one_line(text: str | None) -> str:
    if text is None:
        return "(none)"
    return "`" + text.replace("\n", " ⏎ ").replace("`", "'") + "`"


def review_text(ledger_path: str | Path, run_id: str) -> str:
    """The frame rendered with the run's attestations listed under it (for ``harness review``)."""
    with Ledger(ledger_path, readonly=True) as ledger:
        frame = _frame(ledger, run_id)
        rows = ledger.attestations(frame["run"]["run_id"])
    return format_frame(frame, rows)
