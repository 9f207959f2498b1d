"""Label agreement: the classifier against the real-output corpus in ``tests/corpus/entries/``.

Run: ``python benchmarks/label_agreement.py [--part all|tune|held-out] [--disagreements] [--ignore MODES]``.
Prints, for the chosen part of the corpus: exact-set agreement, per-mode precision and recall
with their support (corpus positives), and with ``--disagreements`` every reply where the
classifier and the corpus differ. The held-out batch (``harness.corpus.HELD_OUT_BATCH``) is
never used to tune the classifier: look at its disagreements only to report them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tabulate import tabulate  # noqa: E402 - after the path set-up

from harness.corpus import Agreement, agreement, load_corpus  # noqa: E402 - after the path set-up

CORPUS = REPO / "tests" / "corpus" / "entries"


def _rate(hits: int, total: int) -> str:
    """``hits / total`` to two places, or ``n/a`` when nothing was counted (no positives, or nothing predicted)."""
    return f"{hits / total:.2f}" if total else "n/a"


def report(result: Agreement, title: str) -> str:
    """The figures of one part as text: the exact-set line and the per-mode table."""
    rows = [[f"`{m.mode}`", m.support, m.tp, m.fp, m.fn, _rate(m.tp, m.tp + m.fp), _rate(m.tp, m.support)] for m in result.modes]
    table = tabulate(rows, headers=["mode", "corpus positives", "TP", "FP", "FN", "precision", "recall"], tablefmt="github")
    return f"## {title}\n\nexact-set agreement: {result.exact}/{result.replies} = {result.exact_rate:.3f}\n\n{table}\n"


def main() -> int:
    """Print the agreement figures; exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["all", "tune", "held-out"], default="all")
    parser.add_argument("--disagreements", action="store_true", help="list every reply where the labels differ")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--ignore", default="", metavar="MODES", help="comma-separated modes left out of both label sets")
    args = parser.parse_args()
    entries = load_corpus(CORPUS)
    parts = {
        "all": entries,
        "tune": [e for e in entries if not e.held_out],
        "held-out": [e for e in entries if e.held_out],
    }
    chosen = ["all", "tune", "held-out"] if args.part == "all" else [args.part]
    ignore = [m for m in args.ignore.split(",") if m]
    results = {name: agreement(parts[name], ignore=ignore) for name in chosen}
    if args.json:
        print(json.dumps({name: {"replies": r.replies, "exact": r.exact,
                                 "modes": {m.mode: [m.tp, m.fp, m.fn] for m in r.modes}} for name, r in results.items()}, indent=2))  # fmt: skip
        return 0
    for name, result in results.items():
        print(report(result, f"{name} ({result.replies} replies)"))
    if args.disagreements:
        for entry, corpus, predicted in results[chosen[0]].disagreements:
            content = str(entry.response.get("content") or "")[:300].replace("\n", "⏎")
            print(f"- {entry.id}: corpus {list(corpus)} classifier {list(predicted)}\n    {content}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
