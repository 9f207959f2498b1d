"""Classification time per reply on a realistic mix, plus pathological inputs.

Run: ``python benchmarks/classifier_speed.py`` from the repository root. Prints the median and
p99 per reply kind and for the whole mix, in milliseconds. Not a test: timings depend on the
machine; the target is a median under 1 ms for a 2 KB reply.

``--adversarial`` prints, for inputs built to trigger quadratic scans (an unclosed string of
escaped quotes, runs of quotes, braces, tags, fences, call openers), the time at 16 KB to 1 MB
and the time per KB relative to 16 KB at 256 KB (the most content that is scanned,
``MAX_SCAN_CHARS``) and at 1 MB: a ratio near 1 or below is linear; a quadratic scan would show
16 at 256 KB.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.classifier import classify  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List files.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
]
HISTORY = [
    {"role": "system", "content": "You are a careful file assistant. Use the tools; answer briefly."},
    {"role": "user", "content": "List the files, then write report.txt listing them one per line."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "list_files", "arguments": '{"path": "."}'}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"files": ["hello.txt", "notes.md", "data.csv"]})},
]
LONG_TEXT = ("The directory holds three files: hello.txt, notes.md and data.csv. " * 40)[:2000]
LIST = '{"name": "list_files", "arguments": {"path": "."}}'
WRITE_2K = json.dumps({"name": "write_file", "arguments": {"path": "report.txt", "content": LONG_TEXT[:1900]}})


def structured(name: str, args: dict) -> list[dict]:
    return [{"id": "c9", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]


MIX = {
    "clean_structured": {
        "content": "",
        "tool_calls": structured("write_file", {"path": "report.txt", "content": "hello.txt\nnotes.md\ndata.csv"}),
        "finish_reason": "tool_calls",
    },
    "raw_json": {"content": LIST, "finish_reason": "stop"},
    "fenced": {"content": "```json\n" + json.dumps(json.loads(LIST), indent=2) + "\n```", "finish_reason": "stop"},
    "prose_json": {"content": "There are 3 files. I will create report.txt.\n" + WRITE_2K[:300] + "}}"},
    "pythonic": {"content": "list_files(path='.')"},
    "broken": {
        "content": LIST + '\n{"name": "write_file", "arguments": {"path": "r.txt", "content": "F:\\n" + '
        '"\\n".join(result["files"])}}'
    },
    "empty": {"content": "", "usage": {"completion_tokens": 40}},
    "long_2kb_final": {"content": LONG_TEXT, "finish_reason": "stop"},
    "long_2kb_call": {"content": WRITE_2K, "finish_reason": "stop"},
    "long_2kb_structured": {
        "content": LONG_TEXT,
        "tool_calls": structured("write_file", {"path": "report.txt", "content": LONG_TEXT}),
        "finish_reason": "tool_calls",
    },
}
PATHOLOGICAL = {
    "1MB prose": "word " * 200_000,
    "1MB of {": "{" * 1_000_000,
    "10k nested braces": "{" * 10_000 + "}" * 10_000,
    "1M-char line": "a" * 1_000_000,
    "1MB unclosed string": '{"name": "write_file", "arguments": {"content": "' + "x" * 1_000_000,
    "1MB of {'": "{'" * 500_000,
}


def timed(response: dict, repeat: int, *, tools: list[dict] = TOOLS, history: list[dict] = HISTORY) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        classify(response, tools=tools, history=history)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


ADVERSARIAL = {
    "unclosed string of \\'": ('{"name": "list_files", "arguments": {"path": \'', "\\'"),
    'unclosed string of \\"': ('{"name": "write_file", "arguments": {"content": "', '\\"'),
    "run of quotes": ("", '"'),
    "run of {": ("", "{"),
    'run of {"a":': ("", '{"a":'),
    "run of <tool_call>": ("", "<tool_call>"),
    "run of fences": ("", "```json\n"),
    "run of list_files(": ("", "list_files("),
    "run of Action: lines": ("", "Action: list_files\n"),
    "run of <think>": ("", "<think>"),
    'run of  a=" (key=value)': ("x", ' a="'),
    "run of newlines": ("Sure! Here are the files:", "\n"),
    'run of {tool => "x"': ("", '{tool => "x" '),
    "run of to=functions.a": ("", "to=functions.a "),
    "one long a.py token": ("See ", "a.py"),
    "run of <arg_key> pairs": ("list_files", "<arg_key>path</arg_key><arg_value>"),
    "run of Action: f(": ("Action: ", "list_files("),
    "run of <functioncall {": ("", "<functioncall {"),
    "run of call:f{ (Gemma 4)": ("<|tool_call>", "call:f{a:"),
    'run of list_files([{"a",': ("", 'list_files([{"a", '),
    'run of "jsonrpc" {': ("", '{"jsonrpc": "2.0", "method": "a", "params": '),
    "fenced { then spaces": ("```\n{", " "),  # 2.8.0: 30+ s at 100 KB (a backtracking first-key regex)
    "```json { then spaces": ("```json\n{", " "),
    "{ then spaces": ("{", " "),
    "[ then spaces": ("[", " "),
    "[{ then tabs": ("[{", "\t"),
    '{"name": then newlines': ('{"name":', "\n"),
}
WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ADVERSARIAL_WEATHER = {
    "run of digits (weather tool)": ("It is ", "1"),
    "one long word (weather tool)": ("temp", "a"),
}
"""Shapes that reach the weather rules: classified with a weather tool offered and no history."""
SIZES_KB = (16, 64, 256, 1024)


def adversarial() -> None:
    """Time each adversarial shape at each size; print ms and the per-KB ratio to 16 KB."""
    ratios = f" {f'per-KB ratio at {SIZES_KB[-2]} KB':>24} {f'at {SIZES_KB[-1]} KB':>10}"
    print(f"{'adversarial input':26} " + " ".join(f"{f'{kb} KB ms':>10}" for kb in SIZES_KB) + ratios)
    shapes = [(name, shape, TOOLS, HISTORY) for name, shape in ADVERSARIAL.items()]
    shapes += [(name, shape, WEATHER, []) for name, shape in ADVERSARIAL_WEATHER.items()]
    for name, (head, unit), tools, history in shapes:
        times = []
        for kb in SIZES_KB:
            content = head + unit * ((kb * 1024 - len(head)) // len(unit))
            times.append(min(timed({"content": content}, 3, tools=tools, history=history)))
        per_kb = [t / kb for t, kb in zip(times, SIZES_KB, strict=True)]
        print(
            f"{name:26} "
            + " ".join(f"{t:10.1f}" for t in times)
            + f" {per_kb[-2] / per_kb[0]:24.2f} {per_kb[-1] / per_kb[0]:10.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adversarial", action="store_true", help="time adversarial inputs from 16 KB to 1 MB")
    if parser.parse_args().adversarial:
        adversarial()
        return
    print(f"{'reply kind':24} {'bytes':>7} {'median ms':>10} {'p99 ms':>8}")
    everything: list[float] = []
    for name, response in MIX.items():
        timed(response, 20)  # warm caches (validators, history)
        samples = timed(response, 1000)
        everything.extend(samples)
        size = len(response.get("content") or "") + len(json.dumps(response.get("tool_calls")))
        print(f"{name:24} {size:7d} {statistics.median(samples):10.3f} {p99(samples):8.3f}")
    print(f"{'whole mix':24} {'':7} {statistics.median(everything):10.3f} {p99(everything):8.3f}")
    print()
    print(f"{'pathological':24} {'chars':>9} {'ms':>8}")
    for name, content in PATHOLOGICAL.items():
        samples = timed({"content": content}, 3)
        print(f"{name:24} {len(content):9d} {max(samples):8.1f}")


if __name__ == "__main__":
    main()
