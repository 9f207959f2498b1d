"""CPU time of one ``classify`` call on three workloads, this code against a baseline checkout.

Run: ``python benchmarks/classifier_cost.py [--baseline DIR] [--rounds 5] [--profile GROUP]``.

Workloads (``benchmarks/classifier_inputs.py``): ``matrix``, what the agent loop hands the classifier in
``benchmarks/matrix_scale.py``'s part 1 (``list_and_report`` replayed: three structured calls and a final answer,
the history growing to 4 turns, one tools list for every pass); ``runs``, the same turns with a fresh copy of the tools
list for each pass, as the loop builds one per run (``Scenario.tool_schemas()``: memos of the list's identity miss on a
new run's first turn); ``mix``, ``benchmarks/classifier_speed.py``'s realistic mix; ``corpus``, the 802 real replies of
``tests/corpus/entries/``. The inputs are built once by this code; each measurement runs in a fresh
child process that imports the classifier of the code measured, classifies every input of a group once to warm the
caches, then times whole passes over the group with ``time.process_time`` (CPU, not wall: the machine is shared).
Prints the median over rounds of the CPU milliseconds per call and, with ``--baseline``, the ratio this code /
baseline, the rounds alternating the two codes. ``--profile GROUP`` prints this code's cProfile of that group.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(os.environ.get("HARNESS_BENCH_CODE") or REPO)))  # the code measured (a child's)
sys.path.insert(1, str(REPO / "benchmarks"))

from classifier_inputs import GROUPS, arguments, load_inputs, write_inputs  # noqa: E402 - after the path set-up

MIN_CALLS = {"matrix": 4000, "runs": 4000, "mix": 2000, "corpus": 1604}
"""Calls timed per group and round: whole passes over the group until at least this many."""
TIMED = ("matrix", "runs", "mix", "corpus")
"""The groups timed: :data:`GROUPS` and ``runs`` (the matrix turns, a fresh tools list per pass)."""


def _passes(groups: dict[str, list[dict]], name: str) -> list[list[tuple[dict, dict]]]:
    """The timed passes over a group, built before the clock starts: ``runs`` gives each pass (one run) its own deep
    copy of the tools list, shared by the pass's turns; the other groups are the same items every pass."""
    items = [(item["response"], arguments(item)) for item in groups["matrix" if name == "runs" else name]]
    passes = max(1, -(-MIN_CALLS[name] // len(items)))
    if name != "runs":
        return [items] * passes
    out = []
    for _ in range(passes):
        tools = copy.deepcopy(items[0][1]["tools"])
        out.append([(response, {**kwargs, "tools": tools}) for response, kwargs in items])
    return out


def child(inputs: Path) -> dict[str, float]:
    """CPU ms per call for each timed group, with the classifier of the code on ``sys.path[0]``."""
    from harness.classifier import classify

    groups = load_inputs(inputs)
    out = {}
    for name in TIMED:
        passes = _passes(groups, name)
        for response, kwargs in passes[0]:
            classify(response, **kwargs)  # warm: validators, compiled patterns, the tools' text
        start = time.process_time()
        for items in passes:
            for response, kwargs in items:
                classify(response, **kwargs)
        out[name] = (time.process_time() - start) * 1000 / sum(map(len, passes))
    return out


def _run_child(code: Path, inputs: Path) -> dict[str, float]:
    env = {**os.environ, "HARNESS_BENCH_CODE": str(code)}
    done = subprocess.run([sys.executable, __file__, "--child", str(inputs)], env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def compare(inputs: Path, rounds: int, baseline: Path | None) -> None:
    """Alternate the codes for ``rounds`` rounds; print medians (and ratios with a baseline)."""
    codes = {"this code": REPO} | ({"baseline": baseline.resolve()} if baseline else {})
    got: dict[str, list[dict[str, float]]] = {name: [] for name in codes}
    for _ in range(rounds):
        for name, code in codes.items():
            got[name].append(_run_child(code, inputs))
    medians = {name: {g: statistics.median(r[g] for r in rows) for g in TIMED} for name, rows in got.items()}
    print(f"classify CPU ms per call, medians of {rounds} rounds (load average {os.getloadavg()[0]:.1f})")
    print(f"{'code':10} " + " ".join(f"{g:>9}" for g in TIMED))
    for name, m in medians.items():
        print(f"{name:10} " + " ".join(f"{m[g]:9.4f}" for g in TIMED))
    if baseline:
        print(f"{'ratio':10} " + " ".join(f"{medians['this code'][g] / medians['baseline'][g]:9.3f}" for g in TIMED))


def profile(inputs: Path, group: str) -> None:
    """cProfile (CPU time) of this code classifying ``group`` (warm), top entries by own and cumulative time."""
    from harness.classifier import classify

    items = [(item["response"], arguments(item)) for item in load_inputs(inputs)[group]]
    for response, kwargs in items:
        classify(response, **kwargs)
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for _ in range(max(1, -(-MIN_CALLS[group] // len(items)))):
        for response, kwargs in items:
            classify(response, **kwargs)
    profiler.disable()
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(35)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a checkout of other code, measured alternately with this code")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per code (default 5)")
    parser.add_argument("--profile", choices=GROUPS, help="print this code's cProfile of one group instead")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    with tempfile.TemporaryDirectory() as folder:
        inputs = Path(folder) / "inputs.json"
        write_inputs(inputs)
        if args.profile:
            profile(inputs, args.profile)
        else:
            compare(inputs, args.rounds, args.baseline)


if __name__ == "__main__":
    main()
