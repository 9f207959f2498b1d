"""Scenario files: one agent task, its tools, fixtures, limits, done checks and default matrix.

A scenario is a TOML file (see ``scenarios/list_and_report.toml``)::

    name = "list_and_report"                  # required, 1-100 of [A-Za-z0-9_.-], first not '.' or '-'
    what_it_does = "..."                      # required: scope, stated to the model
    what_it_does_not = "..."                  # required: out of scope, stated to the model
    done_looks_like = "..."                   # required: one checkable sentence the checks implement
    system_prompt = "..."                     # required
    task = "..."                              # required: the user message
    tools = ["list_files", "write_file"]      # required: built-in tool names, each once (may be empty)
    turn_limit = 8                            # optional, default 8
    token_limit = 32000                       # optional, default 32000
    max_tokens = 256                          # optional, completion cap per reply
    num_ctx = 4096                            # optional, context length
    api_key_env = "MY_KEY"                    # optional, env var for openai: backends ([A-Za-z_][A-Za-z0-9_]*)
    requires_tool = true                      # optional, default true: the task cannot be done without a tool
    write_limit_bytes = 16777216              # optional, default 16 MiB: bytes a run's tools may write in total

    [fixtures]                                # optional: sandbox-relative path -> text
    "hello.txt" = "Hello"

    [tool_data.get_current_weather]           # required for each offered tool that answers
    "Paris" = {temperature_c = 17, condition = "light drizzle"}   # from fixture data

    [[checks]]                                # required, at least one; see harness.checks
    type = "file_exists"
    path = "report.txt"

    [matrix]                                  # optional default matrix
    models = ["embedded:smollm2-135m"]
    temperatures = [0.0, 0.7]
    repeats = 2
    seeds = [0]
    tool_modes = ["prompt"]
    parsers = ["lenient"]
    think = ["default"]                       # default (the request says nothing), on, off
    streams = [false]                         # stream replies (true) and/or not (false)

Any missing or wrong field raises :class:`~harness.errors.ScenarioError` naming the file, the
field and what was expected; unknown fields are refused too, since they are usually typos.

The ``name`` is what the ledger stores as each run's scenario, what reports group and pair runs
by, what ``harness compare --scenario NAME`` selects and what the console's run lines show; no
file name is made from it. It is 1 to 100 characters from ``A-Z a-z 0-9 _ . -`` and does not
start with ``.`` or ``-``: so it is one short word on a console line or in a report's table,
never ``.``/``..`` nor a hidden-file name should it become part of a path, and never read as an
option when given after ``--scenario``.

``[tool_data.<tool>]`` holds the fixture data of a tool that answers from data rather than
files (a :class:`~harness.tools.Tool` with a ``data_schema``). Each table is validated against
that schema; a table for a tool that is not offered, or for a tool that takes no data, is an
error, and so is an offered data tool without its table. The loaded scenario's ``tools`` hold
copies of the built-in tools with their data bound (:meth:`~harness.tools.Tool.with_data`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from harness.backends import parse_model_spec
from harness.checks import validate_check
from harness.errors import ScenarioError, UsageError
from harness.matrix import AXES, Matrix, expected_value, value_problem
from harness.tool_protocol import render_tools_prompt
from harness.tools import BUILTIN_TOOLS, DEFAULT_WRITE_LIMIT_BYTES, Tool
from harness.vocab import ToolMode

__all__ = [
    "DEFAULT_SCENARIO",
    "Scenario",
    "fixture_path_problem",
    "load_scenario",
]

DEFAULT_SCENARIO = Path("scenarios") / "list_and_report.toml"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")  # the whole name (fullmatch): "$" let a final newline through
_NAME_RULE = "1 to 100 letters, digits, '_', '.' or '-', not starting with '.' or '-'"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # what a shell can export (POSIX names)
_ENV_RULE = "an environment variable name (letters, digits and '_', not starting with a digit)"


@dataclass(frozen=True)
class Scenario:
    """A loaded, validated scenario file. See the module docstring for the fields."""

    name: str
    path: Path
    content_hash: str
    what_it_does: str
    what_it_does_not: str
    done_looks_like: str
    system_prompt: str
    task: str
    tools: tuple[Tool, ...]
    fixtures: Mapping[str, str]
    checks: tuple[Mapping[str, Any], ...]
    turn_limit: int = 8
    token_limit: int = 32000
    max_tokens: int = 256
    num_ctx: int = 4096
    api_key_env: str | None = None
    write_limit_bytes: int = DEFAULT_WRITE_LIMIT_BYTES
    """Bytes one run's tools may write in total; a write past it is a tool error."""
    requires_tool: bool = True
    """Whether the task needs a tool: a run that ends without any tool answering is
    ``skipped_required_tool``; with False, any call is ``unneeded_call``."""
    matrix: Matrix = field(default_factory=Matrix)

    @property
    def tool_data(self) -> dict[str, Mapping[str, Any]]:
        """Fixture data of the offered data tools (``[tool_data.<tool>]``), by tool name."""
        return {t.name: t.data for t in self.tools if t.data is not None}

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI-style tool definitions for the tools offered."""
        return [tool.schema() for tool in self.tools]

    def system_message(self, tool_mode: ToolMode) -> str:
        """The system prompt sent to the model: prompt, scope statement, and (prompt mode) tools.

        Args:
            tool_mode: ``native`` (tools go in the API field) or ``prompt`` (rendered here).
        """
        text = (
            f"{self.system_prompt.strip()}\n\nScope: {self.what_it_does.strip()}\nOut of scope: {self.what_it_does_not.strip()}"
        )
        if tool_mode == "prompt" and self.tools:
            text += "\n\n" + render_tools_prompt(self.tool_schemas())
        return text


MAX_INT = 2**31 - 1


def fixture_path_problem(paths: list[str]) -> str | None:
    """Say what makes a set of fixture paths unusable, or return None.

    Each path must be relative, without ``.``/``..``/empty components, NUL bytes or components
    longer than 255 bytes, and no path may be a folder of another (``a`` and ``a/b``).
    """
    for rel in paths:
        parts = rel.replace("\\", "/").split("/")
        if not rel or rel.startswith(("/", "~")) or "\x00" in rel:
            return f"not a relative path: {rel!r}"
        if any(part in ("", ".", "..") for part in parts):
            return f"'.', '..' and empty components are not allowed: {rel!r}"
        if any(len(part.encode("utf-8", "surrogatepass")) > 255 for part in parts):
            return f"a component is longer than 255 bytes: {rel[:40]!r}..."
    folders = {"/".join(rel.split("/")[:i]) for rel in paths for i in range(1, rel.count("/") + 1)}
    clash = sorted(folders & set(paths))
    return f"a file is also used as a folder: {clash[0]!r}" if clash else None


class _Fields:
    """Typed access to a TOML table that raises ScenarioError naming file and field."""

    def __init__(self, path: Path, data: Mapping[str, Any], prefix: str = ""):
        self.path, self.data, self.prefix = path, data, prefix

    def fail(self, key: str, expected: str, got: Any = None, *, missing: bool = False) -> ScenarioError:
        where = f"{self.path}: field '{self.prefix}{key}'"
        if missing:
            return ScenarioError(f"{where} is missing; expected {expected}.")
        return ScenarioError(f"{where} must be {expected}, got {json.dumps(got, default=str)[:60]}.")

    def text(self, key: str, default: str | None = None, *, required: bool = True) -> str:
        if key not in self.data:
            if required and default is None:
                raise self.fail(key, "a non-empty string", missing=True)
            return default or ""
        value = self.data[key]
        if not isinstance(value, str) or (required and not value.strip()):
            raise self.fail(key, "a non-empty string", value)
        return value

    def integer(self, key: str, default: int, *, minimum: int = 1, maximum: int = MAX_INT) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            too_big = isinstance(value, int) and not isinstance(value, bool) and value > maximum
            expected = (
                f"an integer >= {minimum}" if maximum == MAX_INT and not too_big else f"an integer from {minimum} to {maximum}"
            )
            raise self.fail(key, expected, value)
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, "true or false", value)
        return value

    def string_list(self, key: str, default: tuple[str, ...], *, nonempty: bool = True) -> tuple[str, ...]:
        value = self.data.get(key, list(default))
        what = "a list of strings" + (" (not empty)" if nonempty else "")
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value) or (nonempty and not value):
            raise self.fail(key, what, value)
        return tuple(value)

    def axis(self, key: str, default: Any) -> Any:
        """A ``[matrix]`` axis checked by :func:`harness.matrix.value_problem` (lists must be non-empty)."""
        value = self.data.get(key, default)
        if key == "repeats":
            problem = value_problem(key, value)
            if problem is not None:
                raise self.fail(key, problem, value)
            return value
        if not isinstance(value, list) or not value:
            raise self.fail(key, f"a non-empty list, each {expected_value(key)}", value)
        for index, item in enumerate(value):  # the first bad entry is named, whatever makes it bad
            if value_problem(key, item) is not None:
                raise self.fail(f"{key}[{index}]", expected_value(key), item)
            if key == "models":
                try:
                    parse_model_spec(item)
                except UsageError as exc:
                    raise ScenarioError(f"{self.path}: field '{self.prefix}{key}[{index}]': {exc}") from exc
        return tuple(float(v) for v in value) if key == "temperatures" else tuple(value)


_TOP_LEVEL = {
    "name", "what_it_does", "what_it_does_not", "done_looks_like", "system_prompt", "task", "tools",
    "fixtures", "checks", "turn_limit", "token_limit", "max_tokens", "num_ctx", "api_key_env", "matrix", "description", "tool_data",
    "requires_tool", "write_limit_bytes",
}  # fmt: skip
_MATRIX = set(AXES)


def load_scenario(path: str | Path) -> Scenario:
    """Load and validate one scenario file.

    Args:
        path: the TOML file.

    Returns:
        The validated :class:`Scenario`; ``content_hash`` is the SHA-256 of the file's bytes.

    Raises:
        ScenarioError: the file is missing, unreadable, not TOML, or a field is missing or wrong.
    """
    path = Path(path)
    raw, data = _read_toml(path)
    f = _Fields(path, data)
    name = f.text("name")
    if len(name) > 100:  # not the usual 60-character quote: its length is what is wrong
        raise ScenarioError(f"{path}: field 'name' must be {_NAME_RULE}, got {len(name)} characters.")
    if not _NAME.fullmatch(name):
        raise f.fail("name", _NAME_RULE, name)
    tool_names = _tool_names(f)
    tool_data = _load_tool_data(f, tool_names)
    fixtures, checks = _fixtures_and_checks(f)
    matrix = _load_matrix(f)
    api_key_env = f.text("api_key_env", required=False) if "api_key_env" in data else None
    if api_key_env is not None and not _ENV_NAME.fullmatch(api_key_env):  # "" too: it named no variable, silently
        raise f.fail("api_key_env", _ENV_RULE, api_key_env)
    requires_tool = f.boolean("requires_tool", True)
    if requires_tool and not tool_names:
        raise f.fail("requires_tool", "false when tools = [] (a task that needs a tool must offer one)", True)
    return Scenario(
        name=name,
        path=path,
        content_hash=hashlib.sha256(raw).hexdigest(),
        what_it_does=f.text("what_it_does"),
        what_it_does_not=f.text("what_it_does_not"),
        done_looks_like=f.text("done_looks_like"),
        system_prompt=f.text("system_prompt"),
        task=f.text("task"),
        tools=tuple(BUILTIN_TOOLS[n].with_data(tool_data[n]) if n in tool_data else BUILTIN_TOOLS[n] for n in tool_names),
        fixtures=dict(fixtures),
        checks=tuple(checks),
        turn_limit=f.integer("turn_limit", 8),
        token_limit=f.integer("token_limit", 32000),
        max_tokens=f.integer("max_tokens", 256),
        num_ctx=f.integer("num_ctx", 4096, minimum=256),
        write_limit_bytes=f.integer("write_limit_bytes", DEFAULT_WRITE_LIMIT_BYTES),
        api_key_env=api_key_env,
        requires_tool=requires_tool,
        matrix=matrix,
    )


def _tool_names(f: _Fields) -> tuple[str, ...]:
    """The ``tools`` list: built-in tool names, each named once (a second copy would be offered to the model twice).

    Raises:
        ScenarioError: ``tools`` is missing, not a list of strings, names an unknown tool or one tool twice.
    """
    if "tools" not in f.data:
        raise f.fail("tools", f"a list of tool names from {sorted(BUILTIN_TOOLS)}", missing=True)
    tool_names = f.string_list("tools", (), nonempty=False)
    for index, tool_name in enumerate(tool_names):
        if tool_name not in BUILTIN_TOOLS:
            raise f.fail("tools", f"a list of tool names from {sorted(BUILTIN_TOOLS)}", tool_name)
        if tool_name in tool_names[:index]:
            raise ScenarioError(f"{f.path}: field 'tools' names {tool_name!r} twice; offer each tool once.")
    return tool_names


def _read_toml(path: Path) -> tuple[bytes, dict[str, Any]]:
    """The file's bytes and its TOML table, whose top-level fields are all known ones.

    Raises:
        ScenarioError: the file is missing, unreadable, not UTF-8 TOML, or has an unknown field.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise ScenarioError(f"{path}: no such scenario file; `harness scenarios list` shows the shipped ones.") from exc
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the scenario file ({exc.strerror or exc}).") from exc
    try:
        data = tomllib.loads(raw.decode("utf-8-sig"))  # a byte-order mark (Windows editors) is not part of the TOML
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: not a valid TOML file ({exc}).") from exc
    unknown = sorted(set(data) - _TOP_LEVEL)
    if unknown:
        raise ScenarioError(f"{path}: unknown field '{unknown[0]}'; expected only {', '.join(sorted(_TOP_LEVEL))}.")
    return raw, data


