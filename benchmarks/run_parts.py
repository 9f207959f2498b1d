"""Where a whole run's time goes, part by part, on the peer task; optionally against another checkout, alternating.

Run: ``python benchmarks/run_parts.py [--baseline DIR] [--rounds 5] [--runs 1000]``. Each measurement is a fresh child
process that records ``--runs`` runs of ``benchmarks/peer_inspect.py``'s task (``list_and_report`` replayed from its
3-reply cassette, jobs 1, a fresh ledger) after 20 warm-up runs, with ``time.perf_counter`` around each part below;
it prints wall milliseconds per turn (turns = 3 x runs) for each part, the median over the rounds, and with
``--baseline`` the baseline's median and the ratio (this code / baseline). The rounds alternate the two checkouts,
the order turned each round. The wrappers add about a microsecond per call to every part (the same on both sides).

Parts (they add up to the whole run's wall time but for the wrappers):

* ``start``: a run's start without its start row (identity, claim, sandbox folder, fixtures, the row's values);
  ``sandbox folder`` and ``fixtures`` are two of its pieces;
* ``start row``, ``turn rows``, ``end row``: the ledger's appends;
* ``classify``: the classifier; ``model call``: the backend (a replayed reply);
* ``tools``: the assistant message, the calls run and answered;
* ``rest of turn``: a turn without the four above (request hash, timestamps, the reply and the record's values);
* ``checks``: the done checks; ``end``: the end without its row;
* ``outside runs``: the matrix's wall time outside every run (plans and identities, thread hand-off, summaries).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PARTS = ("whole run", "CPU", "start", "sandbox folder", "fixtures", "start row", "model call", "classify", "tools",
         "rest of turn", "turn rows", "checks", "end", "end row", "outside runs")  # fmt: skip


def _wrap(owner: Any, name: str, label: str, spent: collections.Counter[str]) -> None:
    """Replace ``owner.name`` by a wrapper adding its wall time to ``spent[label]``."""
    inner: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(inner)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start

    setattr(owner, name, timed)


def _child(runs: int) -> dict[str, float]:
    """Measure the parts with the code of ``HARNESS_BENCH_CODE`` (imported before this checkout's benchmark module)."""
    sys.path.insert(0, os.environ["HARNESS_BENCH_CODE"])
    import harness.ledger.store as store
    import harness.loop as loop
    import harness.tools as tools

    sys.path.insert(1, str(REPO / "benchmarks"))
    import peer_inspect

    spent: collections.Counter[str] = collections.Counter()
    for owner, name, label in [
        (loop._Run, "_start", "start+"), (store.Ledger, "start_run", "start row"), (tools.Sandbox, "__init__", "sandbox folder"),
        (tools.Sandbox, "seed", "fixtures"), (loop._Run, "_turn", "turn+"), (loop, "classify", "classify"),
        (loop, "_generate", "model call"), (loop._Run, "_act", "tools"), (store.Ledger, "record_turn", "turn rows"),
        (loop, "evaluate_checks", "checks"), (loop._Run, "_end", "end+"), (store.Ledger, "end_run", "end row"),
        (loop._Run, "execute", "runs"),
    ]:  # fmt: skip
        _wrap(owner, name, label, spent)
    peer_inspect._harness_runs(20, Path(tempfile.mkdtemp()))
    spent.clear()
    with tempfile.TemporaryDirectory() as folder:
        wall, cpu, turns = peer_inspect._harness_runs(runs, Path(folder))
    ms = {label: seconds / turns * 1000 for label, seconds in spent.items()}
    ms["start"] = ms.pop("start+") - ms["start row"]
    ms["rest of turn"] = ms.pop("turn+") - sum(ms[k] for k in ("classify", "model call", "tools", "turn rows"))
    ms["end"] = ms.pop("end+") - ms["end row"]
    ms["outside runs"] = wall / turns * 1000 - ms.pop("runs")
    ms["whole run"], ms["CPU"] = wall / turns * 1000, cpu / turns * 1000
    return ms


def _measure(code: Path, runs: int) -> dict[str, float]:
    done = subprocess.run([sys.executable, __file__, "--child", "--runs", str(runs)], capture_output=True, text=True,
                          env={**os.environ, "HARNESS_BENCH_CODE": str(code)}, check=True, timeout=900)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a checkout of other code, measured alternately")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--runs", type=int, default=1000, help="runs per measurement (default 1000)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.runs)))
        return
    sides = {"this code": REPO} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    got: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for round_ in range(args.rounds):
        for side in sides if round_ % 2 == 0 else reversed(sides):
            got[side].append(_measure(sides[side], args.runs))
    medians = {side: {part: statistics.median(m[part] for m in got[side]) for part in PARTS} for side in sides}
    print(f"wall ms per turn, medians of {args.rounds} rounds of {args.runs} runs (3 turns each); load {os.getloadavg()[0]:.1f}")
    print(f"{'part':16s}" + "".join(f"{side:>12s}" for side in sides) + ("       ratio" if args.baseline else ""))
    for part in PARTS:
        row = [medians[side][part] for side in sides]
        ratio = f"{row[0] / row[1]:12.2f}" if args.baseline and row[1] else ""
        print(f"{part:16s}" + "".join(f"{value:12.3f}" for value in row) + ratio)
    for side, path in sides.items():
        print(f"{side}: {path}")


if __name__ == "__main__":
    main()
