"""Content analysis: reasoning blocks, wrapper tags, fences, bare payloads and the envelope modes.

Pass 2 of classification: strips reasoning, finds wrapper regions and Markdown fences, collects
every call attempt (:func:`~harness.classifier.shapes.payload_candidates`) and turns them into
recovered :class:`~harness.classifier.types.ToolCall` objects, with the envelope and payload
modes they show. Also the envelope and multiple-calls steps of :func:`harness.classifier.classify`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.classifier.jsonscan import scan_balanced
from harness.classifier.shapes import payload_candidates, remove_spans, wrapper_call, xml_spans
from harness.classifier.types import MAX_CANDIDATES, MAX_REGIONS, MAX_SCAN_CHARS, Cand, ToolCall, get, text_of
from harness.classifier.validate import args_from_raw, shown_pairs

__all__ = [
    "ContentResult",
    "analyse_content",
    "has_prose",
    "envelope_step",
    "multiple_calls_step",
    "response_content",
]

# --------------------------------------------------------------------------- envelope regions

_REASON_OPEN = re.compile(r"<\s*(think|thinking|reasoning|thought)\s*>", re.I)
_REASON_CLOSE = re.compile(r"<\s*/\s*(think|thinking|reasoning|thought)\s*>", re.I)


_NAMESPACE_TOKEN = re.compile(r"[\[\]<|{}][\[\]<>|{}]{0,2}[A-Za-z_]\w{0,20}[\[\]<>|{}]{1,3}(?=</?[A-Za-z_])")


def _without_namespace_tokens(text: str) -> str:
    """``text`` without a vendor's namespace token written before each tag (MiniMax M3's ``]<]minimax[>[<tool_call>``,
    ``]<]minimax[>[</path>``): part of the tags' spelling, so each tag is read by its own name (MiniMax-M3#31). A
    token counts when it stands before at least three tags and nowhere else."""
    if "<" not in text:
        return text
    seen: dict[str, int] = {}
    for m, _ in zip(_NAMESPACE_TOKEN.finditer(text), range(MAX_REGIONS * 4), strict=False):
        seen[m.group()] = seen.get(m.group(), 0) + 1
    for token, count in seen.items():
        if count >= 3 and text.count(token) == count:
            text = text.replace(token, "")
    return text


def _strip_reasoning(text: str) -> tuple[str, int, str]:
    """Drop reasoning blocks; returns ``(visible_text, number_of_blocks, the blocks' text)``."""
    out: list[str] = []
    inside: list[str] = []
    pos = 0
    blocks = 0
    for _ in range(MAX_REGIONS):
        mo = _REASON_OPEN.search(text, pos)
        mc = _REASON_CLOSE.search(text, pos)
        if mc and (not mo or mc.start() < mo.start()):
            blocks += 1  # orphan close: the template opened the block
            inside.append("".join(out) + text[pos : mc.start()])
            out = []
            pos = mc.end()
            continue
        if mo is None:
            break
        out.append(text[pos : mo.start()])
        blocks += 1
        mc = _REASON_CLOSE.search(text, mo.end())
        inside.append(text[mo.end() : mc.start() if mc else len(text)])
        pos = mc.end() if mc else len(text)
    out.append(text[pos:])
    return "".join(out), blocks, "\n".join(inside)


_WRAPPER = r"tool_calls?|toolcalls?|tool-calls?|tools?|tool[_-]?uses?|functions?|function[_-]?calls?|functioncalls?|json|call"
_MARKERS = (
    r"\[TOOL_CALLS?\]|\[TOOL_REQUEST\]|<\|python_tag\|>|<\|python_start\|>|<\|tool_calls?\|>|<\|tool_call_start\|>"
    r"|<\|action_start\|>(?:[ \t]*<\|(?:plugin|interpreter)\|>)?"  # InternLM 2/2.5
    r"|<\|tool_call>"  # Gemma 4: <|tool_call>call:name{...}<tool_call|>
    r"|(?<![\w.=])to=functions\.(?=[\w.-]+[ \t\u00a0\u200b]*(?:\n(?!\s*[{\"])|\Z))"  # gpt-oss's stripped header, no arguments
)
_MENTION = r"(?!(?<=`)<[^<>`\n]{1,60}>`)"
"""Not a tag alone in an inline code span (`<tool_call>`): that is a mention, not markup."""
_NS = r"(?:[A-Za-z_][\w-]{0,20}:)?"
"""A namespace inside a wrapper's name (``<minimax:tool_call>``): the name is then another wrapper's (MiniMax-M3#31)."""
_TAG_OPEN = re.compile(
    rf"{_MENTION}<\s*({_NS}(?:{_WRAPPER}))\s*>|({_MARKERS})|<\s*({_WRAPPER})\s+(?=[{{\[])"
    rf"|{_MENTION}<\s*({_NS}(?:{_WRAPPER}))\s+([^<>{{\[]{{1,300}})>",
    re.I,
)
"""Groups: 1 a bare wrapper tag, 2 a marker, 3 a tag holding its call inline, 4 and 5 a wrapper tag with attributes
(``<tool_call id="..." name="x">``) and its attribute text."""
_NAME_ATTR = re.compile(r"""\bname[ \t]*=[ \t]*["']([^"'<>]{1,100})["']""")
_TAG_CLOSE = re.compile(rf"{_MENTION}<\s*/\s*({_NS}(?:{_WRAPPER}))\s*>|<\|/(tool_calls?)\|>", re.I)
_MARKER_CLOSE = re.compile(
    r"<\|python_end\|>|<\|action_end\|>|<\|tool_call_end\|>|\[/TOOL_CALLS?\]|\[END_TOOL_REQUEST\]|<\|eom_id\|>|<\|eot_id\|>"
    r"|<tool_call\|>",
    re.I,
)


@dataclass
class _Region:
    """A wrapper tag or marker region: its inner text is searched for calls.

    ``closed`` regions (a tag and its closing tag) are removed whole from the prose; of the
    others only ``tags`` (the markup itself) and the calls found inside.
    """

    inner_start: int
    inner_end: int
    tags: list[tuple[int, int]]
    name: str  # lower-case tag name or the marker text
    marker: bool
    well_formed: bool
    closed: bool
    attr_name: str | None = None  # the tool a wrapper names in an attribute: <tool_call name="x">


def _tag_regions(text: str, xml: list[tuple[int, int, int, int, str]]) -> list[_Region]:  # long: one scan over four kinds of tag
    def inside_xml(pos: int) -> bool:
        return any(a <= pos < b for a, b, *_ in xml)

    def search(pattern: re.Pattern[str], pos: int) -> re.Match[str] | None:
        for _ in range(MAX_REGIONS * 4):
            m = pattern.search(text, pos)
            if m is None or not inside_xml(m.start()):
                return m
            pos = m.end()
        return None

    regions: list[_Region] = []
    pos = prev_end = 0
    while len(regions) < MAX_REGIONS:
        mo = search(_TAG_OPEN, pos)
        mc = search(_TAG_CLOSE, pos)
        if mc and (not mo or mc.start() < mo.start()):
            # orphan close (the template may have written the opener): the text before it is
            # searched for the call but stays content, so prose around the call still counts
            pipe = mc.group(2) is not None  # `<|/tool_call|>`: a vendor marker, not `<tool_call>` markup
            name = mc.group(0).lower() if pipe else mc.group(1).lower()
            regions.append(_Region(prev_end, mc.start(), [mc.span()], name, pipe, False, False))
            pos = prev_end = mc.end()
            continue
        if mo is None:
            break
        if mo.group(3):  # <functioncall {...}>: one tag holding the call
            regions.append(_inline_tag(text, mo))
            pos = prev_end = max(regions[-1].inner_end, regions[-1].tags[-1][1])
            continue
        nxt = search(_TAG_OPEN, mo.end())
        limit = nxt.start() if nxt else len(text)
        if mo.group(2):  # marker: runs to its close, the next opener or the end
            close = _MARKER_CLOSE.search(text, mo.end(), limit) or search(_TAG_CLOSE, mo.end())
            if close and close.start() < limit:
                regions.append(_Region(mo.end(), close.start(), [mo.span(), close.span()], mo.group(2), True, True, True))
                pos = prev_end = close.end()
            else:
                regions.append(_Region(mo.end(), limit, [mo.span()], mo.group(2), True, True, False))
                pos = prev_end = limit
            continue
        name = (mo.group(1) or mo.group(4)).lower()
        attr = _NAME_ATTR.search(mo.group(5)) if mo.group(5) else None
        close = search(_TAG_CLOSE, mo.end())
        if close and close.start() < limit:
            ok = (close.group(1) or "").lower() == name
            regions.append(_Region(mo.end(), close.start(), [mo.span(), close.span()], name, False, ok, True))
            pos = prev_end = close.end()
        else:
            regions.append(_Region(mo.end(), limit, [mo.span()], name, False, False, False))
            pos = prev_end = limit
        regions[-1].attr_name = attr.group(1).strip() if attr else None
    return regions


def _inline_tag(text: str, mo: re.Match[str]) -> _Region:
    """The region of a single tag holding a call (``<functioncall {"name": ..., "arguments": {...}}>``): its JSON, then
    the tag's ``>`` (and a closing tag right after it, if any); unclosed, the region runs to the JSON's end."""
    end, _closed, _depth = scan_balanced(text, mo.end(), len(text))
    name = mo.group(3).lower()
    close = re.compile(rf"\s*/?>(?:\s*<\s*/\s*{re.escape(name)}\s*>)?", re.I).match(text, end)
    tags = [mo.span(), close.span()] if close else [mo.span()]
    return _Region(mo.end(), end, tags, name, False, False, True)  # a call tag with no body: never well formed


_FENCE = re.compile(r"(`{3,}|~{3,})([A-Za-z0-9_+#.-]*)(.*?)(?:\1(?![A-Za-z0-9_+#.-])|\Z)", re.S)  # ```python never closes
_SHELL_LANGS = frozenset({"bash", "sh", "shell", "console", "zsh", "terminal", "cmd", "powershell", "ps1", "fish"})
_SHELL_LINE = re.compile(
    r"^[ \t]*(?:\$ \S|(?:ls|cat|echo|mkdir|touch|cd|python3?|pip3?|rm|cp|mv|grep|find|curl|wget|git|npm|sed|awk|"
    r"head|tail|chmod|printf|tee)\b(?![ \t]*[=(]))",
    re.M,
)


# --------------------------------------------------------------------------- content analysis


@dataclass
class ContentResult:
    """What pass 2 found in the content: recovered calls, modes, and the texts the heuristics read."""

    calls: list[ToolCall]
    modes: set[str]
    attempts: int  # call attempts, broken ones included
    canonicals: list[str]  # canonical form of each attempt (broken ones get a unique key)
    visible: str  # content with reasoning stripped
    prose: str  # visible text with wrappers, fences and call spans removed
    shell_block: bool
    details: dict
    reasoning: str = ""  # the text of reasoning blocks left in the content
    code: list[str] = field(default_factory=list)  # bodies of fences that hold no call
    excerpts: list[str] = field(default_factory=list)  # the text of each call attempt, in order
    spans: dict[str, str] = field(default_factory=dict)  # mode -> the text of the first attempt showing it


def _tagged_candidates(
    visible: str, tool_names: frozenset[str], offered: Mapping[str, Any], *, tools_known: bool
) -> tuple[list[tuple[str, Cand]], set[str], list[str], str]:
    """Attempts inside wrapper tags and markers: ``(found, modes, wrapper names, text outside the regions)``.

    A well-formed region is removed whole; of a malformed one (unclosed, or an orphan closing
    tag) only its tags and the calls found in it, so prose around them still counts. A region
    holding a call inside a Markdown fence is ``code_fence`` too.
    """
    found: list[tuple[str, Cand]] = []
    modes: set[str] = set()
    wrappers: list[str] = []
    removed: list[tuple[int, int]] = []
    fences: list[tuple[int, int]] | None = None
    for region in _tag_regions(visible, xml_spans(visible)):
        inner = visible[region.inner_start : region.inner_end]
        cands = payload_candidates(inner, tool_names, offered, wrapped=True, tools_known=tools_known)
        if not cands and not region.marker and _CALL_WRAPPER.search(region.name):
            cands = wrapper_call(inner, region.attr_name)
        found.extend(("tagged", c) for c in cands)
        if cands and ("```" in visible or "~~~" in visible):
            if fences is None:  # ```xml <function_call>{...}</function_call> ```: the fence is around the wrapper
                fences = [m.span() for m, _ in zip(_FENCE.finditer(visible), range(MAX_REGIONS), strict=False)]
            if any(a < region.inner_start < b for a, b in fences):
                modes.add("code_fence")
        if region.name == "tool_call" and not region.marker:
            modes.add("tool_call_tags_in_content")
            wrappers.append(region.name)
            if not region.well_formed:
                modes.add("wrong_wrapper_tag")
        elif region.marker or cands:
            modes.add("wrong_wrapper_tag")
            wrappers.append(region.name)
        removed.extend(region.tags)
        if region.closed:
            removed.append((region.inner_start, region.inner_end))
        else:
            removed.extend((region.inner_start + c.start, region.inner_start + c.end) for c in cands)
    return found, modes, wrappers, remove_spans(visible, removed)


_CALL_WRAPPER = re.compile(r"call|use")
"""A wrapper whose name says it holds a call (``<tool_call>``, ``<function_call>``, ``<tool_use>``): a name in it
counts whatever the tools are."""

_REACT_INPUT_BEFORE = re.compile(r"Action[ \t]+Input[ \t]*:[ \t]*\n?[ \t]*\Z", re.I)


def _fenced_candidates(
    rest: str, tool_names: frozenset[str], offered: Mapping[str, Any], *, tools_known: bool
) -> tuple[list[tuple[str, Cand]], bool, bool, str, list[str]]:
    """Attempts inside Markdown fences: ``(found, any fence held a call, shell block seen, text
    outside the fences, bodies of the fences that hold no call)``."""
    found: list[tuple[str, Cand]] = []
    shell_block = False
    fences: list[tuple[int, int]] = []
    code: list[str] = []
    fenced_calls = False
    for fm in _FENCE.finditer(rest):
        if len(fences) >= MAX_REGIONS:
            break
        if _REACT_INPUT_BEFORE.search(rest, max(0, fm.start() - 40), fm.start()):
            continue  # "Action Input: ```json {...}```": the ReAct call's arguments, read with its Action line
        fences.append((fm.start(), fm.end()))
        body = fm.group(3)
        cands = payload_candidates(body, tool_names, offered, wrapped=True, tools_known=tools_known)
        found.extend(("fenced", c) for c in cands)
        if cands:
            fenced_calls = True
            continue
        code.append(body)
        if fm.group(2).lower() in _SHELL_LANGS or _SHELL_LINE.search(body.lstrip("\n")[:200].split("\n", 1)[0]):
            shell_block = True
    return found, fenced_calls, shell_block, remove_spans(rest, fences), code


@dataclass
class _Recovered:
    calls: list[ToolCall] = field(default_factory=list)
    canonicals: list[str] = field(default_factory=list)
    modes: set[str] = field(default_factory=set)
    invalid: list[str] = field(default_factory=list)  # excerpts of broken call-like objects
    pseudo: set[str] = field(default_factory=set)  # code patterns found in arguments
    spans: dict[str, str] = field(default_factory=dict)  # mode -> the text of the first attempt showing it


def _recover_calls(found: list[tuple[str, Cand]]) -> _Recovered:
    """Turn ``(step, candidate)`` pairs into calls, with the payload modes they show."""
    out = _Recovered()

    def shows(mode: str, cand: Cand) -> None:
        out.modes.add(mode)
        out.spans.setdefault(mode, cand.excerpt)

    for index, (step, cand) in enumerate(found):
        for flag, mode in ((cand.foreign, "foreign_call_syntax"), (cand.wrapper, "wrong_wrapper_tag"),
                           (cand.repaired, "repaired_json"), (cand.pseudo, "pseudo_code_in_arguments")):  # fmt: skip
            if flag:
                shows(mode, cand)
        out.pseudo.update(cand.pseudo)
        if not cand.calls:
            shows("invalid_json", cand)
            if cand.nonstandard:
                shows("nonstandard_keys", cand)
            out.invalid.append(cand.excerpt)
            out.canonicals.append(f"\x00invalid{index}")
            continue
        for raw in cand.calls:
            if raw.nonstandard:
                shows("nonstandard_keys", cand)
            args, errors, arg_modes = args_from_raw(raw.raw_args, structured=False)
            for mode in arg_modes:
                if mode.startswith("pseudo:"):
                    shows("pseudo_code_in_arguments", cand)
                    out.pseudo.add(mode[7:])
                else:
                    shows(mode, cand)
            errors = list(cand.errors) + errors
            call = ToolCall(raw.name, args, step, valid=not errors, errors=errors, shown=shown_pairs(raw.raw_args, errors))
            out.calls.append(call)
            out.canonicals.append(call.canonical())
    return out


def analyse_content(text: str, offered: Mapping[str, Any], *, tools_known: bool = True) -> ContentResult:
    """Recover the calls in ``text`` (already capped) given ``{tool name: parameters schema}``.

    ``tools_known`` is False when the offered tools are not known (``tools=None``): a bare
    function-like name before JSON arguments then counts as a call.
    """
    if not text:  # no content (a reply that only calls): what _analyse finds in "" (a test holds them equal)
        return ContentResult([], set(), 0, [], "", "", False, {})
    if _PLAIN_PROSE.search(text) is None:  # plain prose: what _analyse finds in it (a hypothesis test holds them equal)
        return ContentResult([], set(), 0, [], text, text, False, {})
    return _analyse(text, offered, tools_known=tools_known)


_PLAIN_PROSE = re.compile(r"[^\w \n.,;!?'%*&+-]|_")
"""A character outside plain prose: anything but letters, digits, spaces, newlines and ``.,;!?'%*&+-``. A text without
one holds nothing any step of :func:`_analyse` reads: every call shape, tag, marker and fence it finds needs one of
``{ [ < ( : = | ` ~ _`` (JSON, pythonic ``name(``, markup and vendor markers, ReAct ``Action:``, Gemma ``call:``,
``key=value`` and ``to=``, fences, tool names with an underscore), a reasoning block needs ``<``, and a shell line
counts only with ``$`` (then the content's visible text and prose are the text itself, and no shell block is seen)."""


def _analyse(text: str, offered: Mapping[str, Any], *, tools_known: bool) -> ContentResult:
    """:func:`analyse_content` of any text, every step run."""
    tool_names = frozenset(offered)
    modes: set[str] = set()
    details: dict[str, Any] = {}
    visible, blocks, reasoning = _strip_reasoning(_without_namespace_tokens(text))
    if blocks:
        modes.add("reasoning_leak")
        details["reasoning_leak"] = {"blocks": blocks, "chars_removed": len(text) - len(visible)}

    found, tag_modes, wrappers, rest = _tagged_candidates(visible, tool_names, offered, tools_known=tools_known)
    modes |= tag_modes
    if wrappers:
        details["wrappers"] = wrappers
    fenced, fenced_calls, shell_block, bare, code = _fenced_candidates(rest, tool_names, offered, tools_known=tools_known)
    found.extend(fenced)
    if fenced_calls:
        modes.add("code_fence")

    bare_cands = payload_candidates(bare, tool_names, offered, wrapped=False, tools_known=tools_known)
    found.extend((c.method, c) for c in bare_cands)
    raw = [c for c in bare_cands if not (c.foreign or c.wrapper or c.react)]
    if raw:
        modes.add("raw_json_in_content")
    prose = remove_spans(bare, [(c.start, c.end) for c in bare_cands])
    if not shell_block and _SHELL_LINE.search(prose) and re.search(r"^[ \t]*\$ \S", prose, re.M):
        shell_block = True

    recovered = _recover_calls(found)
    modes |= recovered.modes
    if recovered.invalid:
        details["invalid_json"] = recovered.invalid[:MAX_CANDIDATES]
    if recovered.pseudo:
        details["pseudo_code_in_arguments"] = sorted(recovered.pseudo)
    capped = len(bare_cands) >= MAX_CANDIDATES  # uncounted calls would read as prose
    if capped:
        details["candidates_capped"] = MAX_CANDIDATES
    if found and not capped and has_prose(prose):
        modes.add("mixed_prose")
    canonicals = recovered.canonicals
    spans = dict(recovered.spans)
    if raw:
        spans["raw_json_in_content"] = raw[0].excerpt
    if fenced_calls:
        spans["code_fence"] = next(c.excerpt for _step, c in fenced)
    elif "code_fence" in tag_modes:  # a fence around a wrapper tag
        spans["code_fence"] = next(c.excerpt for step, c in found if step == "tagged")
    return ContentResult(recovered.calls, modes, len(canonicals), canonicals, visible, prose, shell_block, details,
                         reasoning=reasoning, code=code, excerpts=[c.excerpt for _step, c in found if c.excerpt],
                         spans=spans)  # fmt: skip


_REACT_KEYWORD = re.compile(
    r"^[ \t]*(?:Observation[ \t]*:(?![^\n]*?(?<![^\W\d_])[^\W\d_]{2,}+[ \t]++[^\W\d_]{2}).*|(?:Observation|Thought|Final[ \t]+Answer|Answer|Output|Result)[ \t]*:)",
    re.I | re.M,
)
"""ReAct keywords and lone labels; a model-written observation goes too unless it holds a phrase (two words in a row):
``Observation: 36`` or ``Observation: hello.txt`` is a value, "Observation: The engineer delegates the task." is text."""
_MARKUP = re.compile(r"<\|[^|\n]{0,40}\|>|<｜[^｜\n]{0,40}｜>|</?[A-Za-z_][\w:-]{0,40}(?:\s[^<>\n]{0,80})?/?>|\[/?[A-Z_]{3,20}\]")
_LABEL = r"(?!(?i:I|we|let|you|here|now|this|then|so)\b)\w+(?:[ \t]+\w+){0,2}[ \t]*:[ \t]*$"
"""A lone label or a framework's heading (``Output:``, ``Calling tools:``): up to three words, not a sentence
("I will call the tool now:", "Let me check:")."""
_NOT_PROSE_LINE = re.compile(rf"^[ \t]*(?:[{{}}\[\]]|\"[^\"]*\"\s*:|#|def |import |from |return |\w+\s*=[^=]|{_LABEL}).*$", re.M)
_WORD = re.compile(r"[^\W\d_]{2,}")


def has_prose(text: str) -> bool:
    """Whether ``text`` holds natural language: a word once markup, ReAct keywords (a model-written
    observation's phrase stays: it is text around the call), lone labels (``Output:``), JSON and code lines are dropped."""
    text = _NOT_PROSE_LINE.sub(" ", _REACT_KEYWORD.sub(" ", _MARKUP.sub(" ", text)))
    return _WORD.search(text) is not None


# --------------------------------------------------------------------------- classification steps


def response_content(response: Any) -> tuple[str, int | None]:
    """The reply's content as text, capped at ``MAX_SCAN_CHARS``, and its full length when it was capped."""
    content = text_of(get(response, "content"))
    if len(content) > MAX_SCAN_CHARS:
        return content[:MAX_SCAN_CHARS], len(content)
    return content, None


def envelope_step(structured_modes: set[str], content: ContentResult, clipped: int | None) -> tuple[set[str], dict[str, Any]]:
    """Envelope and payload modes of both passes: the structured calls' argument modes and the content's.

    Returns:
        ``(modes, evidence)``; evidence holds ``content_truncated_for_analysis`` (the full
        length, when ``clipped``) and the content analysis' details.
    """
    modes = {m for m in structured_modes if not m.startswith("pseudo:")}
    if any(m.startswith("pseudo:") for m in structured_modes):
        modes.add("pseudo_code_in_arguments")
    modes |= content.modes
    evidence: dict[str, Any] = {}
    if clipped is not None:
        evidence["content_truncated_for_analysis"] = clipped
    evidence.update(content.details)
    return modes, evidence


def multiple_calls_step(
    structured: list[ToolCall], content: ContentResult, keys: Sequence[str] | None = None
) -> tuple[set[str], dict[str, Any]]:
    """``multiple_calls``: structured calls plus content attempts that do not repeat a structured call (``keys``: the
    structured calls' :meth:`~ToolCall.canonical` keys when already drawn)."""
    structured_keys = set(keys) if keys is not None else {c.canonical() for c in structured}
    extra = [k for k in content.canonicals if k not in structured_keys]
    if len(structured) + len(extra) > 1:
        return {"multiple_calls"}, {}
    return set(), {}
