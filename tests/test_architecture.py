"""The package's standing structural rules, checked on the source itself.

* Only ``harness/ledger/`` knows the ledger's tables: no SQL text and no ``sqlite3`` elsewhere.
* Only the CLI and ``harness/console.py`` print.
* Dependencies point one way: backends know nothing of the loop, the ledger or the classifier;
  the classifier does no I/O and imports nothing stateful; the ledger knows nothing above it;
  reports only read the ledger.
* No module over 500 lines; no function over 60 lines or 6 parameters without a reason written
  next to it (``# long: <reason>`` on the ``def`` line, ``# noqa: PLR0913 - <reason>`` for parameters);
  every ``noqa`` says why.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "harness"
MODULES = sorted(PACKAGE.rglob("*.py"))
SQL = re.compile(r"\b(?:SELECT|INSERT INTO|CREATE (?:TABLE|INDEX|TRIGGER)|DROP TABLE|UPDATE \w+ SET|DELETE FROM|PRAGMA)\b")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 6


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def _imports(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_rules_see_every_module():
    assert len(MODULES) > 30 and PACKAGE / "ledger" / "store.py" in MODULES


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_no_sql_outside_the_ledger_package(path):
    if path.parent.name == "ledger":
        return
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert "sqlite3" not in _imports(tree), f"{_rel(path)} imports sqlite3; read through named Ledger methods"
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    offending = [s for s in strings if SQL.search(s)]
    assert not offending, f"{_rel(path)} holds SQL text: {offending[0][:80]!r}"


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_only_the_cli_and_the_console_print(path):
    if path.parent.name == "cli" or path.name == "console.py":
        return
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            raise AssertionError(f"{_rel(path)}:{node.lineno} prints; report through return values, events or logging")
        if isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr") and getattr(node.value, "id", None) == "sys":
            raise AssertionError(f"{_rel(path)}:{node.lineno} writes to sys.{node.attr}")


FORBIDDEN = {
    "backends": ("harness.loop", "harness.runner", "harness.ledger", "harness.classifier", "harness.report", "harness.cli"),
    "classifier": (
        "harness.loop",
        "harness.runner",
        "harness.ledger",
        "harness.backends",
        "harness.report",
        "harness.cli",
        "harness.tools",
        "harness.scenarios",
    ),  # fmt: skip
    "ledger": ("harness.loop", "harness.runner", "harness.classifier", "harness.backends", "harness.report", "harness.cli"),
    "report": ("harness.loop", "harness.runner", "harness.backends", "harness.cli", "harness.classifier"),
}
"""Package -> modules it must not import (dependencies point one way)."""


@pytest.mark.parametrize("path", [p for p in MODULES if p.parent.name in FORBIDDEN], ids=_rel)
def test_dependencies_point_one_way(path):
    imported = _imports(ast.parse(path.read_text(encoding="utf-8")))
    bad = sorted(i for i in imported for f in FORBIDDEN[path.parent.name] if i == f or i.startswith(f + "."))
    assert not bad, f"{_rel(path)} imports {bad}"


@pytest.mark.parametrize("path", [p for p in MODULES if p.parent.name == "classifier"], ids=_rel)
def test_the_classifier_does_no_io(path):
    imported = _imports(ast.parse(path.read_text(encoding="utf-8")))
    io = {"os", "pathlib", "sqlite3", "subprocess", "socket", "httpx", "time", "random", "threading"} & {
        i.split(".")[0] for i in imported
    }
    assert not io, f"{_rel(path)} imports {sorted(io)}; the classifier is pure"


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_modules_and_functions_stay_small(path):
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= MAX_MODULE_LINES, f"{_rel(path)} has {len(lines)} lines; split it (a module per concern)"
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        where = f"{_rel(path)}:{node.lineno} {node.name}"
        header = "\n".join(lines[node.lineno - 2 : node.body[0].lineno])
        length = node.end_lineno - node.lineno + 1
        assert length <= MAX_FUNCTION_LINES or "# long:" in header, f"{where} has {length} lines and no '# long: <reason>'"
        args = node.args
        count = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs)
        count -= 1 if args.args and args.args[0].arg in ("self", "cls") else 0
        assert count <= MAX_PARAMETERS or re.search(r"noqa: PLR0913 - \w", header), (
            f"{where} takes {count} parameters and gives no reason"
        )


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_every_noqa_says_why(path):
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if "# noqa" in line:
            assert re.search(r"# noqa: [A-Z]+\d+(?:, [A-Z]+\d+)* - \S", line), f"{_rel(path)}:{number}: '# noqa: CODE - reason'"
