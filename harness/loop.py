"""The agent loop: one run of one scenario on one backend, every turn written to the ledger.

One run::

    seed a fresh sandbox with the scenario's fixtures; append the run's start row
    messages = [system, user]
    loop:
        circuit breaker: refuse the call if it would be turn turn_limit + 1, or if the tokens
                         already spent exceed token_limit (checked before the call, never after)
        reply = backend.generate(messages, tools if native mode)
        classification = classify(reply, tools, history)       # labels + structured/recovered calls
        calls = classification.calls(parser)                   # strict: structured only
        append the assistant message; execute every call; answer each one (errors as "ERROR: ...")
        append the turn to the ledger (one transaction)
        stop when calls is empty
    evaluate the done checks; append the run's end row with the outcome

Outcomes: ``pass`` (the loop ended by itself and every check holds), ``task_failed``,
``turn_limit``, ``token_limit``, ``infra_error`` (the server failed: never a model failure),
``interrupted`` (Ctrl-C). In ``prompt`` tool mode the tool results go back as user messages
wrapped in ``<tool_response>`` tags, since the model's template knows no tool role; in
``native`` mode they are ``role: "tool"`` messages answering each call id.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import __version__
from harness.backends.base import Backend, BackendIdentity, GenerateOptions, Reply
from harness.checks import CheckContext, evaluate_checks
from harness.classifier import Classification, ToolCall, classify
from harness.errors import BackendError, BackendResponseError, BreakerTripped, TokenLimitExceeded, TurnLimitExceeded
from harness.ledger import Ledger, RunEnd, RunStart, TurnRecord, canonical_json, utc_now
from harness.scenarios import Scenario
from harness.tools import Sandbox, ToolResult

__all__ = [
    "DEFAULT_RETRY", "IDENTITY_VERSION", "OUTCOMES", "CircuitBreaker", "IdentityTaken", "RetryPolicy", "RunPlan", "RunSummary",
    "rebuild_history", "request_hash", "run_once",
]  # fmt: skip

OUTCOMES = ("pass", "task_failed", "turn_limit", "token_limit", "infra_error", "interrupted")
IDENTITY_VERSION = "1"


@dataclass(frozen=True)
class RetryPolicy:
    """How infrastructure errors are retried: exponential backoff with jitter, honouring ``Retry-After``.

    Attempt ``a`` (from 1) that fails with a retryable :class:`~harness.errors.BackendError` waits
    ``Retry-After`` seconds when the server sent one (capped at ``max_delay_s``), else a uniformly
    jittered ``[0.5, 1] x min(max_delay_s, base_delay_s x 2^(a-1))`` seconds ("equal jitter"),
    then tries again, up to ``max_attempts`` attempts in all.

    Attributes:
        max_attempts: attempts per model call, >= 1 (1 means no retry).
        base_delay_s: first backoff, seconds.
        max_delay_s: cap on any single wait, seconds.
    """

    max_attempts: int = 4
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0

    def delay_s(self, attempt: int, retry_after_s: float | None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (from 1)."""
        if retry_after_s is not None:
            return max(0.0, min(self.max_delay_s, retry_after_s))
        return min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)


DEFAULT_RETRY = RetryPolicy()


class IdentityTaken(Exception):
    """Another run (finished, or in flight in a live process) already holds this run identity."""


class _Interrupted(Exception):
    """The runner asked the run to stop (Ctrl-C in the main thread)."""


