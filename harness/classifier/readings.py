"""How a reply presents what it writes: the stance of a sentence, code, and the reply's blocks with
the frames that present them. Shared by the fabrication and narration rules (docs/failure-modes.md,
"Heuristics and their rationale").

* **stance**: a sentence states a fact unless a word marks its value as unknown, possible or an
  example (``might``, ``for example``, ``something like``, ``I cannot``...). The definite future
  ("The file will have the following content:") and approximate or forecast words tied to now
  ("around 22 degrees") are statements of fact.
* **units**: the visible text read once, line by line, as paragraphs and fences in order; a line
  ending with ``:`` inside a paragraph ends its unit, so the lines after it are a block it frames.
* **frames**: a block (a fence, a list, or lines after a colon line) is presented by the last
  line of the paragraph before it and by a sentence right after it that points back at it
  ("This is a report that shows ...").
* **code** is a fence or lines that read as code (``def``, ``import``, ``with open(``...).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.classifier.types import MAX_SCAN_CHARS, get

__all__ = [
    "DOMAIN_WORDS",
    "MEANS",
    "RESULT_TAGS",
    "Unit",
    "acts",
    "drop_code_lines",
    "frame_after",
    "frame_before",
    "hedged",
    "is_code",
    "is_data",
    "tool_domains",
    "units",
    "unhedged",
]

HEDGE = re.compile(
    r"\b(?:might|may|could|possibl[ey]|possibility|perhaps|probably|I think|I believe|I guess|not sure|unknown|hypothetical\w*"
    r"|I (?:don't|do not|cannot|can't|am unable|'m unable)|unable to|no access|don't have access|do not have access|real[- ]time"
    r"|as an AI|I'm not able|I am not able|let me check|I'll check|I will check|would|you can check|for example|for instance"
    r"|e\.g\.|such as|imagine|suppose|assum(?:e|ing)|let's say|something like|example|sample|placeholder|template|if"
    r"|this (?:(?:script|code|program|function|command|snippet) )?(?:(?:will|would) (?:write|create|save|make|generate|open"
    r"|read|run|execute|call|add|append|update|install)|(?:writes|creates|saves|makes|generates|opens|reads|runs|executes"
    r"|calls|adds|appends|updates|installs))"
    r"|how\b[^.!?\n]{0,60}\b(?:formatted|laid out|structured)|(?:is|are|be) (?:formatted|laid out|structured) (?:as|like)"
    r"|(?:in|of) the (?:following )?format)\b",
    re.I,
)
"""Words that mark a value as unknown, possible or an example, and what a reply says its own code will do or does
("This will write ... to a file named x.json", "This script creates report.txt ...": the code's effect, not a result):
such a sentence states no result. So does a frame saying how the data is laid out ("This is how the list of files is
formatted:", "Your answer will be in the format ..."): it shows the form, not the facts."""

RESULT_TAGS = r"tool_response|tool_result|tool_output|function_results?|function_response|observation"
"""The names of tool-result markup a reply may write itself (``<tool_response>``): what a tool told, when a tool did;
invented when none did (fabrication), and never code handed over (narration)."""

MEANS = re.compile(
    r"\b(?:(?:you|we|I) (?:can|could|may|should|might) (?:use|run|call|try|do)|use (?:the following|this)|like this"
    r"|how (?:to|you)|solution|guide|version|implementation|code|script|command|snippet|program|function|steps?|syntax)\b",
    re.I,
)
"""A frame presenting the block after it as the way to do something ("You can use the following code to ...", "Here
is how ...", "the steps"): what a block so framed holds is a means, not a fact (fabrication) and, about the task's tool
action, is handed over (narration)."""
_CODE_LINE = re.compile(
    r"^[ \t]*(?:def |class |import |from \w[\w.]* import |with open\(|for \w+ in |while |if __name__|print\(|return "
    r"|async def |function |const |let |var |#include|public |\$ |>>> "
    r"|(?i:select [^\n]*\bfrom|insert into|update \w+ set|delete from|create table)\b)",
    re.M,
)
_CODEISH_LINE = re.compile(
    r"^(?:[ \t]{2,}\S.*|[ \t]*#.*|[ \t]*[\w.\[\]]+[ \t]*=[^=].*|.*\)[ \t]*:?[ \t]*|.*[{}][ \t]*|[ \t]*(?:return|yield|pass|else|elif|try|except|finally)\b.*)$",
    re.M,
)
DOMAIN_WORDS = {
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
        domains.update(name for name, words in DOMAIN_WORDS.items() if words.search(text))
    return domains


def is_code(text: str) -> bool:
    """Whether a block reads as code: a line like ``def``, ``import``, ``with open(``..., or most lines code-shaped."""
    if _CODE_LINE.search(text):
        return True
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return len(lines) >= 2 and 2 * sum(bool(_CODEISH_LINE.fullmatch(line)) for line in lines) > len(lines)


_JSON_DATA = re.compile(r"\s*(?:<tools>\s*)?[\[{]\s*(?:[\"'\]}]|$)")


def is_data(text: str) -> bool:
    """Whether a block is JSON (an object or array, a ``<tools>`` echo of definitions): data, not code doing an action,
    however indented its lines."""
    return bool(_JSON_DATA.match(text))


def drop_code_lines(prose: str) -> str:
    """Prose with its code lines dropped when it holds a code dump outside fences (names in code are literals)."""
    if _CODE_LINE.search(prose):
        return _CODEISH_LINE.sub(" ", _CODE_LINE.sub(" ", prose))
    return prose


def hedged(text: str) -> bool:
    """Whether ``text`` marks its value as unknown, possible or an example; "example" naming where a block comes from
    ("the code from the example stats.py") marks nothing."""
    return bool(HEDGE.search(_SOURCE_EXAMPLE.sub(" ", text[:2000]) if "xample" in text else text))


_SOURCE_EXAMPLE = re.compile(r"\bexample[ \t]+(?=[`\"']?[\w-]+\.[A-Za-z]\w{0,4}\b)", re.I)


_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n\s*\n")


def unhedged(text: str) -> str:
    """``text`` without its hedged sentences ("it might be sunny", "for example, ..."): what it states as fact."""
    hedges = [m.start() for m in HEDGE.finditer(text)]  # one pass over the text, not one search per sentence
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


@dataclass(frozen=True)
class Unit:
    """A paragraph (``fence`` False) or a fence body of the visible text, with its offset."""

    text: str
    start: int
    fence: bool

    @property
    def lines(self) -> list[str]:
        return [line for line in self.text.splitlines() if line.strip()]


_FENCE_OPEN = re.compile(r"[ \t]*(`{3,}|~{3,})")
_MAX_UNITS = 2000


def units(visible: str) -> list[Unit]:
    """The paragraphs and fences of ``visible`` in order (an unclosed fence runs to the end); a line
    ending with ``:`` followed by more lines ends its paragraph (what follows is the block it frames)."""
    out: list[Unit] = []
    buf: list[str] = []
    start = pos = 0
    mark = ""

    def flush(fence: bool) -> None:
        if buf and (fence or "".join(buf).strip()) and len(out) < _MAX_UNITS:
            out.append(Unit("".join(buf), start, fence))
        buf.clear()

    for line in visible[:MAX_SCAN_CHARS].splitlines(keepends=True):
        stripped = line.strip()
        opener = _FENCE_OPEN.match(line)
        if mark:
            if opener and stripped.strip("`~") == "" and stripped[0] == mark[0]:
                flush(True)
                mark = ""
            else:
                buf.append(line)
        elif opener:
            flush(False)
            mark, start = opener.group(1), pos + len(line)
        elif not stripped:
            flush(False)
        else:
            if not buf:
                start = pos
            buf.append(line)
            if stripped.endswith(":"):
                flush(False)
        pos += len(line)
    flush(bool(mark))
    return out


def frame_before(seq: list[Unit], k: int) -> str:
    """The line that presents unit ``k``: the last line of the paragraph right before it, with the
    one-line labels before that (``Output:`` then ``report.txt:``)."""
    parts: list[str] = []
    while k > 0 and not seq[k - 1].fence and seq[k - 1].lines and len(parts) < 3:
        parts.insert(0, seq[k - 1].lines[-1].strip())
        if len(seq[k - 1].lines) > 1 or not parts[0].endswith(":"):
            break
        k -= 1
    return " ".join(parts)


_POINTS_BACK = re.compile(r"^\W*(?:this|these|the above|above|in this|that)\b", re.I)


def frame_after(seq: list[Unit], k: int) -> str:
    """A sentence right after unit ``k`` that points back at it ("This is a report that shows ...")."""
    if k + 1 < len(seq) and not seq[k + 1].fence and seq[k + 1].lines:
        first = re.split(r"(?<=[.!?])\s", seq[k + 1].lines[0].strip(), maxsplit=1)[0]
        if _POINTS_BACK.match(first):
            return first
    return ""


_CODE_EFFECT = re.compile(
    r"\bopen\s*\(|os\.(?:listdir|scandir|walk|remove|makedirs)|glob\.|Path\(|\.write\(|\.read\(|json\.(?:load|dump)"
    r"|requests\.|urllib|httpx\.|fetch\(|fs\.|csv\.|subprocess|\b(?:read|write|append)File(?:Sync)?\s*\(|\bfopen\s*\("
    r"|\bFile(?:Reader|Writer|\.(?:open|read|write)\w*)\b|\bshutil\.|\bos\.path\.|\breaddir(?:Sync)?\s*\(|\bGet-(?:ChildItem|Content)\b"
    r"|\bSet-Content\b|(?<!\w)\w++\s*=\s*\[\s*\{"
    r"|(?<!\w)\w++\s*=\s*\[\s*([\"'])[\w-]++\.[A-Za-z]\w{0,4}\1",
)
_CALLED = re.compile(r"(?<![\w.])(\w++)\s*+\(")
_TOOL_NOUN = re.compile(r"files?|dir|folder|weather|tickets?", re.I)
_DEFINED = re.compile(r"(?:def|function|class)\s+$")


def acts(code: str) -> bool:
    """Whether code (or a command block) does what a tool does: file I/O, a request, a literal table of
    records, or a call of a function named for what the tools work on (``files()``, ``get_weather(...)``;
    not its ``def`` line)."""
    code = code[:MAX_SCAN_CHARS]
    if _CODE_EFFECT.search(code):
        return True
    for m, _ in zip(_CALLED.finditer(code), range(2000), strict=False):
        if _TOOL_NOUN.search(m.group(1)) and not _DEFINED.search(code[max(0, m.start() - 12) : m.start()]):
            return True
    return False
