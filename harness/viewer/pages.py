"""The viewer's pages: what each one shows, read from the ledger, rendered with Jinja2 templates (autoescape on).

Three pages, the same whether served (:mod:`harness.viewer.server`) or written as files (:mod:`harness.viewer.export`):

* the run list (``list.html``): one row per run, filtered and sorted in SQLite when served, in the browser when
  exported (over the data files of :mod:`harness.viewer.export`);
* one run (``run.html``): its scenario's promise, the thread (each reply as text, each call beside its result, the
  recovery step that produced a recovered call, each failure-mode label with its evidence), the breaker's breach,
  the done checks (not judged when the outcome is not scored: the run did not finish) and the sandbox's final files;
* a side-by-side of two runs that pair (``pair.html``): the two run pages next to each other.

Model output is hostile text: every value reaches the page through Jinja2's escaping, never ``|safe``, and links are
built only from run ids, percent-encoded (:class:`Links`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2

from harness.classifier.types import FAILURE_MODES
from harness.errors import UsageError
from harness.ledger import Ledger, RunFilter, RunRow, check_failed
from harness.ledger.viewer_reads import LIST_SORTS
from harness.review import scenario_promise
from harness.viewer.sandbox_files import sandbox_files
from harness.vocab import counted, is_scored

__all__ = [
    "CONTENT_POLICY",
    "LIST_COLUMNS",
    "META_POLICY",
    "PAGE_SIZE",
    "Links",
    "list_page",
    "page_name",
    "render",
    "run_page",
    "pair_page",
]

PAGE_SIZE = 50
"""Runs on one page of the run list."""
LIST_COLUMNS = (
    ("scenario", "scenario"), ("model", "model"), ("temperature", "temp."), ("tool_mode", "tool mode"),
    ("parser", "parser"), ("stream", "stream"), ("repetition", "rep."), ("outcome", "outcome"),
    ("failed_checks", "failed checks"), ("failure_modes", "failure modes"), ("turns", "turns"), ("tokens", "tokens"),
)  # fmt: skip
"""Run-list columns: (key, heading)."""
_SAFE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MAX_INT = 2**63 - 1
"""SQLite's largest integer: a whole number in a query past it cannot be bound as a parameter."""

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("harness.viewer", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


_ENV.filters["counted"] = counted


def page_name(run_id: str) -> str:
    """The file name stem of a run's exported page: the run id when it is plain (letters, digits, ``_``, ``-``; at
    most 64), else ``h-`` and the first 32 hex digits of the SHA-256 of the id (a ledger edited by hand)."""
    if _SAFE_NAME.fullmatch(run_id):
        return run_id
    return "h-" + hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass(frozen=True)
class Links:
    """Where a page's links point: ``served`` (paths of :mod:`harness.viewer.server`) or files of an export, seen from
    a page ``depth`` folders below the export's top (0: ``index.html``, 1: ``runs/<id>.html``)."""

    served: bool
    depth: int = 0

    @property
    def top(self) -> str:
        """Prefix of the export's top folder ("" when served: paths are absolute)."""
        return "" if self.served else "../" * self.depth

    def index(self) -> str:
        """The run list."""
        return "/" if self.served else self.top + "index.html"

    def run(self, run_id: str) -> str:
        """One run's page."""
        return f"/run/{quote(run_id, safe='')}" if self.served else f"{self.top}runs/{page_name(run_id)}.html"

    def pair(self, a: str, b: str) -> str:
        """The side-by-side of runs ``a`` and ``b``."""
        if self.served:
            return "/pair?" + urlencode({"a": a, "b": b})
        return f"{self.top}pair.html?" + urlencode({"a": page_name(a), "b": page_name(b)})

    def static(self, name: str) -> str:
        """A file of the viewer's own (CSS, scripts)."""
        return f"/static/{name}" if self.served else f"{self.top}static/{name}"

    def data(self, name: str) -> str:
        """A data file of an export (``data/<name>``)."""
        return f"{self.top}data/{name}"


CONTENT_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; frame-src 'self'; "
                  "frame-ancestors 'self'; form-action 'self'; base-uri 'none'")  # fmt: skip
"""The Content-Security-Policy of every page: scripts, styles, images and frames only from the viewer's own files, no
inline script (model text that slips past escaping still cannot run). Served as a header by :mod:`harness.viewer.server`."""

