"""Leave-one-batch-out view: agreement per tuning batch, for the behaviour modes.

Run: ``python benchmarks/batch_agreement.py [--json] [--disagreements MODE]``.
Prints, for each tuning batch separately (the held-out batch is never loaded past the filter):
exact-set agreement and TP/FP/FN for ``fabricated_tool_result`` and ``narration_without_call``.
A change is worth keeping when it gains on several batches other than the one that inspired it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.corpus import HELD_OUT_BATCH, agreement, load_corpus  # noqa: E402 - after the path set-up

CORPUS = REPO / "tests" / "corpus" / "entries"
MODES = ("fabricated_tool_result", "narration_without_call")


def per_batch() -> dict[int, dict]:
    """Per tuning batch: replies, exact, and ``[tp, fp, fn]`` per behaviour mode, plus disagreements."""
    entries = [e for e in load_corpus(CORPUS) if e.batch != HELD_OUT_BATCH and not e.held_out]
    out = {}
    for batch in sorted({e.batch for e in entries}):
        result = agreement([e for e in entries if e.batch == batch])
        out[batch] = {
            "replies": result.replies,
            "exact": result.exact,
            "modes": {m: [result.mode(m).tp, result.mode(m).fp, result.mode(m).fn] for m in MODES},
            "disagreements": [(e.id, list(c), list(p)) for e, c, p in result.disagreements],
        }
    return out


def main() -> int:
    """Print the per-batch figures; exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--disagreements", default="", metavar="MODE", help="list disagreements involving MODE ('any' for all)")
    args = parser.parse_args()
    figures = per_batch()
    if args.json:
        print(json.dumps({b: {k: v for k, v in f.items() if k != "disagreements"} for b, f in figures.items()}))
        return 0
    total = [0, 0]
    for batch, f in figures.items():
        total[0] += f["exact"]
        total[1] += f["replies"]
        cells = "  ".join(f"{m[:5]} tp{t} fp{p} fn{n}" for m, (t, p, n) in f["modes"].items())
        print(f"batch {batch}: exact {f['exact']}/{f['replies']}  {cells}")
    print(f"total: {total[0]}/{total[1]}")
    if args.disagreements:
        for batch, f in figures.items():
            for eid, corpus, predicted in f["disagreements"]:
                if args.disagreements == "any" or args.disagreements in set(corpus) ^ set(predicted):
                    print(f"  b{batch} {eid}: corpus {corpus} classifier {predicted}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
