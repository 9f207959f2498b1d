"""Built-in tools and the per-run sandbox they are confined to.

Every tool is an ordinary Python function taking a :class:`Sandbox` first and the model's
arguments as keywords, paired with a JSON Schema in a :class:`Tool`. Tools signal refusal or
failure by raising :class:`~harness.errors.ToolError`; the loop sends that back to the model
as ``ERROR: <message>``.

Fixture data: a tool that answers from data instead of files (``get_current_weather``,
``list_tickets``) declares a ``data_schema``, a JSON Schema for the scenario's
``[tool_data.<tool>]`` table. The scenario loader validates that table and binds it into its
copy of the tool with :meth:`Tool.with_data`; :meth:`Tool.call` then passes it to the function
as the keyword ``data``. The model cannot send ``data`` itself, since only the names in the
tool's parameter schema are accepted. Outputs depend only on the arguments and the data, so
they are deterministic.

Confinement (nothing the model sends may touch anything outside its run's sandbox):

* a path is resolved as ``os.path.realpath`` resolves it against the sandbox root, following
  symlinks (:func:`real_path_within`: the same result, looking only at the components below the root), and must
  stay inside the root; ``..`` escapes, absolute paths and symlinks
  pointing out are refused with ``ToolError(escape_attempt=True)`` before any I/O;
* the final path component is opened with ``O_NOFOLLOW`` so a symlink swapped in after the
  check is not followed either; ``write_file`` opens a plain name (:func:`plain_name`: no ``/``) in the root at once
  that way, the resolved path being the same unless a symlink is there, and resolves it as above when the open says
  one is (``ELOOP``);
* writes above :data:`MAX_WRITE_BYTES` (1 MiB) and reads above :data:`MAX_READ_BYTES` are
  refused, and so is a write that would take the run past its total write limit (the
  scenario's ``write_limit_bytes``, default :data:`DEFAULT_WRITE_LIMIT_BYTES`, 16 MiB);
  NUL bytes in a path are refused.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from harness.errors import ToolError
from harness.sandbox import (
    DEFAULT_WRITE_LIMIT_BYTES,
    NO_SUCH_FILE,
    Sandbox,
    is_within,
    open_plain,
    plain_name,
    read_at_most,
    real_path_within,
    write_all,
)

__all__ = [
    "BUILTIN_TOOLS",
    "DEFAULT_WRITE_LIMIT_BYTES",
    "MAX_READ_BYTES",
    "MAX_WRITE_BYTES",
    "NO_SUCH_FILE",
    "TICKETS_DATA_SCHEMA",
    "WEATHER_DATA_SCHEMA",
    "Sandbox",
    "is_within",
    "plain_name",
    "read_at_most",
    "write_all",
    "real_path_within",
    "Tool",
    "ToolResult",
]

MAX_WRITE_BYTES = 1024 * 1024
MAX_READ_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one tool call, as sent back to the model and stored in the ledger.

    Attributes:
        name: tool name as called.
        arguments: arguments as parsed.
        output: the text sent to the model (``ERROR: ...`` on error).
        error: True when the tool refused or failed (including unknown tools).
        escape_attempt: True when a path pointed outside the sandbox.
    """

    name: str
    arguments: Any
    output: str
    error: bool = False
    escape_attempt: bool = False