META_POLICY = CONTENT_POLICY.replace(" frame-ancestors 'self';", "")
"""The same policy as a ``<meta>`` tag in exported pages (no server sends them headers); browsers ignore
``frame-ancestors`` in a ``<meta>`` policy, so it is left out there."""
_ENV.globals["meta_policy"] = META_POLICY


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def render(template: str, **context: Any) -> str:
    """Render one template of ``harness/viewer/templates`` (autoescape on) with ``context``; a lone surrogate (JSON
    lets a model send ``"\\udcff"``, and it survives ``json.loads`` of a stored call) becomes U+FFFD, so the page can
    always be written as UTF-8."""
    return _LONE_SURROGATE.sub("\ufffd", _ENV.get_template(template).render(**context))


def _filter_from(query: dict[str, str]) -> RunFilter:
    def number(key: str, kind: type) -> Any:
        text = query.get(key, "")
        if text == "":
            return None
        try:
            value = kind(text)
        except ValueError:
            raise UsageError(f"the filter {key}={text!r} is not a number.") from None
        if kind is int and abs(value) > _MAX_INT:
            raise UsageError(f"the filter {key}={text!r} is out of range (at most {_MAX_INT}).")
        return value

    text = {k: (query.get(k) or None) for k in ("scenario", "model", "tool_mode", "parser", "outcome", "mode", "check")}
    return RunFilter(scenario=text["scenario"], model=text["model"], temperature=number("temperature", float),
                     tool_mode=text["tool_mode"], parser=text["parser"], stream=number("stream", int),
                     repetition=number("repetition", int), outcome=text["outcome"], failure_mode=text["mode"],
                     failed_check=text["check"], only_failed=query.get("failed") == "1",
                     failed_every_repetition=query.get("every") == "1")  # fmt: skip


