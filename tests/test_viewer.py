"""The transcript viewer (``harness view``) over HTTP and as exported files, without a browser.

Every ledger is real: replay cassettes through ``harness run`` (tests/helpers.py), or runs appended through the
public Ledger API (tests/ledger_builders.py). Pages are fetched from a real server on 127.0.0.1 started by the test.
The browser tests are in tests/test_viewer_browser.py.
"""

from __future__ import annotations

import html
import json
import os
import re
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import markupsafe
import pytest

from harness.cli import main
from harness.ledger import Ledger, RunFilter
from harness.review import review_frame
from harness.viewer import export_site, open_server
from harness.viewer.export import EXPORT_LIST
from harness.viewer.jsdata import js_value
from harness.viewer.pages import CONTENT_POLICY, META_POLICY, PAGE_SIZE
from tests.helpers import (
    CASSETTES,
    HOSTILE_LABEL,
    HOSTILE_NAME,
    HOSTILE_TEXT,
    RUN_FLAGS,
    SCENARIO_FILE,
    assert_one_sentence_error,
    build_hostile_ledger,
    build_viewer_ledger,
    call_line,
    cli,
    text_line,
    write_cassette,
)
from tests.ledger_builders import SMALL, UNJUDGED_CHECK, add_run, build_unjudged_checks_ledger
from tests.ledger_tamper import last_run_id, rechain, tamper


@contextmanager
def served(ledger: Path):
    """The viewer of ``ledger`` served in a thread of this process; yields an HTTP client on its address."""
    server = open_server(ledger)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            yield client
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _rows(page: str) -> list[str]:
    """The run ids linked from a run-list page, in order (the link text is the first 12 characters)."""
    return re.findall(r'<a class="open" href="/run/([0-9a-zA-Z_%-]+)"[ >]', page)


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Path:
    return build_viewer_ledger(tmp_path_factory.mktemp("viewer-real"))


def _expected(ledger: Path, keep) -> list[str]:
    """Run ids (start order) of the runs for which ``keep(run, modes)`` holds, computed in Python from every turn."""
    with Ledger(ledger, readonly=True) as db:
        out = []
        for run in db.runs():
            modes = {m for t in db.turns(run.run_id) for m in t.labels}
            if keep(run, modes):
                out.append(run.run_id)
        return out


def test_run_list_filters_match_a_computation_over_every_turn(two):
    """Each filter of the run list gives the runs a plain Python reading of every run and turn gives (newest labels)."""
    cases = {
        RunFilter(failure_mode="raw_json_in_content"): lambda r, m: "raw_json_in_content" in m,
        RunFilter(failure_mode="empty_response"): lambda r, m: "empty_response" in m,
        RunFilter(model=SMALL, temperature=0.7): lambda r, m: r.start.model == SMALL and r.start.temperature == 0.7,
        RunFilter(only_failed=True): lambda r, m: r.outcome in ("task_failed", "turn_limit", "token_limit"),
        RunFilter(outcome="infra_error"): lambda r, m: r.outcome == "infra_error",
        RunFilter(failed_check="file_exists", repetition=3): lambda r, m: r.start.repetition == 3 and any(
            c["check"] == "file_exists" and not c["passed"] for c in (r.end.checks if r.end else [])),
    }  # fmt: skip
    with Ledger(two, readonly=True) as ledger:
        for f, keep in cases.items():
            rows, total = ledger.run_list(f, limit=1000)
            assert [r["run_id"] for r in rows] == _expected(two, keep), f
            assert total == len(rows) > 0, f


def test_failed_in_every_repetition_is_a_cell_without_a_pass(tmp_path):
    with Ledger(tmp_path / "l.sqlite") as ledger:
        for rep in range(3):
            add_run(ledger, f"a{rep}", model=SMALL, repetition=rep, outcome="task_failed")
            add_run(ledger, f"b{rep}", model="m2", repetition=rep, outcome="pass" if rep == 1 else "turn_limit")
        add_run(ledger, "a-infra", model=SMALL, repetition=3, outcome="infra_error")
        rows, total = ledger.run_list(RunFilter(failed_every_repetition=True))
    assert [r["run_id"] for r in rows] == ["a0", "a1", "a2", "a-infra"] and total == 4  # the whole cell is listed