@dataclass(frozen=True)
class Tool:
    """A tool offered to the model: a Python function plus its JSON Schema.

    Attributes:
        name: the tool name the model calls.
        description: one sentence for the model.
        parameters: JSON Schema (object) of the keyword arguments.
        function: ``function(sandbox, **arguments) -> str``, or
            ``function(sandbox, *, data, **arguments) -> str`` when ``data_schema`` is set;
            raises ToolError to refuse.
        data_schema: JSON Schema of the fixture data the tool answers from (the scenario's
            ``[tool_data.<name>]`` table), or None for a tool that takes no data.
        data: the fixture data bound by :meth:`with_data` (None until bound).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., str] = field(compare=False)
    data_schema: dict[str, Any] | None = field(default=None, compare=False)
    data: Mapping[str, Any] | None = field(default=None, compare=False)

    def with_data(self, data: Mapping[str, Any]) -> Tool:
        """Return a copy of this tool that answers from ``data``.

        Args:
            data: fixture data already validated against :attr:`data_schema`.

        Raises:
            ValueError: the tool takes no fixture data (``data_schema`` is None).
        """
        if self.data_schema is None:
            raise ValueError(f"tool {self.name!r} takes no fixture data")
        return replace(self, data=data)

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style tool definition ``{"type": "function", "function": {...}}``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def call(self, sandbox: Sandbox, arguments: Any) -> ToolResult:
        """Execute the tool; never raises.

        Args:
            sandbox: the run's sandbox.
            arguments: the model's arguments (expected dict; anything else is a tool error).

        Returns:
            The result; errors become ``ERROR: <message>`` with ``error=True``.
        """
        try:
            if not isinstance(arguments, dict):
                raise ToolError(f"arguments must be a JSON object, got {type(arguments).__name__}")
            allowed = set(self.parameters.get("properties", {}))
            unexpected = sorted(set(arguments) - allowed)
            if unexpected:
                raise ToolError(
                    f"unexpected argument(s) {', '.join(unexpected)}; {self.name} takes {', '.join(sorted(allowed)) or 'none'}"
                )
            missing = [k for k in self.parameters.get("required", []) if k not in arguments]
            if missing:
                raise ToolError(f"missing required argument(s) {', '.join(missing)}")
            if self.data_schema is not None:
                output = self.function(sandbox, data=self.data or {}, **arguments)
            else:
                output = self.function(sandbox, **arguments)
        except ToolError as exc:
            text = sandbox.hide_root(f"ERROR: {exc}")
            return ToolResult(self.name, arguments, text, error=True, escape_attempt=exc.escape_attempt)
        except Exception as exc:  # noqa: BLE001 - a tool bug must not crash the loop; it is data
            return ToolResult(self.name, arguments, sandbox.hide_root(f"ERROR: {type(exc).__name__}: {exc}"), error=True)
        return ToolResult(self.name, arguments, output)


def _list_files(sandbox: Sandbox, path: Any = ".") -> str:
    target = sandbox.resolve(path)
    try:  # no stat first: listdir says "not a directory" as Path.is_dir would (the path is resolved: no symlink)
        names = os.listdir(target)  # the names Path.iterdir gives
    except OSError as exc:
        if exc.errno in NO_SUCH_FILE:
            raise ToolError(f"{path!r} is not a directory") from None
        raise
    return json.dumps(sorted(names))


def _read_file(sandbox: Sandbox, path: Any) -> str:
    target = sandbox.resolve(path)
    try:
        info: os.stat_result | None = target.stat()  # one stat for "is it a file" and "how large"
    except OSError as exc:
        if exc.errno not in NO_SUCH_FILE:
            raise
        info = None
    except ValueError:  # as Path.is_file
        info = None
    if info is None or not stat.S_ISREG(info.st_mode):
        raise ToolError(f"no such file: {path!r}")
    if info.st_size > MAX_READ_BYTES:
        raise ToolError(f"{path!r} is larger than {MAX_READ_BYTES} bytes")
    fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return read_at_most(fd, MAX_READ_BYTES, info.st_size).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def _write_file(sandbox: Sandbox, path: Any, content: Any) -> str:
    if not isinstance(content, str):
        raise ToolError(f"content must be a string, got {type(content).__name__}")
    data = content.encode("utf-8")
    if len(data) > MAX_WRITE_BYTES:
        raise ToolError(f"content is {len(data)} bytes; the limit is {MAX_WRITE_BYTES} bytes (1 MiB)")
    if sandbox.bytes_written + len(data) > sandbox.write_limit:
        raise ToolError(
            f"this run has written {sandbox.bytes_written} bytes; {len(data)} more would pass its limit of "
            f"{sandbox.write_limit} bytes (the scenario's write_limit_bytes)"
        )
    fd, rel = _open_for_write(sandbox, path)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)
    sandbox.bytes_written += len(data)
    if rel not in sandbox.written:
        sandbox.written.append(rel)
    return f"wrote {len(data)} bytes to {rel}"


_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_for_write(sandbox: Sandbox, path: Any) -> tuple[int, str]:
    """Open the model's ``path`` for ``write_file`` (created or truncated); the open file and its sandbox-relative path.

    A plain name (:func:`plain_name`) is opened in the root at once (``O_NOFOLLOW``; a folder there answers ``EISDIR``);
    a symlink there (``ELOOP``), or any other path, is resolved first (:meth:`Sandbox.resolve`), its folders made and
    checked again after they are made. Raises ToolError (a folder, an escape) or OSError.
    """
    if isinstance(path, str):
        try:
            fd = open_plain(sandbox.root, path, _WRITE, 0o644)
        except IsADirectoryError:
            raise ToolError(f"{path!r} is a directory") from None
        if fd is not None:
            return fd, path
    target = sandbox.resolve(path)
    if target == sandbox.root or target.is_dir():
        raise ToolError(f"{path!r} is a directory")
    if target.parent != sandbox.root:  # the root exists
        target.parent.mkdir(parents=True, exist_ok=True)
        sandbox.resolve(sandbox.relative(target.parent))  # re-check after mkdir: no symlinked parent
    return os.open(target, _WRITE, 0o644), sandbox.relative(target)


def _get_current_weather(sandbox: Sandbox, *, data: Mapping[str, Any], city: Any) -> str:
    if not isinstance(city, str) or not city.strip():
        raise ToolError(f"city must be a non-empty string, got {json.dumps(city)[:80]}")
    wanted = city.strip().casefold()
    for name, report in data.items():
        if name.casefold() == wanted:
            return json.dumps({"city": name, **report}, ensure_ascii=False)
    raise ToolError(f"no weather data for {city.strip()!r}")


def _list_tickets(sandbox: Sandbox, *, data: Mapping[str, Any]) -> str:
    return json.dumps([{"id": ticket_id, "text": text} for ticket_id, text in data.items()], ensure_ascii=False)


_PATH = {"type": "string", "description": "Path relative to the working directory."}

#: ``[tool_data.get_current_weather]``: city name -> its current weather.
WEATHER_DATA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "minProperties": 1,
    "additionalProperties": {
        "type": "object",
        "properties": {
            "temperature_c": {"type": "number"},
            "condition": {"type": "string", "minLength": 1},
            "humidity_pct": {"type": "integer", "minimum": 0, "maximum": 100},
            "wind_kph": {"type": "number", "minimum": 0},
        },
        "required": ["temperature_c", "condition"],
        "additionalProperties": False,
    },
}

#: ``[tool_data.list_tickets]``: ticket id -> ticket text, in the order listed.
TICKETS_DATA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "minProperties": 1,
    "additionalProperties": {"type": "string", "minLength": 1},
}

BUILTIN_TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        Tool(
            "list_files",
            "List the names of the files in a directory of the working directory, as a JSON array.",
            {"type": "object", "properties": {"path": {**_PATH, "default": "."}}, "required": []},
            _list_files,
        ),
        Tool(
            "read_file",
            "Read a text file from the working directory.",
            {"type": "object", "properties": {"path": _PATH}, "required": ["path"]},
            _read_file,
        ),
        Tool(
            "write_file",
            "Write text to a file in the working directory, replacing it if it exists.",
            {
                "type": "object",
                "properties": {"path": _PATH, "content": {"type": "string", "description": "The full text to write."}},
                "required": ["path", "content"],
            },
            _write_file,
        ),
        Tool(
            "get_current_weather",
            "Get the current weather for a city: temperature in degrees Celsius and conditions, as JSON.",
            {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city name, e.g. Paris."}},
                "required": ["city"],
            },
            _get_current_weather,
            data_schema=WEATHER_DATA_SCHEMA,
        ),
        Tool(
            "list_tickets",
            "List the open support tickets as a JSON array of objects with an id and a text.",
            {"type": "object", "properties": {}, "required": []},
            _list_tickets,
            data_schema=TICKETS_DATA_SCHEMA,
        ),
    )
}
