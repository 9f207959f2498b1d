"""Build ledgers with known outcomes and failure modes through the public Ledger API."""

from __future__ import annotations

from pathlib import Path

from harness.ledger import Labels, Ledger, RunEnd, RunStart, TurnRecord

SMALL = "ollama:qwen2.5-coder:1.5b"
BIG = "ollama:qwen2.5-coder:7b"


def add_run(ledger: Ledger, run_id: str, *, model: str, temperature: float = 0.0, repetition: int = 0, outcome: str = "pass",
            turns: list[tuple[list[str], str]] | None = None, parser: str = "lenient", scenario: str = "s",
            scenario_path: str = "s.toml", scenario_hash: str = "h", tool_mode: str = "native", seed: int | None = None,
            latency: float | None = None, checks: list[dict] | None = None, files_written: list[str] | None = None,
            day: int = 1, identity: str | None = None, requires_tool: bool | None = None,
            ttft: float | None = None, decode_tps: float | None = None) -> None:  # fmt: skip
    """Append one complete run: start, one turn per ``(failure_modes, content)``, end (unless outcome is None)."""
    turns = [([], "done")] if turns is None else turns
    ledger.start_run(RunStart(
        run_id=run_id, identity=identity or "id-" + run_id, scenario=scenario, scenario_path=scenario_path, scenario_hash=scenario_hash,
        model=model, backend="ollama", base_url=None, server_version=None, model_digest=None, temperature=temperature,
        seed=repetition if seed is None else seed, max_tokens=64, num_ctx=2048, tool_mode=tool_mode, parser=parser,
        repetition=repetition, turn_limit=8, token_limit=32000, harness_version="0.1.0", git_sha=None, git_dirty=None,
        sandbox="/tmp/x", started_at=f"2026-01-{day:02d}T00:00:00.000+00:00",
        config={} if requires_tool is None else {"requires_tool": requires_tool},
    ))  # fmt: skip
    for n, (modes, content) in enumerate(turns, 1):
        ledger.record_turn(TurnRecord(
            run_id=run_id, turn=n, request_hash=f"req-{run_id}-{n}", raw_reply={"content": content}, content=content,
            tool_calls=None, recovered_calls=[], executed_calls=[], failure_modes=list(modes), recovered_by=None,
            classifier_version="1", finish_reason="stop", prompt_tokens=100, completion_tokens=10 * n,
            latency_ms=latency if latency is not None else 100.0 * n + repetition, started_at="2026-01-01T00:00:00.000+00:00",
            ended_at="2026-01-01T00:00:01.000+00:00", ttft_ms=ttft, decode_tps=decode_tps,
        ))  # fmt: skip
    if outcome is not None:
        ledger.end_run(RunEnd(
            run_id=run_id, outcome=outcome, turns=len(turns), prompt_tokens=100 * len(turns),
            completion_tokens=sum(10 * n for n in range(1, len(turns) + 1)), breach=None,
            error="connection refused" if outcome == "infra_error" else None,
            checks=checks if checks is not None else [{"check": "file_exists", "passed": outcome == "pass", "detail": "report.txt"}],
            final_answer=turns[-1][1] if turns else None, escape_attempts=[], files_written=files_written or [],
            ended_at=f"2026-01-{day:02d}T00:05:00.000+00:00",
        ))  # fmt: skip


# The two-model ledger: 10 repetitions per (model, temperature), all lenient/native on scenario "s".
PASSES = {(SMALL, 0.0): {0, 1, 2}, (SMALL, 0.7): {9}, (BIG, 0.0): set(range(8)), (BIG, 0.7): set(range(7))}
RAW = "raw_json_in_content"
REPEAT = "repeated_call"


def build_two_model_ledger(path: Path) -> Path:
    """Known ledger. Per run: two turns. A failed run shows ``raw_json_in_content`` on turn 1;
    the small model's even repetitions show ``repeated_call`` on turn 2. Then: the small
    model's (T=0, rep 3) turn 1 is relabelled to no mode, the big model's (T=0, rep 9) turn 2
    to ``empty_response``; the small model has 2 extra infra_error runs and the big one an
    interrupted run, all excluded from denominators.
    """
    with Ledger(path) as ledger:
        for (model, temperature), passes in PASSES.items():
            for rep in range(10):
                passed = rep in passes
                tag = "small" if model == SMALL else "big"
                run_id = f"{tag}-t{temperature:g}-r{rep}"
                first = ([] if passed else [RAW], "ok" if passed else '{"name": "list_files", "arguments": {}}' + " " * rep)
                second = ([REPEAT] if model == SMALL and rep % 2 == 0 else [], "x" * (20 + rep))
                add_run(ledger, run_id, model=model, temperature=temperature, repetition=rep,
                        outcome="pass" if passed else "task_failed", turns=[first, second])  # fmt: skip
        for rep in (10, 11):
            add_run(ledger, f"small-t0-r{rep}", model=SMALL, temperature=0.0, repetition=rep, outcome="infra_error", turns=[])
        add_run(
            ledger, "big-t0.7-r10", model=BIG, temperature=0.7, repetition=10, outcome="interrupted", turns=[([], "hm")], day=2
        )
        ledger.record_labels(
            Labels(
                run_id="small-t0-r3",
                turn=1,
                classifier_version="2",
                failure_modes=[],
                recovered_calls=[],
                recovered_by=None,
                details={},
            )
        )
        ledger.record_labels(
            Labels(
                run_id="big-t0-r9",
                turn=2,
                classifier_version="2",
                failure_modes=["empty_response"],
                recovered_calls=[],
                recovered_by=None,
                details={},
            )
        )
    return path


UNJUDGED_CHECK = "names_<b>only</b>_existing"
"""A check name with markup (scenario files name checks): the viewer must show it as text."""


def build_unjudged_checks_ledger(path: Path) -> Path:
    """Three runs in start order: ``a-cut`` interrupted with two failed checks (``file_exists`` and
    :data:`UNJUDGED_CHECK`: not judged, the run did not finish), ``b-fail`` task_failed with ``file_exists`` failed,
    ``c-pass`` passed with its check passed."""
    with Ledger(path) as ledger:
        add_run(ledger, "a-cut", model=SMALL, repetition=0, outcome="interrupted", checks=[
            {"check": "file_exists", "passed": False, "detail": "report.txt"},
            {"check": UNJUDGED_CHECK, "passed": False, "detail": "<i>no file</i>"},
        ])  # fmt: skip
        add_run(ledger, "b-fail", model=SMALL, repetition=1, outcome="task_failed")
        add_run(ledger, "c-pass", model=SMALL, repetition=2, outcome="pass")
    return path
