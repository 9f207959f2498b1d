"""Behaviour checks that read the reply's text: fabricated tool results, narration instead of a
call, empty replies, chat-template markup, and the scenario's tool requirement.

Each ``*_step`` returns ``(modes, evidence)``. The rules are docs/failure-modes.md's; the
detectors below are their concrete, documented approximations:

* **tool domains**: an offered tool is a *file* tool when its name or description speaks of
  files, folders or directories, a *weather* tool when they speak of weather or forecasts, a
  *ticket* tool when they speak of tickets; only their domains' facts count as tool-only.
* **code** is a fence without a call, or lines that read as code (``def``, ``import``, ``with
  open(``...); code never holds a *claim* (names written in code are literals).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from harness.classifier.content import ContentResult
from harness.classifier.heuristics import FILE_TOKEN, History, path_values, string_values, tools_text
from harness.classifier.types import MAX_CANDIDATES, MAX_REPAIR_CHARS, ToolCall, get, short
from harness.classifier.validate import offered_tools
from harness.classifier.values import bare_numbers, norm, numbers, sky, temperature_given, temperatures

__all__ = ["fabrication_step", "markup_step", "no_call_step", "requirement_step", "tool_domains"]

# --------------------------------------------------------------------------- shared readings

_HEDGE = re.compile(
    r"\b(?:might|may|could|possibly|perhaps|probably|likely|I think|I believe|I (?:don't|do not|cannot|can't|am unable|'m unable)"
    r"|unable to|no access|don't have access|do not have access|real[- ]time|as an AI|I'm not able|I am not able|let me check"
    r"|I'll check|I will check|would need to|you can check|this (?:will|would)|for example|e\.g\.|such as|imagine|hypothetical)\b",
    re.I,
)
_CODE_LINE = re.compile(
    r"^[ \t]*(?:def |class |import |from \w[\w.]* import |with open\(|for \w+ in |while |if __name__|print\(|return "
    r"|async def |function |const |let |var |#include|public |\$ |>>> )",
    re.M,
)
_DOMAIN_WORDS = {
    "file": re.compile(r"\b(?:files?|folders?|director(?:y|ies)|dir|path|ls)\b|_files?\b|file_|_dir\b", re.I),
    "weather": re.compile(r"weather|forecast|temperature", re.I),
    "ticket": re.compile(r"ticket", re.I),
}


def tool_domains(tools: Any) -> set[str]:
    """The domains of the offered tools: ``file``, ``weather``, ``ticket`` (from their names and descriptions)."""
    domains: set[str] = set()
    if not isinstance(tools, list):
        return domains
    for tool in tools[:1000]:
        fn = get(tool, "function")
        spec = fn if isinstance(fn, Mapping) else tool
        text = f"{get(spec, 'name') or ''} {get(spec, 'description') or ''}"
        domains.update(name for name, words in _DOMAIN_WORDS.items() if words.search(text))
    return domains


_CODEISH_LINE = re.compile(
    r"^(?:[ \t]{2,}\S.*|[ \t]*#.*|[ \t]*[\w.\[\]]+[ \t]*=[^=].*|.*\)[ \t]*:?[ \t]*|.*[{}][ \t]*|[ \t]*(?:return|yield|pass|else|elif|try|except|finally)\b.*)$",
    re.M,
)


def _is_code(text: str) -> bool:
    """Whether a block reads as code: a line like ``def``, ``import``, ``with open(``..., or most lines code-shaped."""
    if _CODE_LINE.search(text):
        return True
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]  # or headings
    return len(lines) >= 2 and 2 * sum(bool(_CODEISH_LINE.fullmatch(line)) for line in lines) > len(lines)


def _claims(content: ContentResult) -> str:
    """Where claims of fact live: the prose with code lines dropped, plus fences that are not code (shown output)."""
    prose = content.prose
    if _CODE_LINE.search(prose):  # a code dump outside fences: drop every line that reads as code
        prose = _CODEISH_LINE.sub(" ", _CODE_LINE.sub(" ", prose))
    shown = [body for body in content.code if not _is_code(body)]
    return "\n".join([prose, *shown])


_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n\s*\n")


def _unhedged(text: str) -> str:
    """``text`` without its hedged or hypothetical sentences ("it might be sunny", "for example, ...")."""
    hedges = [m.start() for m in _HEDGE.finditer(text)]  # one pass over the text, not one search per sentence
    if not hedges:
        return text
    kept, start, i = [], 0, 0
    for cut in [*_SENTENCE.finditer(text), None]:
        end = cut.start() if cut else len(text)
        while i < len(hedges) and hedges[i] < start:
            i += 1
        if i == len(hedges) or hedges[i] >= end:
            kept.append(text[start:end])
        start = cut.end() if cut else end
    return "\n".join(kept)


# --------------------------------------------------------------------------- fabricated tool result

_FABRICATED_MARKUP = re.compile(
    r"<\s*(?:tool_response|tool_result|tool_output|function_results?|function_response|observation)\b[^>]*>(?!\s*</)"
    r"|<\|im_start\|>\s*tool|<\|start_header_id\|>\s*ipython|^[ \t]*(?:Observation|Tool (?:output|result|response))[ \t]*:",
    re.I | re.M,
)
_TEMPERATURE = re.compile(r"(?<![\d.])-?\d++(?:\.\d++)?+(?:\s*+(?:°\s*[CF]?|º\s*[CF]?|degrees?\b|deg\b|℃|℉)|[CF]\b)", re.I)
_CONDITION = re.compile(
    r"\b(?:sunny|cloudy|overcast|rain(?:y|ing)?|drizzl(?:e|ing)|snow(?:y|ing)?|clear sk(?:y|ies)|fog(?:gy)?|windy|storm(?:y|s)?"
    r"|thunderstorms?|pleasant|humid(?:ity)?|breez(?:e|y)|showers?|partly cloudy|mild)\b",
    re.I,
)
_WEATHER_SENTENCE = re.compile(
    r"\b(?:weather|it)\b[^.!?\n]{0,40}\b(?:is|looks|feels)\s+(?:\w+\s+){0,2}?(?:lovely|beautiful|nice|hot|cold|warm|chilly|freezing|cool"
    r"|gorgeous|perfect|great|fine|wonderful|sunny|cloudy|rainy|pleasant|mild)\b",
    re.I,
)
_LISTING = re.compile(
    r"\b(?:here(?:'s| is| are) (?:the |a )?(?:list(?:ing)? of |complete list of )?(?:the )?files|(?:the |these )?files (?:in|of) (?:the |your )?"
    r"(?:current |working )*director(?:y|ies) (?:are|is|include)|listing(?: of)? files|list of files:|the (?:\w+\.\w+ )?file contains"
    r"|contains the following|here(?:'s| is) (?:the |a )?(?:summary|content|contents) of (?:the )?(?:json|file|\w+\.\w+))\b",
    re.I,
)
_OUTPUT_CLAIM = re.compile(
    r"^[ \t]*(?:\**Output\**|\**Result\**)[ \t]*:|\bthe output (?:is|will be)\b|(?:^[ \t]*|\bso[ \t]+)the output[ \t]*:"
    r"|\bthis will (?:print|output)\b(?![ \t]+(?:something|anything)[ \t]+like)",  # "something like:" is an illustration
    re.I | re.M,
)
_LIST_LINE = re.compile(r"^[ \t]*(?:[-*•]|\d+[.)])[ \t]+\S", re.M)
_EFFECT = re.compile(
    r"\b(?:(?:created|written|saved|updated|generated|wrote)\s+successfully|successfully\s+(?:created|wrote|written|saved|updated)"
    r"|has been (?:created|written|saved|updated))\b",
    re.I,
)
_IN_FILE = re.compile(
    r"(?:\bline \d+|\bfunction(?: name)?\s+[`\"'][\w.]+[`\"']|[`\"'][\w.]+\(\)[`\"']?)[^.\n]{0,80}\bin\s+(?:the\s+)?[`\"']?[\w-]+\.\w{1,5}\b"
    r"|\bthe\s+[\w-]+\.\w{1,5}\s+file\s+has\b|\bin\s+(?:the\s+)?[\w-]+\.\w{1,5}(?:\s+file)?,?\s+(?:the )?(?:function|line)\b",
    re.I,
)
_TICKET_ID = re.compile(r"\b[A-Z]{1,5}-\d{2,6}\b")
_VALUE = re.compile(
    r"(?<![\w.])(?:\d{4}-\d{2}-\d{2}|(?:EUR|USD|GBP|€|\$|£)\s?\d[\d,]*(?:\.\d+)?|\d[\d,]*(?:\.\d+)?\s?(?:EUR|USD|GBP|€|%|km/h|mph)"
    r"|-?\d+(?:\.\d+)?\s?(?:°\s*[CF]?|℃|℉))",
    re.I,
)
_COUNT_WORD = r"(\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
_COUNT = re.compile(
    rf"(?:^|[.!?:]\s+|\b(?:there(?:'s| is| are| were| was)|shows?|lists?|listed|contains?|holds?|has|have|had|found|total:?"
    rf"|in total,?|all)\s+)(?:only\s+|exactly\s+|just\s+)?{_COUNT_WORD}\s+files?\b"
    rf"(?!\s+(?:are|is|were|was|have|has)\s+(?!present|there|listed|found|in\b))"
    rf"|\b{_COUNT_WORD}\s+files?\s+(?:in total|in (?:the|this|that) (?:current |working )?(?:directory|folder)|were (?:found|listed)"
    rf"|are (?:there|present|listed))\b",
    re.I | re.M,
)
"""A stated total of files ("There are 3 files", "3 files in the directory"), not a part of them ("2 files are Markdown")."""
_COUNT_CLAIM = re.compile(rf"{_COUNT.pattern}|\bnumber of files\s*(?:is|:|=|\()\s*\d+", re.I | re.M)
"""A stated total of files, or "the number of files (10)": before any listing only a tool could know it."""
_NUMBER_WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())}


def fabrication_step(content: ContentResult, calls: list[ToolCall], past: History, tools: Any) -> tuple[set[str], dict[str, Any]]:
    """``fabricated_tool_result``: tool-result markup, tool-only facts before any tool answered,
    or names and values that contradict what the tools returned.

    Evidence is the list of what was found: markup, ``"weather: ..."``, ``"listing: ..."``,
    unexplained ``stem.ext`` tokens, values no tool returned.
    """
    found: list[str] = []
    markup = _FABRICATED_MARKUP.search(content.visible) if tools != [] else None  # with no tool, no tool output to fake
    if markup:
        found.append(short(markup.group().strip()))
    if past.tool_answered:
        found += _contradictions(content, calls, past, tools)
    elif isinstance(tools, list):
        found += _tool_only_facts(content, calls, past, tools)
    if not found:
        return set(), {}
    return {"fabricated_tool_result"}, {"fabricated_tool_result": found[:MAX_CANDIDATES]}


def _tool_only_facts(content: ContentResult, calls: list[ToolCall], past: History, tools: list[Any]) -> list[str]:
    """Facts only an offered tool could supply, stated before any tool answered (rule 2)."""
    if calls:
        return []  # a reply that calls the tool is waiting for the answer, not inventing it
    claims = _unhedged(_claims(content))
    domains = tool_domains(tools)
    known = "\n".join([*past.prompt_parts, tools_text(tools)]).lower()
    found = []
    prompt = "\n".join(past.prompt_parts)
    prompt_temps = temperatures(prompt)
    if "weather" in domains and (
        any(not temperature_given(t.group(), prompt_temps) for t in _TEMPERATURE.finditer(claims))  # "20°C is 68°F" when asked
        or (_CONDITION.search(claims) and re.search(r"weather|temperature", claims, re.I))
        or _WEATHER_SENTENCE.search(claims)
    ):
        found.append("weather: " + short(claims.strip(), 120))
    if "file" in domains:
        found += _file_facts(content, claims, known, code_in_prompt=past.user_code)
    if "ticket" in domains:
        found += [f"ticket: {m.group()}" for m in _TICKET_ID.finditer(claims) if m.group().lower() not in known][:4]
    return found


_WORD = re.compile(r"[^\W\d_]{2,}")
_BUG = re.compile(r"\bthe (?:bug|error|issue|problem)(?: in [\w.`'\"]+)? (?:is|was)\b", re.I)


def _file_facts(content: ContentResult, claims: str, known: str, *, code_in_prompt: bool) -> list[str]:
    """A listing, a file's contents, a tool's effect, or a line of a file, presented as fact.

    A listing needs something listed (a file name or list lines), not only "Here are the files:";
    "the bug is" is a claim about a file only when the prompt holds no code of its own.
    """
    found = []
    patterns = [("listing", _LISTING), ("effect", _EFFECT), ("file content", _IN_FILE)]
    for label, pattern in patterns + ([] if code_in_prompt else [("file content", _BUG)]):
        m = pattern.search(claims)
        shows_items = bool(content.code or _LIST_LINE.search(claims) or (m and _WORD.search(claims, m.end())))
        if m and (label != "listing" or shows_items):
            found.append(f"{label}: {short(m.group(), 80)}")
    count = _COUNT_CLAIM.search(claims)
    number = re.search(r"\d+|[a-z]+(?=\s+files?\b)", count.group().lower()) if count else None
    if count and number and not re.search(rf"\b{number.group()}\s+files?\b", known):  # "write 3 files" in the prompt
        found.append(f"count: {short(count.group().strip(), 60)}")
    if _OUTPUT_CLAIM.search(content.visible) and (content.code or _LIST_LINE.search(content.prose)):
        found.append("output: shown as what the code prints")
    listed = "\n".join(m.group() for m in re.finditer(r"^[ \t]*(?:[-*•|]|\d+[.)])[ \t]+.*$", claims, re.M))  # list or table rows
    found += [
        f"file name: {m.group(1)}" for m in FILE_TOKEN.finditer(listed[:MAX_REPAIR_CHARS]) if m.group(1).lower() not in known
    ][:4]
    return found


def _contradictions(content: ContentResult, calls: list[ToolCall], past: History, tools: Any) -> list[str]:
    """Names and values in the reply or its call arguments that no tool result, prompt or definition holds (rule 3).

    The sentences are checked whole first; only when something is found are the hedged ones
    dropped and the check repeated (most final answers repeat what the tools said, so the
    costlier sentence split is rarely needed).
    """
    known = "\n".join([*past.known_parts, tools_text(tools)]).lower()
    claims = _claims(content)
    found = _unexplained(claims, content, calls, past, known)
    return _unexplained(_unhedged(claims), content, calls, past, known) if found else []


def _unexplained(claims: str, content: ContentResult, calls: list[ToolCall], past: History, known: str) -> list[str]:  # noqa: PLR0913 - the claims and what explains them
    """Rule 3 on the given claims: see :func:`_contradictions`."""
    own_paths = {value.replace("\\", "/").rsplit("/", 1)[-1].lower() for call in calls for _k, value in path_values(call)}
    texts = [claims] + [v for call in calls for v in string_values(call.arguments, skip_paths=True)]
    found: list[str] = []
    seen: set[str] = set()
    results = "\n".join(past.tool_results)
    result_values: set[str] | None = None
    known_norm = ""
    result_numbers: set[float] = set()
    result_temps: list[tuple[float, str | None]] = []
    for text in texts:
        for m in FILE_TOKEN.finditer(text[:MAX_REPAIR_CHARS]):
            token = m.group(1).lower()
            if token not in seen and token not in own_paths and token not in known:
                seen.add(token)
                found.append(m.group(1))
        for m in _VALUE.finditer(text[:MAX_REPAIR_CHARS]):
            value, normal = m.group(), norm(m.group())
            if value in seen:
                continue
            if len(seen) >= _MAX_VALUES:
                break  # bounded: a reply that states thousands of distinct values has been judged by then
            seen.add(value)
            if result_values is None:  # only replies that state values pay for reading the results' values
                result_values, known_norm = {norm(v) for v in _VALUE.findall(results)}, norm(known)
                result_numbers, result_temps = bare_numbers(results), temperatures(results)
            temperature = _TEMPERATURE.fullmatch(value.strip())
            if temperature and temperature_given(value, result_temps):
                continue
            if not temperature and numbers(value) & result_numbers:
                continue  # the tool's number with a unit or a format of its own ("65%" for humidity 65, "4250" for 4,250.00)
            measured = bool(temperature or re.fullmatch(r"\d{4}-\d{2}-\d{2}", value))
            if (result_values or measured) and normal not in result_values and normal not in known_norm:
                found.append(f"value: {value}")
    conditions = {f for c in _CONDITION.findall(results) if (f := sky(c))}
    stated = {f for c in _CONDITION.findall(claims) if (f := sky(c))} if conditions else set()
    if conditions and stated - conditions:
        found.append(f"condition: {sorted(stated - conditions)[0]} (the tool said {', '.join(sorted(conditions))})")
    found += _count_mismatch(texts, past)
    return found


_MAX_VALUES = 500
"""Distinct names and values of one reply checked against the tool results (each check reads the results' values)."""


def _count_mismatch(texts: list[str], past: History) -> list[str]:
    """A stated number of files that differs from the length of the last listing a tool returned."""
    counts = [m for text in texts if "file" in text.lower() for m in _COUNT.finditer(text)]
    if not counts:
        return []
    listing = None
    for result in reversed(past.tool_results):
        body = re.sub(r"</?tool_response>", "", result).strip()
        try:
            value = json.loads(body)
        except ValueError:
            continue
        if isinstance(value, dict) and len(value) == 1:  # {"files": [...]}
            value = next(iter(value.values()))
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            listing = value
            break
    if listing is None:
        return []
    for m in counts:
        word = next(g for g in m.groups() if g).lower()
        number = int(word) if word.isdigit() else _NUMBER_WORDS.get(word)
        if number is not None and number != len(listing):
            return [f"count: {m.group()} (the listing held {len(listing)})"]
    return []


# --------------------------------------------------------------------------- no call at all

_NARRATION = re.compile(
    r"(?:\bI(?:'ll|’ll| will| shall| am going to|'m going to|’m going to| need to| should| have to)|\blet me|\blet's|\blet’s"
    r"|\b(?:now|next|first|then),? I(?:'ll|’ll| will))"
    r"\s+(?:now\s+|first\s+|then\s+|next\s+|quickly\s+|go ahead and\s+|proceed to\s+|start by\s+|begin by\s+|have to\s+"
    r"|need to\s+)?"
    r"(?:create|write|make|list|read|run|execute|call|use|check|open|save|generate|look|search|update|edit|refer|implement"
    r"|delete|remove|add|start|fetch|get|build|test|install|copy|move|rename|inspect|examine|view|scan|find|fix"
    r"|append|modify|produce|compile|put|print|show|invoke|draft|prepare|record|store|do\b)",
    re.I,
)
_NARRATION_CJK = re.compile(
    r"(?:我将|我会|我要|让我|我来|我先|我们将|我们来)[^\n。，,.!?！？]{0,4}?"
    r"(?:使用|调用|获取|查询|读取|列出|写入|创建|搜索|查看|检查|运行|执行|打开|保存)"
)
"""The announcing cue in Chinese ("我将使用..." = "I will use..."), for the models that answer in it."""
_SHELL_ACTION = re.compile(r"^[ \t]*(?:\$ )?(?:(?:ls|cat|touch|mkdir|rm|cp|mv|head|tail|tree)\b(?![ \t]*[=(:])|echo\b.*>)", re.M)
_CODE_EFFECT = re.compile(
    r"\bopen\s*\(|os\.(?:listdir|scandir|walk|remove|makedirs)|glob\.|Path\(|\.write\(|\.read\(|json\.(?:load|dump)"
    r"|requests\.|urllib|httpx\.|fetch\(|fs\.|csv\.|subprocess|(?<!\w)\w++\s*=\s*\[\s*\{",
)
_HANDED_OVER = re.compile(
    r"\b(?:you can|you could|you may|we can) use (?:the following|this|a|an|the) (?:[\w-]+ ){0,2}?(?:code|script|command|function"
    r"|snippet|program|loop|list comprehension)"
    r"|\bhere(?:'s| is) (?:the|a|an) (?:\w+ )?(?:code|script|python (?:code|script)|command|snippet) (?:to|that)\b"
    r"|\bhere(?:'s| is) (?:a |the |an )?(?:possible |simple |modified |updated |step-by-step |complete |example )*"
    r"(?:solution|guide|version of the code|implementation)\b|\bhere(?:'s| is) how (?:you|to)\b",
    re.I,
)


def no_call_step(
    content: ContentResult, attempts: int, response: Any, tools: Any, requires_tool: bool | None
) -> tuple[set[str], dict[str, Any]]:
    """``empty_response`` (no visible text) or ``narration_without_call`` (an announcement, a shell
    command, or code handed over to do the task), when the reply attempts no call at all."""
    if attempts:
        return set(), {}
    visible = content.visible.strip()
    if not visible:
        usage = get(response, "usage")
        tokens = get(usage, "completion_tokens")
        return {"empty_response"}, {
            "empty_response": {"completion_tokens": tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None}
        }
    cue = _NARRATION.search(content.prose) or _NARRATION_CJK.search(content.prose)
    if cue:
        return {"narration_without_call"}, {"narration_without_call": {"cue": short(cue.group())}}
    shell = _SHELL_ACTION.search(content.prose) or next((m for c in content.code if (m := _SHELL_ACTION.search(c))), None)
    if shell:
        return {"narration_without_call"}, {
            "narration_without_call": {"cue": "shell command: " + short(shell.group().strip(), 60)}
        }
    offered = isinstance(tools, list) and bool(tools) and requires_tool is not False
    told = _told_to_call(content.prose, tools) if offered else None
    if told:
        return {"narration_without_call"}, {"narration_without_call": {"cue": "tells how to call " + told}}
    code = [c for c in content.code if _CODE_EFFECT.search(c)]
    if _CODE_LINE.search(content.prose) and _CODE_EFFECT.search(content.prose):
        code.append(content.prose)
    handed = bool(_HANDED_OVER.search(content.prose) and (content.code or _LIST_LINE.search(content.prose)))
    if handed and offered:  # steps or code for the task itself: they name what the offered tools work on
        shown = "\n".join([content.prose, *content.code])
        handed = any(_DOMAIN_WORDS[d].search(shown) for d in tool_domains(tools))
    if offered and (code or handed):
        return {"narration_without_call"}, {
            "narration_without_call": {"cue": "code: " + short((code or content.code)[0].strip(), 80)}
        }
    return set(), {}


def _told_to_call(prose: str, tools: list[Any]) -> str | None:
    """An offered tool's name after "call"/"use"/"invoke" in the prose: the reply tells how to call it instead of calling it."""
    names = [n for n in offered_tools(tools) if len(n) > 2]
    if not names:
        return None
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)[:200])
    m = re.search(rf"\b(?<!not )(?<!n't )(?<!never )(?:call|use|invoke|run)\s+(?:the\s+)?[`\"']?({alternatives})\b", prose, re.I)
    return m.group(1) if m else None


