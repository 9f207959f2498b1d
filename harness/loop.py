"""The agent loop: one run of one scenario on one backend, every turn written to the ledger.

One run::

    seed a fresh sandbox with the scenario's fixtures; append the run's start row
    messages = [system, user]
    loop:
        circuit breaker: refuse the call if it would be turn turn_limit + 1, or if the tokens
                         already spent exceed token_limit (checked before the call, never after)
        reply = backend.generate(messages, tools if native mode)
        classification = classify(reply, tools, history)       # labels + structured/recovered calls
        a reply the server's parser refused (reply.rejection): record the turn, stop (nothing to send back)
        calls = classification.calls(parser)                   # strict: structured only
        append the assistant message; execute every call; answer each one (errors as "ERROR: ...")
        append the turn to the ledger (one transaction; a quick model call's turn: with the next commit, GROUP_COMMIT_S)
        stop when calls is empty
    evaluate the done checks; append the run's end row with the outcome

Outcomes are :data:`harness.vocab.OUTCOMES`. How calls and results are written into the messages in each tool mode
is :mod:`harness.tool_protocol`'s business; what the run is (:class:`RunPlan`) is kept apart from how it is executed
(:class:`RunOptions`).
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from harness import __version__
from harness.backends import replica_specs
from harness.backends.base import Backend, BackendIdentity, GenerateOptions, Reply
from harness.backends.replay import CassetteRecorder
from harness.backends.streaming import stored_stream
from harness.breaker import CircuitBreaker
from harness.canonical import canonical_json, canonical_members
from harness.checks import CheckContext, evaluate_checks
from harness.classifier import Classification, ToolCall, classify
from harness.classifier.validate import MAX_STRUCTURED_CALLS, structured_overflow
from harness.errors import BackendError, BackendResponseError, BreakerTripped, ContextOverflow
from harness.ledger import Attempt, RunEnd, RunLedger, RunStart, TurnRecord, utc_now
from harness.ownership import Claim
from harness.provenance import git_revision as _git_revision
from harness.retry import DEFAULT_RETRY, RetryPolicy
from harness.run_facts import process_facts, resolved_text, run_folder
from harness.run_options import STOPPED_BY_USER, RunOptions, stop_reason
from harness.scenarios import Scenario
from harness.tool_protocol import RequestHasher, assistant_message, refusal_text, result_message
from harness.tools import Sandbox, ToolResult
from harness.vocab import DEFAULT_THINK, Outcome, ParserPolicy, Think, ToolMode

__all__ = [
    "DEFAULT_RETRY", "GROUP_COMMIT_S", "IDENTITY_VERSION", "CircuitBreaker", "IdentityTaken", "RetryPolicy", "RunOptions", "RunPlan", "RunSummary",
    "run_once",
]  # fmt: skip

IDENTITY_VERSION = "1"
GROUP_COMMIT_S = 0.05
"""A turn whose model call (retries included) took less than this many seconds is committed with the ledger's next
commit (``record_turn(..., defer=True)``: its run's end row at the latest, one transaction for all), any other at once
with those before it. So against a slow model a crash loses only the turn in flight, as with one transaction per
turn; against a fast server, where a commit costs as much as the rest of a turn, at most the quick turns of the runs
in flight (resume runs those runs again)."""
REFUSED_CALL = (
    f"call refused, not run: a reply may make at most {MAX_STRUCTURED_CALLS} structured calls; send the rest in the next reply"
)


class IdentityTaken(Exception):
    """Another run holds the identity: one that finished, or a live one (``in_flight``); nothing was written."""

    def __init__(self, identity: str, *, in_flight: bool = False) -> None:
        super().__init__(identity)
        self.in_flight = in_flight


class _Interrupted(Exception):
    """The runner asked the run to stop (Ctrl-C in the main thread, or an error: :func:`~harness.run_options.stop_reason`)."""


@dataclass(frozen=True)
class RunPlan:
    """One planned run: a scenario on a model with fixed options (a cell plus a repetition).

    Attributes:
        scenario: the loaded scenario.
        model: model spec string (it may list replicas: :attr:`named_model`).
        temperature: sampling temperature.
        seed: base seed; the seed sent is ``seed + repetition``.
        tool_mode: ``native`` or ``prompt``.
        parser: ``strict`` or ``lenient``.
        repetition: repetition index, from 0.
        think: ``default`` (the request says nothing about thinking), ``on`` or ``off``.
        stream: request streamed replies (``--stream on``).
    """

    scenario: Scenario
    model: str
    temperature: float
    seed: int = 0
    tool_mode: ToolMode = "native"
    parser: ParserPolicy = "lenient"
    repetition: int = 0
    think: Think = DEFAULT_THINK
    stream: bool = False

    def options(self) -> GenerateOptions:
        """The generation options sent on every request of this run."""
        return GenerateOptions(
            temperature=self.temperature,
            seed=self.seed + self.repetition,
            max_tokens=self.scenario.max_tokens,
            num_ctx=self.scenario.num_ctx,
            think=self.think,
            stream=self.stream,
        )

    @functools.cached_property  # the plan is frozen: parsed once (cached_property writes the instance's __dict__)
    def named_model(self) -> str:
        """The spec that names the model in the run's identity and in the ledger's ``model`` column: :attr:`model`,
        or for a spec listing replicas the first replica's spec (:func:`harness.backends.replica_specs`), so which
        replica serves a run, and which others the spec lists, changes neither."""
        return replica_specs(self.model)[0]

    def identity(self, model_digest: str | None = None, slots: int | None = None) -> str:
        """Deterministic SHA-256 over everything that can change the model's output.

        Covers the scenario file's content, tool schemas, rendered system prompt, model spec
        (:attr:`named_model`) and digest (when known: :attr:`BackendIdentity.identity_digest`), effective options (``think``
        only when it is not ``default``, ``stream`` only when on: :meth:`GenerateOptions.as_dict`, so runs
        recorded before they existed keep their identity), tool mode, parser policy, repetition,
        :data:`IDENTITY_VERSION`, and ``slots`` when given and not 1 (the embedded server's slot count:
        :attr:`BackendIdentity.identity_slots`; batched decoding changes the replies). ``--jobs``, retries and
        timeouts are not part of it.
        """
        memo = self.__dict__.setdefault("_identities", {})  # the plan and its scenario are frozen: computed once
        key = (model_digest, None if slots == 1 else slots)
        if key not in memo:
            memo[key] = self._identity(model_digest, slots)
        return memo[key]

    def _identity(self, model_digest: str | None, slots: int | None) -> str:
        """:func:`~harness.canonical.sha256_of` the payload below, with the scenario's tools and system prompt encoded once
        per scenario and tool mode (:func:`_scenario_texts`), not once per plan: the same text, so the same hash."""
        payload: dict[str, Any] = {
            "v": IDENTITY_VERSION,
            "scenario": self.scenario.content_hash,
            "model": self.named_model,
            "digest": model_digest,
            "options": self.options().as_dict(),
            "tool_mode": self.tool_mode,
            "parser": self.parser,
            "repetition": self.repetition,
        }
        if slots is not None and slots != 1:
            payload["slots"] = slots
        texts = {key: canonical_json(value) for key, value in payload.items()} | _scenario_texts(self.scenario, self.tool_mode)
        text = "{" + canonical_members(texts) + "}"  # canonical_json's of the whole payload
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _scenario_texts(scenario: Scenario, tool_mode: ToolMode) -> dict[str, str]:
    """The canonical JSON of the identity's ``tools`` (the scenario's tool schemas) and ``system`` (its system message
    in ``tool_mode``), remembered on the (frozen) scenario: the largest parts of every plan's identity payload."""
    memo = scenario.__dict__.setdefault("_identity_texts", {})
    texts = memo.get(tool_mode)
    if texts is None:
        texts = memo[tool_mode] = {
            "tools": canonical_json(scenario.tool_schemas()),
            "system": canonical_json(scenario.system_message(tool_mode)),
        }
    return texts  # read only: the caller builds its own dict around it


