"""``narration_without_call`` and ``empty_response``: the reply attempts no call at all.

The guide's rule (docs/failure-modes.md) read as two questions about the reply's own text:

* **an announcement**: the reply speaks of its *own* action ("I will", "Let me", "we'll", "I'm
  using") with a verb an offered tool performs (list, read, write, get, call a tool...); an act
  no tool performs ("I will provide the function signature") is not one;
* **something handed over**: a shell command that acts on files, or a block of code (a fence, or
  code lines) presented as the way to do the task's tool action, whatever its quality: framed
  by the line before it as the means ("you can use the following code:", "Here is how ...") and
  about what the tools work on, or, with no frame, code that does the tool's action itself
  (``open(``, ``os.listdir``, ``requests.``, a call of ``files()``).

Not enough: imperatives and step lists (a plan, an echo of the prompt), advice to "you" in prose,
a block framed as something else (an output, "the bug is:", an example, the body of a fake
``<tool_response>``), comments only, package installs.
"""

from __future__ import annotations

import re
from typing import Any

from harness.classifier.content import ContentResult
from harness.classifier.readings import (
    DOMAIN_WORDS,
    MEANS,
    RESULT_TAGS,
    Unit,
    acts,
    frame_before,
    is_code,
    is_data,
    tool_domains,
)
from harness.classifier.types import MAX_SCAN_CHARS, get, short
from harness.classifier.validate import offered_tools

__all__ = ["no_call_step"]

_OWN = (
    r"(?:\bI(?:'ll|’ll| will| shall| am going to|'m going to|’m going to| need to| have to| am| 'm|'m|’m)|\blet me|\blet's|\blet’s"
    r"|\bwe(?:'ll|’ll| will| are going to|'re going to| need to)|\b(?:now|next|first|then),? I(?:'ll|’ll| will))"
)
TOOL_VERBS = (
    "create write make list read run execute call check open save generate look search update edit refer delete remove add"
    " fetch get copy move rename inspect examine view scan find fix append modify put record store query retrieve load"
    " invoke complete handle perform"
).split()
"""The verbs of a tool's act (on files, the weather, tickets): the one vocabulary of an announcement, as verb or gerund."""


def _gerund(verb: str) -> str:
    """``write`` -> ``writing``, ``run`` -> ``running``, ``list`` -> ``listing``."""
    if verb.endswith("e") and not verb.endswith("ee"):
        return verb[:-1] + "ing"
    if re.fullmatch(r"[^aeiou]*[aeiou][bdgmnprt]", verb):  # one short vowel before a final consonant: run, get, scan
        return verb + verb[-1] + "ing"
    return verb + "ing"


