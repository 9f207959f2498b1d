"""``harness view``: the transcript viewer, served on 127.0.0.1 or exported as static files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.cli._common import Subparsers, ledger_option, ledger_path
from harness.vocab import printable

__all__ = ["add_view"]


def add_view(sub: Subparsers) -> None:
    p = sub.add_parser("view", help="browse runs and transcripts in a web browser (read-only)", description=(
        "Serve the ledger's runs read-only on 127.0.0.1 (a free port unless --port is given; the address is printed): "
        "a run list with filters and sorting, each run's thread, labels with their evidence, checks and final files, "
        "and two models' runs of the same identity side by side. With --export DIR, write the same pages as files "
        "that open from disk with no network instead."))  # fmt: skip
    ledger_option(p)
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    p.add_argument("--export", type=Path, default=None, metavar="DIR", help="write static pages to DIR instead of serving")
    p.set_defaults(func=_cmd_view)


def _cmd_view(args: argparse.Namespace) -> int:
    from harness.viewer import export_site, open_server

    if args.export is not None:
        summary = export_site(ledger_path(args), args.export)
        print(f"Wrote {summary.runs} run page(s) and {summary.data_files} data file(s) to {printable(str(args.export))}; "
              f"open {printable(str(summary.index))} in a browser (no server needed).")  # fmt: skip
        return 0
    server = open_server(ledger_path(args), args.port)
    print(f"Serving {printable(str(ledger_path(args)))} read-only at {server.url} (Ctrl-C stops).", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("harness: stopped.", file=sys.stderr)
    finally:
        server.server_close()
    return 0