class CircuitBreaker:
    """Refuses a model call that would exceed the run's turn or token budget.

    The check runs *before* each call: with ``turn_limit = 8`` the 8th call is allowed and
    the 9th trips; with ``token_limit = 1000`` a run that has spent exactly 1000 tokens may
    call again, one that has spent 1001 may not.

    Args:
        turn_limit: maximum model calls in a run (>= 1).
        token_limit: maximum prompt + completion tokens spent before a call (>= 1).
    """

    def __init__(self, *, turn_limit: int, token_limit: int):
        self.turn_limit = turn_limit
        self.token_limit = token_limit

    def before_call(self, *, turns_done: int, tokens_used: int) -> None:
        """Check the next call against both limits.

        Args:
            turns_done: model calls already made in this run.
            tokens_used: tokens (prompt + completion) already spent in this run.

        Raises:
            TurnLimitExceeded: the next call would be call ``turn_limit + 1``.
            TokenLimitExceeded: ``tokens_used`` exceeds ``token_limit``.
        """
        if turns_done + 1 > self.turn_limit:
            raise TurnLimitExceeded(
                f"turn limit reached: call {turns_done + 1} refused (turn_limit = {self.turn_limit})",
                limit=self.turn_limit,
                observed=turns_done + 1,
            )
        if tokens_used > self.token_limit:
            raise TokenLimitExceeded(
                f"token limit reached: {tokens_used} tokens spent (token_limit = {self.token_limit})",
                limit=self.token_limit,
                observed=tokens_used,
            )


@dataclass(frozen=True)
class RunPlan:
    """One planned run: a scenario on a model with fixed options (a cell plus a repetition).

    Attributes:
        scenario: the loaded scenario.
        model: model spec string.
        temperature: sampling temperature.
        seed: base seed; the seed sent is ``seed + repetition``.
        tool_mode: ``native`` or ``prompt``.
        parser: ``strict`` or ``lenient``.
        repetition: repetition index, from 0.
    """

    scenario: Scenario
    model: str
    temperature: float
    seed: int = 0
    tool_mode: str = "native"
    parser: str = "lenient"
    repetition: int = 0

    def options(self) -> GenerateOptions:
        """The generation options sent on every request of this run."""
        return GenerateOptions(
            temperature=self.temperature,
            seed=self.seed + self.repetition,
            max_tokens=self.scenario.max_tokens,
            num_ctx=self.scenario.num_ctx,
        )

    def identity(self, model_digest: str | None = None) -> str:
        """Deterministic SHA-256 over everything that can change the model's output.

        Covers the scenario file's content, tool schemas, rendered system prompt, model spec
        and digest (when known), effective options, tool mode, parser policy, repetition and
        :data:`IDENTITY_VERSION`. Concurrency, retries and timeouts are not part of it.
        """
        payload = {
            "v": IDENTITY_VERSION,
            "scenario": self.scenario.content_hash,
            "tools": self.scenario.tool_schemas(),
            "system": self.scenario.system_message(self.tool_mode),
            "model": self.model,
            "digest": model_digest,
            "options": self.options().as_dict(),
            "tool_mode": self.tool_mode,
            "parser": self.parser,
            "repetition": self.repetition,
        }
        return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


@dataclass
class RunSummary:
    """What one run came to (also in the ledger).

    Attributes:
        run_id: the run's id in the ledger.
        plan: what was run.
        outcome: one of :data:`OUTCOMES`.
        turns: model calls made.
        tokens: prompt + completion tokens spent.
        failure_modes: every failure-mode label seen in the run, first-seen order.
        checks: done-check results ``[{"check", "passed", "detail"}]``.
        sandbox: the run's sandbox folder.
        error: the infrastructure error or breach message, if any.
        elapsed_s: wall-clock duration of the run, seconds.
    """

    run_id: str
    plan: RunPlan
    outcome: str
    turns: int
    tokens: int
    failure_modes: list[str]
    checks: list[dict[str, Any]]
    sandbox: Path
    error: str | None = None
    elapsed_s: float | None = None


@functools.cache
def _git_revision() -> tuple[str | None, bool | None]:
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return None, None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, timeout=5)
        return sha.stdout.strip(), bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


def request_hash(messages: list[dict[str, Any]]) -> str:
    """SHA-256 (hex) of the canonical JSON of a request's messages, as stored in ``turns.request_hash``."""
    return hashlib.sha256(canonical_json(messages).encode()).hexdigest()


def _assistant_message(reply: Reply, calls: list[ToolCall], ids: list[str], tool_mode: str) -> dict[str, Any]:
    if tool_mode == "prompt":
        # the template knows no tool_calls field: structured calls are written back as the text convention
        text = reply.content or ""
        for call in calls:
            if call.source == "structured":
                payload = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False, sort_keys=True)
                text += ("\n" if text else "") + f"<tool_call>\n{payload}\n</tool_call>"
        return {"role": "assistant", "content": text}
    if not calls:
        return {"role": "assistant", "content": reply.content or ""}
    return {
        "role": "assistant",
        "content": reply.content or "",
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False, sort_keys=True)}}
            for call, call_id in zip(calls, ids, strict=True)
        ],
    }


