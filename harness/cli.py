"""The ``harness`` command line: a thin shell over library calls.

Each command is one ``_cmd_<noun>_<verb>`` function registered in :func:`build_parser`.
Errors are turned into one sentence and an exit code in one place, :func:`main`:
``HarnessError`` -> exit 1 (or 2 for usage errors), never a traceback.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tabulate import tabulate

from harness.errors import HarnessError, ScenarioError, UsageError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="harness",
        description="Benchmark how LLM agent loops break, model by model.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_run(sub)
    _add_ledger(sub)
    _add_export(sub)
    _add_scenarios(sub)
    _add_models(sub)
    _add_classify(sub)
    _add_rescore(sub)
    _add_report(sub)
    _add_compare(sub)
    _add_review(sub)
    _add_attest(sub)
    return parser


def _ledger_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ledger", type=Path, default=None, help="ledger file (default: results/ledger.sqlite)")


def _ledger_path(args: argparse.Namespace) -> Path:
    from harness.ledger import DEFAULT_LEDGER_PATH

    return args.ledger or DEFAULT_LEDGER_PATH


def _default_scenario() -> Path:
    from harness.scenarios import DEFAULT_SCENARIO

    if DEFAULT_SCENARIO.exists():
        return DEFAULT_SCENARIO
    return Path(__file__).resolve().parent.parent / DEFAULT_SCENARIO


# -- harness run -------------------------------------------------------------------------------------
def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run scenarios over a matrix of models and options", description=(
        "Run scenario files over a matrix of models, temperatures, seeds, tool modes and parser policies, "
        "recording every turn in the ledger. With no arguments: scenarios/list_and_report.toml on "
        "embedded:smollm2-135m with the scenario's default matrix."))  # fmt: skip
    p.add_argument("scenarios", nargs="*", type=Path, metavar="SCENARIO", help="scenario TOML files")
    p.add_argument("--model", action="append", metavar="SPEC", help="model spec (repeatable): ollama:M[@URL], openai:M@URL, embedded:NAME|PATH, replay:FILE")
    p.add_argument("--temperature", action="append", type=float, metavar="T", help="temperature (repeatable)")
    p.add_argument("--seed", action="append", type=int, metavar="N", help="base seed (repeatable); repetition r sends seed N + r")
    p.add_argument("--repeats", type=int, metavar="N", help="repetitions per cell")
    p.add_argument("--tool-mode", action="append", choices=["native", "prompt"], help="how tools reach the model (repeatable)")
    p.add_argument("--parser", action="append", choices=["strict", "lenient"], help="parser policy (repeatable)")
    _ledger_option(p)
    p.add_argument("--record", type=Path, metavar="DIR", help="write one replay cassette per run into DIR")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="concurrent runs per model endpoint (default 1)")
    p.add_argument("--max-attempts", type=int, default=4, metavar="N", help="attempts per model call on server errors (default 4)")
    p.add_argument("--cache", action="store_true", help="reuse recorded replies for identical requests of the same run identity")
    p.add_argument("--no-resume", action="store_true", help="run every planned run even if the ledger already has it")
    p.add_argument("--dry-run", action="store_true", help="print the planned runs, how many are already done, and exit")
    p.set_defaults(func=_cmd_run)


def _cmd_run(args: argparse.Namespace) -> int:
    from harness.ledger import Ledger
    from harness.loop import RetryPolicy
    from harness.runner import MatrixOverrides, expand_matrix, plan_matrix, plural, run_matrix
    from harness.scenarios import MAX_REPEATS, MAX_SEED, load_scenario

    if args.repeats is not None and not 1 <= args.repeats <= MAX_REPEATS:
        raise UsageError(f"--repeats must be from 1 to {MAX_REPEATS}.")
    if not 1 <= args.jobs <= 256 or not 1 <= args.max_attempts <= 100:
        raise UsageError("--jobs must be from 1 to 256 and --max-attempts from 1 to 100.")
    if any(not 0 <= t < math.inf for t in args.temperature or []):  # also refuses nan
        raise UsageError("--temperature must be a finite number, 0 or more.")
    if any(not 0 <= seed <= MAX_SEED for seed in args.seed or []):
        raise UsageError(f"--seed must be from 0 to {MAX_SEED}.")
    if args.record is not None and args.record.exists() and not args.record.is_dir():
        raise UsageError(f"--record {args.record} is a file; give a folder for the cassettes.")
    scenarios = [load_scenario(path) for path in (args.scenarios or [_default_scenario()])]
    overrides = MatrixOverrides(args.model, args.temperature, args.repeats, args.seed, args.tool_mode, args.parser)
    plans = expand_matrix(scenarios, overrides)
    ledger_path = _ledger_path(args)
    if args.dry_run:  # never creates a ledger
        ledger = Ledger(ledger_path, readonly=True) if ledger_path.exists() else None
        try:
            planned = plan_matrix(plans, ledger)
        finally:
            if ledger is not None:
                ledger.close()
        for i, item in enumerate(planned.planned, 1):
            print(f"[{i}/{len(plans)}] {_plan_label(item.plan)}{' (done)' if item.done else ''}")
        for model, reason, count in planned.skipped:
            print(f"harness: {count} runs of {model} cannot be planned: {reason}", file=sys.stderr)
        print(f"{plural(len(plans), 'run')} planned, {planned.already_done} already done, {len(plans) - planned.already_done} to run.")
        return 0
    with Ledger(ledger_path) as ledger:
        started = time.perf_counter()
        progress = _Progress(len(plans))

        def on_planned(result) -> None:
            todo = len(result.planned) - result.already_done
            progress.set_total(todo)
            done = f" ({result.already_done} already in the ledger)" if result.already_done else ""
            print(f"Running {todo} of {len(plans)} planned runs{done}; ledger: {ledger_path}", file=sys.stderr, flush=True)

        try:
            result = run_matrix(plans, ledger, runs_dir=ledger_path.parent / "runs", record_dir=args.record,
                                on_run=progress.update, on_planned=on_planned, jobs=args.jobs, use_cache=args.cache,
                                retry=RetryPolicy(max_attempts=args.max_attempts), resume=not args.no_resume)  # fmt: skip
        finally:
            progress.close()
    _print_run_summary(result, time.perf_counter() - started, ledger_path)
    if args.record is not None and not result.summaries:
        print("harness: nothing was recorded: every planned run is already in the ledger; add --no-resume to run them again.", file=sys.stderr)
    return 1 if result.skipped or any(s.outcome == "infra_error" for s in result.summaries) else 0


def _plan_label(plan) -> str:
    return (f"{plan.scenario.name} {plan.model} T={plan.temperature:g} seed={plan.seed + plan.repetition} "
            f"{plan.tool_mode}/{plan.parser} rep={plan.repetition}")  # fmt: skip


class _Progress:
    """A tqdm bar on a terminal; a plain line per run otherwise (CI logs)."""

    def __init__(self, total: int):
        from tqdm import tqdm

        self.total, self.done = total, 0
        self.counts = {"pass": 0, "fail": 0, "infra": 0}
        self.bar = tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True) if sys.stderr.isatty() else None

    def set_total(self, total: int) -> None:
        self.total = total
        if self.bar is not None:
            self.bar.reset(total=total)

    def update(self, summary) -> None:
        from harness.runner import format_run_line

        self.done += 1
        kind = {"pass": "pass", "infra_error": "infra", "interrupted": "infra"}.get(summary.outcome, "fail")
        self.counts[kind] += 1
        line = format_run_line(self.done, self.total, summary)
        if self.bar is None:
            print(line, flush=True)
        else:
            self.bar.write(line)
            self.bar.set_postfix(self.counts, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _print_run_summary(result, elapsed_s: float, ledger_path: Path) -> None:
    from harness.runner import plural, summary_rows

    for warning in result.warnings:
        print(f"harness: warning: {warning}", file=sys.stderr)
    rows = summary_rows(result.summaries)
    if rows:
        table = [{**r, "pass_rate": "n/a" if r["pass_rate"] is None else f"{r['pass_rate']:.0%}"} for r in rows]
        for key in ("turn_limit", "token_limit", "interrupted"):
            if not any(r[key] for r in rows):
                for row in table:
                    row.pop(key)
        print()
        print(tabulate(table, headers="keys", tablefmt="github"))
        print()
    done_note = f" ({result.already_done} already in the ledger, skipped)" if result.already_done else ""
    print(f"{plural(len(result.summaries), 'run')} in {elapsed_s:.1f} s{done_note}; ledger: {ledger_path}")
    for model, reason, count in result.skipped:
        print(f"harness: skipped {plural(count, 'run')} of {model}: {reason}", file=sys.stderr)
    infra = sum(s.outcome == "infra_error" for s in result.summaries)
    if infra:
        print(f"harness: {infra} runs could not be done (infra_error: server failures, not model failures, "
              "excluded from pass rates); run the same command again to retry them.", file=sys.stderr)  # fmt: skip


# -- harness ledger ... ------------------------------------------------------------------------------
def _add_ledger(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ledger", help="inspect and check the ledger")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    v = verbs.add_parser("verify", help="recompute the hash chains; exit 1 naming the first bad row")
    _ledger_option(v)
    v.set_defaults(func=_cmd_ledger_verify)
    m = verbs.add_parser("migrate", help="create or upgrade the ledger schema")
    _ledger_option(m)
    m.set_defaults(func=_cmd_ledger_migrate)


def _cmd_ledger_verify(args: argparse.Namespace) -> int:
    from harness.ledger import Ledger

    path = _ledger_path(args)
    with Ledger(path, readonly=True) as ledger:
        result = ledger.verify()
    if result.ok:
        print(f"{path}: OK, {result.rows} rows verified.")
        return 0
    print(f"harness: {path}: verification FAILED at {result.problem}.", file=sys.stderr)
    return 1


def _cmd_ledger_migrate(args: argparse.Namespace) -> int:
    from harness.ledger import Ledger

    path = _ledger_path(args)
    with Ledger(path) as ledger:
        print(f"{path}: schema up to date ({', '.join(ledger.applied_migrations())}).")
    return 0


# -- harness rescore --------------------------------------------------------------------------------
def _add_rescore(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rescore", help="re-classify every stored reply with the current classifier")
    _ledger_option(p)
    p.add_argument("--force", action="store_true", help="also re-label turns already labelled by this classifier version")
    p.set_defaults(func=_cmd_rescore)


def _cmd_rescore(args: argparse.Namespace) -> int:
    from harness.ledger import Ledger
    from harness.rescore import rescore

    path = _ledger_path(args)
    if not path.is_file():
        raise UsageError(f"no ledger at {path}; pass --ledger PATH.")
    with Ledger(path) as ledger:
        result = rescore(ledger, force=args.force)
    print(f"{path}: {result.turns} turns re-classified with classifier {result.version} "
          f"({result.changed} changed labels, {result.skipped_current} already current).")  # fmt: skip
    if result.history_mismatch:
        print(f"harness: warning: {result.history_mismatch} turns' rebuilt messages did not match their request hash.", file=sys.stderr)
    return 0


# -- harness export ----------------------------------------------------------------------------------
def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write one record per turn as JSONL or CSV")
    _ledger_option(p)
    p.add_argument("--format", choices=["jsonl", "csv"], default="jsonl", help="one JSON object per line (default) or CSV with a header")
    p.add_argument("--out", type=Path, help="output file (default: standard output)")
    p.set_defaults(func=_cmd_export)


def _cmd_export(args: argparse.Namespace) -> int:
    import io

    from harness.ledger import EXPORT_COLUMNS, Ledger
    from harness.runner import plural

    ledger_path = _ledger_path(args)
    if args.out is not None:
        target = args.out.resolve()
        if target in {Path(f"{ledger_path.resolve()}{suffix}") for suffix in ("", "-wal", "-shm", "-journal")}:
            raise UsageError(f"--out {args.out} is the ledger itself; choose another file.")
        if target.is_dir() or not target.parent.is_dir():
            raise UsageError(f"--out {args.out}: {'is a folder' if target.is_dir() else 'its folder does not exist'}; give a file path.")
    with Ledger(ledger_path, readonly=True) as ledger:
        rows = list(ledger.export_rows())  # read everything before any output file is touched
    buffer = io.StringIO(newline="")
    if args.format == "jsonl":
        buffer.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    else:
        writer = csv.DictWriter(buffer, fieldnames=EXPORT_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({**row, "failure_modes": ";".join(row["failure_modes"])} for row in rows)
    if args.out is None:
        sys.stdout.write(buffer.getvalue())
        return 0
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    try:
        tmp.write_text(buffer.getvalue(), encoding="utf-8", newline="")
        os.replace(tmp, args.out)
    except OSError as exc:
        raise UsageError(f"cannot write --out {args.out}: {exc.strerror or exc}.") from exc
    print(f"Wrote {plural(len(rows), 'turn')} to {args.out}.", file=sys.stderr)
    return 0


# -- harness scenarios ... ---------------------------------------------------------------------------
def _add_scenarios(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scenarios", help="list and validate scenario files")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    ls = verbs.add_parser("list", help="list the scenarios in a folder")
    ls.add_argument("folder", nargs="?", type=Path, default=None, help="folder (default: scenarios/)")
    ls.set_defaults(func=_cmd_scenarios_list)
    ck = verbs.add_parser("check", help="validate scenario files without running anything")
    ck.add_argument("files", nargs="*", type=Path, help="scenario files (default: every file in scenarios/)")
    ck.set_defaults(func=_cmd_scenarios_check)


def _scenario_files(folder: Path | None) -> list[Path]:
    folder = folder or _default_scenario().parent
    files = sorted(folder.glob("*.toml"))
    if not files:
        raise ScenarioError(f"{folder}: no scenario files (*.toml) found.")
    return files


def _cmd_scenarios_list(args: argparse.Namespace) -> int:
    from harness.scenarios import load_scenario

    rows = []
    for path in _scenario_files(args.folder):
        s = load_scenario(path)
        rows.append({"scenario": s.name, "tools": ", ".join(t.name for t in s.tools), "turn_limit": s.turn_limit,
                     "done looks like": s.done_looks_like, "file": str(path)})  # fmt: skip
    print(tabulate(rows, headers="keys", tablefmt="github"))
    return 0


def _cmd_scenarios_check(args: argparse.Namespace) -> int:
    from harness.scenarios import load_scenario

    failures = 0
    for path in args.files or _scenario_files(None):
        try:
            scenario = load_scenario(path)
            print(f"{path}: OK ({scenario.name}, {len(scenario.checks)} checks)")
        except ScenarioError as exc:
            failures += 1
            print(f"harness: {exc}", file=sys.stderr)
    return 1 if failures else 0


# -- harness models ... -----------------------------------------------------------------------------
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


# -- harness classify -------------------------------------------------------------------------------
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
    if not isinstance(doc.get("response"), dict):
        raise UsageError(f'{where} has no "response" object; expected {{"tools": [...], "messages": [...], "response": {{"content": ..., "tool_calls": ...}}}}.')
    print(json.dumps(classify_document(doc), indent=2, ensure_ascii=True))
    return 0


# -- harness report / compare / review / attest -------------------------------------------------------
def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write a markdown comparison report with tables and plots", description=(
        "Write report.md (summary per cell, failure modes by model, shortest example replies, lenient-parser "
        "rescue) with PNG plots and CSV tables. Reads the ledger only; the same ledger gives the same bytes."))  # fmt: skip
    _ledger_option(p)
    p.add_argument("--out", type=Path, default=Path("reports"), help="output folder (default: reports/)")
    p.add_argument("--by", default=None, metavar="AXES", help="summary grouping, comma-separated from scenario,model,temperature,tool_mode,parser (default: all)")
    p.add_argument("--format", default="md,png", metavar="FORMATS", help="comma-separated from md, png, csv (default: md,png)")
    p.set_defaults(func=_cmd_report_write)


def _cmd_report_write(args: argparse.Namespace) -> int:
    from harness.reports import parse_axes, write_report
    from harness.runner import plural

    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    written = write_report(_ledger_path(args), args.out, by=parse_axes(args.by), formats=formats)
    print(f"Wrote {plural(len(written), 'file')} to {args.out}: {', '.join(p.name for p in written)}")
    return 0


def _add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="paired comparison of two models (pass rate and failure modes)")
    p.add_argument("model_a", metavar="MODEL_A", help="model spec, or its name without the backend prefix")
    p.add_argument("model_b", metavar="MODEL_B")
    _ledger_option(p)
    p.add_argument("--scenario", default=None, help="compare on one scenario only")
    p.set_defaults(func=_cmd_compare_models)


def _cmd_compare_models(args: argparse.Namespace) -> int:
    from harness.compare import compare_models, format_comparison
    from harness.reports import load_frames

    result = compare_models(load_frames(_ledger_path(args)), args.model_a, args.model_b, scenario=args.scenario)
    print(format_comparison(result))
    return 0 if result.pairs else 1


def _add_review(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("review", help="show one run's review frame: promise, criteria, diff, evidence, open questions")
    p.add_argument("run_id", metavar="RUN_ID", help="run id or a unique prefix")
    _ledger_option(p)
    p.add_argument("--verify", action="store_true", help="say whether the frame changed since its newest attestation (exit 1 if so)")
    p.set_defaults(func=_cmd_review_show)


def _cmd_review_show(args: argparse.Namespace) -> int:
    from harness.review import review_text, verify_attestation

    if not args.verify:
        print(review_text(_ledger_path(args), args.run_id), end="")
        return 0
    unchanged, sentence = verify_attestation(_ledger_path(args), args.run_id)
    print(sentence, file=sys.stdout if unchanged else sys.stderr)
    return 0 if unchanged else 1


def _add_attest(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attest", help="record that you reviewed a run's frame (appends its SHA-256 to the ledger)")
    p.add_argument("run_id", metavar="RUN_ID", help="run id or a unique prefix")
    p.add_argument("--reviewer", required=True, help="who reviewed it")
    p.add_argument("--notes", default=None, help="free text")
    _ledger_option(p)
    p.set_defaults(func=_cmd_attest_run)


def _cmd_attest_run(args: argparse.Namespace) -> int:
    from harness.review import attest

    run_id, digest = attest(_ledger_path(args), args.run_id, reviewer=args.reviewer, notes=args.notes)
    print(f"Attested run {run_id} by {args.reviewer.strip()}: frame SHA-256 {digest}.")
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
    except BrokenPipeError:  # e.g. `harness classify x.json | head`: the reader left, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