def test_served_list_pages_sorts_and_filters(tmp_path):
    path = tmp_path / "l.sqlite"
    with Ledger(path) as ledger:
        for i in range(PAGE_SIZE * 2 + 7):
            add_run(ledger, f"run{i:04d}", model=SMALL if i % 3 else "ollama:other", repetition=i,
                    outcome="pass" if i % 4 else "task_failed", turns=[([], "x")] * (1 + i % 5))  # fmt: skip
    with served(path) as client:
        first = client.get("/").text
        assert "107 runs match; page 1 of 3." in first
        assert _rows(first) == [f"run{i:04d}" for i in range(PAGE_SIZE)]
        third = client.get("/", params={"page": 3}).text
        assert _rows(third) == [f"run{i:04d}" for i in range(PAGE_SIZE * 2, PAGE_SIZE * 2 + 7)]
        by_turns = _rows(client.get("/", params={"sort": "turns", "desc": "1"}).text)
        assert by_turns[:3] == ["run0004", "run0009", "run0014"]  # 5 turns each, ties in start order
        failed = client.get("/", params={"failed": "1", "model": "ollama:other"}).text
        assert _rows(failed) == [f"run{i:04d}" for i in range(0, 107, 12)]
        assert client.get("/", params={"sort": "nonsense"}).status_code == 404
        assert client.get("/", params={"temperature": "hot"}).status_code == 404


def _check_cell(page: str, run_id: str) -> tuple[str, str | None]:
    """The failed-checks cell of ``run_id``'s row on a run-list page: its text and its title (None without one),
    unescaped."""
    row = re.search(r'<tr class="[^"]*">((?:(?!</tr>).)*?href="[^"]*/' + re.escape(run_id) + r'[."])', page, re.S)
    assert row, run_id
    attrs, text = re.findall(r"<td([^>]*)>(.*?)</td>", row.group(1), re.S)[8]
    title = re.search(r'title="([^"]*)"', attrs)
    return html.unescape(text), html.unescape(title.group(1)) if title else None


def _text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def test_an_unfinished_runs_failed_checks_are_not_judged_in_the_list_the_filter_the_sort_and_the_run_page(tmp_path):
    """An interrupted run's failed checks are not judged (as the run line and ``harness review`` say): the list's cell
    says so (names in its title), the failed-check filter skips them, the sort counts 0, the run page says why."""
    path = build_unjudged_checks_ledger(tmp_path / "l.sqlite")
    unjudged = f"checks not judged (the run did not finish): file_exists, {UNJUDGED_CHECK}"
    with Ledger(path, readonly=True) as ledger:
        assert [r["run_id"] for r in ledger.run_list(RunFilter(failed_check="file_exists"))[0]] == ["b-fail"]
        assert ledger.run_list(RunFilter(failed_check=UNJUDGED_CHECK)) == ([], 0)
        rows, _ = ledger.run_list(RunFilter(), sort="failed_checks")
    assert [r["run_id"] for r in rows] == ["a-cut", "c-pass", "b-fail"]  # the interrupted run counts 0, ties in start order
    with served(path) as client:
        listed = client.get("/").text
        filtered = client.get("/", params={"check": "file_exists"}).text
        by_failed = client.get("/", params={"sort": "failed_checks", "desc": "1"}).text
        cut, failed = client.get("/run/a-cut").text, client.get("/run/b-fail").text
    assert _check_cell(listed, "a-cut") == ("not judged", unjudged)
    assert _check_cell(listed, "b-fail") == ("file_exists", None) and _check_cell(listed, "c-pass") == ("", None)
    assert "<b>only" not in listed and "names_&lt;b&gt;only&lt;/b&gt;_existing" in listed  # a check name is text
    assert _rows(filtered) == ["b-fail"] and _rows(by_failed) == ["b-fail", "a-cut", "c-pass"]
    assert unjudged in _text(cut) and "failed checks" not in _text(cut) and "<b>only" not in cut
    assert "The run did not finish (interrupted): its checks ran on what it left" in _text(cut)
    assert _text(cut).count("FAIL (not judged)") == 2
    assert "failed checks: file_exists" in _text(failed) and "not judged" not in _text(failed)
    out = tmp_path / "site"
    export_site(path, out)
    exported = _text((out / "runs" / "a-cut.html").read_text())
    assert unjudged in exported and "failed checks" not in exported and exported.count("FAIL (not judged)") == 2
    data = (out / "data" / "runs-0000.js").read_text(encoding="utf-8")
    runs = {r["run_id"]: r for r in json.loads(data.split(".concat(", 1)[1].rsplit(");", 1)[0])}
    assert runs["a-cut"]["failed_checks"] == [] and runs["a-cut"]["unjudged_checks"] == ["file_exists", UNJUDGED_CHECK]
    assert runs["b-fail"]["failed_checks"] == ["file_exists"] and runs["b-fail"]["unjudged_checks"] == []


def test_a_page_past_the_last_says_so_and_links_the_last(tmp_path):
    path = tmp_path / "l.sqlite"
    with Ledger(path) as ledger:
        for i in range(PAGE_SIZE + 1):
            add_run(ledger, f"run{i:04d}", model=SMALL, repetition=i)
    with served(path) as client:
        past = client.get("/", params={"page": 99, "model": SMALL}).text
        last = client.get("/", params={"page": 2}).text
    assert _rows(past) == [] and '51 runs match. <span id="past-end">Page 99 is past the last page (2): ' in past
    assert "page 99 of" not in past and 'id="prev"' not in past
    link = re.search(r'<a href="([^"]+)" id="last-page">go to page 2</a>', past)
    assert link and html.unescape(link.group(1)) == f"?page=2&model={SMALL}".replace(":", "%3A")
    assert _rows(last) == ["run0050"] and "past the last page" not in last


