"""Kill-and-resume benchmark (issue 11, "Done when"): nothing lost, nothing run twice, tampering caught.

Run: ``python benchmarks/kill_resume.py [--runs 500] [--kills 10] [--latency-ms 50] [--jobs 4] [--seed N]
[--executor processes --workers 2]`` (about a minute on 2 cores at the defaults). It

1. starts a scripted OpenAI-compatible server on 127.0.0.1 (tests/fake_agent_server.py) that answers
   every request after ``--latency-ms`` like an ideal model (3 requests per run of list_and_report);
2. runs the ``--runs``-run matrix with ``harness run`` in a subprocess and kills it with SIGKILL
   ``--kills`` times at random moments (a seeded RNG picks the request count to wait for and a
   delay within one reply after it; the seed is printed), restarting it after each kill; each start
   is, at random, pid 1 in a new pid namespace (``unshare -pf --mount-proc``; skipped with a note
   where unavailable), and the first restart always is when it is available;
3. takes ``harness ledger head`` after the first kill, lets the last start finish, and checks:
   ``--dry-run`` says every planned run is done; the finished (scored) runs in the ledger are
   exactly the planned identities, each once; every run with an end row has its turn rows 1..``end.turns``
   (the processes executor sends turns without waiting for them); no process the killed harness started
   (its workers) is still running 5 s after the kill; ``ledger verify`` and ``ledger verify --anchor HEAD``
   pass; and a tampered copy of each kind issue 11 lists fails verify (cuts past the anchor and
   re-chained edits with ``--anchor``, the rest without it), using tests/ledger_tamper.py.

Prints PASS or FAIL with every failed check and exits 1 on failure.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.ledger import Ledger, parse_anchor  # noqa: E402
from harness.matrix import MatrixOverrides  # noqa: E402
from harness.runner import expand_matrix, plan_matrix  # noqa: E402
from harness.scenarios import load_scenario  # noqa: E402
from harness.vocab import is_scored  # noqa: E402
from tests.fake_agent_server import FakeAgentServer  # noqa: E402
from tests.helpers import child_pids, left_after  # noqa: E402
from tests.ledger_tamper import CHAINED, delete_last_run, rechain, tamper  # noqa: E402

SCENARIO = REPO / "scenarios" / "list_and_report.toml"
REQUESTS_PER_RUN = 3  # list_files, write_file, final answer
PID_NAMESPACE = ("unshare", "-pf", "--mount-proc", "--kill-child")
FLAGS = ("--temperature", "0", "--tool-mode", "native", "--parser", "lenient")


def harness(*args: str, prefix: tuple[str, ...] = (), **kwargs) -> subprocess.CompletedProcess[str]:
    """Run ``python -m harness ARGS`` to completion (a hang guard of 10 minutes, not a speed check)."""
    return subprocess.run([*prefix, sys.executable, "-m", "harness", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600, **kwargs)  # fmt: skip


def pid_namespace_works() -> bool:
    """Whether ``unshare -pf --mount-proc`` can start a process as pid 1 here (needs root or user namespaces)."""
    if shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run([*PID_NAMESPACE, sys.executable, "-c", "import os; print(os.getpid())"],
                               capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0 and probe.stdout.strip() == "1"


def _harness_pid(proc: subprocess.Popen[bytes], as_pid_1: bool) -> int:
    """The harness's pid as seen from here: the unshare child when it runs as pid 1 in its own namespace."""
    if not as_pid_1:
        return proc.pid
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    except OSError:
        children = []
    return int(children[0]) if children else proc.pid  # unshare --kill-child takes the harness down with it