_TOOL_VERB = "(?:" + "|".join(TOOL_VERBS) + ")"
_GERUND = "(?:" + "|".join(_gerund(v) for v in TOOL_VERBS) + r")\b"
_NARRATION = re.compile(
    _OWN + r"\s+(?:(?:now|first|then|next|just|also|simply|quickly|\w+ly)\s+)?(?:go ahead and\s+|proceed to\s+|start by\s+"
    r"|begin by\s+|have to\s+|need to\s+|try to\s+|help(?:\s+you)?\s+by\s+)?"
    r"(?:(?:re-?)?" + _TOOL_VERB + r"(?:ing)?\b|do\b"
    r"|us(?:e|ing)\b(?=[^.\n]{0,40}?\b(?:tool|function|api|command|script|code|package|library|module|program)s?\b))",
    re.I,
)
"""An announcement: the reply's own next act with a verb an offered tool performs. An offer of help ("I'll help you
create a JSON object") makes the user the doer and announces nothing; help by the reply's own tool act ("I'll help by
reading memo.txt") does."""
_BARE_PROGRESSIVE = re.compile(
    r"(?:^|(?<=[.!?]\s)|(?<=\n))[ \t]*(?:(?:now|next|first|then),?[ \t]+)?"
    + _GERUND
    + r"(?!(?:[^.!?:\n]|\.(?=\w)){0,100}\b(?:is|are|was|were|can|could|will|would|should|may|might|has|have|does|helps?|makes?)\b)"
    r"(?:[^.!?:\n]|\.(?=\w)){0,100}(?:\.{1,3}|…|!)[ \t]*(?=\n|$)",
    re.I,
)
_TASK_START = re.compile(
    _OWN + r"\s+(?:(?:now|just)\s+)?(?:begin|start|get started|proceed|get (?:to work|going))"
    r"(?:\s+(?:now|with (?:the|your|this) (?:task|work|request)|on (?:the|your|this) (?:task|work|request)))?[ \t]*[.!]",
    re.I,
)
"""An announcement whose object is the task itself ("Let's begin.", "I'll get started on your task."): the task's tool
work announced, none of it taken."""
"""A bare progressive standing as its own sentence, whose only subject is the reply (``Writing to file.``): a gerund
heading ending in a colon frames a block, and a gerund with a finite verb after it is a noun (``Listing files is
...``)."""
_NARRATION_CJK = re.compile(
    r"(?:我将|我会|我要|让我|我来|我先|我们将|我们来)[^\n。，,.!?！？]{0,4}?"
    r"(?:使用|调用|获取|查询|读取|列出|写入|创建|搜索|查看|检查|运行|执行|打开|保存)"
)
"""The announcing cue in Chinese ("我将使用..." = "I will use..."), for the models that answer in it."""
_FILE_COMMANDS = r"(?:ls|cat|touch|mkdir|rm|cp|mv|head|tail|tree)\b(?![ \t]*[=(:])"
"""Shell commands that act on files (a tool's action); ``echo ... >`` writes one."""
_SHELL_ACTION = re.compile(rf"^[ \t]*(?:\$ )?(?:{_FILE_COMMANDS}|echo\b.*>)", re.M)
_GERUND_HEADING = re.compile(r"^[ \t]*" + _GERUND + r"[^\n]*:[ \t]*$", re.I | re.M)
"""A gerund heading of a tool act ("Creating report.txt using a for loop:"): the means when the block after it is code
(a listing after "Listing files:" is the block it frames, data)."""
_OTHER = re.compile(
    r"(?:\b(?:output|outputs|result|results|contents?)\b[ \t]+(?:of|from)[ \t]+[^:\n]{1,60}?"
    r"|\b(?:output|outputs|result|results|bug|error|issue|contents?|example|observation)\b)"
    r"[ \t]*(?:is|are|was|will be|would be)?[ \t]*:?[ \t]*(?<![.!?])$",
    re.I,
)
"""A frame presenting the block after it as something else: an output ("the output of your code is:"), the bug, a
file's contents, an example. A sentence ending in a stop ("... use the output of the function to create a new
report.") states something; it presents no block."""
_REMEDY = re.compile(
    r"\b(?:fix(?:es|ed|ing)?|solved?|solving|resolved?|resolving|avoid(?:ing)?)\b"
    r"|\b(?:to|can|could|should|will|would|must|and|then|we|you|I)[ \t]+(?:correct|handle)\b|\bcorrected\b",
    re.I,
)
"""A frame saying the block fixes something (a means, though it names the bug); "the correct output is:" is no remedy."""
_DEFINITION_ONLY = re.compile(r"[ \t]*(?:def|class|function|async def)\b[^\n]*")
_NO_ACTION_LINE = re.compile(
    r"[ \t]*(?:#|//|(?:\$ )?(?:pip3?|npm|yarn|apt(?:-get)?|brew|conda|poetry) |(?:return(?:[ \t]+None)?|pass|\.\.\.)[ \t]*;?[ \t]*$)"
)
"""A comment, a package install, or a stub's body (``return None``, ``pass``): a block of only these and signatures
shows no tool action."""
_RESULT_OPEN = re.compile(rf"<\s*(?:{RESULT_TAGS})\b[^>]*>", re.I)
_RESULT_CLOSE = re.compile(rf"</\s*(?:{RESULT_TAGS})\s*>", re.I)


