"""``harness ledger verify|head|migrate``, ``harness rescore`` and ``harness export``: the ledger's own commands."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

from harness.cli._common import Subparsers, ledger_option, ledger_path
from harness.errors import LedgerError, UsageError
from harness.vocab import printable

__all__ = ["add_export", "add_ledger", "add_rescore"]


# -- harness ledger ... ------------------------------------------------------------------------------
def add_ledger(sub: Subparsers) -> None:
    p = sub.add_parser("ledger", help="inspect and check the ledger")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    v = verbs.add_parser(
        "verify", help="check the schema, the migration record and every hash chain; exit 1 naming the first problem"
    )
    ledger_option(v)
    v.add_argument("--anchor", metavar="DIGEST_OR_FILE", default=None,
                   help="a line printed by `harness ledger head` (or a file holding it): also prove the ledger still extends it")  # fmt: skip
    v.set_defaults(func=_cmd_ledger_verify)
    h = verbs.add_parser("head", help="print one line (row counts and a digest of every chain head) to keep outside the ledger")
    ledger_option(h)
    h.add_argument("--json", action="store_true", help="print the line with each table's row count and head hash as JSON")
    h.set_defaults(func=_cmd_ledger_head)
    m = verbs.add_parser("migrate", help="create or upgrade the ledger schema")
    ledger_option(m)
    m.set_defaults(func=_cmd_ledger_migrate)
    g = verbs.add_parser("merge", help="merge the ledgers of a sharded matrix (`harness run --shard I/N`) into a new ledger",
                         description="Verify each input, refuse inputs whose shared scenarios or newest classifier versions "
                                     "differ, keep one run per identity (a scored run over an unscored one, then the one "
                                     "that ended last, then the greater run id) and write a new ledger at OUT that records "
                                     "where each row came from.")  # fmt: skip
    g.add_argument("out", type=Path, metavar="OUT", help="the new ledger (must not exist)")
    g.add_argument("inputs", type=Path, nargs="+", metavar="LEDGER", help="the ledgers to merge, e.g. one per shard")
    g.set_defaults(func=_cmd_ledger_merge)


def _cmd_ledger_verify(args: argparse.Namespace) -> int:
    from harness.ledger import Ledger, parse_anchor

    path = ledger_path(args)
    try:
        anchor = parse_anchor(args.anchor) if args.anchor is not None else None
    except LedgerError as exc:
        raise UsageError(str(exc)) from exc
    with Ledger(path, readonly=True) as ledger:
        result = ledger.verify(anchor)
        pending = ledger.pending_migrations()
    shown = printable(str(path))
    if result.ok:
        extends = "; it extends the anchor" if anchor is not None else ""
        if result.anchored_input is not None:
            extends = f"; its merged input {printable(result.anchored_input)} extends the anchor"
        print(f"{shown}: OK, {result.rows} rows verified{extends}.")
        if pending:
            print(f"harness: {shown} has an older schema ({', '.join(pending)} not applied); `harness ledger migrate --ledger {shown}` upgrades it.",
                  file=sys.stderr)  # fmt: skip
        return 0
    print(f"harness: {shown}: verification FAILED: {printable(str(result.problem))}.", file=sys.stderr)
    return 1


def _cmd_ledger_head(args: argparse.Namespace) -> int:
    from harness.ledger import Ledger

    with Ledger(ledger_path(args), readonly=True) as ledger:
        head = ledger.head()
    print(json.dumps(head.as_json(), indent=2) if args.json else head.anchor)
    return 0


def _cmd_ledger_migrate(args: argparse.Namespace) -> int:
    from harness.ledger import Ledger

    path = ledger_path(args)
    existed = path.exists()
    pending: list[str] | None = []
    if existed:
        try:
            with Ledger(path, readonly=True) as old:
                pending = old.pending_migrations()
        except LedgerError:
            pending = None  # e.g. a ledger whose creation was cut short: opening it to write says what it is
    with Ledger(path) as ledger:
        applied = ", ".join(ledger.applied_migrations())
    shown = printable(str(path))
    if not existed or pending is None:
        print(f"{shown}: {'created' if not existed else 'finished'}, schema {applied}.")
    elif pending:
        print(f"{shown}: upgraded, applied {', '.join(pending)}; schema {applied}.")
    else:
        print(f"{shown}: schema already up to date ({applied}).")
    return 0


def _cmd_ledger_merge(args: argparse.Namespace) -> int:
    from harness.cli._common import head_line
    from harness.console import plural
    from harness.ledger.merge import merge_ledgers

    result = merge_ledgers(args.out, args.inputs)
    for item in result.inputs:
        print(f"{printable(str(item.path))}: {plural(item.runs, 'run')}, {item.kept} kept; its head {item.anchor}")
    left = f" ({plural(result.left_out, 'run')} left out: another run of the same identity won)" if result.left_out else ""
    print(f"{printable(str(result.out))}: {plural(result.runs, 'run')} from {plural(len(result.inputs), 'ledger')}{left}; "
          f"`harness report --ledger {printable(str(result.out))}` reports them.")  # fmt: skip
    print(head_line(result.head.anchor))
    return 0


# -- harness rescore --------------------------------------------------------------------------------
def add_rescore(sub: Subparsers) -> None:
    p = sub.add_parser("rescore", help="re-classify every stored reply with the current classifier")
    ledger_option(p)
    p.add_argument("--force", action="store_true", help="also re-label turns already labelled by this classifier version")
    p.set_defaults(func=_cmd_rescore)


def _cmd_rescore(args: argparse.Namespace) -> int:
    from harness.console import plural
    from harness.ledger import Ledger
    from harness.rescore import rescore

    path = ledger_path(args)
    Ledger(path, readonly=True).close()  # the readers' refusals first: no file, an empty file, not a ledger (never made one)
    with Ledger(path) as ledger:
        result = rescore(ledger, force=args.force)
    print(f"{printable(str(path))}: {plural(result.turns, 'turn')} re-classified with classifier {result.version} "
          f"({plural(result.changed, 'changed label')}, {result.skipped_current} already current).")  # fmt: skip
    if result.history_mismatch:
        print(
            f"harness: warning: the rebuilt messages of {plural(result.history_mismatch, 'turn')} did not match their request hash.",
            file=sys.stderr,
        )
    return 0


# -- harness export ----------------------------------------------------------------------------------
def add_export(sub: Subparsers) -> None:
    p = sub.add_parser("export", help="write one record per turn (or per run, --runs) as JSONL or CSV")
    ledger_option(p)
    p.add_argument(
        "--format", choices=["jsonl", "csv"], default="jsonl", help="one JSON object per line (default) or CSV with a header"
    )
    p.add_argument("--out", metavar="FILE", help='output file, or "-" for standard output (the default; ./- names a '
                   "file called -); on a terminal the model's words are escaped, in a file or a pipe they are exact")  # fmt: skip
    p.add_argument("--runs", action="store_true", help="one record per run (identity, seed, outcome, checks, final answer, "
                   "totals) instead of one per turn; list fields are JSON lists, in CSV too")  # fmt: skip
    p.set_defaults(func=_cmd_export)


def _cmd_export(args: argparse.Namespace) -> int:
    from harness.console import plural
    from harness.ledger import Ledger
    from harness.outputs import write_output_file

    path = ledger_path(args)
    out: str | None = None if args.out == "-" else args.out
    if out is not None:
        _check_export_target(out, path)
    with Ledger(path, readonly=True) as ledger:  # read everything before any output file is touched
        rows = ledger.export_run_rows() if args.runs else list(ledger.export_rows())
    if out is None:
        from harness.cli import write_machine_output  # the CLI package's: its stdout wrapper guards the write

        write_machine_output(_export_text(rows, args, terminal=_stdout_is_terminal()))
        return 0
    try:
        write_output_file(out, _export_text(rows, args, terminal=False).encode("utf-8"), option="--out",
                          on_terminal=lambda: _export_text(rows, args, terminal=True).encode("utf-8"))  # fmt: skip
    except BrokenPipeError as exc:
        if _names_stdout(out):  # its reader stopped reading (`--out /dev/stdout | head`): as `harness export | head`
            return 0
        raise UsageError(f"cannot write --out {out}: {exc.strerror or exc}.") from exc  # a FIFO's reader died
    print(f"Wrote {plural(len(rows), 'run' if args.runs else 'turn')} to {printable(out)}.", file=sys.stderr)
    return 0


def _check_export_target(out: str, ledger: Path) -> None:
    """Refuse an ``--out`` that names the ledger, a file SQLite keeps beside it, the ledger's lock folder (or a file in
    it: ``harness run`` takes its locks there) or a folder; nothing is read or written before."""
    from harness.ownership import lock_folder

    target = Path(os.path.realpath(out))  # never raises, even on a symlink loop (written later, refused there)
    if target in {Path(f"{os.path.realpath(ledger)}{suffix}") for suffix in ("", "-wal", "-shm", "-journal")}:
        raise UsageError(f"--out {out} is the ledger itself; choose another file.")
    locks = Path(os.path.realpath(lock_folder(ledger)))
    if target == locks or locks in target.parents:
        where = "" if target == locks else "in "
        raise UsageError(f"--out {out} is {where}the ledger's lock folder {locks.name}, where `harness run` takes its "
                         "locks; choose another file.")  # fmt: skip
    if target.is_dir():
        raise UsageError(f"--out {out} is a folder; give a file path.")


def _export_text(rows: list[dict[str, Any]], args: argparse.Namespace, *, terminal: bool) -> str:
    """The export of ``rows`` in ``args.format``: byte-exact for a file or a pipe; for a ``terminal``, what a model wrote
    is escaped (JSONL: JSON's own ASCII escapes, the same values; CSV: each field as :func:`printable` shows it)."""
    from harness.ledger import EXPORT_COLUMNS, RUN_EXPORT_COLUMNS

    buffer = io.StringIO(newline="")
    if args.format == "jsonl":
        buffer.writelines(json.dumps(row, ensure_ascii=terminal) + "\n" for row in rows)
        return buffer.getvalue()
    if args.runs:
        lists = ("checks_passed", "checks_failed", "failure_modes")
        records = [{**row, **{k: json.dumps(row[k], ensure_ascii=False) for k in lists},
                    "requires_tool": "" if row["requires_tool"] is None else str(row["requires_tool"]).lower()} for row in rows]  # fmt: skip
    else:
        records = [{**row, "failure_modes": ";".join(row["failure_modes"])} for row in rows]
    columns = RUN_EXPORT_COLUMNS if args.runs else EXPORT_COLUMNS  # a terminal ends lines with \r itself (\r\r\n: red team 2)
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n" if terminal else "\r\n")
    writer.writeheader()
    if terminal:
        records = [{k: printable(v) if isinstance(v, str) else v for k, v in record.items()} for record in records]
    writer.writerows(records)
    return buffer.getvalue()


def _stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, OSError, ValueError):  # a closed or detached stream: not a terminal
        return False


def _names_stdout(path: str) -> bool:
    """Whether ``path`` is this process's standard output (``/dev/stdout``, ``/proc/self/fd/1``, or the same pipe) and
    that output's reader has gone: the case a reader that stopped reading ends quietly, as for ``| head``."""
    from harness.cli._common import stdout_reader_gone

    try:
        here, there = os.fstat(sys.stdout.fileno()), os.stat(path)
    except (AttributeError, OSError, ValueError):
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino) and stdout_reader_gone()