class Matrix:
    """One ``harness run`` matrix against the server, started, killed and restarted as a subprocess."""

    def __init__(self, server: FakeAgentServer, folder: Path, runs: int, jobs: int, executor: tuple[str, ...] = ()) -> None:
        self.server, self.folder = server, folder
        self.ledger = folder / "ledger.sqlite"
        self.model = f"openai:ideal@{server.base_url}"
        self.args = (str(SCENARIO), "--model", self.model, *FLAGS, "--repeats", str(runs), "--jobs", str(jobs),
                     "--ledger", str(self.ledger), *executor)  # fmt: skip
        self.starts = 0
        self.orphans: list[int] = []  # processes of a killed harness still running 5 s after the kill

    def start(self, as_pid_1: bool) -> subprocess.Popen[bytes]:
        """Start ``harness run`` (output to files: a full pipe must not stall it)."""
        self.starts += 1
        out = open(self.folder / f"start{self.starts}.out", "wb")  # noqa: SIM115 - closed when the process is reaped
        err = open(self.folder / f"start{self.starts}.err", "wb")  # noqa: SIM115
        prefix = PID_NAMESPACE if as_pid_1 else ()
        proc = subprocess.Popen([*prefix, sys.executable, "-m", "harness", "run", *self.args], cwd=REPO, stdout=out, stderr=err)
        out.close()
        err.close()
        return proc

    def stderr(self) -> str:
        """The last start's stderr."""
        return (self.folder / f"start{self.starts}.err").read_text(errors="replace")

    def stdout(self) -> str:
        """The last start's stdout."""
        return (self.folder / f"start{self.starts}.out").read_text(errors="replace")

    def kill_at(self, proc: subprocess.Popen[bytes], as_pid_1: bool, request: int, delay_s: float,
                start_s: float | None = None) -> str | None:  # fmt: skip
        """SIGKILL the harness ``delay_s`` after the server's ``request``-th request, or ``start_s`` after now if sooner.

        Returns:
            When the kill landed, in words; None when the harness exited by itself first.
        """
        deadline = time.monotonic() + (start_s if start_s is not None else 1e9)
        while self.server.requests < request:
            if proc.poll() is not None:
                return None
            if time.monotonic() >= deadline:
                moment = f"{start_s * 1000:4.0f} ms after its start, at request {self.server.requests}"
                break
            time.sleep(0.002)
        else:
            time.sleep(delay_s)
            moment = f"{delay_s * 1000:4.0f} ms after request {request}"
        if proc.poll() is not None:
            return None
        pid = _harness_pid(proc, as_pid_1)
        children = child_pids(pid)
        os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=60)
        self.orphans += left_after(children, 5.0)
        return moment


def _run_with_kills(matrix: Matrix, rng: random.Random, kills: int, latency_s: float, runs: int, jobs: int, pid1: bool) -> dict:
    """Start, kill ``kills`` times, restart, let the last start finish; return what happened."""
    total = REQUESTS_PER_RUN * runs
    # the first kill waits for a few finished runs, so the head taken after it anchors real rows
    low = min(total - kills, REQUESTS_PER_RUN * (jobs + 1) + 1)
    targets = sorted(rng.sample(range(low, total), kills))
    outcome: dict = {"landed": 0, "as_pid_1": 0, "anchor": None, "final_rc": None, "final_out": "", "final_err": ""}
    as_pid_1 = pid1 and rng.random() < 0.5
    proc = matrix.start(as_pid_1)
    for k, target in enumerate(targets, 1):
        # one kill in five (not the first) lands at a random moment of the start (imports, migration, planning)
        # unless its request comes first
        start_s = rng.uniform(0, 1.0) if k > 1 and rng.random() < 0.2 else None
        outcome["as_pid_1"] += as_pid_1
        moment = matrix.kill_at(proc, as_pid_1, target, rng.uniform(0, latency_s), start_s)
        where = "as pid 1 in a new pid namespace" if as_pid_1 else "as a plain child"
        if moment is None:
            print(f"  kill {k}: the harness ({where}) exited by itself first (rc {proc.returncode})")
            break
        outcome["landed"] += 1
        print(f"  kill {k}: SIGKILL {moment} of about {total} ({where})", flush=True)
        if k == 1:
            head = harness("ledger", "head", "--ledger", str(matrix.ledger))
            outcome["anchor"] = head.stdout.strip() if head.returncode == 0 else None
            print(f"  head after the first kill: {outcome['anchor'] or head.stderr.strip()}")
        as_pid_1 = pid1 and (k == 1 or rng.random() < 0.5)  # the case: killed as pid 1, restarted as pid 1
        proc = matrix.start(as_pid_1)
    outcome["as_pid_1"] += as_pid_1
    outcome["final_rc"] = proc.wait(timeout=3600)
    outcome["final_out"], outcome["final_err"] = matrix.stdout(), matrix.stderr()
    return outcome