def no_call_step(  # noqa: PLR0913 - the reply, what it attempted, the scenario's tools and flag, its units
    content: ContentResult,
    attempts: int,
    response: Any,
    tools: Any,
    requires_tool: bool | None,
    seq: list[Unit],
) -> tuple[set[str], dict[str, Any]]:
    """``empty_response`` (no visible text) or ``narration_without_call`` (an announcement of the
    reply's own tool action, a shell command, or code handed over), when the reply attempts no call. ``seq``:
    :func:`units` of the visible text."""
    if attempts:
        return set(), {}
    if not content.visible.strip():
        tokens = get(get(response, "usage"), "completion_tokens")
        return {"empty_response"}, {
            "empty_response": {"completion_tokens": tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None}
        }
    if tools == []:
        return set(), {}  # nothing offered: no tool action the text could stand in for
    prose = content.prose
    cue = _NARRATION.search(prose) or _NARRATION_CJK.search(prose) or _TASK_START.search(prose) or _bare_progressive(prose)
    if cue:
        return {"narration_without_call"}, {"narration_without_call": {"cue": short(cue.group())}}
    fake = _fake_results(content.visible)
    shell = next((m for u in seq if not _inside(u, fake) and (m := _SHELL_ACTION.search(u.text))), None)
    shell = shell or next((m for u in seq if not u.fence and not _inside(u, fake) and (m := _inline_command(u.text))), None)
    if shell:
        return {"narration_without_call"}, {
            "narration_without_call": {"cue": "shell command: " + short(shell.group().strip(), 60)}
        }
    if not (isinstance(tools, list) and requires_tool is not False):
        return set(), {}  # code is judged against known tools; code answering a task that needs none is the answer
    handed = _handed_over(seq, fake, tools)
    if handed:
        return {"narration_without_call"}, {"narration_without_call": {"cue": "code: " + short(handed.strip(), 80)}}
    return set(), {}


def _bare_progressive(prose: str) -> re.Match[str] | None:
    """A bare progressive sentence of the reply's own (``Writing to file.``) ending a paragraph; lines of a list under
    a colon ("I can help you with:" then ``Listing files.``, ``Reading file contents.``) are items, not acts."""
    for m, _ in zip(_BARE_PROGRESSIVE.finditer(prose[:MAX_SCAN_CHARS]), range(50), strict=False):
        before, after = prose[: m.start()].rstrip(" \t"), prose[m.end() :].lstrip(" \t")
        listed = before.rstrip().endswith(":") or (before.endswith("\n") and not before.endswith("\n\n") and before.strip())
        if not listed and (not after.strip() or after.startswith("\n\n") or after.startswith("\n\r\n")):
            return m
    return None


_RESULT_FRAME = re.compile(_RESULT_OPEN.pattern + r"[ \t]*$", re.I)
"""A frame that is result markup opening the block after it (``<tool_response>`` then a fence): the block is its body."""
_LITERAL = re.compile(r"\"[^\"\n]*+\"|'[^'\n]*+'|`[^`\n]*+`|(?:#|//)[^\n]*+")
"""String literals and comments of code (one line each)."""


_INLINE_SHELL = re.compile(rf"`[ \t]*((?:\$ )?{_FILE_COMMANDS}[^`\n]*+|echo\b[^`\n>]*+>[^`\n]*+)`")
_HANDS_OVER = re.compile(r"(?::|\b(?:run|type|enter|execute|use|using|try))[ \t]*$", re.I)


def _inline_command(text: str) -> re.Match[str] | None:
    """A shell command in an inline code span that the sentence before it hands over ("To list the files, use the
    following command: `ls -l`", "run `cat a.txt`"); a command only named ("The `ls` command lists files", "You can use
    the `ls` command") is not."""
    for m, _ in zip(_INLINE_SHELL.finditer(text[:MAX_SCAN_CHARS]), range(200), strict=False):
        line_start = text.rfind("\n", 0, m.start()) + 1
        head = re.split(r"(?<=[.!?])\s", text[max(line_start, m.start() - 200) : m.start()])[-1]
        if _HANDS_OVER.search(head.rstrip()):
            return m
    return None


def _fake_results(visible: str) -> list[tuple[int, int]]:
    """Spans of result markup the reply wrote (to its closing tag, or else to the first blank line)."""
    spans: list[tuple[int, int]] = []
    if "<" not in visible:
        return spans  # every result tag opens with one
    for m in _RESULT_OPEN.finditer(visible):
        close = _RESULT_CLOSE.search(visible, m.end())
        blank = re.compile(r"\n[ \t]*\n").search(visible, m.end())
        end = close.end() if close else blank.start() if blank else len(visible)
        spans.append((m.start(), end))
        if len(spans) >= 32:
            break
    return spans


def _inside(unit: Unit, spans: list[tuple[int, int]]) -> bool:
    return any(a <= unit.start < b for a, b in spans)


