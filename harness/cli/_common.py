"""Helpers shared by the command modules: the ``--ledger`` option and default paths."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["Subparsers", "default_scenario", "head_line", "ledger_option", "ledger_path"]

Subparsers = Any
"""``argparse._SubParsersAction``: private in argparse, so typed loosely here."""


def ledger_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--ledger PATH``."""
    parser.add_argument("--ledger", type=Path, default=None, help="ledger file (default: results/ledger.sqlite)")


def ledger_path(args: argparse.Namespace) -> Path:
    """The ``--ledger`` given, or the default ``results/ledger.sqlite``."""
    from harness.ledger import DEFAULT_LEDGER_PATH

    return args.ledger or DEFAULT_LEDGER_PATH


def default_scenario() -> Path:
    """``scenarios/list_and_report.toml`` under the working folder, else in the checkout the package runs from."""
    from harness.scenarios import DEFAULT_SCENARIO

    if DEFAULT_SCENARIO.exists():
        return DEFAULT_SCENARIO
    return Path(__file__).resolve().parent.parent.parent / DEFAULT_SCENARIO


def head_line(anchor: str) -> str:
    """The closing line of ``harness run`` and ``harness report``: the ledger head to keep outside the ledger."""
    return f"Ledger head (check later with `harness ledger verify --anchor`): {anchor}"