def test_icon_is_served_and_linked_and_pair_frames_hide_the_header(real, tmp_path):
    with served(real) as client:
        icon, linked = client.get("/favicon.ico"), client.get("/static/favicon.svg")
        listed = client.get("/").text
        run_id = _rows(listed)[0]
        run = client.get(f"/run/{run_id}").text
    assert f'href="/run/{run_id}" title="{run_id}">{run_id[:12]}</a>' in listed  # short id shown, full id on hover
    assert icon.status_code == linked.status_code == 200 and icon.content == linked.content
    assert icon.headers["content-type"].startswith("image/svg+xml") and icon.content.startswith(b"<svg")
    assert '<link rel="icon" type="image/svg+xml" href="/static/favicon.svg">' in run
    assert re.search(r'<span id="embed"></span>\s*<header class="top">', run)  # the #embed target right before the bar
    css = (Path(__file__).parents[1] / "harness" / "viewer" / "static" / "viewer.css").read_text()
    assert "#embed:target + header.top { display: none; }" in css
    export_site(real, tmp_path / "site")
    assert (tmp_path / "site" / "static" / "favicon.svg").read_bytes() == icon.content
    assert 'href="../static/favicon.svg"' in (tmp_path / "site" / "runs" / f"{run_id}.html").read_text()
    assert '".html#embed"' in (tmp_path / "site" / "static" / "pair.js").read_text()


def test_run_page_shows_spec_thread_calls_results_evidence_checks_and_files(real):
    with Ledger(real, readonly=True) as ledger:
        run = next(r for r in ledger.runs() if r.start.scenario == "list_and_report" and r.outcome == "task_failed")
        pair = next(r for r in ledger.runs() if r.start.scenario == "list_and_report" and r.outcome == "pass"
                    and r.start.repetition == run.start.repetition)  # fmt: skip
    with served(real) as client:
        raw = client.get(f"/run/{run.run_id}").text
        page = html.unescape(re.sub(r"<[^>]+>", "", raw))
        listed = client.get("/", params={"mode": "fabricated_tool_result", "scenario": "list_and_report"}).text
        pair_page = client.get("/pair", params={"a": run.run_id, "b": pair.run_id}).text
    assert run.run_id in _rows(listed) and pair.run_id not in _rows(listed)
    for expected in ("What it does", "List the files in the working directory", "Done looks like",  # the spec
                     "tool call list_files", '"config.json", "hello.txt", "memo.md"',  # a call and its result
                     "tool call write_file", "wrote 48 bytes to report.txt",
                     "fabricated_tool_result", 'tool output or tool-only facts that no tool returned', '["echo.txt"]',  # evidence
                     "file_names_only_existing", "FAIL", "names files that do not exist: ['echo.txt']",  # checks
                     "report.txt", "There are 3 files:\nconfig.json\necho.txt\nmemo.md",  # the sandbox's final file
                     "Done: report.txt lists the 3 files."):  # fmt: skip
        assert expected in page, expected
    assert raw.count('<div class="call">') == 2  # list_files and write_file, each beside its result
    assert f'href="/pair?a={run.run_id}&amp;b={pair.run_id}"' in raw
    assert f'src="/run/{run.run_id}#embed"' in pair_page and f'src="/run/{pair.run_id}#embed"' in pair_page


def test_recovery_step_and_breach_are_shown(tmp_path):
    """A call recovered from text shows the recovery step that produced it; a run the breaker stopped shows the breach."""
    recovered = json.dumps({"name": "list_files", "arguments": {"path": "."}})
    cassette = write_cassette(
        tmp_path / "loop.jsonl", [text_line(recovered)] + [call_line("read_file", {"path": f"f{i}.txt"}) for i in range(12)]
    )
    path = tmp_path / "ledger.sqlite"
    assert (
        main(["run", str(SCENARIO_FILE), "--model", f"replay:{cassette}", "--ledger", str(path), "--repeats", "1", *RUN_FLAGS])
        == 0
    )
    with Ledger(path, readonly=True) as ledger:
        [run] = ledger.runs()
        step = ledger.turns(run.run_id)[0].record.recovered_by
    assert step and run.outcome == "turn_limit" and run.end.breach
    with served(path) as client:
        page = client.get(f"/run/{run.run_id}").text
    assert f'recovered by <span class="recovery">{step}</span>' in page
    breach = page.split('id="breach">', 1)[1].split("</pre>", 1)[0]
    assert html.unescape(breach) == json.dumps(run.end.breach, indent=2, sort_keys=True)


