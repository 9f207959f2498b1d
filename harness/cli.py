"""The ``harness`` command line: a thin shell over library calls.

Each command is one ``_cmd_<noun>_<verb>`` function registered in :func:`build_parser`.
Errors are turned into one sentence and an exit code in one place, :func:`main`:
``HarnessError`` -> exit 1 (or 2 for usage errors), never a traceback.
"""

from __future__ import annotations

import argparse
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
    _add_models(sub)
    return parser


def _add_models(sub: argparse._SubParsersAction) -> None:
    """Register ``harness models pull NAME`` and ``harness models list``."""
    models_parser = sub.add_parser("models", help="manage the embedded backend's model cache")
    models_sub = models_parser.add_subparsers(dest="models_command", metavar="ACTION")
    models_sub.required = True
    pull = models_sub.add_parser("pull", help="download and verify a known model; print its path")
    pull.add_argument("name", metavar="NAME", help="a known model name, e.g. smollm2-135m")
    pull.set_defaults(func=_cmd_models_pull)
    listing = models_sub.add_parser("list", help="list known models, cached or not")
    listing.set_defaults(func=_cmd_models_list)


def _cmd_models_pull(args: argparse.Namespace) -> int:
    from harness import models

    print(models.pull(args.name))
    return 0


def _cmd_models_list(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from harness import models

    rows = [
        [m.info.name, f"{m.info.size / 1e6:.1f} MB", "yes" if m.cached else "no", m.info.license, m.path]
        for m in models.list_models()
    ]
    print(tabulate(rows, headers=["name", "size", "cached", "license", "path"]))
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
