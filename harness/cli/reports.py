"""``harness report``, ``harness compare``, ``harness review`` and ``harness attest``: reading results."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.cli._common import Subparsers, head_line, ledger_option, ledger_path
from harness.vocab import printable

__all__ = ["add_attest", "add_compare", "add_report", "add_review"]


# -- harness report / compare / review / attest -------------------------------------------------------
def add_report(sub: Subparsers) -> None:
    p = sub.add_parser("report", help="write a markdown comparison report with tables and plots", description=(
        "Write report.md (pass rate on tool-using vs restraint scenarios, summary, failed done checks, failure modes, "
        "shortest example replies, latency, lenient-parser rescue) with PNG plots and CSV tables, every one grouped by "
        "--by. Reads the ledger only; the same ledger gives the same bytes."))  # fmt: skip
    ledger_option(p)
    p.add_argument("--out", type=Path, default=Path("reports"), help="output folder (default: reports/)")
    p.add_argument(
        "--by",
        default=None,
        metavar="AXES",
        help="grouping of every table and plot, comma-separated from scenario,model,temperature,tool_mode,parser,think,stream "
        "(default: all; e.g. --by model,temperature)",
    )
    p.add_argument("--format", default="md,png", metavar="FORMATS", help="comma-separated from md, png, csv (default: md,png)")
    p.set_defaults(func=_cmd_report_write)


def _cmd_report_write(args: argparse.Namespace) -> int:
    from harness.outputs import check_output_folder
    from harness.report import parse_axes, write_report
    from harness.vocab import plural  # not harness.console: that imports the run loop, 0.4 s a report does not need

    check_output_folder(args.out, option="--out")
    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    written = write_report(ledger_path(args), args.out, by=parse_axes(args.by), formats=formats)
    print(f"Wrote {plural(len(written), 'file')} to {printable(str(args.out))}: {', '.join(p.name for p in written)}")
    print(head_line(written.ledger_head))  # read after every row the report used: the one its header carries
    return 0


def add_compare(sub: Subparsers) -> None:
    p = sub.add_parser("compare", help="paired comparison of two models (pass rate and failure modes)")
    p.add_argument("model_a", metavar="MODEL_A", help="model spec, or its name without the backend prefix")
    p.add_argument("model_b", metavar="MODEL_B")
    ledger_option(p)
    p.add_argument("--scenario", default=None, help="compare on one scenario only")
    p.set_defaults(func=_cmd_compare_models)


def _cmd_compare_models(args: argparse.Namespace) -> int:
    from harness.report import compare_models, format_comparison, load_frames

    result = compare_models(load_frames(ledger_path(args)), args.model_a, args.model_b, scenario=args.scenario)
    print(format_comparison(result))
    return 0 if result.pairs else 1


def add_review(sub: Subparsers) -> None:
    p = sub.add_parser("review", help="show one run's review frame: promise, criteria, diff, evidence, open questions")
    p.add_argument("run_id", metavar="RUN_ID", help="run id or a unique prefix")
    ledger_option(p)
    p.add_argument(
        "--verify",
        action="store_true",
        help="say whether the frame changed since its newest attestation (exit 1 if so, or if it has none)",
    )
    p.set_defaults(func=_cmd_review_show)


def _cmd_review_show(args: argparse.Namespace) -> int:
    from harness.review import review_text, verify_attestation

    if not args.verify:
        print(review_text(ledger_path(args), args.run_id), end="")
        return 0
    unchanged, sentence = verify_attestation(ledger_path(args), args.run_id)
    print(printable(sentence), file=sys.stdout if unchanged else sys.stderr)  # the reviewer's name is from the ledger
    return 0 if unchanged else 1


def add_attest(sub: Subparsers) -> None:
    p = sub.add_parser("attest", help="record that you reviewed a run's frame (appends its SHA-256 to the ledger)")
    p.add_argument("run_id", metavar="RUN_ID", help="run id or a unique prefix")
    p.add_argument("--reviewer", required=True, help="who reviewed it")
    p.add_argument("--notes", default=None, help="free text")
    ledger_option(p)
    p.set_defaults(func=_cmd_attest_run)


def _cmd_attest_run(args: argparse.Namespace) -> int:
    from harness.review import attest

    run_id, digest = attest(ledger_path(args), args.run_id, reviewer=args.reviewer, notes=args.notes)
    print(f"Attested run {printable(run_id)} by {printable(args.reviewer.strip())}: frame SHA-256 {digest}.")
    return 0
