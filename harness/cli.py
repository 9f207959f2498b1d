"""The ``harness`` command line: a thin shell over library calls.

Each command is one ``_cmd_<noun>_<verb>`` function registered in :func:`build_parser`.
Errors are turned into one sentence and an exit code in one place, :func:`main`:
``HarnessError`` -> exit 1 (or 2 for usage errors), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from harness.errors import HarnessError, UsageError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="harness",
        description="Benchmark how LLM agent loops break, model by model.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_classify(sub)
    return parser


def _add_classify(sub: argparse._SubParsersAction) -> None:
    """Register ``harness classify FILE`` and ``harness classify --list-modes``."""
    cmd = sub.add_parser(
        "classify",
        help="classify one assistant reply from a JSON document",
        description=(
            'Read {"tools": [...], "messages": [...], "response": {...}} from FILE ("-" for stdin) '
            "and print its failure modes and recoverable calls as one JSON object."
        ),
    )
    cmd.add_argument("file", nargs="?", metavar="FILE", help='the JSON document, or "-" for stdin')
    cmd.add_argument("--list-modes", action="store_true", help="print every failure mode with its definition")
    cmd.set_defaults(func=_cmd_classify)


def _cmd_classify(args: argparse.Namespace) -> int:
    """Print ``classify_document`` of the input (or the mode list).

    Raises:
        UsageError: no FILE, FILE unreadable, or not one JSON object.
    """
    from harness.classifier import FAILURE_MODES, classify_document

    if args.list_modes:
        width = max(len(name) for name in FAILURE_MODES)
        for name, definition in FAILURE_MODES.items():
            print(f"{name:<{width}}  {definition}")
        return 0
    if args.file is None:
        raise UsageError("classify needs FILE (a JSON document, or - for stdin), or --list-modes.")
    where = "stdin" if args.file == "-" else args.file
    try:
        if args.file == "-":
            text = sys.stdin.read()
        else:
            with open(args.file, encoding="utf-8") as handle:
                text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {where}: {exc.__class__.__name__}: {exc}".replace("\n", " ")) from exc
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"{where} is not valid JSON: {reason}") from exc
    if not isinstance(doc, dict):
        kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(doc), "number")
        raise UsageError(f"{where} must hold one JSON object, not a JSON {kind}.")
    print(json.dumps(classify_document(doc), indent=2, ensure_ascii=True))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code (0 ok, 1 failure, 2 usage error)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"harness: {exc}", file=sys.stderr)
        return 2
    except HarnessError as exc:
        print(f"harness: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("harness: interrupted; everything finished so far is in the ledger.", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