@dataclass
class RunSummary:
    """What one run came to (also in the ledger).

    Attributes:
        run_id: the run's id in the ledger.
        plan: what was run.
        outcome: one of :data:`harness.vocab.OUTCOMES`.
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
    outcome: Outcome
    turns: int
    tokens: int
    failure_modes: list[str]
    checks: list[dict[str, Any]]
    sandbox: Path
    error: str | None = None
    elapsed_s: float | None = None


def _execute(call: ToolCall, scenario: Scenario, sandbox: Sandbox, *, refused: bool = False) -> ToolResult:
    """Run one call; a ``refused`` call (past the cap) and an unknown tool are answered with an error, never run."""
    tool = None if refused else next((t for t in scenario.tools if t.name == call.name), None)
    if tool is not None:
        return tool.call(sandbox, call.arguments)
    offered = ", ".join(t.name for t in scenario.tools) or "none"
    error = REFUSED_CALL if refused else f"unknown tool {call.name!r}; available tools: {offered}"
    return ToolResult(call.name, call.arguments, f"ERROR: {error}", error=True)


def run_once(
    plan: RunPlan, backend: Backend, ledger: RunLedger, options: RunOptions = RunOptions(), *, run_id: str | None = None
) -> RunSummary:
    """Run one scenario once, recording every turn; never raises for model misbehaviour.

    Args:
        plan: what to run.
        backend: an open backend for ``plan.model``.
        ledger: where the run, its turns and its end go: a :class:`~harness.ledger.Ledger` or anything else that
            satisfies :class:`~harness.ledger.RunLedger` (a worker process's proxy to the driver's ledger).
        options: how to run it (sandbox folder, retries, cache, claim policy, stop event, cassette folder).
        run_id: the id to record the run under (default: a new uuid4 hex).

    Returns:
        The run's summary.

    Raises:
        IdentityTaken: ``options.claim`` refused the run (nothing written, no cassette kept).
        LedgerError: the ledger cannot be written.
        KeyboardInterrupt: re-raised after the run's end row (``interrupted``) is written.
    """
    run_id = run_id or uuid.uuid4().hex
    if options.record_dir is None:
        return _Run(plan, backend, ledger, options, run_id).execute()
    cassette = Path(options.record_dir) / f"{run_id}.jsonl"
    with CassetteRecorder(cassette) as recorder:
        try:
            return _Run(plan, backend, ledger, options, run_id, on_reply=recorder.record).execute()
        except IdentityTaken:
            cassette.unlink(missing_ok=True)
            raise


class _Run:
    """The state of one run in progress: messages, counters, sandbox; its steps are the methods."""

    def __init__(self, plan: RunPlan, backend: Backend, ledger: RunLedger, options: RunOptions, run_id: str,
                 on_reply: Callable[[Reply], None] | None = None) -> None:  # fmt: skip
        self.plan, self.backend, self.ledger, self.options, self.run_id = plan, backend, ledger, options, run_id
        self.on_reply = on_reply
        self.stop = options.stop or threading.Event()
        self.tool_schemas = plan.scenario.tool_schemas()
        self.generate_options = plan.options()  # the same on every request of the run
        self.system = plan.scenario.system_message(plan.tool_mode)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": plan.scenario.task},
        ]
        self.request_hasher = RequestHasher()  # each message encoded once: the list only grows
        self.turns = self.prompt_tokens = self.completion_tokens = self.calls_made = 0
        self.labels_seen: list[str] = []
        self.final_answer: str | None = None
        self.identity = ""
        self.sandbox: Sandbox | None = None
        self.claim: Claim | None = None

    def execute(self) -> RunSummary:
        try:
            return self._execute()
        finally:
            self.backend.end_run()  # e.g. a replica's place is free for another run (harness.replicas)
            if self.claim is not None:
                self.claim.release()  # after the end row: the identity is finished (or free to redo)

    def _execute(self) -> RunSummary:
        clock = time.perf_counter()
        self.backend.start_run()
        outcome, error = self._start()
        assert self.sandbox is not None
        breach = None
        try:
            while outcome is None:
                outcome = self._turn()
        except BreakerTripped as exc:
            outcome, error = exc.outcome, str(exc)
            breach = {"kind": exc.outcome, "limit": exc.limit, "observed": exc.observed}
        except ContextOverflow as exc:  # the scenario's num_ctx, not the model nor the server: its own outcome
            outcome, error = "context_overflow", str(exc)
        except BackendError as exc:
            outcome, error = "infra_error", str(exc)
        except _Interrupted:
            outcome, error = "interrupted", stop_reason(self.stop)  # the user, or an error that stopped the matrix
        except KeyboardInterrupt:
            self._end("interrupted", None, STOPPED_BY_USER, [])
            raise
        results = evaluate_checks(
            self.plan.scenario.checks,
            CheckContext(
                self.sandbox.root,
                tuple(self.plan.scenario.fixtures),
                tuple(self.sandbox.written),
                self.final_answer,
                self.calls_made,
                real=True,
            ),
        )
        checks = [r.as_dict() for r in results]
        if outcome == "ended":
            outcome = "pass" if all(r.passed for r in results) else "task_failed"
        self._end(outcome, breach, error, checks)
        return RunSummary(self.run_id, self.plan, cast(Outcome, outcome), self.turns, self.prompt_tokens + self.completion_tokens, self.labels_seen,
                          checks, self.sandbox.root, error, time.perf_counter() - clock)  # fmt: skip

    def _start(self) -> tuple[str | None, str | None]:
        """Append the start row and seed the sandbox; returns ``(outcome, error)`` when the server already failed."""
        plan, scenario = self.plan, self.plan.scenario
        outcome = error = None
        try:
            ident = self.backend.identity()
        except BackendError as exc:
            ident = BackendIdentity(backend=plan.model.split(":", 1)[0], model=plan.model)
            outcome, error = "infra_error", str(exc)
        git_sha, git_dirty = _git_revision()
        self.identity = plan.identity(ident.identity_digest, ident.identity_slots)
        if self.options.claim is not None:
            self.claim = self.options.claim(self.identity)
            if self.claim is None:
                raise IdentityTaken(self.identity, in_flight=True)
        sandbox = Sandbox(run_folder(self.options.runs_dir, self.run_id), write_limit=scenario.write_limit_bytes, real=True)
        try:
            started = self._append_start(sandbox, ident, git_sha, git_dirty)
        except BaseException:
            sandbox.discard()
            raise
        if not started:
            sandbox.discard()
            raise IdentityTaken(self.identity)
        self.sandbox = sandbox
        self.sandbox.seed(scenario.fixtures)
        self.breaker = CircuitBreaker(turn_limit=scenario.turn_limit, token_limit=scenario.token_limit)
        return outcome, error

    def _append_start(self, sandbox: Sandbox, ident: BackendIdentity, git_sha: str | None, git_dirty: bool | None) -> bool:
        """Append the run's start row (the claim's policy applied in its transaction); False: the identity is taken."""
        plan, scenario, options = self.plan, self.plan.scenario, self.generate_options
        tools = self.tool_schemas if plan.tool_mode == "native" else None
        return self.ledger.start_run(
            RunStart(
                run_id=self.run_id, identity=self.identity, scenario=scenario.name,
                scenario_path=resolved_text(scenario.path), scenario_hash=scenario.content_hash, model=plan.named_model,
                backend=ident.backend, base_url=ident.base_url, server_version=ident.server_version,
                model_digest=ident.model_digest, manifest_digest=ident.manifest_digest, think=plan.think, temperature=plan.temperature, seed=options.seed,
                max_tokens=options.max_tokens, num_ctx=options.num_ctx, tool_mode=plan.tool_mode, parser=plan.parser,
                repetition=plan.repetition, turn_limit=scenario.turn_limit, token_limit=scenario.token_limit,
                harness_version=__version__, git_sha=git_sha, git_dirty=git_dirty, sandbox=str(sandbox.root),
                config={"system_prompt": self.system, "task": scenario.task, "tool_schemas": self.tool_schemas,
                        "requires_tool": scenario.requires_tool,
                        "request_settings": self.backend.request_settings(options, tools=bool(tools)),
                        **process_facts(), **self.backend.run_facts(), **self.options.extra_config,
                        **(self.claim.facts if self.claim else {})}, stream=plan.stream,
            ),
            claim=self.claim.policy if self.claim else None,
        )  # fmt: skip

    def _turn(self) -> str | None:
        """One model call and its tool calls; returns ``"ended"`` when the reply holds no call or the server refused it."""
        if self.stop.is_set():
            raise _Interrupted
        self.breaker.before_call(turns_done=self.turns, tokens_used=self.prompt_tokens + self.completion_tokens)
        started = utc_now()
        turn_request_hash = self.request_hasher.digest(self.messages)
        plan = self.plan
        called = time.perf_counter()
        reply = self._cached_reply(turn_request_hash) if self.options.use_cache else None
        if reply is None:
            reply = _generate(self, self.tool_schemas if plan.tool_mode == "native" else None, self.generate_options)
        quick = time.perf_counter() - called < GROUP_COMMIT_S
        self.turns += 1
        if self.on_reply is not None:
            self.on_reply(reply)
        self.prompt_tokens += reply.prompt_tokens or 0
        self.completion_tokens += reply.completion_tokens or 0
        self.final_answer = reply.content
        verdict: Classification = classify(
            reply.response_dict(),
            tools=self.tool_schemas,
            history=self.messages,
            requires_tool=plan.scenario.requires_tool,
            server_rejection=refusal_text(reply.rejection),
            stream_problems=reply.stream_problems,
        )
        # a refused reply left no assistant message to send back: the run ends at it, nothing is run
        executed = [] if reply.rejection is not None else self._act(reply, verdict)
        self.labels_seen.extend(m for m in verdict.failure_modes if m not in self.labels_seen)
        self.ledger.record_turn(
            TurnRecord(
                run_id=self.run_id, turn=self.turns, request_hash=turn_request_hash, raw_reply=reply.raw, content=reply.content,
                tool_calls=reply.tool_calls, recovered_calls=[c.to_dict() for c in verdict.recovered_calls],
                executed_calls=executed, failure_modes=verdict.failure_modes, recovered_by=verdict.recovered_by,
                classifier_version=verdict.classifier_version, finish_reason=reply.finish_reason, prompt_tokens=reply.prompt_tokens,
                completion_tokens=reply.completion_tokens, latency_ms=reply.latency_ms, started_at=started, ended_at=utc_now(),
                details={**verdict.details, **({"cache_hit": True} if reply.extra.get("cache_hit") else {})},
                reasoning=reply.reasoning, server_rejection=reply.rejection, timings=reply.timings,
                stream_chunks=reply.stream_chunks, ttft_ms=reply.ttft_ms, decode_tps=reply.decode_tps,
            ),
            defer=quick,
        )  # fmt: skip
        if self.stop.is_set():
            raise _Interrupted  # the reply that was in flight is recorded; the run is not complete
        return None if executed else "ended"

    def _act(self, reply: Reply, verdict: Classification) -> list[dict[str, Any]]:
        """Append the assistant message, run every call the parser policy acts on and answer each; returns them as stored."""
        assert self.sandbox is not None
        plan = self.plan
        refused = structured_overflow(reply.tool_calls)  # past the classifier's cap: answered as refused, never run
        calls = verdict.calls(plan.parser) + refused
        ids = [call.id or f"call_{self.turns}_{i}" for i, call in enumerate(calls)]
        self.messages.append(assistant_message(reply.content, calls, ids, plan.tool_mode))
        executed = []
        acted_on = len(calls) - len(refused)
        for index, (call, call_id) in enumerate(zip(calls, ids, strict=True)):
            result = _execute(call, plan.scenario, self.sandbox, refused=index >= acted_on)
            self.calls_made += index < acted_on
            self.messages.append(result_message(result.output, name=result.name, call_id=call_id, tool_mode=plan.tool_mode))
            executed.append({"id": call_id, "name": call.name, "arguments": call.arguments, "source": call.source,
                             "output": result.output, "error": result.error, "escape_attempt": result.escape_attempt})  # fmt: skip
        return executed

    def _cached_reply(self, turn_request_hash: str) -> Reply | None:
        row = self.ledger.cached_turn(self.identity, turn_request_hash)
        if row is None:
            return None
        return Reply(
            content=row.content,
            tool_calls=row.tool_calls,
            finish_reason=row.finish_reason,
            prompt_tokens=row.prompt_tokens,
            completion_tokens=row.completion_tokens,
            latency_ms=row.latency_ms,  # the latency measured when the reply was recorded (null if unknown)
            raw=row.raw_reply,
            identity=self.backend.identity(),
            reasoning=row.reasoning,
            extra={"cache_hit": True},
            rejection=row.server_rejection,
            timings=row.timings,
            **stored_stream(row.stream_chunks, row.ttft_ms, row.decode_tps, self.backend.identity().backend),
        )

    def _end(self, outcome: str, breach: dict[str, Any] | None, error: str | None, checks: list[dict[str, Any]]) -> None:
        assert self.sandbox is not None
        self.ledger.end_run(
            RunEnd(
                run_id=self.run_id, outcome=outcome, turns=self.turns, prompt_tokens=self.prompt_tokens,
                completion_tokens=self.completion_tokens, breach=breach, error=error, checks=checks,
                final_answer=self.final_answer, escape_attempts=list(self.sandbox.escape_attempts),
                files_written=list(self.sandbox.written),
            )
        )  # fmt: skip


def _generate(run: _Run, tools: list[dict[str, Any]] | None, options: GenerateOptions) -> Reply:
    """Call the backend, retrying retryable infrastructure errors; record every failed attempt."""
    backend, retry, turn = run.backend, run.options.retry, run.turns + 1
    for attempt in range(1, retry.max_attempts + 1):
        try:
            try:
                return backend.generate(run.messages, tools, options)
            except BackendError:
                raise
            except Exception as bug:  # a backend bug is still the infrastructure's failure, never the model's
                error = BackendResponseError(
                    f"the {type(backend).__name__} backend failed unexpectedly ({type(bug).__name__}: {bug}); "
                    "this is a harness bug, please report it",
                    status_code=None,
                )
                error.retryable = False
                raise error from bug
        except BackendError as exc:
            last = attempt == retry.max_attempts or not exc.retryable
            delay = None if last else retry.delay_s(attempt, getattr(exc, "retry_after_s", None))
            failed = Attempt(run_id=run.run_id, turn=turn, attempt=attempt, error_type=type(exc).__name__, error=str(exc),
                             status_code=getattr(exc, "status_code", None), retry_in_ms=None if delay is None else delay * 1000)  # fmt: skip
            run.ledger.record_attempt(failed)
            if last:
                raise
            if run.options.on_retry is not None:
                run.options.on_retry(failed)
            if run.stop.wait(delay):
                raise _Interrupted from exc
    raise AssertionError("unreachable: max_attempts >= 1")