def _check_identities(matrix: Matrix, runs: int, failures: list[str]) -> None:
    """``--dry-run`` says all done; the scored runs are exactly the planned identities, each once."""
    dry = harness("run", "--dry-run", *matrix.args)
    lines = dry.stdout.strip().splitlines()
    want = f"{runs} runs planned, {runs} already done, 0 to run."
    done_lines = sum(line.startswith("[done] ") for line in lines)
    print(f"  --dry-run: {lines[-1] if lines else dry.stderr.strip()} ({done_lines} lines marked done; exit {dry.returncode})")
    if dry.returncode != 0 or not lines or lines[-1] != want or done_lines != runs:
        failures.append(f"--dry-run does not say every planned run is done: {lines[-1:] or dry.stderr.strip()}")
    plans = expand_matrix([load_scenario(SCENARIO)], MatrixOverrides([matrix.model], [0.0], runs, None, ["native"], ["lenient"]))
    with Ledger(matrix.ledger, readonly=True) as ledger:
        planned = {p.identity for p in plan_matrix(plans, ledger).planned}
        rows = ledger.runs()
    scored = Counter(r.start.identity for r in rows if is_scored(r.outcome))
    outcomes = Counter(r.outcome or "unfinished (killed)" for r in rows)
    missing, extra = planned - set(scored), set(scored) - planned
    duplicates = {i: n for i, n in scored.items() if n > 1}
    print(f"  planned identities: {len(planned)}; start rows: {len(rows)}; outcomes: {dict(sorted(outcomes.items()))}")
    print(f"  scored runs: {sum(scored.values())}; missing: {len(missing)}; duplicates: {len(duplicates)}; "
          f"not planned: {len(extra)}")  # fmt: skip
    if len(planned) != runs:
        failures.append(f"the matrix plans {len(planned)} identities, not {runs}")
    if missing or duplicates or extra:
        failures.append(f"scored runs are not the planned set: {len(missing)} missing, {len(duplicates)} duplicated, "
                        f"{len(extra)} not planned")  # fmt: skip
    if set(outcomes) - {"pass", "unfinished (killed)"}:
        failures.append(f"outcomes other than pass (the server is ideal): {dict(outcomes)}")
    _check_turns(matrix, failures)


def _check_turns(matrix: Matrix, failures: list[str]) -> None:
    """Every run with an end row has its turn rows 1..``end.turns``, no gap, none after."""
    with Ledger(matrix.ledger, readonly=True) as ledger:
        numbers: dict[str, list[int]] = {}
        for turn in ledger.turns():
            numbers.setdefault(turn.record.run_id, []).append(turn.record.turn)
        ended = [run for run in ledger.runs() if run.end is not None]
    short = [run.run_id for run in ended if numbers.get(run.run_id, []) != list(range(1, run.end.turns + 1))]
    print(f"  ended runs whose turn rows are not 1..end.turns: {len(short)} of {len(ended)}")
    if short:
        failures.append(f"{len(short)} ended runs lack turn rows their end row counts (or have extra): {short[:3]}")


def _truncate_to_before(anchor: str) -> Callable[[Path], None]:
    """A cut back past the anchor: every anchored chained table keeps one row fewer than anchored; counters fixed."""
    counts = parse_anchor(anchor).rows
    statements = [f"DELETE FROM {t} WHERE seq NOT IN (SELECT seq FROM {t} ORDER BY seq LIMIT {counts[t] - 1})"
                  for t in CHAINED if counts.get(t)]  # fmt: skip
    return lambda path: tamper(path, *statements, fix_counters=True)


def _rechained(table: str, assignment: str) -> Callable[[Path], None]:
    """Edit the first row of ``table`` and recompute its chain with the harness's own hash function."""

    def forge(path: Path) -> None:
        tamper(path, f"UPDATE {table} SET {assignment} WHERE seq = (SELECT MIN(seq) FROM {table})")
        rechain(path, table)

    return forge


