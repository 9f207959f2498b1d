"""Time `harness view` on a synthetic ledger of 1,000,000 turns: how soon the served run list shows its first page.

Usage::

    python benchmarks/viewer_scale.py [--turns 1000000] [--ledger /tmp/harness_bench_viewer_1m.sqlite] [--rebuild]
                                      [--repeats 3]

The ledger is built once by ``benchmarks/report_scale.py``'s builder (125,000 runs of 8 turns, four models, random
failure modes) and cached at ``--ledger``. Each repeat starts ``harness view`` as a child process on a free port and
times, with a fresh HTTP connection each: the server's start (process start until it prints its address), the first
page of the run list, the same page filtered to one failure mode, sorted by tokens, page 1,000, and one run's page.
The child's peak RSS (``VmHWM``) shows that no page loads all turns. Medians of ``--repeats`` are printed.
Target: the first page in < 2 s.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUESTS = {
    "first page": "",
    "filtered to code_fence": "?mode=code_fence",
    "only failed, by tokens desc": "?failed=1&sort=tokens&desc=1",
    "failed in every repetition": "?every=1",
    "page 1,000": "?page=1000",
    "one run": "run/{run_id}",
}


def _builder():
    spec = importlib.util.spec_from_file_location("report_scale", HERE / "report_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build


def _get(url: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as reply:
        body = reply.read()
    return time.perf_counter() - started, body


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def once(ledger: Path) -> dict[str, float]:
    """One server start and the timed requests: name -> seconds, plus ``start`` and ``peak RSS MB``."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "harness", "view", "--ledger", str(ledger)], cwd=HERE.parent,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = child.stdout.readline() if child.stdout else ""
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        if not found:
            raise SystemExit(f"harness view printed no address: {line!r}")
        figures = {"start": time.perf_counter() - started}
        url = found.group(0)
        run_id = None
        for name, path in REQUESTS.items():
            if "{run_id}" in path:
                path = path.format(run_id=run_id)
            figures[name], body = _get(url + path)
            if run_id is None:
                run_id = re.search(rb'href="/run/([0-9a-f]+)"', body).group(1).decode()
                figures["rows on the first page"] = body.count(b'class="open"')
        figures["peak RSS MB"] = _peak_rss_mb(child.pid)
        return figures
    finally:
        child.terminate()
        child.communicate(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1_000_000)
    parser.add_argument("--ledger", type=Path, default=Path("/tmp/harness_bench_viewer_1m.sqlite"))
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.rebuild or not args.ledger.exists():
        started = time.perf_counter()
        _builder()(args.ledger, args.turns)
        print(f"built {args.ledger} ({args.turns:,} turns, {args.ledger.stat().st_size / 1e6:.0f} MB) in "
              f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    runs = [once(args.ledger) for _ in range(args.repeats)]
    for i, figures in enumerate(runs, 1):
        print(f"run {i}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()))
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"harness view on {args.turns:,} turns, median of {args.repeats}: server start {medians['start']:.2f} s; "
          + "; ".join(f"{name} {medians[name]:.2f} s" for name in REQUESTS)
          + f"; peak RSS {medians['peak RSS MB']:.0f} MB (target: first page < 2 s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