def list_page(ledger: Ledger, query: dict[str, str], links: Links, *, static: bool = False) -> str:
    """The run list: served, one page of rows from SQLite for ``query`` (the form's fields: ``scenario``, ``model``,
    ``temperature``, ``tool_mode``, ``parser``, ``stream``, ``repetition``, ``outcome``, ``mode``, ``check``,
    ``failed=1``, ``every=1``, ``sort`` (a key of :data:`harness.ledger.viewer_reads.LIST_SORTS`), ``desc=1``,
    ``page`` from 1); ``static``, the same page with no rows, filled in the browser from the export's data files.

    Raises:
        UsageError: a number field or ``page`` is not a number, or ``sort`` is unknown.
        LedgerError: the ledger cannot be read.
    """
    sort = query.get("sort") or "started"
    if sort not in LIST_SORTS:
        raise UsageError(f"unknown sort {sort!r}; use one of {', '.join(LIST_SORTS)}.")
    try:
        page = max(1, int(query.get("page") or 1))
    except ValueError:
        raise UsageError(f"the page {query.get('page')!r} is not a number.") from None
    if (page - 1) * PAGE_SIZE > _MAX_INT:
        raise UsageError(f"the page {page} is out of range (at most {_MAX_INT // PAGE_SIZE}).")
    descending = query.get("desc") == "1"
    rows: list[dict[str, Any]] = []
    total = 0
    if not static:
        rows, total = ledger.run_list(_filter_from(query), sort=sort, descending=descending, limit=PAGE_SIZE,
                                      offset=(page - 1) * PAGE_SIZE)  # fmt: skip

    def sort_link(key: str) -> str:
        return "?" + urlencode({**query, "sort": key, "desc": "1" if key == sort and not descending else "", "page": 1})

    def page_link(number: int) -> str:
        return "?" + urlencode({**query, "page": number})

    return render("list.html", links=links, static=static, rows=rows, total=total, page=page, page_size=PAGE_SIZE,
                  pages=max(1, -(-total // PAGE_SIZE)), columns=LIST_COLUMNS, sortable=set(LIST_SORTS), sort=sort,
                  descending=descending, query=query, choices=ledger.list_choices(), modes=list(FAILURE_MODES),
                  sort_link=sort_link, page_link=page_link, ledger_name=ledger.path.name)  # fmt: skip


def _json(text: Any, default: Any) -> Any:
    if text is None:
        return default
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return default


def pretty(value: Any) -> str:
    """A JSON value as indented text (strings as they are)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def _evidence(details: dict[str, Any], mode: str) -> dict[str, str]:
    found = details.get("evidence", {}).get(mode) if isinstance(details.get("evidence"), dict) else None
    if isinstance(found, dict):
        return {"rule": str(found.get("rule", "")), "span": pretty(found.get("span", ""))}
    if mode in details:
        return {"rule": "", "span": pretty(details[mode])}
    return {"rule": "", "span": "(no evidence recorded)"}


def _turn(row: dict[str, Any]) -> dict[str, Any]:
    details = _json(row["labels_details"], {})
    details = details if isinstance(details, dict) else {}
    labels = _json(row["labels"], [])
    executed = _json(row["executed_calls"], [])
    recovered_by = row["labels_recovered_by"] or row["recovered_by"]
    calls = [{
        "id": str(c.get("id", "")), "name": str(c.get("name", "")), "arguments": pretty(c.get("arguments")),
        "source": str(c.get("source", "")), "output": pretty(c.get("output", "")), "error": bool(c.get("error")),
        "escape_attempt": bool(c.get("escape_attempt")),
        "recovery": recovered_by if c.get("source") not in (None, "structured") else None,
    } for c in executed if isinstance(c, dict)]  # fmt: skip
    return {
        "turn": row["turn"], "content": row["content"], "reasoning": row.get("reasoning"),
        "tool_calls": pretty(_json(row["tool_calls"], None)) if row["tool_calls"] not in (None, "null") else None,
        "recovered_calls": pretty(_json(row["recovered_calls"], [])) if _json(row["recovered_calls"], []) else None,
        "recovered_by": recovered_by, "calls": calls,
        "labels": [{"mode": str(m), **_evidence(details, str(m))} for m in labels if isinstance(m, str)]
        if isinstance(labels, list) else [],
        "labels_version": row["labels_version"], "finish_reason": row["finish_reason"],
        "prompt_tokens": row["prompt_tokens"], "completion_tokens": row["completion_tokens"], "latency_ms": row["latency_ms"],
        "server_rejection": pretty(_json(row.get("server_rejection"), None)) if row.get("server_rejection") else None,
    }  # fmt: skip


def find_run(ledger: Ledger, run_id: str) -> RunRow:
    """The run with this exact id.

    Raises:
        UsageError: no run has this id.
    """
    rows = [r for r in ledger.runs_matching(run_id, limit=1) if r.run_id == run_id]
    if not rows:
        raise UsageError(f"no run {run_id!r} in the ledger.")
    return rows[0]


def run_page(ledger: Ledger, run_id: str, links: Links) -> str:
    """One run's page (see the module docstring).

    Raises:
        UsageError: no run has this id.
        LedgerError: the ledger cannot be read.
    """
    run = find_run(ledger, run_id)
    start, end = run.start, run.end
    config = start.config if isinstance(start.config, dict) else {}
    turns = [_turn(row) for row in ledger.run_turns(run.run_id)]
    checks = [{"check": str(c.get("check")), "passed": not check_failed(c), "detail": pretty(c.get("detail", ""))}
              for c in (end.checks if end else [])]  # fmt: skip
    modes = sorted({label["mode"] for t in turns for label in t["labels"]})
    return render("run.html", links=links, run=start, end=end, outcome=end.outcome if end else "unfinished",
                  promise=scenario_promise(run, ledger.path), system_prompt=config.get("system_prompt"),
                  task=config.get("task"), turns=turns, checks=checks, modes=modes,
                  breach=pretty(end.breach) if end and end.breach else None,
                  files=sandbox_files(Path(start.sandbox)) if start.sandbox else None,
                  pairs=ledger.paired_runs(run.run_id), tokens=(end.prompt_tokens or 0) + (end.completion_tokens or 0)
                  if end else None, failed_checks=[c["check"] for c in checks if not c["passed"]],
                  judged=is_scored(end.outcome if end else None))  # fmt: skip


def pair_page(ledger: Ledger | None, a: str | None, b: str | None, links: Links) -> str:
    """The side-by-side of runs ``a`` and ``b`` (served: checked to exist; exported: ``a`` and ``b`` None, the
    page reads them from its address in the browser). Each frame shows a run page at ``#embed``, which hides its
    header bar (a CSS ``:target`` rule in ``viewer.css``, so it needs no script).

    Raises:
        UsageError: a run does not exist (served).
    """
    runs = [find_run(ledger, x) for x in (a, b)] if ledger is not None and a and b else []
    frames = [{"src": links.run(r.run_id) + "#embed", "model": r.start.model} for r in runs]
    return render("pair.html", links=links, frames=frames, static=ledger is None)