def _own_triggers(*statements: str) -> Callable[[Path], None]:
    """Run the forger's trigger statements as they are (their triggers are not put back)."""

    def forge(path: Path) -> None:
        db = sqlite3.connect(path)
        for sql in statements:
            db.execute(sql)
        db.commit()
        db.close()

    return forge


def tamper_kinds(ledger: Path, anchor: str) -> list[tuple[str, Callable[[Path], None], bool]]:
    """``(kind, forge(path), with_anchor)`` for every kind of tampering issue 11 lists.

    Re-chained edits touch a table's first row, and only of tables the anchor covers (an anchor
    cannot speak for rows written after it).
    """
    with Ledger(ledger, readonly=True) as opened:
        counts = opened.row_counts()
    anchored = parse_anchor(anchor).rows
    edits = {"turns": "content = 'forged'", "runs": "model = 'openai:gpt-9@http://x'", "run_ends": "outcome = 'task_failed'"}
    kinds: list[tuple[str, Callable[[Path], None], bool]] = [
        (f"last row of {t} deleted", lambda p, t=t: tamper(p, f"DELETE FROM {t} WHERE seq = (SELECT MAX(seq) FROM {t})"), False)
        for t in CHAINED if counts.get(t)
    ]  # fmt: skip
    kinds += [
        ("whole last run deleted", lambda p: delete_last_run(p, fix_counters=False), False),
        ("trigger replaced by a no-op of the same name", _own_triggers(
            "DROP TRIGGER turns_no_update", "CREATE TRIGGER turns_no_update BEFORE UPDATE ON turns BEGIN SELECT 1; END"), False),
        ("same-named trigger on another event", _own_triggers(
            "DROP TRIGGER turns_no_delete", "CREATE TRIGGER turns_no_delete BEFORE INSERT ON turns WHEN 0 BEGIN"
            " SELECT RAISE(ABORT, 'the ledger is append-only: DELETE on turns refused'); END"), False),
        ("_migrations dropped", lambda p: tamper(p, "DROP TABLE _migrations"), False),
        ("_migrations row edited", lambda p: tamper(p, "UPDATE _migrations SET name = 'm003_other' WHERE name = 'm003_attempts'"), False),
        ("_migrations last row deleted", lambda p: tamper(p, "DELETE FROM _migrations WHERE rowid = (SELECT MAX(rowid) FROM _migrations)"), False),
        ("cut back past the anchor, counters fixed", _truncate_to_before(anchor), True),
        ("whole last run deleted, counters fixed, then a cut past the anchor",
         lambda p: (delete_last_run(p, fix_counters=True), _truncate_to_before(anchor)(p)), True),
        *((f"first row of {t} edited ({edit}) and re-chained", _rechained(t, edit), True)
          for t, edit in edits.items() if anchored.get(t)),
        ("_migrations time moved", lambda p: tamper(
            p, "UPDATE _migrations SET applied_at = '2000-01-01T00:00:00.000+00:00' WHERE name = 'm001_initial'"), True),
    ]  # fmt: skip
    return kinds


