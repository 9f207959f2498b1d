"""Time `harness report` on a synthetic ledger of 1,000,000 turns; print wall time, CPU time and peak memory.

Usage::

    python benchmarks/report_scale.py [--turns 1000000] [--ledger /tmp/harness_bench_1m.sqlite] [--rebuild]
                                      [--repeats 3] [--baseline DIR] [--baseline-ledger PATH]

The ledger is built once (bulk ``executemany`` in one transaction, the hash chain computed in
Python with the ledger's own row hashing, in a child process of its own) and cached at ``--ledger``; later runs reuse
it. (Built in this process, the rows it held stayed in its memory, and every report child counted them: Linux keeps a
process's peak RSS across ``exec``, so a child forked from a 1 GB process reports 1 GB before it starts.) Each
report runs in a child process so its peak RSS and CPU time (user + system) are measured alone, each counting the
processes the report starts (its plotting process: CPU added, and its peak RSS added to the report's own peak, an
upper bound since the two peaks need not coincide and forked pages are shared); the medians of ``--repeats`` runs are printed. ``--baseline DIR`` (a
checkout of other code, e.g. ``git worktree add /tmp/old HEAD~1``) runs that code's report
alternately with this one on the same ledger and prints the ratios, which a shared, noisy machine
distorts less than the absolute figures. A cached ledger is migrated first (opened for writing, as ``harness run``
would), so it carries the schema's indexes; ``--baseline-ledger`` gives the baseline a ledger of its own, e.g. one
copied before a migration that adds an index, so that "before" is the old code on the old file.
Targets: < 10 s and < 1 GB.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.canonical import canonical_json  # noqa: E402
from harness.ledger import Ledger  # noqa: E402
from harness.ledger.chain import GENESIS_HASH, row_hash  # noqa: E402

MODELS = ["ollama:qwen2.5-coder:1.5b", "ollama:qwen2.5-coder:7b", "ollama:llama3.2:3b", "embedded:smollm2-135m"]
MODES = ["raw_json_in_content", "code_fence", "mixed_prose", "repeated_call", "empty_response", "narration_without_call"]
TURNS_PER_RUN = 8


def _chain(db, table: str, columns: list[str], rows: list[tuple]) -> None:
    prev = GENESIS_HASH
    out = []
    for row in rows:
        digest = row_hash(prev, columns, row)
        out.append((*row, prev, digest))
        prev = digest
    marks = ", ".join("?" * (len(columns) + 2))
    db.executemany(f"INSERT INTO {table} ({', '.join(columns)}, prev_hash, row_hash) VALUES ({marks})", out)


def build(path: Path, n_turns: int) -> None:
    path.unlink(missing_ok=True)
    Ledger(path).close()  # schema via the real migrations
    import sqlite3

    rng = random.Random(0)
    db = sqlite3.connect(path, isolation_level=None)
    cols = {
        t: [r[1] for r in db.execute(f"PRAGMA table_info({t})") if r[1] not in ("seq", "prev_hash", "row_hash")]
        for t in ("runs", "turns", "run_ends")
    }
    runs, turns, ends = [], [], []
    n_runs = n_turns // TURNS_PER_RUN
    for i in range(n_runs):
        model = MODELS[i % len(MODELS)]
        weak = MODELS.index(model)
        run_id = f"{i:032x}"
        temperature = (0.0, 0.7)[(i // 4) % 2]
        rep = i // 8
        values = dict(run_id=run_id, identity=f"id{i}", scenario=f"scenario_{(i // 16) % 5}", scenario_path="s.toml",
                      scenario_hash="h", model=model, backend="ollama", base_url=None, server_version=None, model_digest=None,
                      temperature=temperature, seed=rep, max_tokens=256, num_ctx=4096, tool_mode="native",
                      parser=("lenient", "strict")[(i // 32) % 2], repetition=rep % 20, turn_limit=8, token_limit=32000,
                      harness_version="0.1.0", git_sha=None, git_dirty=None, sandbox="/tmp/x",
                      started_at="2026-01-01T00:00:00.000+00:00", config="{}", think=None, manifest_digest=None,
                      stream=None)  # fmt: skip
        runs.append(tuple(values[c] for c in cols["runs"]))
        for n in range(1, TURNS_PER_RUN + 1):
            modes = sorted({m for m in MODES if rng.random() < 0.03 * (weak + 1)})
            content = "x" * rng.randint(5, 300)
            t = dict(run_id=run_id, turn=n, request_hash=f"{i:x}-{n}", raw_reply=canonical_json({"content": content}),
                     content=content, tool_calls=None, recovered_calls="[]", executed_calls="[]",
                     failure_modes=canonical_json(modes), recovered_by=None, classifier_version="1", finish_reason="stop",
                     prompt_tokens=500 + 50 * n, completion_tokens=rng.randint(5, 200), latency_ms=rng.uniform(50, 3000),
                     started_at="2026-01-01T00:00:00.000+00:00", ended_at="2026-01-01T00:00:01.000+00:00", details="{}",
                     reasoning=None, blob_refs=None, server_rejection=None, timings=None, stream_chunks=None, ttft_ms=None,
                     decode_tps=None)  # fmt: skip
            turns.append(tuple(t[c] for c in cols["turns"]))
        outcome = rng.choices(["pass", "task_failed", "turn_limit", "infra_error"], [0.6 - 0.12 * weak, 0.25, 0.1, 0.05])[0]
        e = dict(run_id=run_id, outcome=outcome, turns=TURNS_PER_RUN, prompt_tokens=6000, completion_tokens=800, breach=None,
                 error=None, checks="[]", final_answer="done", escape_attempts="[]", files_written="[]", blob_refs=None,
                 ended_at=f"2026-01-01T{(i // 3600) % 24:02d}:{(i // 60) % 60:02d}:{i % 60:02d}.000+00:00")  # fmt: skip
        ends.append(tuple(e[c] for c in cols["run_ends"]))
    db.execute("BEGIN")
    _chain(db, "runs", cols["runs"], runs)
    _chain(db, "turns", cols["turns"], turns)
    _chain(db, "run_ends", cols["run_ends"], ends)
    db.execute("COMMIT")
    db.close()


def _report_once(code_dir: Path, ledger: Path, out: Path) -> tuple[float, float, float]:
    """One ``harness report`` of ``ledger`` by the code in ``code_dir``, in a child: (wall s, CPU s, peak RSS MB)."""
    code = ("import sys, time, resource; sys.path.insert(0, '.'); from harness.cli import main; t = time.perf_counter(); "
            f"rc = main(['report', '--ledger', {str(ledger)!r}, '--out', {str(out)!r}, '--format', 'md,png,csv']); "
            "u, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN); "
            "print(f'{time.perf_counter() - t:.3f} {u.ru_utime + u.ru_stime + c.ru_utime + c.ru_stime:.3f} "
            "{(u.ru_maxrss + c.ru_maxrss) / 1024:.0f} {rc}')")  # fmt: skip
    started = time.perf_counter()
    child = subprocess.run([sys.executable, "-c", code], check=True, cwd=code_dir, capture_output=True, text=True)
    wall = time.perf_counter() - started
    _, cpu, rss, rc = child.stdout.split()[-4:]
    if rc != "0":
        raise SystemExit(f"harness report exited {rc}: {child.stderr.strip()}")
    return wall, float(cpu), float(rss)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1_000_000)
    parser.add_argument("--ledger", type=Path, default=Path("/tmp/harness_bench_1m.sqlite"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/harness_bench_report"))
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3, help="reports to time (medians printed)")
    parser.add_argument("--baseline", type=Path, default=None, help="a checkout of other code to time alternately")
    parser.add_argument("--baseline-ledger", type=Path, default=None, help="the ledger the baseline reads (default: --ledger)")
    args = parser.parse_args()
    if args.build_only:
        build(args.ledger, args.turns)
        return 0
    if args.rebuild or not args.ledger.exists():
        started = time.perf_counter()
        command = [sys.executable, __file__, "--build-only", "--ledger", str(args.ledger), "--turns", str(args.turns)]
        subprocess.run(command, check=True)  # in a child: this process stays small for the report children it forks
        print(
            f"built {args.ledger} ({args.turns:,} turns, {args.ledger.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - started:.1f} s"
        )
    with Ledger(args.ledger, readonly=True) as ledger:
        pending = ledger.pending_migrations()
    if pending:  # a ledger cached by older code gets the migrations added since (a writable open applies them)
        started = time.perf_counter()
        Ledger(args.ledger).close()
        print(f"migrated {args.ledger} ({', '.join(pending)}) in {time.perf_counter() - started:.1f} s")
    here = Path(__file__).resolve().parent.parent
    codes = {"this code": here} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in codes}
    for i in range(args.repeats):
        for name, code_dir in codes.items():
            out = args.out if name == "this code" else args.out.with_name(args.out.name + "_baseline")
            ledger = args.baseline_ledger if name == "baseline" and args.baseline_ledger else args.ledger
            figures[name].append(_report_once(code_dir, ledger, out))
            wall, cpu, rss = figures[name][-1]
            print(f"run {i + 1}, {name}: {wall:.1f} s wall (incl. interpreter start), {cpu:.1f} s CPU, peak RSS {rss:.0f} MB")
    medians = {name: [statistics.median(f[k] for f in runs) for k in range(3)] for name, runs in figures.items()}
    for name, (wall, cpu, rss) in medians.items():
        print(f"harness report on {args.turns:,} turns, {name}, median of {args.repeats}: {wall:.1f} s wall, {cpu:.1f} s CPU, "
              f"peak RSS {rss:.0f} MB (targets: < 10 s, < 1 GB)")  # fmt: skip
    if args.baseline:
        (w, c, r), (bw, bc, br) = medians["this code"], medians["baseline"]
        print(f"ratios this code / baseline: wall {w / bw:.2f}, CPU {c / bc:.2f}, peak RSS {r / br:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
