"""Content analysis: reasoning blocks, wrapper tags, fences, bare payloads and the envelope modes.

Pass 2 of classification: strips reasoning, finds wrapper regions and Markdown fences, collects
every call attempt (:func:`~harness.classifier.shapes.payload_candidates`) and turns them into
recovered :class:`~harness.classifier.types.ToolCall` objects, with the envelope and payload
modes they show. Also the envelope and multiple-calls steps of :func:`harness.classifier.classify`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.classifier.shapes import Cand, payload_candidates, remove_spans, xml_spans
from harness.classifier.types import MAX_CANDIDATES, MAX_REGIONS, MAX_SCAN_CHARS, ToolCall, get, text_of
from harness.classifier.validate import args_from_raw

__all__ = [
    "ContentResult",
    "analyse_content",
    "envelope_step",
    "history_content_calls",
    "multiple_calls_step",
    "response_content",
]

# --------------------------------------------------------------------------- envelope regions

_REASON_OPEN = re.compile(r"<\s*(think|thinking|reasoning|thought)\s*>", re.I)
_REASON_CLOSE = re.compile(r"<\s*/\s*(think|thinking|reasoning|thought)\s*>", re.I)


def _strip_reasoning(text: str) -> tuple[str, int]:
    """Drop reasoning blocks; returns ``(visible_text, number_of_blocks)``."""
    out: list[str] = []
    pos = 0
    blocks = 0
    for _ in range(MAX_REGIONS):
        mo = _REASON_OPEN.search(text, pos)
        mc = _REASON_CLOSE.search(text, pos)
        if mc and (not mo or mc.start() < mo.start()):
            blocks += 1  # orphan close: the template opened the block
            out = []
            pos = mc.end()
            continue
        if mo is None:
            break
        out.append(text[pos : mo.start()])
        blocks += 1
        mc = _REASON_CLOSE.search(text, mo.end())
        pos = mc.end() if mc else len(text)
    out.append(text[pos:])
    return "".join(out), blocks


_WRAPPER = r"tool_calls?|toolcalls?|tool-calls?|tools?|functions?|function[_-]?calls?|functioncalls?|json|call"
_TAG_OPEN = re.compile(rf"<\s*({_WRAPPER})\s*>|(\[TOOL_CALLS\]|<\|python_tag\|>|<\|tool_calls?\|>)", re.I)
_TAG_CLOSE = re.compile(rf"<\s*/\s*({_WRAPPER})\s*>", re.I)


@dataclass
class _Region:
    start: int
    end: int
    inner_start: int
    inner_end: int
    name: str  # lower-case tag name or the marker text
    marker: bool
    well_formed: bool


def _tag_regions(text: str, xml: list[tuple[int, int, int, int, str]]) -> list[_Region]:
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
            regions.append(_Region(prev_end, mc.end(), prev_end, mc.start(), mc.group(1).lower(), False, False))
            pos = prev_end = mc.end()
            continue
        if mo is None:
            break
        if mo.group(2):  # marker: runs to the next opener or the end
            nxt = search(_TAG_OPEN, mo.end())
            end = nxt.start() if nxt else len(text)
            close = search(_TAG_CLOSE, mo.end())
            inner_end = close.start() if close and close.start() < end else end
            regions.append(_Region(mo.start(), end, mo.end(), inner_end, mo.group(2), True, True))
            pos = prev_end = end
            continue
        name = mo.group(1).lower()
        close = search(_TAG_CLOSE, mo.end())
        nxt = search(_TAG_OPEN, mo.end())
        if close and (not nxt or close.start() < nxt.start()):
            ok = close.group(1).lower() == name
            regions.append(_Region(mo.start(), close.end(), mo.end(), close.start(), name, False, ok))
            pos = prev_end = close.end()
        else:
            end = nxt.start() if nxt else len(text)
            regions.append(_Region(mo.start(), end, mo.end(), end, name, False, False))
            pos = prev_end = end
    return regions


_FENCE = re.compile(r"(`{3,}|~{3,})([A-Za-z0-9_+#.-]*)(.*?)(?:\1|\Z)", re.S)
_SHELL_LANGS = frozenset({"bash", "sh", "shell", "console", "zsh", "terminal", "cmd", "powershell", "ps1", "fish"})
_SHELL_LINE = re.compile(
    r"^\s*(?:\$ \S|(?:ls|cat|echo|mkdir|touch|cd|python3?|pip3?|rm|cp|mv|grep|find|curl|wget|git|npm|sed|awk|"
    r"head|tail|chmod|printf|tee)\b(?!\s*[=(]))",
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


def _tagged_candidates(
    visible: str, tool_names: frozenset[str], offered: Mapping[str, Any]
) -> tuple[list[tuple[str, Cand]], set[str], list[str], str]:
    """Attempts inside wrapper tags and markers: ``(found, modes, wrapper names, text outside the regions)``."""
    found: list[tuple[str, Cand]] = []
    modes: set[str] = set()
    wrappers: list[str] = []
    xml = xml_spans(visible)
    regions = _tag_regions(visible, xml)
    for region in regions:
        inner = visible[region.inner_start : region.inner_end]
        cands = payload_candidates(inner, tool_names, offered, wrapped=True)
        found.extend(("tagged", c) for c in cands)
        if region.name in ("tool_call",) and not region.marker:
            modes.add("tool_call_tags_in_content")
            wrappers.append(region.name)
            if not region.well_formed:
                modes.add("wrong_wrapper_tag")
        elif region.marker or cands:
            modes.add("wrong_wrapper_tag")
            wrappers.append(region.name)
    return found, modes, wrappers, remove_spans(visible, [(r.start, r.end) for r in regions])


def _fenced_candidates(
    rest: str, tool_names: frozenset[str], offered: Mapping[str, Any]
) -> tuple[list[tuple[str, Cand]], bool, bool, str]:
    """Attempts inside Markdown fences: ``(found, any fence held a call, shell block seen, text outside the fences)``."""
    found: list[tuple[str, Cand]] = []
    shell_block = False
    fences: list[tuple[int, int]] = []
    fenced_calls = False
    for fm in _FENCE.finditer(rest):
        if len(fences) >= MAX_REGIONS:
            break
        fences.append((fm.start(), fm.end()))
        body = fm.group(3)
        cands = payload_candidates(body, tool_names, offered, wrapped=True)
        found.extend(("fenced", c) for c in cands)
        if cands:
            fenced_calls = True
        elif fm.group(2).lower() in _SHELL_LANGS or _SHELL_LINE.search(body.lstrip("\n")[:200].split("\n", 1)[0]):
            shell_block = True
    return found, fenced_calls, shell_block, remove_spans(rest, fences)


@dataclass
class _Recovered:
    calls: list[ToolCall] = field(default_factory=list)
    canonicals: list[str] = field(default_factory=list)
    modes: set[str] = field(default_factory=set)
    invalid: list[str] = field(default_factory=list)  # excerpts of broken call-like objects
    pseudo: set[str] = field(default_factory=set)  # code patterns found in arguments


def _recover_calls(found: list[tuple[str, Cand]]) -> _Recovered:
    """Turn ``(step, candidate)`` pairs into calls, with the payload modes they show."""
    out = _Recovered()
    for index, (step, cand) in enumerate(found):
        if cand.foreign:
            out.modes.add("foreign_call_syntax")
        if cand.repaired:
            out.modes.add("repaired_json")
        if cand.pseudo:
            out.modes.add("pseudo_code_in_arguments")
            out.pseudo.update(cand.pseudo)
        if not cand.calls:
            out.modes.add("invalid_json")
            out.invalid.append(cand.excerpt)
            out.canonicals.append(f"\x00invalid{index}")
            continue
        for raw in cand.calls:
            if raw.nonstandard:
                out.modes.add("nonstandard_keys")
            args, errors, arg_modes = args_from_raw(raw.raw_args, structured=False)
            for mode in arg_modes:
                if mode.startswith("pseudo:"):
                    out.modes.add("pseudo_code_in_arguments")
                    out.pseudo.add(mode[7:])
                else:
                    out.modes.add(mode)
            errors = list(cand.errors) + errors
            call = ToolCall(name=raw.name, arguments=args, source=step, valid=not errors, errors=errors)
            out.calls.append(call)
            out.canonicals.append(call.canonical())
    return out


def analyse_content(text: str, offered: Mapping[str, Any]) -> ContentResult:
    """Recover the calls in ``text`` (already capped) given ``{tool name: parameters schema}``."""
    tool_names = frozenset(offered)
    modes: set[str] = set()
    details: dict[str, Any] = {}
    visible, blocks = _strip_reasoning(text)
    if blocks:
        modes.add("reasoning_leak")
        details["reasoning_leak"] = {"blocks": blocks, "chars_removed": len(text) - len(visible)}

    found, tag_modes, wrappers, rest = _tagged_candidates(visible, tool_names, offered)
    modes |= tag_modes
    if wrappers:
        details["wrappers"] = wrappers
    fenced, fenced_calls, shell_block, bare = _fenced_candidates(rest, tool_names, offered)
    found.extend(fenced)
    if fenced_calls:
        modes.add("code_fence")

    bare_cands = payload_candidates(bare, tool_names, offered, wrapped=False)
    found.extend((c.method, c) for c in bare_cands)
    if any(not c.foreign for c in bare_cands):
        modes.add("raw_json_in_content")
    prose = remove_spans(bare, [(c.start, c.end) for c in bare_cands])
    if not shell_block and _SHELL_LINE.search(prose) and re.search(r"^\s*\$ \S", prose, re.M):
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
    if found and not capped and re.search(r"[^\W\d_]{2,}", prose):
        modes.add("mixed_prose")
    canonicals = recovered.canonicals
    return ContentResult(recovered.calls, modes, len(canonicals), canonicals, visible, prose, shell_block, details)


_CONTENT_CACHE: dict[tuple[bytes, frozenset[str]], list[str]] = {}


def history_content_calls(text: str, offered: Mapping[str, Any]) -> list[str]:
    """Canonical calls recovered from an earlier assistant message (memoized by content digest)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    key = (digest, frozenset(offered))
    cached = _CONTENT_CACHE.get(key)
    if cached is None:
        result = analyse_content(text[:MAX_SCAN_CHARS], offered)
        cached = [c.canonical() for c in result.calls]
        if len(_CONTENT_CACHE) > 512:
            _CONTENT_CACHE.clear()
        _CONTENT_CACHE[key] = cached
    return cached


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


def multiple_calls_step(structured: list[ToolCall], content: ContentResult) -> tuple[set[str], dict[str, Any]]:
    """``multiple_calls``: structured calls plus content attempts that do not repeat a structured call."""
    structured_keys = {c.canonical() for c in structured}
    extra = [k for k in content.canonicals if k not in structured_keys]
    if len(structured) + len(extra) > 1:
        return {"multiple_calls"}, {}
    return set(), {}