def _check_ledger(matrix: Matrix, anchor: str | None, failures: list[str]) -> None:
    """Verify with and without the anchor; each tampered copy must fail verify."""
    plain = harness("ledger", "verify", "--ledger", str(matrix.ledger))
    print(f"  ledger verify: exit {plain.returncode}: {(plain.stdout + plain.stderr).strip().splitlines()[-1:]}")
    if plain.returncode != 0:
        failures.append(f"ledger verify fails on the real ledger: {plain.stdout}{plain.stderr}")
    if anchor is None:
        failures.append("no head was taken after the first kill")
        return
    anchored = harness("ledger", "verify", "--ledger", str(matrix.ledger), "--anchor", anchor)
    print(f"  ledger verify --anchor (head after the first kill): exit {anchored.returncode}")
    if anchored.returncode != 0:
        failures.append(f"ledger verify --anchor fails on the real ledger: {anchored.stdout}{anchored.stderr}")
    for n, (kind, forge, with_anchor) in enumerate(tamper_kinds(matrix.ledger, anchor), 1):
        copy = matrix.folder / f"tampered{n}.sqlite"
        shutil.copyfile(matrix.ledger, copy)
        forge(copy)
        result = harness("ledger", "verify", "--ledger", str(copy), *(("--anchor", anchor) if with_anchor else ()))
        said = " ".join((result.stdout + result.stderr).split())[:150]
        how = "verify --anchor" if with_anchor else "verify"
        inside = ""
        if with_anchor:  # what verify sees from inside the file alone (expected: nothing, hence the anchor)
            inside = f" (without the anchor: exit {harness('ledger', 'verify', '--ledger', str(copy)).returncode})"
        print(f"  tampered ({kind}): {how} exit {result.returncode}{inside}: {said}")
        if result.returncode != 1 or "Traceback" in result.stderr:
            failures.append(f"{how} did not catch a tampered copy ({kind}): exit {result.returncode}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when every check passes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500, help="planned runs (repeats of list_and_report); default 500")
    parser.add_argument("--kills", type=int, default=10, help="SIGKILLs at random moments; default 10")
    parser.add_argument("--latency-ms", type=float, default=50.0, help="the server's delay per reply; default 50")
    parser.add_argument("--jobs", type=int, default=4, help="harness run --jobs (and the server's slots); default 4")
    parser.add_argument("--seed", type=int, default=None, help="the RNG seed (default: a random one, printed)")
    parser.add_argument("--executor", choices=("threads", "processes"), default="threads", help="harness run --executor")
    parser.add_argument("--workers", type=int, default=2, help="--workers with --executor processes; default 2")
    args = parser.parse_args(argv)
    if args.runs < 3 or not 1 <= args.kills <= REQUESTS_PER_RUN * args.runs - 8:
        parser.error("--runs must be at least 3 and --kills from 1 to about 3 x --runs")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    rng = random.Random(seed)
    pid1 = pid_namespace_works()
    executor = ("--executor", "processes", "--workers", str(args.workers)) if args.executor == "processes" else ()
    print(f"kill_resume: {args.runs} runs, {args.kills} kills, {args.latency_ms:g} ms per reply, --jobs {args.jobs}, "
          f"{' '.join(executor) or '--executor threads'}, seed {seed}")  # fmt: skip
    if not pid1:
        print("  note: unshare -pf --mount-proc is not available here; every start is a plain child process")
    failures: list[str] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, FakeAgentServer(delay_s=args.latency_ms / 1000, slots=args.jobs) as server:
        matrix = Matrix(server, Path(tmp), args.runs, args.jobs, executor)
        outcome = _run_with_kills(matrix, rng, args.kills, args.latency_ms / 1000, args.runs, args.jobs, pid1)
        elapsed = time.perf_counter() - started
        print(f"  {outcome['landed']} of {args.kills} kills landed; {matrix.starts} starts, {outcome['as_pid_1']} as pid 1; "
              f"{server.requests} model requests; last start exit {outcome['final_rc']}; {elapsed:.1f} s to finish")  # fmt: skip
        if outcome["landed"] != args.kills:
            failures.append(f"only {outcome['landed']} of {args.kills} kills landed before the matrix finished")
        if outcome["final_rc"] != 0:
            failures.append(f"the last start exited {outcome['final_rc']}: {outcome['final_err'][-500:]}")
        print(f"  processes of a killed harness still running 5 s after its kill: {len(matrix.orphans)}")
        if matrix.orphans:
            failures.append(f"{len(matrix.orphans)} processes outlived their killed harness by 5 s (killed now)")
        _check_identities(matrix, args.runs, failures)
        _check_ledger(matrix, outcome["anchor"], failures)
    total = time.perf_counter() - started
    if failures:
        print(f"FAIL ({total:.1f} s in all, seed {seed}):")
        for failure in failures:
            print(f"  - {failure}")
        return 1
    print(f"PASS: {args.runs} runs, {args.kills} kills ({outcome['as_pid_1']} of {matrix.starts} starts as pid 1), "
          f"matrix finished in {elapsed:.1f} s, {total:.1f} s in all with the checks; seed {seed}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