def _fixtures_and_checks(f: _Fields) -> tuple[dict[str, str], list[Any]]:
    """The ``[fixtures]`` table and the ``[[checks]]`` list, validated.

    Raises:
        ScenarioError: a fixture is not text at a usable sandbox-relative path, or a check is invalid.
    """
    path, data = f.path, f.data
    fixtures = data.get("fixtures", {})
    if not isinstance(fixtures, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in fixtures.items()):
        raise f.fail("fixtures", "a table of file path = text", fixtures)
    problem = fixture_path_problem(list(fixtures))
    if problem:
        raise ScenarioError(f"{path}: field 'fixtures' has an unusable path: {problem}; use sandbox-relative file paths.")
    checks = data.get("checks")
    if not isinstance(checks, list) or not checks:
        raise f.fail("checks", "a non-empty list of [[checks]] tables", checks, missing="checks" not in data)
    for index, check in enumerate(checks):
        problem = validate_check(check)
        unusable = fixture_path_problem([check["path"]]) if problem is None and isinstance(check.get("path"), str) else None
        if unusable:  # the same rule as fixture paths: a check never reads outside the sandbox
            problem = f"parameter 'path' is unusable: {unusable}; use a sandbox-relative file path"
        if problem:
            raise ScenarioError(f"{path}: field 'checks[{index}]': {problem}.")
    return fixtures, checks