def test_hostile_model_output_is_escaped_everywhere(tmp_path):
    path = build_hostile_ledger(tmp_path)
    with Ledger(path, readonly=True) as ledger:
        run_id = ledger.runs()[0].run_id
    with served(path) as client:
        pages = {"list": client.get("/").text, "filtered": client.get("/", params={"mode": "raw_json_in_content"}).text,
                 "run": client.get(f"/run/{run_id}").text}  # fmt: skip
        assert "script-src 'self'" in client.get("/").headers["content-security-policy"]
    out = tmp_path / "site"
    export_site(path, out)
    pages |= {"export list": (out / "index.html").read_text(), "export run": (out / "runs" / f"{run_id}.html").read_text()}
    for name, page in pages.items():
        for raw in ("<script>window", "<img src=x", "<svg", "</script><script>", 'href="javascript:'):
            assert raw not in page, (name, raw)
        assert page.count("<script") == (2 if name == "export list" else 0), name  # only our own script files
    run_page = pages["run"]
    for text in (HOSTILE_TEXT, HOSTILE_NAME, HOSTILE_LABEL, "document.title='pwned'"):
        assert text in html.unescape(run_page) and text not in run_page, text  # shown, as text
    assert "[x](javascript:window.__pwned=5)" in run_page  # plain text in the reply, never a link
    assert 'recovered by <span class="recovery">' in run_page  # the recovered write_file call
    data = (out / "data" / "runs-0000.js").read_text(encoding="utf-8")
    assert "</script" not in data.lower() and "<" not in data and "\u2028" not in data
    [row] = json.loads(data.split(".concat(", 1)[1].rsplit(");", 1)[0])
    assert HOSTILE_LABEL in row["failure_modes"] and "<img" in row["model"]  # the text itself survives, escaped


def test_script_data_escapes_closing_tags_and_line_separators():
    text = js_value({"a": "</script><!-- \u2028\u2029 & é"})
    assert re.fullmatch(r"[\x20-\x7e]+", text) and "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"a": "</script><!-- \u2028\u2029 & é"}


