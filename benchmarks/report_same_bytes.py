"""Check that this code's ``harness report`` writes the same bytes as another checkout's on a few ledgers.

Usage::

    python benchmarks/report_same_bytes.py --baseline DIR [--work /tmp/harness_same_bytes] [--png]

``DIR`` is a checkout of the code to compare with (e.g. ``git worktree add /tmp/base HEAD~1``). The ledgers: the
test suite's varied ledger (replayed real runs plus built edge cases: relabelled turns, missing latencies, a blob,
resumed and superseded identities), the old ledgers kept in ``tests/data`` (written before later migrations, read
as they are), and :mod:`benchmarks.report_scale`'s synthetic ledger at 4,000 and 40,000 turns (the second has 80
groups, so the plots take their small-multiples form), each also with the ``turns_report`` and ``turns_modes`` indexes
dropped (a ledger before ``m010_report_index`` and ``m012_mode_index``). Each report (``md,csv``, plus ``png`` with ``--png``) runs in a child process per
checkout; the files are compared byte for byte. Prints one line per ledger and exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import io
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.report_scale import build  # noqa: E402
from tests.test_report_aggregates import _varied_ledger  # noqa: E402


def _ledgers(work: Path) -> list[Path]:
    with contextlib.redirect_stdout(io.StringIO()):  # `harness run` prints its runs
        out = [_varied_ledger(work / "varied.sqlite")]
    for name in ("ledger_m003.sqlite", "ledger_m004.sqlite", "ledger_m006_replay.sqlite"):
        shutil.copyfile(REPO / "tests" / "data" / name, work / name)
        out.append(work / name)
    for turns in (4_000, 40_000):
        build(work / f"scale_{turns}.sqlite", turns)
        out.append(work / f"scale_{turns}.sqlite")
    for path in [out[0], *out[-2:]]:
        bare = path.with_name(path.stem + "_no_index.sqlite")
        shutil.copyfile(path, bare)
        db = sqlite3.connect(bare)
        db.execute("DROP INDEX IF EXISTS turns_report")
        db.execute("DROP INDEX IF EXISTS turns_modes")
        db.commit()
        db.close()
        out.append(bare)
    return out


def _report(code_dir: Path, ledger: Path, out: Path, formats: str) -> None:
    code = (f"import sys; sys.path.insert(0, '.'); from harness.cli import main; sys.exit(main(['report', '--ledger', "
            f"{str(ledger)!r}, '--out', {str(out)!r}, '--format', {formats!r}]))")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True, cwd=code_dir, capture_output=True, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the code to compare with")
    parser.add_argument("--work", type=Path, default=Path("/tmp/harness_same_bytes"))
    parser.add_argument("--png", action="store_true", help="compare the plots too")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    (args.work / "ledgers").mkdir(parents=True)
    formats = "md,csv,png" if args.png else "md,csv"
    differ = 0
    for ledger in _ledgers(args.work / "ledgers"):
        here, there = args.work / "this" / ledger.stem, args.work / "baseline" / ledger.stem
        _report(REPO, ledger, here, formats)
        _report(args.baseline.resolve(), ledger, there, formats)
        names = sorted(p.name for p in here.iterdir())
        _, mismatch, errors = filecmp.cmpfiles(here, there, names, shallow=False)
        if sorted(p.name for p in there.iterdir()) != names:
            mismatch.append("(the file lists differ)")
        differ += bool(mismatch or errors)
        print(
            f"{ledger.name}: {len(names)} files, "
            + (f"DIFFERENT: {', '.join(mismatch + errors)}" if mismatch or errors else "identical")
        )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