def _result_message(result: ToolResult, call_id: str, tool_mode: str) -> dict[str, Any]:
    if tool_mode == "prompt":
        return {"role": "user", "content": f"<tool_response>\n{result.output}\n</tool_response>"}
    return {"role": "tool", "tool_call_id": call_id, "name": result.name, "content": result.output}


def rebuild_history(run: dict[str, Any], turns: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rebuild the request messages of every turn of a recorded run, as the loop sent them.

    Args:
        run: the run's ``runs`` row (its ``config`` holds the system prompt and the task).
        turns: the run's ``turns`` rows in order.

    Returns:
        ``messages[i]`` is the list sent for turn ``i + 1``; its canonical SHA-256 equals the
        turn's ``request_hash`` when the ledger is intact.

    Raises:
        KeyError: the run was recorded without its prompts in ``config``.
    """
    config = json.loads(run["config"] or "{}")
    messages: list[dict[str, Any]] = [{"role": "system", "content": config["system_prompt"]}, {"role": "user", "content": config["task"]}]
    out = []
    for turn in turns:
        out.append(list(messages))
        executed = json.loads(turn["executed_calls"] or "[]")
        calls = [ToolCall(name=c["name"], arguments=c["arguments"], source=c.get("source", "structured"), id=c["id"]) for c in executed]
        reply = Reply(turn["content"], None, None, None, None, 0.0, None, BackendIdentity("ledger", ""))
        messages.append(_assistant_message(reply, calls, [c["id"] for c in executed], run["tool_mode"]))
        for c in executed:
            result = ToolResult(c["name"], c["arguments"], c["output"], c["error"], c["escape_attempt"])
            messages.append(_result_message(result, c["id"], run["tool_mode"]))
    return out


def _execute(call: ToolCall, scenario: Scenario, sandbox: Sandbox) -> ToolResult:
    for tool in scenario.tools:
        if tool.name == call.name:
            return tool.call(sandbox, call.arguments)
    offered = ", ".join(t.name for t in scenario.tools) or "none"
    return ToolResult(call.name, call.arguments, f"ERROR: unknown tool {call.name!r}; available tools: {offered}", error=True)


def run_once(
    plan: RunPlan,
    backend: Backend,
    ledger: Ledger,
    *,
    runs_dir: Path,
    on_reply: Callable[[Reply], None] | None = None,
    extra_config: dict[str, Any] | None = None,
    run_id: str | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
    stop: threading.Event | None = None,
    use_cache: bool = False,
    claim: bool = False,
) -> RunSummary:
    """Run one scenario once, recording every turn; never raises for model misbehaviour.

    Args:
        plan: what to run.
        backend: an open backend for ``plan.model``.
        ledger: where the run, its turns and its end go.
        runs_dir: parent folder of run sandboxes (``<runs_dir>/<run_id>/`` is created and kept).
        on_reply: called with every reply (``harness run --record`` writes cassettes with it).
        extra_config: extra facts stored in the run's ``config`` column.
        run_id: the id to record the run under (default: a new uuid4 hex).
        retry: how infrastructure errors are retried; every failed attempt is recorded.
        stop: when set, the run ends as ``interrupted`` before its next model call.
        use_cache: reuse the reply recorded for the same run identity and the same request
            messages (the identity includes the repetition, so repeats stay independent).
        claim: start only if no finished or in-flight run holds this identity (resume).

    Returns:
        The run's summary.

    Raises:
        IdentityTaken: ``claim`` is set and another run holds the identity (nothing written).
        LedgerError: the ledger cannot be written.
        KeyboardInterrupt: re-raised after the run's end row (``interrupted``) is written.
    """
    scenario = plan.scenario
    clock = time.perf_counter()
    run_id = run_id or uuid.uuid4().hex
    sandbox_path = Path(os.path.realpath(Path(runs_dir) / run_id))
    options = plan.options()
    tool_schemas = scenario.tool_schemas()
    system = scenario.system_message(plan.tool_mode)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": scenario.task}]
    backend.start_run()
    stop = stop or threading.Event()
    outcome, error, breach = None, None, None
    try:
        ident = backend.identity()
    except BackendError as exc:
        ident = BackendIdentity(backend=plan.model.split(":", 1)[0], model=plan.model)
        outcome, error = "infra_error", str(exc)
    git_sha, git_dirty = _git_revision()
    identity = plan.identity(ident.model_digest)
    started_run = ledger.start_run(
        RunStart(
            run_id=run_id, identity=identity, scenario=scenario.name,
            scenario_path=str(scenario.path.resolve()), scenario_hash=scenario.content_hash, model=plan.model,
            backend=ident.backend, base_url=ident.base_url, server_version=ident.server_version,
            model_digest=ident.model_digest, temperature=plan.temperature, seed=options.seed,
            max_tokens=options.max_tokens, num_ctx=options.num_ctx, tool_mode=plan.tool_mode, parser=plan.parser,
            repetition=plan.repetition, turn_limit=scenario.turn_limit, token_limit=scenario.token_limit,
            harness_version=__version__, git_sha=git_sha, git_dirty=git_dirty, sandbox=str(sandbox_path),
            config={"system_prompt": system, "task": scenario.task, "tool_schemas": tool_schemas,
                    "pid": os.getpid(), "host": socket.gethostname(), **(extra_config or {})},
        ),
        claim=claim,
    )  # fmt: skip
    if not started_run:
        raise IdentityTaken(identity)
    sandbox = Sandbox(sandbox_path)
    sandbox.seed(scenario.fixtures)
    breaker = CircuitBreaker(turn_limit=scenario.turn_limit, token_limit=scenario.token_limit)
    turns = prompt_tokens = completion_tokens = calls_made = 0
    labels_seen: list[str] = []
    final_answer: str | None = None
    try:
        while outcome is None:
            if stop.is_set():
                raise _Interrupted
            breaker.before_call(turns_done=turns, tokens_used=prompt_tokens + completion_tokens)
            started = utc_now()
            turn_request_hash = request_hash(messages)
            reply = _cached_reply(ledger, identity, turn_request_hash, backend) if use_cache else None
            if reply is None:
                reply = _generate(backend, messages, tool_schemas if plan.tool_mode == "native" else None, options,
                                  retry=retry, stop=stop, ledger=ledger, run_id=run_id, turn=turns + 1)  # fmt: skip
            turns += 1
            if on_reply is not None:
                on_reply(reply)
            prompt_tokens += reply.prompt_tokens or 0
            completion_tokens += reply.completion_tokens or 0
            final_answer = reply.content
            verdict: Classification = classify(reply.response_dict(), tools=tool_schemas, history=messages)
            calls = verdict.calls(plan.parser)
            ids = [call.id or f"call_{turns}_{i}" for i, call in enumerate(calls)]
            messages.append(_assistant_message(reply, calls, ids, plan.tool_mode))
            executed = []
            for call, call_id in zip(calls, ids, strict=True):
                result = _execute(call, scenario, sandbox)
                calls_made += 1
                messages.append(_result_message(result, call_id, plan.tool_mode))
                executed.append({"id": call_id, "name": call.name, "arguments": call.arguments, "source": call.source,
                                 "output": result.output, "error": result.error, "escape_attempt": result.escape_attempt})  # fmt: skip
            labels_seen.extend(m for m in verdict.failure_modes if m not in labels_seen)
            ledger.record_turn(
                TurnRecord(
                    run_id=run_id, turn=turns, request_hash=turn_request_hash, raw_reply=reply.raw, content=reply.content,
                    tool_calls=reply.tool_calls, recovered_calls=[c.to_dict() for c in verdict.recovered_calls],
                    executed_calls=executed, failure_modes=verdict.failure_modes, recovered_by=verdict.recovered_by,
                    classifier_version=verdict.classifier_version, finish_reason=reply.finish_reason,
                    prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens,
                    latency_ms=reply.latency_ms, started_at=started, ended_at=utc_now(),
                    details={**verdict.details, **({"cache_hit": True} if reply.extra.get("cache_hit") else {})},
                )
            )  # fmt: skip
            if stop.is_set():
                raise _Interrupted  # the reply that was in flight is recorded; the run is not complete
            if not calls:
                outcome = "ended"
    except BreakerTripped as exc:
        outcome, error = exc.outcome, str(exc)
        breach = {"kind": exc.outcome, "limit": exc.limit, "observed": exc.observed}
    except BackendError as exc:
        outcome, error = "infra_error", str(exc)
    except _Interrupted:
        outcome, error = "interrupted", "interrupted by the user"
    except KeyboardInterrupt:
        _end(ledger, run_id, "interrupted", turns, prompt_tokens, completion_tokens, None, "interrupted by the user", [], final_answer, sandbox)
        raise
    results = evaluate_checks(
        scenario.checks,
        CheckContext(sandbox.root, tuple(scenario.fixtures), tuple(sandbox.written), final_answer, calls_made),
    )
    checks = [r.as_dict() for r in results]
    if outcome == "ended":
        outcome = "pass" if all(r.passed for r in results) else "task_failed"
    _end(ledger, run_id, outcome, turns, prompt_tokens, completion_tokens, breach, error, checks, final_answer, sandbox)
    return RunSummary(run_id, plan, outcome, turns, prompt_tokens + completion_tokens, labels_seen, checks, sandbox.root,
                      error, time.perf_counter() - clock)  # fmt: skip


def _generate(backend: Backend, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
              options: GenerateOptions, *, retry: RetryPolicy, stop: threading.Event, ledger: Ledger,
              run_id: str, turn: int) -> Reply:  # fmt: skip
    """Call the backend, retrying retryable infrastructure errors; record every failed attempt."""
    for attempt in range(1, retry.max_attempts + 1):
        try:
            try:
                return backend.generate(messages, tools, options)
            except BackendError:
                raise
            except Exception as bug:  # a backend bug is still the infrastructure's failure, never the model's
                error = BackendResponseError(
                    f"the {type(backend).__name__} backend failed unexpectedly ({type(bug).__name__}: {bug}); "
                    "this is a harness bug, please report it", status_code=None,
                )
                error.retryable = False
                raise error from bug
        except BackendError as exc:
            last = attempt == retry.max_attempts or not exc.retryable
            delay = None if last else retry.delay_s(attempt, getattr(exc, "retry_after_s", None))
            ledger.record_attempt(run_id=run_id, turn=turn, attempt=attempt, error_type=type(exc).__name__, error=str(exc),
                                  status_code=getattr(exc, "status_code", None),
                                  retry_in_ms=None if delay is None else delay * 1000)  # fmt: skip
            if last:
                raise
            if stop.wait(delay):
                raise _Interrupted from exc
    raise AssertionError("unreachable: max_attempts >= 1")


def _cached_reply(ledger: Ledger, identity: str, request_hash: str, backend: Backend) -> Reply | None:
    row = ledger.cached_turn(identity, request_hash)
    if row is None:
        return None
    return Reply(
        content=row["content"],
        tool_calls=None if row["tool_calls"] is None else json.loads(row["tool_calls"]),
        finish_reason=row["finish_reason"],
        prompt_tokens=row["prompt_tokens"],
        completion_tokens=row["completion_tokens"],
        latency_ms=row["latency_ms"],  # the latency measured when the reply was recorded (null if unknown)
        raw=None if row["raw_reply"] is None else json.loads(row["raw_reply"]),
        identity=backend.identity(),
        extra={"cache_hit": True},
    )


def _end(ledger: Ledger, run_id: str, outcome: str, turns: int, prompt_tokens: int, completion_tokens: int,
         breach: dict[str, Any] | None, error: str | None, checks: list[dict[str, Any]], final_answer: str | None,
         sandbox: Sandbox) -> None:  # fmt: skip
    ledger.end_run(
        RunEnd(
            run_id=run_id, outcome=outcome, turns=turns, prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens, breach=breach, error=error, checks=checks,
            final_answer=final_answer, escape_attempts=list(sandbox.escape_attempts), files_written=list(sandbox.written),
        )
    )  # fmt: skip