def _load_matrix(f: _Fields) -> Matrix:
    """The scenario's ``[matrix]`` table, each axis checked with the same rules as the CLI flags.

    Raises:
        ScenarioError: ``matrix`` is not a table or has an unknown field, an axis value is wrong (the first bad
            entry is named), a model spec is malformed, or two base seeds send one seed
            (:meth:`~harness.matrix.Matrix.check_seeds`).
    """
    path, table = f.path, f.data.get("matrix", {})
    if not isinstance(table, dict):
        raise f.fail("matrix", "a table", table)
    unknown = sorted(set(table) - _MATRIX)
    if unknown:
        raise ScenarioError(f"{path}: unknown field 'matrix.{unknown[0]}'; expected only {', '.join(sorted(_MATRIX))}.")
    m = _Fields(path, table, "matrix.")
    matrix = Matrix(
        **{axis: m.axis(axis, getattr(Matrix, axis) if axis == "repeats" else list(getattr(Matrix, axis))) for axis in AXES}
    )
    try:
        matrix.check_seeds()  # the rule `harness run` applies to the merged matrix, so `scenarios check` agrees with it
    except UsageError as exc:
        raise ScenarioError(f"{path}: field 'matrix.seeds': {exc}") from exc
    return matrix


def _non_finite(value: Any, where: str = "") -> str | None:
    """Dotted path of the first NaN or infinite number inside a TOML value, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where.lstrip(".") or "value"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, f"{where}.{key}")
        if found is not None:
            return found
    return None


def _load_tool_data(f: _Fields, tool_names: tuple[str, ...]) -> dict[str, Mapping[str, Any]]:
    """Validate the ``[tool_data]`` table against the offered tools and their data schemas.

    Args:
        f: the top-level fields of the scenario file.
        tool_names: the tools the scenario offers.

    Returns:
        tool name -> its fixture data, for every offered tool that takes data.

    Raises:
        ScenarioError: ``tool_data`` is not a table, names a tool that is not offered or takes
            no data, misses the table of an offered data tool, or a table breaks its schema.
    """
    tables = f.data.get("tool_data", {})
    if not isinstance(tables, dict):
        raise f.fail("tool_data", "a table of [tool_data.<tool>] tables", tables)
    for name, table in tables.items():
        if name not in tool_names:
            raise ScenarioError(
                f"{f.path}: field 'tool_data.{name}' is data for a tool that is not offered; "
                f"add {name!r} to 'tools' or remove the table."
            )
        schema = BUILTIN_TOOLS[name].data_schema
        if schema is None:
            raise ScenarioError(f"{f.path}: field 'tool_data.{name}' is not allowed; the tool {name} takes no fixture data.")
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(table))
        if error is not None:
            where = ".".join(["tool_data", name, *(str(p) for p in error.absolute_path)])
            raise ScenarioError(f"{f.path}: field '{where}' is invalid: {error.message[:160]}.")
        bad = _non_finite(table)
        if bad is not None:
            raise ScenarioError(f"{f.path}: field 'tool_data.{name}.{bad}' must be a finite number (tool output is JSON).")
        if name == "get_current_weather":  # looked up ignoring case, so two spellings of one city clash
            folded: dict[str, str] = {}
            for city in table:
                if city.casefold() in folded:
                    raise ScenarioError(f"{f.path}: field 'tool_data.{name}' names {folded[city.casefold()]!r} and {city!r}; "
                                        "cities are matched ignoring case, keep one.")  # fmt: skip
                folded[city.casefold()] = city
    for name in tool_names:
        if BUILTIN_TOOLS[name].data_schema is not None and name not in tables:
            raise f.fail(f"tool_data.{name}", f"a table of fixture data for the offered tool {name}", missing=True)
    return {name: tables[name] for name in tool_names if name in tables}