# --------------------------------------------------------------------------- markup and requirement

_TEMPLATE_MARKUP = re.compile(
    r"<\|im_start\|>|<\|im_end\|>|<\|eot_id\|>|<\|eom_id\|>|<\|start_header_id\|>|<\|end_header_id\|>|<\|end\|>|<\|endoftext\|>"
    r"|<\|(?:assistant|user|system)\|>|<start_of_turn>|<end_of_turn>|\[/?INST\]|</s>|<\|begin_of_text\|>"
    r"|<\|start\|>|<\|channel\|>|<\|message\|>|<\|return\|>",
)
_HARMONY_CALL = re.compile(r"to=functions\.|<\|call\|>|<\|constrain\|>")
_HARMONY_TOKEN = re.compile(r"<\|start\|>|<\|channel\|>|<\|message\|>|<\|return\|>|<\|end\|>")
_STRIPPED_HARMONY = re.compile(r"\A\s*analysis\S.*?assistantfinal", re.S)


def markup_step(content: ContentResult) -> tuple[set[str], dict[str, Any]]:
    """``chat_markup_leak``: chat-template tokens in the content (a harmony call header's own tokens excepted)."""
    text = content.visible
    if _HARMONY_CALL.search(text):
        text = _HARMONY_TOKEN.sub(" ", text)  # the call's wrapper as a whole is wrong_wrapper_tag
    whole = text.strip()
    if "<s>" in text and not (whole.startswith("<s>") and whole.endswith("</s>")):
        text = text.replace("</s>", " ")  # <s>$20</s> is HTML strikethrough; <s>...</s> around the whole reply is BOS/EOS
    m = _TEMPLATE_MARKUP.search(text) or _STRIPPED_HARMONY.search(text)
    if m is None:
        return set(), {}
    return {"chat_markup_leak"}, {"chat_markup_leak": short(m.group(), 60)}


def requirement_step(requires_tool: bool | None, attempts: int, past: History) -> tuple[set[str], dict[str, Any]]:
    """``skipped_required_tool`` and ``unneeded_call`` from the scenario's ``requires_tool`` (None: not judged)."""
    if requires_tool is True and not attempts and not past.tool_answered:
        return {"skipped_required_tool"}, {"skipped_required_tool": "no call, and no tool has answered in the run"}
    if requires_tool is False and attempts:
        return {"unneeded_call"}, {"unneeded_call": f"{attempts} call attempt(s) where no tool is needed"}
    return set(), {}
