"""Whether this code's classifier gives byte for byte what a baseline checkout's gives, on every corpus reply.

Run: ``python benchmarks/labels_same.py --baseline DIR`` (e.g. ``git worktree add /tmp/base HEAD``). Classifies the
inputs of ``benchmarks/classifier_inputs.py`` (the 802 replies of ``tests/corpus/entries/`` with their tools,
histories and ``requires_tool`` flags; the matrix benchmark's turns; the speed mix) in two child processes, one
importing the baseline's ``harness`` and one this code's, and compares, input by input, the JSON text of the whole
result: labels, ``details`` (the evidence included), the structured and recovered calls with every attribute, the
lenient and strict calls and ``recovered_by``. Each child classifies every input twice (the second time with its
caches warm) and the two results must be equal too. Prints ``corpus: 802/802 identical`` and the like per group,
then the first differences; exits 1 when any input differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(os.environ.get("HARNESS_BENCH_CODE") or REPO)))  # the code classifying (a child's)
sys.path.insert(1, str(REPO / "benchmarks"))

from classifier_inputs import GROUPS, arguments, load_inputs, write_inputs  # noqa: E402 - after the path set-up


def _text(result: Any) -> str:
    """The whole result of one ``classify`` call as JSON text (key order kept)."""

    def calls(items: list[Any]) -> list[dict[str, Any]]:
        return [dataclasses.asdict(c) for c in items]

    whole = {
        "failure_modes": result.failure_modes,
        "structured_calls": calls(result.structured_calls),
        "recovered_calls": calls(result.recovered_calls),
        "recovered_by": result.recovered_by,
        "details": result.details,
        "classifier_version": result.classifier_version,
        "lenient": calls(result.calls("lenient")),
        "strict": calls(result.calls("strict")),
    }
    return json.dumps(whole, ensure_ascii=False, default=repr)


def child(inputs: Path) -> None:
    """Print one JSON line per group: ``{"group", "results": [text, ...], "warm_differs": [index, ...]}``."""
    from harness.classifier import classify

    groups = load_inputs(inputs)
    for name in GROUPS:
        items = groups[name]
        cold = [_text(classify(item["response"], **arguments(item))) for item in items]
        warm = [_text(classify(item["response"], **arguments(item))) for item in items]
        differs = [k for k, (a, b) in enumerate(zip(cold, warm, strict=True)) if a != b]
        print(json.dumps({"group": name, "results": cold, "warm_differs": differs}))


def _run(code: Path, inputs: Path) -> dict[str, dict[str, Any]]:
    env = {**os.environ, "HARNESS_BENCH_CODE": str(code)}
    done = subprocess.run([sys.executable, __file__, "--child", str(inputs)], env=env, check=True, capture_output=True, text=True)
    return {row["group"]: row for row in map(json.loads, done.stdout.splitlines())}


def compare(baseline: Path) -> int:
    """Run both children and print the comparison; returns the exit status (0: every input identical)."""
    with tempfile.TemporaryDirectory() as folder:
        inputs = Path(folder) / "inputs.json"
        write_inputs(inputs)
        ids = [item.get("id", str(k)) for k, item in enumerate(load_inputs(inputs)["corpus"])]
        base, mine = _run(baseline.resolve(), inputs), _run(REPO, inputs)
    status = 0
    for name in GROUPS:
        pairs = list(zip(base[name]["results"], mine[name]["results"], strict=True))
        same = sum(a == b for a, b in pairs)
        warm = mine[name]["warm_differs"]
        print(f"{name}: {same}/{len(pairs)} identical; warm second pass differs on {len(warm)}")
        for k, (a, b) in [(k, p) for k, p in enumerate(pairs) if p[0] != p[1]][:3]:
            where = ids[k] if name == "corpus" else k
            print(f"  {where}:\n    baseline  {a[:400]}\n    this code {b[:400]}")
        status |= same != len(pairs) or bool(warm)
    return int(status)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=False, help="a checkout of the code to compare with")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    if args.baseline is None or not (args.baseline / "harness" / "classifier").is_dir():
        parser.error("--baseline must name a checkout holding harness/classifier/")
    return compare(args.baseline)


if __name__ == "__main__":
    sys.exit(main())