def test_sandbox_links_are_listed_never_followed(tmp_path):
    path = build_viewer_ledger(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-OUTSIDE", encoding="utf-8")
    with Ledger(path, readonly=True) as ledger:
        run = next(r for r in ledger.runs() if r.start.scenario == "list_and_report")
        other = next(r for r in ledger.runs() if r.run_id != run.run_id)
    sandbox = Path(run.start.sandbox)
    (sandbox / "link.txt").symlink_to(secret)
    (sandbox / "dir-link").symlink_to(tmp_path)
    other_box = Path(other.start.sandbox)
    os.rename(other_box, other_box.with_name("moved"))
    other_box.symlink_to(other_box.with_name("moved"))  # the sandbox folder itself is a link now
    with served(path) as client:
        page = client.get(f"/run/{run.run_id}").text
        other_page = client.get(f"/run/{other.run_id}").text
    assert "TOP-SECRET-OUTSIDE" not in page and "not followed" in page and "dir-link" in page
    assert "hello.txt" in page and "not a plain folder" in other_page and "config.json" not in other_page.split("final files")[1]


def test_a_file_name_that_is_not_utf8_shows_served_and_exported(tmp_path):
    # JSON lets a model send a lone surrogate; the sandbox writes it as the byte 0xFF, a name no page can encode as is
    cassette = write_cassette(tmp_path / "odd.jsonl", [
        call_line("write_file", {"path": "\udcff<b>.txt", "content": "odd name"}),
        call_line("write_file", {"path": "good.txt", "content": "fine"}),
        text_line("done"),
    ])  # fmt: skip
    path = tmp_path / "ledger.sqlite"
    assert main(["run", str(SCENARIO_FILE), "--model", f"replay:{cassette}", "--ledger", str(path), *RUN_FLAGS]) == 0
    with Ledger(path, readonly=True) as ledger:
        run = ledger.runs()[0]
    assert b"\xff<b>.txt" in os.listdir(os.fsencode(run.start.sandbox))
    with served(path) as client:
        page = client.get(f"/run/{run.run_id}")
    assert page.status_code == 200 and "\ufffd&lt;b&gt;.txt" in page.text and "odd name" in page.text
    export_site(path, tmp_path / "site")
    exported = (tmp_path / "site" / "runs" / f"{run.run_id}.html").read_text(encoding="utf-8")
    assert "\ufffd&lt;b&gt;.txt" in exported and "good.txt" in exported


def test_unknown_paths_and_runs_are_not_found(real):
    with served(real) as client:
        for path in ("/run/nope", "/static/../pages.py", "/static/%2e%2e/pages.py", "/etc/passwd", "/pair?a=x&b=y", "/pair"):
            reply = client.get(path)
            assert reply.status_code == 404, path
        assert client.post("/").status_code == 501
        rebound = client.get("/", headers={"Host": "attacker.example:80"})
        assert rebound.status_code == 421 and "run0" not in rebound.text and "<tr class" not in rebound.text


def test_numbers_past_sqlite_integers_are_a_bad_request_not_a_dropped_connection(real):
    huge = "9" * 25
    with served(real) as client:
        for query, word in (("page", "page"), ("repetition", "repetition"), ("stream", "stream")):
            reply = client.get(f"/?{query}={huge}")
            assert reply.status_code == 404 and "out of range" in reply.text and word in reply.text, query
        assert client.get(f"/?page={2**63 // 50}").status_code == 200  # the last page SQLite can reach still answers
        assert client.get("/?repetition=-1&page=-3").status_code == 200


def test_export_writes_pages_and_paged_data_that_need_no_server(real, tmp_path):
    out = tmp_path / "site"
    summary = export_site(real, out, chunk_runs=7)
    with Ledger(real, readonly=True) as ledger:
        ids = [r.run_id for r in ledger.runs()]
    assert summary.runs == len(ids) and summary.data_files == -(-len(ids) // 7)
    assert sorted(p.stem for p in (out / "runs").glob("*.html")) == sorted(ids)
    manifest = (out / "data" / "manifest.js").read_text()
    assert manifest.startswith("window.VIEWER_MANIFEST = ") and '"data/runs-0000.js"' in manifest
    for page in [out / "index.html", out / "pair.html", *(out / "runs").glob("*.html")]:
        text = page.read_text()
        assert (
            "http://" not in text
            and "https://" not in text
            and "//" not in re.sub(r"https?://|<!--.*?-->", "", text).replace("://", "")
        )


def test_bad_input_is_one_sentence(tmp_path, capsys, real):
    rc, _, err = cli(capsys, "view", "--ledger", str(tmp_path / "missing.sqlite"))
    assert_one_sentence_error(rc, err)
    assert "no ledger" in err
    (tmp_path / "a-file").write_text("x")
    rc, _, err = cli(capsys, "view", "--ledger", str(real), "--export", str(tmp_path / "a-file"))
    assert_one_sentence_error(rc, err)
    assert "is a file" in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        rc, _, err = cli(capsys, "view", "--ledger", str(real), "--port", str(taken.getsockname()[1]))
    assert_one_sentence_error(rc, err)
    assert "in use" in err
    rc, _, err = cli(capsys, "view", "--ledger", str(real), "--port", "70000")
    assert_one_sentence_error(rc, err)


def test_exported_pages_carry_the_policy_as_a_meta_tag_and_served_ones_as_a_header(real, tmp_path):
    export_site(real, tmp_path / "site")
    meta = f'<meta http-equiv="Content-Security-Policy" content="{markupsafe.escape(META_POLICY)}">'
    pages = [tmp_path / "site" / "index.html", tmp_path / "site" / "pair.html", *(tmp_path / "site" / "runs").glob("*.html")]
    assert len(pages) > 2 and all(meta in page.read_text() for page in pages)
    assert "frame-ancestors" not in META_POLICY and "script-src 'self'" in META_POLICY
    with served(real) as client:
        answer = client.get("/")
    assert answer.headers["content-security-policy"] == CONTENT_POLICY and "Content-Security-Policy" not in answer.text


def test_re_export_leaves_no_page_of_a_run_the_ledger_does_not_hold(real, tmp_path):
    out, other = tmp_path / "site", tmp_path / "other.sqlite"
    with Ledger(other) as ledger:  # an earlier export, of another ledger: its run is not in the new one
        add_run(ledger, "gone-run", model=SMALL)
    export_site(other, out, chunk_runs=1)
    (out / "data" / "runs-0099.js").write_text("window.RUNS = [];")  # as an earlier export had left it, listed
    with (out / EXPORT_LIST).open("a") as listing:
        listing.write("data/runs-0099.js\n../outside.html\nindex.html\n")  # an edited list: only its pages count
    (tmp_path / "outside.html").write_text("not the export's")
    # newcomer (stop 29): the user's own files beside an export, even named like its pages, were deleted
    mine = {"notes.txt": "the user's own file", "runs/notes.html": "mine", "data/mine.js": "mine too"}
    for name, text in mine.items():
        (out / name).write_text(text)
    export_site(real, out)
    with Ledger(real, readonly=True) as ledger:
        ids = sorted(r.run_id for r in ledger.runs())
    assert sorted(p.stem for p in (out / "runs").glob("*.html")) == sorted([*ids, "notes"])
    assert sorted(p.name for p in (out / "data").glob("runs-*.js")) == ["runs-0000.js"]
    assert {name: (out / name).read_text() for name in mine} == mine and (tmp_path / "outside.html").exists()
    assert sorted((out / EXPORT_LIST).read_text().splitlines()) == sorted([*(f"runs/{i}.html" for i in ids), "data/runs-0000.js"])


def test_a_silent_connection_is_closed_and_the_server_still_answers(real):
    server = open_server(real, idle_timeout=0.5)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with socket.create_connection(server.server_address[:2], timeout=20) as slow:
            slow.sendall(b"GET / HT")  # half a request line, then nothing
            assert slow.recv(1024) == b""  # closed by the server, long before the client's 20 s
        assert httpx.get(server.url, timeout=20).status_code == 200
    finally:
        server.shutdown()
        server.server_close()


def test_a_trickling_connection_is_closed_within_the_idle_timeout(real):
    """Found by red22: the idle timeout was a socket timeout per read, so a client sending a byte every 0.3 s kept
    its connection (and a server thread) past a 0.5 s timeout for as long as it liked."""
    server = open_server(real, idle_timeout=0.5)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with socket.create_connection(server.server_address[:2], timeout=20) as slow:
            started, closed = time.monotonic(), False
            for byte in b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 40:
                try:
                    slow.sendall(bytes([byte]))
                except OSError:
                    closed = True
                    break
                time.sleep(0.3)
            assert closed and time.monotonic() - started < 5
        assert httpx.get(server.url, timeout=20).status_code == 200
    finally:
        server.shutdown()
        server.server_close()


# red team (stop 29): an edited ``passed`` value (a string, null, missing) split the cell from the filter and the sort
def test_the_failed_checks_cell_counts_what_the_filter_and_the_sort_count(tmp_path):
    path = tmp_path / "l.sqlite"
    odd = [{"check": name, "passed": value} for name, value in
           [("str_false", "false"), ("zero", 0), ("null", None), ("empty", ""), ("str_true", "true"), ("false", False)]]  # fmt: skip
    with Ledger(path) as ledger:
        add_run(ledger, "odd", model=SMALL, repetition=0, outcome="task_failed", checks=[*odd, {"check": "missing"}])
        add_run(ledger, "none", model=SMALL, repetition=1, outcome="task_failed", checks=[])
    with Ledger(path, readonly=True) as ledger:
        [row], _ = ledger.run_list(RunFilter(repetition=0))
        by_filter = [c for c in ("str_false", "zero", "null", "empty", "str_true", "false", "missing")
                     if ledger.run_list(RunFilter(failed_check=c))[1]]  # fmt: skip
        ascending = [r["run_id"] for r in ledger.run_list(RunFilter(), sort="failed_checks")[0]]
    # one rule (harness.ledger.check_failed): a check passed only when ``passed`` is JSON true
    assert row["failed_checks"] == by_filter == ["str_false", "zero", "null", "empty", "str_true", "false", "missing"]
    assert ascending == ["none", "odd"]


ODD_PASSED = {"true": True, "str_false": "false", "zero": 0, "one": 1, "str_true": "true", "null": None, "false": False}
"""Edited ``passed`` values of a run's done checks (plus ``missing``, a check without one): only JSON true passed."""


def test_the_run_page_the_list_the_review_and_the_export_agree_on_an_edited_passed_value(tmp_path):
    """A real run whose end row was edited (checks with odd ``passed`` values, the chain recomputed as a careful
    forger would): the run page's pass/FAIL column showed ``"false"`` as passed (truthiness) while the list counted it
    failed, and ``null``/missing the other way round; every reader now uses ``harness.ledger.check_failed``."""
    path = tmp_path / "ledger.sqlite"
    cassette = CASSETTES / "list_and_report" / "ideal.jsonl"
    assert main(["run", str(SCENARIO_FILE), "--model", f"replay:{cassette}", "--ledger", str(path), "--repeats", "1",
                 *RUN_FLAGS]) == 0  # fmt: skip
    checks = [*({"check": k, "passed": v, "detail": ""} for k, v in ODD_PASSED.items()), {"check": "missing", "detail": ""}]
    tamper(path, f"UPDATE run_ends SET checks = '{json.dumps(checks)}'")
    rechain(path, "run_ends")
    run_id = last_run_id(path)
    with Ledger(path, readonly=True) as ledger:
        assert ledger.verify().ok and ledger.runs()[0].outcome == "pass"
        [row], _ = ledger.run_list(RunFilter())
        by_filter = [c["check"] for c in checks if ledger.run_list(RunFilter(failed_check=c["check"]))[1]]
        exported = ledger.export_run_rows()[0]
    with served(path) as client:
        listed, page = client.get("/").text, client.get(f"/run/{run_id}").text
    table = page.split('id="checks"', 1)[1].split("</table>", 1)[0]
    shown = re.findall(r'<tr class="(pass|fail)"><td>([^<]*)</td><td>(pass|FAIL)</td>', table)
    assert [c for _, c, _ in shown] == [c["check"] for c in checks]
    seen = {
        "run page": [c for cls, c, text in shown if (cls, text) == ("fail", "FAIL")],
        "list cell": _check_cell(listed, run_id)[0].split(", "), "list row": row["failed_checks"], "filter": by_filter,
        "export": exported["checks_failed"],
        "review": [c["check"] for c in review_frame(path, run_id)["acceptance"] if not c["passed"]],
    }  # fmt: skip
    assert all(names == seen["run page"] for names in seen.values()), seen
    assert seen["run page"] == [c["check"] for c in checks if c["check"] != "true"]  # only JSON true passed
    assert exported["checks_passed"] == ["true"] and f"failed checks: {', '.join(seen['run page'])}" in _text(page)


def test_a_run_stopped_before_any_check_ran_is_not_judged_in_the_list(tmp_path):
    """A run interrupted at turn 0 (no check ran) and a run with no end row showed an empty checks cell; like any run
    whose outcome is not scored they are "not judged" (list.js: tests/test_viewer_browser.py)."""
    path = build_unjudged_checks_ledger(tmp_path / "l.sqlite")
    with Ledger(path) as ledger:
        add_run(ledger, "d-cut0", model=SMALL, repetition=3, outcome="interrupted", turns=[], checks=[])
        add_run(ledger, "e-open", model=SMALL, repetition=4, outcome=None)
    with served(path) as client:
        listed = client.get("/").text
    title = "checks not judged (the run did not finish)"
    assert _check_cell(listed, "d-cut0") == _check_cell(listed, "e-open") == ("not judged", title)
    assert _check_cell(listed, "a-cut") == ("not judged", f"{title}: file_exists, {UNJUDGED_CHECK}")
    assert _check_cell(listed, "c-pass") == ("", None)
    with Ledger(path, readonly=True) as ledger:  # what list.js reads from an export's data files
        rows = {r["run_id"]: r for r in ledger.run_list(RunFilter())[0]}
    assert [r for r in rows if not rows[r]["judged"]] == ["a-cut", "d-cut0", "e-open"]


def test_the_failed_check_filter_offers_only_checks_that_failed_in_a_judged_run(tmp_path):
    """The filter offered every check name of every end row, among them one that failed only in an interrupted run
    (not judged) and one that never failed: choosing either showed no run."""
    path = build_unjudged_checks_ledger(tmp_path / "l.sqlite")
    with Ledger(path) as ledger:
        add_run(ledger, "d-pass", model=SMALL, repetition=3, outcome="pass",
                checks=[{"check": "never_failed", "passed": True, "detail": ""}])  # fmt: skip
    with Ledger(path, readonly=True) as ledger:
        offered = ledger.list_choices()["check"]
        assert [c for c in offered if not ledger.run_list(RunFilter(failed_check=c))[1]] == []  # each finds a run
    assert offered == ["file_exists"]
    with served(path) as client:
        listed = client.get("/").text
    select = listed.split('id="f-check"', 1)[1].split("</select>", 1)[0]
    assert re.findall(r'<option value="([^"]*)"', select) == ["", "file_exists"]


def test_a_check_item_that_is_not_an_object_does_not_break_the_list(tmp_path):
    """helper (this stop): a string among a run's stored checks made ``json_extract`` fail on it, so the run list, its
    failed-check choices and filter raised 'malformed JSON' and the whole list page failed."""
    path = tmp_path / "l.sqlite"
    with Ledger(path) as ledger:
        add_run(ledger, "odd", model=SMALL, outcome="task_failed", checks=["abc", {"check": "x", "passed": False, "detail": ""}])
        add_run(ledger, "plain", model=SMALL, repetition=1, outcome="pass")
    with Ledger(path, readonly=True) as ledger:
        assert ledger.list_choices()["check"] == ["x"]
        assert [r["run_id"] for r in ledger.run_list(RunFilter(failed_check="x"))[0]] == ["odd"]
        assert sorted(r["run_id"] for r in ledger.run_list(RunFilter())[0]) == ["odd", "plain"]
    with served(path) as client:
        listed = client.get("/")
        assert listed.status_code == 200 and _check_cell(listed.text, "odd")[0] == "x"


def test_checks_nested_past_pythons_stack_are_a_sentence_not_a_traceback(tmp_path, capsys):
    """red team (this stop): an edited ledger whose checks nest 5,000 arrays deep (the chain recomputed) made the served
    list drop the connection and review, export, report and the static export end in a RecursionError traceback."""
    path = tmp_path / "l.sqlite"
    with Ledger(path) as ledger:
        add_run(ledger, "deep", model=SMALL, outcome="task_failed")
        add_run(ledger, "plain", model=SMALL, repetition=1, outcome="pass")
    deep = '[{"check":"d","passed":false,"detail":' + "[" * 5000 + "]" * 5000 + "}]"
    tamper(path, f"UPDATE run_ends SET checks = '{deep}' WHERE run_id = 'deep'")
    rechain(path, "run_ends")
    with Ledger(path, readonly=True) as ledger:
        assert ledger.verify().ok and sorted(r["run_id"] for r in ledger.run_list(RunFilter())[0]) == ["deep", "plain"]
        assert [r["run_id"] for r in ledger.export_run_rows()] == ["deep", "plain"]
    with served(path) as client:
        assert client.get("/").status_code == 200 and client.get("/?sort=failed_checks").status_code == 200
        page = client.get("/run/deep")
        assert page.status_code == 500 and "checks that is not JSON" in page.text  # the run page's clean refusal
    assert cli(capsys, "report", "--ledger", path, "--out", tmp_path / "r")[0] == 0
    for argv in (("review", "deep"), ("view", "--export", tmp_path / "site")):
        rc, _, err = cli(capsys, *argv, "--ledger", path)
        assert_one_sentence_error(rc, err)
        assert "not JSON" in err, err


_ODD_CHECKS = {  # run id -> the run_ends.checks text written behind the harness's back (then the chain recomputed)
    "dup-key": '[{"check":"dk","passed":false,"passed":true,"detail":""}]',
    "object": '{"a":{"check":"oc","passed":false,"detail":""}}',
    "nan": '[{"check":"nan","passed":false,"detail":NaN}]',
    "number": '[{"check":5,"passed":false,"detail":""}]',
}


def test_the_list_cell_the_filter_and_the_dropdown_follow_one_rule(tmp_path):
    """red team (this stop): ``_list_row`` (Python's json: last duplicate key wins, NaN accepted, a non-list is no checks, names str()-ed)
    and the SQL of the filter, sort and dropdown (SQLite's json: first key wins, NaN invalid, json_each walks an
    object's values, names keep their JSON type) disagree: the filter finds runs whose cell names no failed check, a
    cell names a failure the filter cannot find, and the dropdown offers names that find nothing when picked."""
    path = tmp_path / "l.sqlite"
    with Ledger(path) as opened:
        for i, run_id in enumerate(_ODD_CHECKS):
            add_run(opened, run_id, model=SMALL, repetition=i, outcome="task_failed", checks=[])
    tamper(path, *(f"UPDATE run_ends SET checks = '{text}' WHERE run_id = '{run_id}'" for run_id, text in _ODD_CHECKS.items()))
    rechain(path, "run_ends")
    disagreements = []
    with Ledger(path, readonly=True) as opened:
        rows, _ = opened.run_list(RunFilter(), limit=100)
        cells = {row["run_id"]: row["failed_checks"] for row in rows}
        for name in opened.list_choices()["check"]:
            found = [row["run_id"] for row in opened.run_list(RunFilter(failed_check=str(name)))[0]]
            if not found:
                disagreements.append(f"the dropdown offers {name!r}, which finds no run")
            disagreements += [f"{name!r} finds {r}, whose cell says {cells[r]}" for r in found if str(name) not in cells[r]]
        for run_id, failed in cells.items():
            for name in failed:
                if run_id not in [row["run_id"] for row in opened.run_list(RunFilter(failed_check=name))[0]]:
                    disagreements.append(f"{run_id}'s cell names {name!r}, which the filter does not find")
    assert disagreements == [], json.dumps(disagreements, indent=1)


_ODD_NAMES = {
    "object": '[{"check":{"b":"c"},"passed":false}]',
    "array": '[{"check":[["a"]],"passed":false}]',
}


def _odd_ledger(path: Path, odd: dict[str, str]) -> None:
    with Ledger(path) as opened:
        for i, run_id in enumerate(odd):
            add_run(opened, run_id, model=SMALL, repetition=i, outcome="task_failed", checks=[])
    tamper(path, *(f"UPDATE run_ends SET checks = '{text}' WHERE run_id = '{run_id}'" for run_id, text in odd.items()))
    rechain(path, "run_ends")


def test_a_json_object_or_array_name_reads_the_same_in_the_cell_and_the_dropdown(tmp_path):
    """red team (this stop): CHECK_NAME_SQL's CAST kept json_extract's JSON subtype, so json_group_array embeds the name as JSON and
    _list_row str()s the decoded dict: the cell said {'b': 'c'} while the dropdown and filter said {"b":"c"}."""
    path = tmp_path / "l.sqlite"
    _odd_ledger(path, _ODD_NAMES)
    with Ledger(path, readonly=True) as opened:
        cells = {row["run_id"]: row["failed_checks"] for row in opened.run_list(RunFilter())[0]}
        choices = opened.list_choices()["check"]
    assert sorted(name for names in cells.values() for name in names) == sorted(choices), (cells, choices)