def _uses_tool(code: str, names: list[str]) -> bool:
    """Whether code takes up an offered tool to run it: hands it to something that runs it (``asyncio.gather(list_tickets,
    [])``) or imports it (``from jira_util import list_tickets``, then code building the ticket list)."""
    return any(
        re.search(
            rf"[(,][ \t]*{re.escape(n)}[ \t]*[,)]|^[ \t]*(?:from[ \t]+\S+[ \t]+)?import\b[^\n]*\b{re.escape(n)}\b", code, re.M
        )
        for n in names
    )


_LANGUAGE_LINE = re.compile(r"[ \t]*[A-Za-z][\w+#-]{0,15}[ \t]*")
_SENTENCE_LINE = re.compile(r"[ \t]*[^\W\d_][^(){}\[\]=;$<>|`\n]*[.!?][ \t]*")


def _holds_code(block: str) -> bool:
    """Whether a fence holds a command or code at all: a fence of only sentences (after a language name such as
    ``bash``) hands nothing over, whatever its frame names ("This is a simple command that ..." then a fence holding
    ``bash`` and a sentence about it)."""
    lines = [line for line in block.splitlines() if line.strip()]
    if lines and _LANGUAGE_LINE.fullmatch(lines[0]) and len(lines) > 1:
        lines = lines[1:]
    return not lines or not all(_SENTENCE_LINE.fullmatch(line) and len(line.split()) >= 4 for line in lines)


_DEF_NAME = re.compile(r"^[ \t]*(?:async[ \t]+)?(?:def|function)[ \t]+([A-Za-z_]\w*)", re.M)
_EMPTY_LINE = re.compile(
    r"[ \t]*(?:[\w.]+[ \t]*=[ \t]*(?:\{\}|\[\]|\(\)|None|null|\"\"|''|0)|pass|return(?:[ \t]+(?:None|\w+))?|\.\.\.|[{}]|#.*|//.*)[ \t]*;?[ \t]*"
)
"""A line of a body that does no work: an empty value assigned, ``pass``, a bare return, a comment."""


def _rewrites_tool(code: str, names: list[str]) -> bool:
    """Whether code only redefines an offered tool with a body that does none of its work (``def get_current_weather():``
    then ``current_weather = {}``): a rewrite of the tool with no tool step, which hands nothing over. A body building
    the tool's result (``return [{...} for ticket in tickets]``) does its work."""
    defined = {m.group(1).lower() for m in _DEF_NAME.finditer(code)}
    body = [x for x in code.splitlines() if x.strip() and not _DEF_NAME.match(x)]
    return bool(defined & set(names)) and all(_EMPTY_LINE.fullmatch(x) for x in body[:200]) and not _uses_tool(code, names)


def _handed_over(seq: list[Unit], fake: list[tuple[int, int]], tools: list[Any]) -> str | None:
    """The first block of code handed over to do the task's tool action, if any (see the module's doc)."""
    domains: set[str] = set()
    names: list[str] | None = None  # read from the tools at the first block of code (most replies hold none)
    for k, unit in enumerate(seq):
        if (
            not (unit.fence or is_code(unit.text))
            or is_data(unit.text)
            or not _holds_code(unit.text)
            or all(_NO_ACTION_LINE.match(x) or _DEFINITION_ONLY.fullmatch(x) for x in unit.lines)
        ):
            continue  # prose, data, comments and installs only
        if names is None:
            domains, names = tool_domains(tools), [n.lower() for n in offered_tools(tools)]
        if _rewrites_tool(unit.text, names) or _inside(unit, fake):
            continue  # a rewrite of the offered tool, a fake result's body
        before = frame_before(seq, k)
        if (_OTHER.search(before) and not _REMEDY.search(before)) or _RESULT_FRAME.search(before):
            continue  # presented as an output, the bug, an example, a file's contents, a (fake) tool result
        shown = f"{before}\n{_LITERAL.sub(' ', unit.text)}"  # what code prints or says in comments is not what it does
        about = any(DOMAIN_WORDS[d].search(shown) for d in domains) or any(n in shown.lower() for n in names)
        means = bool(MEANS.search(before) or (_GERUND_HEADING.search(before) and is_code(unit.text)))
        if (means and about) or acts(unit.text) or _uses_tool(unit.text, names):
            return unit.text
    return None
