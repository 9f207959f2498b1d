"""Peer benchmark: the harness against inspect_ai on the same 3-turn task, side by side in one run.

Run: ``python benchmarks/peer_inspect.py --install /tmp/inspect-venv`` once (a virtual environment of its own
holding inspect_ai; never a dependency of this project), then
``python benchmarks/peer_inspect.py --venv /tmp/inspect-venv`` (a few minutes on 2 cores). Prints, for each side:

1. Per-turn cost: whole-run wall time divided by turns, for ``--runs`` runs in one fresh child process per
   measurement, the two sides interleaved for ``--rounds`` rounds; the medians and their ratio (target: the
   harness at most 1/20 of inspect_ai, issue 14). Interpreter start and imports are not in the time; everything
   from the first run's set-up to the last run's end is.
2. Peak resident memory of those children (``ru_maxrss``: imports, the runs and their records; median).
3. Start-up: wall time of ``python -m harness --help`` against ``inspect --help`` (median over the rounds).

The task on both sides is ``scenarios/list_and_report.toml``: its system prompt, task, three tools offered
(``list_files``, ``read_file``, ``write_file``) and three fixture files in a fresh folder per run; a
zero-latency scripted model answers ``list_files(".")``, then ``write_file("report.txt", ...)``, then a final
answer without a tool call; the report is checked afterwards (exists, names every fixture and no other file,
states the count). The harness replays those three replies from a cassette (``replay:`` model, jobs 1, a fresh
ledger: one durable transaction per turn, the hash chain, the sandbox, the checks). inspect_ai runs the same
replies from its ``mockllm/model`` (a callable choosing the reply from the number of tool results so far, with
token usage given so none is counted) through ``use_tools`` and ``generate(tool_calls="loop")``, one sample at
a time (``max_samples=1``, the harness's jobs 1; ``--inspect-max-samples`` changes it), ``display="none"``, its
``.eval`` log with every sample (the peer of the ledger) but without realtime event logging
(``log_realtime=False``, about a fifth less CPU than the default) written to a temporary folder, and a scorer doing
the same checks. ``--inspect-max-samples 0`` runs inspect_ai with its own defaults instead (samples in flight,
realtime event log, display): its configuration as a user gets it, the realtime log being what lets its viewer show
a sample in progress, as the harness's viewer shows a run's turns. The CPU time of each child over the same window is printed beside the wall time.

The harness is measured from this checkout (``PYTHONPATH``), inspect_ai with the virtual environment's python.
Without ``--venv`` (or with a folder that holds no inspect_ai) only the harness side is measured and the
script says so. Shared machines are noisy: the ratio within one run is the figure; the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCENARIO_FILE = REPO / "scenarios" / "list_and_report.toml"
INSPECT_VERSION = "0.3.285"  # the version issue 14 measured; --inspect-version picks another
REPORT = "There are 3 files:\nconfig.json\nhello.txt\nmemo.md\n"
FINAL = "I wrote report.txt."
TURNS_PER_RUN = 3
TARGET_RATIO = 0.05  # issue 14: at most 1/20 of inspect_ai's per-turn cost
SIDES = ("harness", "inspect_ai")


# --- the parent: install, interleave, summarise --------------------------------------------------------------


def install(venv: Path, version: str) -> None:
    """Create a virtual environment at ``venv`` and pip install ``inspect_ai==version`` into it.

    Raises:
        subprocess.CalledProcessError: venv creation or pip failed (pip's own message is on stderr).
    """
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(_venv_python(venv)), "-m", "pip", "install", "-q", f"inspect_ai=={version}"], check=True)
    done = subprocess.run([str(_venv_python(venv)), "-c", "import inspect_ai; print(inspect_ai.__version__)"],
                          check=True, capture_output=True, text=True)  # fmt: skip
    print(f"inspect_ai {done.stdout.strip()} installed in {venv}")


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def peer_version(venv: Path | None) -> str | None:
    """The inspect_ai version importable by ``venv``'s python, or None (no venv, or inspect_ai not in it)."""
    if venv is None or not _venv_python(venv).exists():
        return None
    done = subprocess.run([str(_venv_python(venv)), "-c", "import inspect_ai; print(inspect_ai.__version__)"],
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else None


def _child(side: str, runs: int, venv: Path | None, max_samples: int) -> dict[str, float]:
    """One measurement in a fresh child process; its last stdout line is the JSON of :func:`_measure`."""
    if side == "harness":
        command = [sys.executable, __file__, "--child", side, "--runs", str(runs)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    else:
        assert venv is not None
        command = [str(_venv_python(venv)), __file__, "--child", side, "--runs", str(runs)]
        command += ["--inspect-max-samples", str(max_samples)]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {side} child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def _startup_s(side: str, venv: Path | None) -> float:
    """Wall time of ``python -m harness --help`` (this checkout) or the venv's ``inspect --help``."""
    if side == "harness":
        command = [sys.executable, "-m", "harness", "--help"]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
    else:
        assert venv is not None
        command = [str(venv / "bin" / "inspect"), "--help"]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def measure(rounds: int, runs: int, venv: Path | None, max_samples: int = 1) -> dict[str, list[dict[str, float]]]:
    """``rounds`` interleaved rounds; each round measures every side once (whole runs, then start-up).

    Returns: ``{side: [{"ms_per_turn", "turns", "runs", "elapsed_s", "peak_rss_mib", "startup_s"}, ...]}``.
    """
    sides = SIDES if venv is not None else SIDES[:1]
    got: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for index in range(rounds):
        order = sides if index % 2 == 0 else sides[::-1]  # neither side always goes first
        for side in order:
            row = _child(side, runs, venv, max_samples)
            row["startup_s"] = _startup_s(side, venv)
            got[side].append(row)
            print(f"   round {index + 1} {side}: {row['ms_per_turn']:.2f} ms per turn, "
                  f"{row['peak_rss_mib']:.0f} MiB, start-up {row['startup_s']:.2f} s", flush=True)  # fmt: skip
    return got


def summarise(got: Mapping[str, Sequence[Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """Median of each figure per side, plus ``ratio`` rows (harness / inspect_ai) when both sides were measured.

    Args:
        got: ``{side: [row, ...]}`` as :func:`measure` returns; every row holds the same keys.

    Returns:
        ``{side: {figure: median}}`` and, with both sides, ``"ratio": {figure: harness median / inspect_ai median}``.

    Raises:
        ValueError: a side has no rows.
    """
    medians: dict[str, dict[str, float]] = {}
    for side, rows in got.items():
        if not rows:
            raise ValueError(f"no measurements for {side}")
        medians[side] = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    if "harness" in medians and "inspect_ai" in medians:
        mine, peer = medians["harness"], medians["inspect_ai"]
        medians["ratio"] = {key: mine[key] / peer[key] for key in ("ms_per_turn", "cpu_ms_per_turn", "peak_rss_mib", "startup_s")}
    return medians


def report_lines(medians: Mapping[str, Mapping[str, float]], *, rounds: int, peer: str | None) -> list[str]:
    """The printed summary of :func:`summarise`'s result (one figure a line, the verdict on the target last)."""
    lines = [f"Medians of {rounds} interleaved rounds ({TURNS_PER_RUN} turns per run, whole runs, one child each):"]
    for side in SIDES:
        if side not in medians:
            continue
        m = medians[side]
        name = side if side == "harness" else f"inspect_ai {peer}"
        lines.append(f"   {name:17s}: {m['ms_per_turn']:7.2f} ms per turn ({m['runs']:.0f} runs, {m['turns']:.0f} turns, "
                     f"{m['elapsed_s']:.2f} s; CPU {m['cpu_ms_per_turn']:.2f} ms per turn), peak RSS {m['peak_rss_mib']:4.0f} MiB, start-up (--help) {m['startup_s']:.2f} s")  # fmt: skip
    if "ratio" not in medians:
        lines.append("   inspect_ai was not measured (no --venv holding it; --install DIR makes one): no ratio")
        return lines
    r = medians["ratio"]
    lines.append(f"   ratio harness / inspect_ai: per turn {r['ms_per_turn']:.3f} (CPU {r['cpu_ms_per_turn']:.3f}), peak RSS {r['peak_rss_mib']:.2f}, "
                 f"start-up {r['startup_s']:.3f}")  # fmt: skip
    met = "met" if r["ms_per_turn"] <= TARGET_RATIO else "NOT met"
    lines.append(f"   target per turn <= {TARGET_RATIO} of inspect_ai's: {met} ({r['ms_per_turn']:.3f}; "
                 f"at {TARGET_RATIO} the harness would need {TARGET_RATIO * medians['inspect_ai']['ms_per_turn']:.2f} ms per turn)")  # fmt: skip
    return lines


# --- the children: one side's whole runs ----------------------------------------------------------------------


def _measure(side: str, runs: int, folder: Path, max_samples: int = 1) -> dict[str, float]:
    """Run ``runs`` runs of the task on ``side`` in this process; figures of the whole runs and this process.

    ``max_samples`` is inspect_ai's samples in flight (the harness always runs jobs 1).
    """
    if side == "harness":
        elapsed, cpu, turns = _harness_runs(runs, folder)
    else:
        elapsed, cpu, turns = _inspect_runs(runs, folder, max_samples)
    if turns != runs * TURNS_PER_RUN:
        raise RuntimeError(f"{side}: {turns} turns for {runs} runs, expected {TURNS_PER_RUN} per run")
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"ms_per_turn": elapsed / turns * 1000, "turns": turns, "runs": runs, "elapsed_s": elapsed,
            "cpu_ms_per_turn": cpu / turns * 1000, "peak_rss_mib": peak_kib / 1024}  # fmt: skip


def _cassette_lines() -> list[str]:
    def line(calls: list[tuple[str, dict[str, str]]] | None = None, content: str | None = None) -> str:
        tool_calls = [{"function": {"name": n, "arguments": a}} for n, a in calls or []] or None
        return json.dumps({"content": content, "tool_calls": tool_calls, "finish_reason": "stop",
                           "usage": {"prompt_tokens": 100, "completion_tokens": 20}})  # fmt: skip

    return [
        line([("list_files", {"path": "."})]),
        line([("write_file", {"path": "report.txt", "content": REPORT})]),
        line(content=FINAL),
    ]


def _harness_runs(runs: int, folder: Path) -> tuple[float, float, int]:
    """``runs`` runs of ``list_and_report`` replayed from the 3-reply cassette, jobs 1; (wall s, CPU s, turns)."""
    sys.path.insert(0, str(REPO))  # this checkout's code, not an installed copy
    from harness.ledger import Ledger
    from harness.loop import RunOptions
    from harness.runner import MatrixOverrides, expand_matrix, run_matrix
    from harness.scenarios import load_scenario

    cassette = folder / "peer.jsonl"
    cassette.write_text("\n".join(_cassette_lines()) + "\n", encoding="utf-8")
    scenario = load_scenario(SCENARIO_FILE)
    plans = expand_matrix([scenario], MatrixOverrides([f"replay:{cassette}"], [0.0], runs, None, ["native"], None))
    with Ledger(folder / "ledger.sqlite") as ledger:
        start, cpu = time.perf_counter(), time.process_time()
        result = run_matrix(plans, ledger, RunOptions(runs_dir=folder / "runs"))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    outcomes = {s.outcome for s in result.summaries}
    if outcomes != {"pass"} or len(result.summaries) != runs:
        raise RuntimeError(f"harness: {len(result.summaries)} runs, outcomes {outcomes}")
    return elapsed, cpu, sum(s.turns for s in result.summaries)


def _inspect_runs(runs: int, folder: Path, max_samples: int = 1) -> tuple[float, float, int]:
    """The same runs through inspect_ai (see the module docstring); (wall s, CPU s, assistant turns)."""
    from inspect_ai import eval as inspect_eval

    task = _inspect_task(runs, folder / "work")
    start, cpu = time.perf_counter(), time.process_time()
    lean: dict[str, object] = {"max_samples": max_samples, "display": "none", "log_realtime": False} if max_samples else {}
    [log] = inspect_eval(task, model=_inspect_model(), log_dir=str(folder / "logs"), log_format="eval", **lean)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    if log.status != "success" or log.samples is None:
        raise RuntimeError(f"inspect_ai: status {log.status}: {log.error}")
    scores = [score.value for sample in log.samples for score in (sample.scores or {}).values()]
    if len(log.samples) != runs or scores != ["C"] * runs:
        raise RuntimeError(f"inspect_ai: {len(log.samples)} samples, scores {sorted(set(map(str, scores)))}")
    turns = sum(1 for sample in log.samples for message in sample.messages if message.role == "assistant")
    return elapsed, cpu, turns


def _inspect_model():  # noqa: ANN202 - inspect_ai's Model, imported in the child only
    """``mockllm/model`` answering the three scripted replies, chosen by the tool results in the conversation."""
    from inspect_ai.model import ModelOutput, ModelUsage, get_model

    usage = ModelUsage(input_tokens=100, output_tokens=20, total_tokens=120)

    def reply(messages, tools, tool_choice, config):  # noqa: ANN001, ANN202 - mockllm's callable shape
        done = sum(1 for message in messages if message.role == "tool")
        if done == 0:
            output = ModelOutput.for_tool_call("mockllm/model", "list_files", {"path": "."}, tool_call_id="c0")
        elif done == 1:
            output = ModelOutput.for_tool_call("mockllm/model", "write_file", {"path": "report.txt", "content": REPORT},
                                               tool_call_id="c1")  # fmt: skip
        else:
            output = ModelOutput.from_content("mockllm/model", FINAL)
        output.usage = usage
        return output

    return get_model("mockllm/model", custom_outputs=reply)


def _inside(root: Path, path: str) -> Path:
    """``path`` resolved below ``root`` (the sandbox rule of the harness's tools); ValueError outside it."""
    target = (root / path).resolve()
    if target != root and root not in target.parents:
        raise ValueError(f"{path!r} is outside the working folder")
    return target


def _inspect_tools() -> list:
    """The scenario's three tools as inspect_ai tools, each working in the sample's folder (``store()["folder"]``)."""
    from inspect_ai.tool import tool
    from inspect_ai.util import store

    @tool
    def list_files():  # noqa: ANN202 - inspect_ai's tool factory shape
        async def execute(path: str = ".") -> str:
            """List the files in a directory.

            Args:
                path: the directory, relative to the working directory.
            """
            return json.dumps(sorted(entry.name for entry in _inside(Path(store().get("folder")), path).iterdir()))

        return execute

    @tool
    def read_file():  # noqa: ANN202
        async def execute(path: str) -> str:
            """Read a text file.

            Args:
                path: the file, relative to the working directory.
            """
            return _inside(Path(store().get("folder")), path).read_text(encoding="utf-8")

        return execute

    @tool
    def write_file():  # noqa: ANN202
        async def execute(path: str, content: str) -> str:
            """Write a text file.

            Args:
                path: the file, relative to the working directory.
                content: the text to write.
            """
            data = content.encode("utf-8")
            _inside(Path(store().get("folder")), path).write_bytes(data)
            return f"wrote {len(data)} bytes to {path}"

        return execute

    return [list_files(), read_file(), write_file()]


def _report_ok(folder: Path, fixtures: Sequence[str]) -> bool:
    """The scenario's checks on ``report.txt``: it exists, names every fixture and no other file, states the count."""
    import re

    report = folder / "report.txt"
    if not report.is_file():
        return False
    text = report.read_text(encoding="utf-8")
    named = set(re.findall(r"[\w-]+\.[A-Za-z0-9]+", text))
    existing = {entry.name for entry in folder.iterdir()}
    return all(name in text for name in fixtures) and named <= existing and bool(re.search(rf"\b{len(fixtures)}\b", text))


def _inspect_task(runs: int, work: Path):  # noqa: ANN202 - inspect_ai's Task
    """``runs`` samples of the scenario: a fresh folder with its fixtures per sample, the tool loop, the checks."""
    from inspect_ai import Task
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
    from inspect_ai.solver import Generate, TaskState, generate, solver, system_message, use_tools
    from inspect_ai.util import store

    spec = tomllib.loads(SCENARIO_FILE.read_text(encoding="utf-8"))
    fixtures: dict[str, str] = spec["fixtures"]
    work.mkdir(parents=True, exist_ok=True)

    @solver
    def sandbox():  # noqa: ANN202 - inspect_ai's solver factory shape
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            folder = Path(tempfile.mkdtemp(dir=work)).resolve()
            for name, text in fixtures.items():
                (folder / name).write_text(text, encoding="utf-8")
            store().set("folder", str(folder))
            return state

        return solve

    @scorer(metrics=[accuracy()])
    def checks():  # noqa: ANN202
        async def score(state: TaskState, target: Target) -> Score:
            folder = Path(store().get("folder"))
            ok = _report_ok(folder, sorted(fixtures))
            shutil.rmtree(folder)  # the harness removes each run's sandbox too
            return Score(value=CORRECT if ok else INCORRECT)

        return score

    return Task(
        dataset=[Sample(input=spec["task"], id=index) for index in range(runs)],
        solver=[system_message(spec["system_prompt"]), sandbox(), use_tools(_inspect_tools()), generate(tool_calls="loop")],
        scorer=checks(),
    )


def file_system(path: str, table: str | None = None) -> str:
    """The type of the file system holding ``path`` (``ext4``, ``tmpfs``...), from ``table`` in ``/proc/mounts``'s
    format (default: that file; its mount points escape a space as ``\\040``); ``unknown`` where there is none.

    Both sides create a folder and four files per run: where inode creation is slow (a VM's disk whose blocks are
    fetched on first use: 0.3-1 ms per ``mkdir`` or new file on this machine's fresh disk, against 20-100 us later and
    on ``tmpfs``), that cost swamps the harness's and moves the ratio; ``TMPDIR=/dev/shm`` measures the code alone.
    """
    try:
        mounts = [line.split()[1:3] for line in (table or Path("/proc/mounts").read_text()).splitlines()]
    except OSError:
        return "unknown"
    mounts = [(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), point), kind) for point, kind in mounts]  # \040: space
    real = os.path.realpath(path)
    inside = [(len(point), order, kind) for order, (point, kind) in enumerate(mounts)
              if real == point or real.startswith(point.rstrip("/") + "/")]  # fmt: skip
    return max(inside)[2] if inside else "unknown"  # the deepest mount point; of two at one point, the later (on top)


def new_file_ms(folder: str, count: int = 40) -> float:
    """Mean wall milliseconds to create a folder in ``folder`` and one file in it (``count`` times, in a scratch folder
    removed afterwards), as each run's sandbox is made: what the disk costs a run before any code runs (each new
    folder may land in another block group, whose inode blocks a VM's disk fetches on first use)."""
    scratch = Path(tempfile.mkdtemp(dir=folder))
    try:
        start = time.perf_counter()
        for index in range(count):
            (scratch / f"d{index}").mkdir()
            (scratch / f"d{index}" / "f").write_bytes(b"x")
        return (time.perf_counter() - start) / count * 1000
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def work_folder_line() -> str:
    """Where the work folders go, their file system and what a new file and folder cost there (one line)."""
    where = tempfile.gettempdir()
    return (f"work folders in {where} ({file_system(where)}: a new folder and file in it {new_file_ms(where):.2f} ms; "
            "TMPDIR=DIR picks another)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--install", type=Path, metavar="DIR", help="create a venv in DIR holding inspect_ai, then stop")
    parser.add_argument("--inspect-version", default=INSPECT_VERSION, help=f"with --install (default {INSPECT_VERSION})")
    parser.add_argument("--venv", type=Path, metavar="DIR", help="a venv made by --install: measure inspect_ai from it")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--runs", type=int, default=200, help=f"runs ({TURNS_PER_RUN} turns each) per measurement (default 200)")
    parser.add_argument("--inspect-max-samples", type=int, default=1, metavar="N",
                        help="inspect_ai's samples in flight (default 1, as the harness's jobs 1; 0: all of "
                             "inspect_ai's defaults, realtime log and display included)")  # fmt: skip
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory() as folder:
            print(json.dumps(_measure(args.child, args.runs, Path(folder), args.inspect_max_samples)))
        return
    if args.install:
        install(args.install, args.inspect_version)
        return
    peer = peer_version(args.venv)
    if args.venv is not None and peer is None:
        raise SystemExit(f"{args.venv} holds no importable inspect_ai; make it with --install {args.venv}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)", flush=True)
    print(work_folder_line(), flush=True)
    got = measure(args.rounds, args.runs, args.venv if peer else None, args.inspect_max_samples)
    print(f"load average at end:   {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\n".join(report_lines(summarise(got), rounds=args.rounds, peer=peer)))


if __name__ == "__main__":
    main()
