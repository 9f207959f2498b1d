"""Helpers shared by the tests: repository paths and replay-cassette builders."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASSETTES = Path(__file__).resolve().parent / "cassettes"
SCENARIO_FILE = REPO / "scenarios" / "list_and_report.toml"
REPORT = "There are 3 files:\nconfig.json\nhello.txt\nmemo.md\n"
"""A report.txt that passes every check of list_and_report."""


def write_cassette(path: Path, replies: list[dict]) -> Path:
    """Write replies (cassette line dicts) to a JSONL cassette and return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in replies), encoding="utf-8")
    return path


def call_line(name: str, arguments: dict | str, *, content: str | None = None, tokens: tuple[int, int] = (50, 10)) -> dict:
    """A cassette line holding one structured tool call."""
    return {
        "content": content,
        "tool_calls": [{"function": {"name": name, "arguments": arguments}}],
        "finish_reason": "tool_calls",
        "usage": {"prompt_tokens": tokens[0], "completion_tokens": tokens[1]},
    }


def text_line(content: str | None, *, finish_reason: str = "stop", tokens: tuple[int, int] = (50, 10)) -> dict:
    """A cassette line holding only text."""
    return {
        "content": content,
        "tool_calls": None,
        "finish_reason": finish_reason,
        "usage": {"prompt_tokens": tokens[0], "completion_tokens": tokens[1]},
    }


IDEAL = [
    call_line("list_files", {"path": "."}),
    call_line("write_file", {"path": "report.txt", "content": REPORT}),
    text_line("I wrote report.txt: 3 files."),
]
"""An ideal model's replies for list_and_report: list, write the report, answer."""
