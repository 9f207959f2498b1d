"""Red-team round 2: reports, compare, review/attest, the matrix runner, rescore and the
scenario library's data tools and checks.

The rules these tests hold the harness to (README, docs/reports.md, docs/scenarios.md):

* bad input gets one clear sentence and a non-zero exit, never a traceback;
* every started run ends with an outcome; a matrix runs each planned identity once;
* reports give correct numbers and markdown that no stored name can break; the same ledger
  gives the same bytes; a review frame depends on the run, not on where you stand;
* a done check gives a verdict in bounded time, and the verdict matches its documented meaning.

The first part holds the FINDINGS (tests that fail on the code as reviewed, one ``# FINDING n``
comment each); the second part guards attacks that were handled correctly.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ledger_builders import BIG, SMALL, add_run, build_two_model_ledger

from harness.backends import open_backend
from harness.checks import CheckContext, evaluate_checks
from harness.cli import main
from harness.ledger import Ledger, RunStart, TurnRecord
from harness.loop import RunOptions
from harness.matrix import MatrixOverrides
from harness.report import compare_models, format_comparison, load_frames, summary_table, write_report
from harness.runner import expand_matrix, run_matrix
from harness.scenarios import load_scenario
from harness.stats import mcnemar_midp, newcombe_paired_diff, pass_hat_k, wilson_interval
from tests.fake_agent_server import FakeAgentServer
from tests.helpers import IDEAL, REPO, SCENARIO_FILE, write_cassette

RUN_FLAGS = ["--temperature", "0", "--tool-mode", "native", "--parser", "lenient"]


# -- helpers -----------------------------------------------------------------------------------------
def _plans(model: str, repeats: int):
    return expand_matrix([load_scenario(SCENARIO_FILE)], MatrixOverrides([model], [0.0], repeats, None, ["native"], ["lenient"]))


def _unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line))


def _broken_tables(markdown: str) -> list[str]:
    """Lines of a markdown table block whose cell count differs from the block's header."""
    bad, header = [], None
    for line in markdown.splitlines():
        if line.startswith("|"):
            if header is None:
                header = _unescaped_pipes(line)
            elif _unescaped_pipes(line) != header:
                bad.append(line)
        else:
            if header is not None and line.strip():
                bad.append(line)  # a table row split by a newline continues as a non-table line
            header = None
    return bad


def _run_start(run_id: str, config) -> RunStart:
    return RunStart(
        run_id=run_id, identity="i-" + run_id, scenario="s", scenario_path="s.toml", scenario_hash="h", model="m",
        backend="replay", base_url=None, server_version=None, model_digest=None, temperature=0.0, seed=0, max_tokens=64,
        num_ctx=2048, tool_mode="native", parser="lenient", repetition=0, turn_limit=8, token_limit=1000,
        harness_version="x", git_sha=None, git_dirty=None, sandbox="/tmp/x", config=config,
    )  # fmt: skip


def _turn(run_id: str, executed=None) -> TurnRecord:
    return TurnRecord(
        run_id=run_id, turn=1, request_hash="x", raw_reply=None, content='{"name": "list_files", "arguments": {}}',
        tool_calls=None, recovered_calls=[], executed_calls=executed or [], failure_modes=[], recovered_by=None,
        classifier_version="0", finish_reason="stop", prompt_tokens=1, completion_tokens=1, latency_ms=None,
        started_at="a", ended_at="b",
    )  # fmt: skip


def _check(tmp_path: Path, content: str | bytes, check: dict, name: str = "out.txt"):
    target = tmp_path / "sb" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    [result] = evaluate_checks([check], CheckContext(tmp_path / "sb", (), (name,), None, 0))
    return result


# =====================================================================================================
# FINDINGS: these fail on the code as reviewed
# =====================================================================================================


# FINDING 1
def test_report_failure_mode_names_cannot_break_the_markdown_tables(tmp_path):
    """A label that is not a canonical mode name (a rescore by another classifier, a hand-written
    labels row) goes into the failure-mode table unescaped: `|` adds a column, a newline splits the row."""
    ledger = tmp_path / "l.sqlite"
    with Ledger(ledger) as led:
        add_run(led, "a", model=SMALL, turns=[(["raw|json\nnext`x"], "reply")], outcome="task_failed")
        add_run(led, "b", model=BIG, turns=[(["code_fence"], "x")])
    write_report(ledger, tmp_path / "out", formats=["md"])
    text = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert _broken_tables(text) == []


# FINDING 1
def test_report_names_outside_tables_are_escaped_too(tmp_path):
    """Scenario and model names are escaped inside tables (_cell_text) but not in the
    'Same in every row' line, the shortest-reply bullets, the edge notes and the rescue lines:
    a newline in a name starts a new markdown block, a backtick closes the code span."""
    ledger = tmp_path / "l.sqlite"
    scenario, model = "sc\n# injected heading `", "ollama:m\n# injected heading"
    with Ledger(ledger) as led:
        add_run(led, "a", model=model, scenario=scenario, turns=[(["code_fence"], "x")])
        add_run(led, "b", model="ollama:other", scenario=scenario, repetition=1, turns=[([], "y")])
    write_report(ledger, tmp_path / "out", formats=["md"])
    text = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "\n# injected heading" not in text


# FINDING 2
def test_compare_table_survives_pipes_and_newlines_in_model_names(tmp_path):
    """``harness compare`` builds its table with the model specs as column headers, unescaped; a
    replay cassette path or an OpenAI model name with `|` (legal in both) shifts every column."""
    ledger = tmp_path / "l.sqlite"
    a, b = "replay:cassettes/a|b.jsonl", "openai:team|model@http://127.0.0.1:9/v1"
    with Ledger(ledger) as led:
        for rep in range(4):
            add_run(led, f"a{rep}", model=a, repetition=rep, outcome="pass", turns=[(["mode|x"], "t")])
            add_run(led, f"b{rep}", model=b, repetition=rep, outcome="task_failed" if rep else "pass")
    text = format_comparison(compare_models(load_frames(ledger), a, b))
    assert _broken_tables(text) == []


# FINDING 3
def test_a_backend_bug_leaves_no_run_without_an_end_row(tmp_path):
    """A backend raising something other than BackendError inside generate (a bug in a backend,
    an unexpected body shape, a KeyError in a client library) escapes run_once: that run never
    gets an end row (it stays 'unfinished' forever) and every other run in flight is recorded as
    'interrupted by the user', which the user did not do. The CLI then prints a traceback."""
    cassette = write_cassette(tmp_path / "c.jsonl", IDEAL)
    calls = {"n": 0}
    lock = threading.Lock()

    class Buggy:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def for_run(self):
            return Buggy(self.inner.for_run())

        def generate(self, *args, **kwargs):
            with lock:
                calls["n"] += 1
                n = calls["n"]
            if n == 2:
                raise KeyError("choices")  # a bug, not a BackendError
            time.sleep(0.3)
            return self.inner.generate(*args, **kwargs)

    def factory(spec, **kw):
        return Buggy(open_backend(spec, **kw))

    with Ledger(tmp_path / "l.sqlite") as ledger:
        try:
            run_matrix(
                _plans(f"replay:{cassette}", 4), ledger, RunOptions(runs_dir=tmp_path / "runs", jobs=2), backend_factory=factory
            )
        except Exception:
            pass  # raising is acceptable; what the ledger says is not
        runs = ledger.runs()
    assert runs, "no run was recorded at all"
    assert [r.run_id for r in runs if r.outcome is None] == []
    assert not any(r.end.error == "interrupted by the user" for r in runs)


# FINDING 4
def test_two_matrices_on_one_ledger_do_not_run_each_identity_twice(tmp_path):
    """Two `harness run` processes started on one ledger (two terminals, a CI retry) both read the
    finished identities before either starts a run, so every planned run is executed twice; the
    report then counts the copies as independent samples (n = 8 for 4 planned runs). README:
    'completes exactly the planned set'. Threads with their own Ledger connection stand in for
    the two processes; the barrier makes the race deterministic."""
    cassette = write_cassette(tmp_path / "c.jsonl", IDEAL)
    plans = _plans(f"replay:{cassette}", 4)
    barrier = threading.Barrier(2)

    def factory(spec, **kw):
        barrier.wait(10)  # both matrices have planned before either runs
        return open_backend(spec, **kw)

    Ledger(tmp_path / "l.sqlite").close()

    def one_matrix():
        with Ledger(tmp_path / "l.sqlite") as ledger:
            run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs", jobs=2), backend_factory=factory)

    threads = [threading.Thread(target=one_matrix) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    with Ledger(tmp_path / "l.sqlite") as ledger:
        per_identity = ledger.finished_identities()
    assert sorted(per_identity.values()) == [1, 1, 1, 1]


# FINDING 5
def test_the_same_scenario_given_twice_runs_once(tmp_path, capsys):
    """`harness run s.toml ./s.toml` (or a shell glob that matches a file twice) plans every run
    twice with the same identity, and both copies run: the ledger holds duplicates."""
    cassette = write_cassette(tmp_path / "c.jsonl", IDEAL)
    scenario = tmp_path / "s.toml"
    scenario.write_bytes(SCENARIO_FILE.read_bytes())
    main(["run", "s.toml", "./s.toml", "--model", f"replay:{cassette}", "--repeats", "2", *RUN_FLAGS])
    with Ledger(tmp_path / "results" / "ledger.sqlite") as ledger:
        runs = ledger.runs()
    assert len(runs) == len({r.start.identity for r in runs}) == 2


# FINDING 6
def test_cached_replies_do_not_count_as_zero_millisecond_latency(tmp_path, capsys):
    """`--cache --no-resume` re-runs a matrix from recorded replies and stores each cached turn
    with latency_ms = 0.0; the report's per-turn latency p50 then drops to 0 ms although every real
    request took ~50 ms. A cache hit has no latency: it should be NULL (or left out of the
    percentiles), like any other measurement that was not taken."""
    scenario = tmp_path / "s.toml"
    scenario.write_bytes(SCENARIO_FILE.read_bytes())
    with FakeAgentServer(delay_s=0.05) as server:
        argv = ["run", "s.toml", "--model", f"openai:ideal@{server.base_url}", "--repeats", "1", *RUN_FLAGS]
        assert main(argv) == 0
        assert main([*argv, "--cache", "--no-resume"]) == 0
        assert main([*argv, "--cache", "--no-resume"]) == 0
    [row] = summary_table(load_frames(tmp_path / "results" / "ledger.sqlite")).to_dict("records")
    assert row["latency_p50_ms"] >= 40, row


# FINDING 7
@pytest.mark.parametrize("config, executed", [
    ({"system_prompt": "s"}, None),                                   # prompts stored without the task
    (["not", "an", "object"], None),                                  # config is not an object
    ({"system_prompt": "s", "task": "t"}, [{"name": "list_files"}]),  # an executed call without its fields
], ids=["config-without-task", "config-not-object", "executed-call-without-fields"])  # fmt: skip
def test_rescore_of_a_run_with_incomplete_records_is_not_a_traceback(tmp_path, capsys, config, executed):
    """rescore rebuilds histories with `config["task"]`, `config.get(...)` and `c["arguments"]`
    unguarded: a run recorded by another tool or an older harness crashes the whole rescore
    (KeyError / AttributeError traceback) and no other run is relabelled. README: a damaged ledger
    is one sentence, never a traceback."""
    ledger = tmp_path / "l.sqlite"
    with Ledger(ledger) as led:
        led.start_run(_run_start("bad", config))
        led.record_turn(_turn("bad", executed))
    code = main(["rescore", "--ledger", str(ledger)])  # must not raise
    assert code in (0, 1)


# FINDING 8
def test_review_verify_does_not_depend_on_the_working_directory(tmp_path, monkeypatch, capsys):
    """The frame's promise resolves the run's relative scenario_path against the current folder
    (and the ledger's grandparent). Attest in the project, then `review --verify` from any other
    folder: the frame says 'the scenario file s.toml is gone', its SHA-256 differs, and verify
    reports the frame CHANGED (exit 1) although nothing changed."""
    project, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "s.toml").write_bytes(SCENARIO_FILE.read_bytes())
    cassette = write_cassette(project / "c.jsonl", IDEAL)
    ledger = project / "data" / "deep" / "ledger.sqlite"
    monkeypatch.chdir(project)
    assert main(["run", "s.toml", "--model", f"replay:{cassette}", "--repeats", "1", "--ledger", str(ledger), *RUN_FLAGS]) == 0
    with Ledger(ledger) as led:
        run_id = led.runs()[0].run_id
    assert main(["attest", run_id, "--reviewer", "alice", "--ledger", str(ledger)]) == 0
    assert main(["review", run_id, "--verify", "--ledger", str(ledger)]) == 0
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["review", run_id, "--verify", "--ledger", str(ledger)]) == 0, capsys.readouterr().err


# FINDING 9
def test_a_catastrophic_check_regex_cannot_hang_the_end_of_a_run(tmp_path):
    """`file_contains` runs the scenario's regex with `re.search` on up to 1 MiB of model-written
    text, with no time budget. `^(a+)+$` against 40 'a's and a '!' never finishes (28 'a's already
    take ~15 s), so the run never gets its end row and, in a matrix, its worker never frees; Python's
    `re` holds the GIL, so Ctrl-C cannot stop it either. Expected: a bounded evaluation that fails
    the check with 'could not evaluate: timed out' (or the regex refused when the scenario loads)."""
    sandbox = tmp_path / "sb"
    sandbox.mkdir()
    (sandbox / "r.txt").write_text("a" * 40 + "!", encoding="utf-8")
    code = (
        "import sys; from pathlib import Path\n"
        "from harness.checks import CheckContext, evaluate_checks\n"
        "check = {'type': 'file_contains', 'path': 'r.txt', 'regex': '^(a+)+$'}\n"
        f"print(evaluate_checks([check], CheckContext(Path({str(sandbox)!r}), (), (), None, 0)))\n"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=8)
    except subprocess.TimeoutExpired:
        pytest.fail("evaluating one file_contains check took more than 8 s (catastrophic backtracking, no time budget)")
    assert done.returncode == 0 and "passed=False" in done.stdout


# FINDING 10
@pytest.mark.parametrize("written, expected", [('{"count": true}', 1), ('{"count": 1}', True), ('{"flag": 0}', False)])
def test_file_json_field_does_not_confuse_booleans_with_numbers(tmp_path, written, expected):
    """`file_json_field` compares with Python `==`, where True == 1 and False == 0: a model that
    writes `true` passes a check for the number 1 (and `0` passes a check for false)."""
    field = "count" if "count" in written else "flag"
    result = _check(tmp_path, written, {"type": "file_json_field", "path": "out.txt", "field": field, "value": expected})
    assert not result.passed, result.detail


# FINDING 11
def test_csv_checks_read_a_file_with_a_utf8_byte_order_mark(tmp_path):
    """A CSV saved with a UTF-8 BOM (Excel, PowerShell, many Windows tools; a model can emit it
    too) is decoded with 'utf-8', so the first header is '\\ufeffticket' and every check on that
    column fails with the misleading 'no row with ticket = ...' / 'no column ticket'."""
    body = b"ticket,category\nT-101,billing\nT-102,bug\n"
    check = {
        "type": "file_csv_value",
        "path": "t.csv",
        "key_column": "ticket",
        "key": "T-101",
        "column": "category",
        "value": "billing",
    }
    result = _check(tmp_path, b"\xef\xbb\xbf" + body, check, name="t.csv")
    assert result.passed, result.detail


# FINDING 12
def test_file_csv_values_in_checks_the_column_against_the_header(tmp_path):
    """The column's presence is checked on the first data row, not the header: a file with only a
    header that lacks the column passes ('0 data row(s), every category in [...]')."""
    check = {"type": "file_csv_values_in", "path": "t.csv", "column": "category", "allowed": ["bug"]}
    result = _check(tmp_path, "ticket,label\n", check, name="t.csv")
    assert not result.passed, result.detail


# FINDING 12
def test_file_csv_values_in_names_the_short_row_not_a_missing_column(tmp_path):
    """A short first data row is reported as "no column 'category'" although the header has it."""
    check = {"type": "file_csv_values_in", "path": "t.csv", "column": "category", "allowed": ["bug"]}
    result = _check(tmp_path, "ticket,category\nT-1\nT-2,bug\n", check, name="t.csv")
    assert not result.passed
    assert "no column" not in result.detail, result.detail


# FINDING 13
@pytest.mark.parametrize("table", [
    '"Paris" = { temperature_c = nan, condition = "drizzle" }',
    '"Paris" = { temperature_c = inf, condition = "drizzle" }',
    '"Paris" = { temperature_c = 17, condition = "drizzle" }\n"paris" = { temperature_c = 30, condition = "sun" }',
], ids=["nan", "inf", "case-duplicate-city"])  # fmt: skip
def test_weather_tool_data_refuses_non_finite_numbers_and_case_duplicate_cities(tmp_path, table):
    """TOML allows `nan` and `inf`; the data schema's "number" accepts them, and the tool then
    answers with `NaN`/`Infinity`, which is not JSON although the tool promises JSON. Cities that
    differ only in case ("Paris", "paris") are both accepted, but lookup is case-insensitive and
    the second can never be answered."""
    from harness.errors import ScenarioError

    path = tmp_path / "w.toml"
    path.write_text(
        'name = "w"\nwhat_it_does = "a"\nwhat_it_does_not = "b"\ndone_looks_like = "c"\nsystem_prompt = "s"\n'
        'task = "t"\ntools = ["get_current_weather"]\nchecks = [{type = "tool_call_count", min = 1}]\n'
        f"[tool_data.get_current_weather]\n{table}\n", encoding="utf-8")  # fmt: skip
    with pytest.raises(ScenarioError):
        load_scenario(path)


# FINDING 14
def test_plots_stay_readable_with_realistic_model_specs(tmp_path, monkeypatch):
    """The outcomes plot puts each full model spec as an x tick label on a fixed 8-inch figure: four
    ordinary specs (`openai:bartowski/Qwen2.5-Coder-7B-Instruct-GGUF@http://127.0.0.1:8080/v1`, ...)
    print on top of each other and no model can be read."""
    from harness.report import plots as _plots

    figures = {}
    save = _plots._save

    def keep(fig, path, footer):
        figures[Path(path).name] = fig
        save(fig, path, footer)

    monkeypatch.setattr(_plots, "_save", keep)
    models = [f"openai:bartowski/{name}-GGUF@http://127.0.0.1:{8080 + i}/v1"
              for i, name in enumerate(["Qwen2.5-Coder-7B-Instruct", "Llama-3.2-3B-Instruct", "Mistral-7B-Instruct-v0.3", "Phi-3.5-mini-instruct"])]  # fmt: skip
    ledger = tmp_path / "l.sqlite"
    with Ledger(ledger) as led:
        for i, model in enumerate(models):
            for rep in range(2):
                add_run(led, f"r{i}{rep}", model=model, repetition=rep, outcome="pass" if rep else "task_failed")
    write_report(ledger, tmp_path / "out", formats=["png"])
    fig = figures["outcomes.png"]
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].get_xticklabels() if t.get_text()]
    overlapping = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if a.overlaps(b)]
    assert overlapping == [], f"{len(overlapping)} pairs of model labels overlap on outcomes.png"


# FINDING 14
def test_long_model_specs_do_not_collapse_the_plots(tmp_path):
    """A spec of about 90 characters without spaces (a long GGUF path, a hosted model name with a
    URL) makes constrained layout give up: matplotlib warns 'axes sizes collapsed to zero' on stderr
    and the plots are written with unusable axes. Labels should be shortened or wrapped."""
    import warnings

    ledger = tmp_path / "l.sqlite"
    with Ledger(ledger) as led:
        for i in range(2):
            add_run(led, f"r{i}", model=f"embedded:/srv/models/{i}-" + "q" * 70 + ".gguf", turns=[(["code_fence"], "x")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_report(ledger, tmp_path / "out", formats=["png"])
    assert [str(w.message) for w in caught if "collapsed" in str(w.message)] == []


# =====================================================================================================
# Handled correctly: regression guards
# =====================================================================================================


def test_guard_statistics_match_hand_computed_values():
    # Wilson 2/3: (p + z²/2n ± z·sqrt(p(1−p)/n + z²/4n²)) / (1 + z²/n), z = 1.96
    low, high = wilson_interval(2, 3)
    assert (round(low, 4), round(high, 4)) == (0.2077, 0.9385)
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == 1.0
    # McNemar mid-p, b = 3, c = 0: 2·(1/8) − 1/8 = 1/8; b = 5, c = 1: 2·(1+6)/64 − 6/64 = 8/64
    assert mcnemar_midp(3, 0) == pytest.approx(0.125)
    assert mcnemar_midp(5, 1) == pytest.approx(8 / 64)
    assert mcnemar_midp(0, 0) == 1.0
    # pass^k: C(c,k)/C(n,k); 8 of 10 passes, k = 4: C(8,4)/C(10,4) = 70/210
    assert pass_hat_k(10, 8, 4) == pytest.approx(1 / 3)
    diff, lo, hi = newcombe_paired_diff(1, 3, 0, 1)
    assert diff == pytest.approx(0.6) and lo == pytest.approx(0.0801, abs=1e-4) and hi == pytest.approx(0.8006, abs=1e-4)


def test_guard_known_ledger_numbers_in_the_summary(tmp_path):
    frames = load_frames(build_two_model_ledger(tmp_path / "l.sqlite"))
    table = summary_table(frames, ["model"]).set_index("model")
    # SMALL: 3 + 1 passes of 20 scored, 2 infra_error excluded; BIG: 8 + 7 of 20, 1 interrupted excluded
    assert (table.loc[SMALL, "scored"], table.loc[SMALL, "passes"], table.loc[SMALL, "infra_error"]) == (20, 4, 2)
    assert (table.loc[BIG, "scored"], table.loc[BIG, "passes"], table.loc[BIG, "interrupted"]) == (20, 15, 1)
    assert (table.loc[BIG, "pass_low"], table.loc[BIG, "pass_high"]) == pytest.approx(wilson_interval(15, 20))


def test_guard_report_is_byte_identical_with_odd_names_and_tiny_temperatures(tmp_path):
    ledger = tmp_path / "l.sqlite"
    with Ledger(ledger) as led:
        for rep in range(3):
            add_run(led, f"a{rep}", model="ollama:é<script>`|x", repetition=rep, temperature=1e-9,
                    outcome="pass" if rep else "task_failed", turns=[(["code_fence"], "a|b\nc")])  # fmt: skip
            add_run(led, f"b{rep}", model="ollama:b", repetition=rep, latency=float("nan") if rep else None)

    def digest(folder: Path) -> dict[str, str]:
        return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}

    write_report(ledger, tmp_path / "o1", formats=["md", "png", "csv"])
    write_report(ledger, tmp_path / "o2", formats=["md", "png", "csv"])
    assert digest(tmp_path / "o1") == digest(tmp_path / "o2")
    assert "1e-09" in (tmp_path / "o1" / "report.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("argv", [
    ["report", "--out", "{ledger}"], ["report", "--out", "{file}"], ["report", "--by", "seed"], ["report", "--by", ","],
    ["report", "--format", "pdf"], ["compare", SMALL, SMALL], ["compare", SMALL, "nope"], ["compare", SMALL, BIG, "--scenario", "zz"],
    ["review", "%"], ["review", ""], ["attest", "small-t0-r1", "--reviewer", " \n "],
])  # fmt: skip
def test_guard_report_compare_review_usage_errors_are_one_sentence(tmp_path, capsys, argv):
    ledger = build_two_model_ledger(tmp_path / "l.sqlite")
    (tmp_path / "afile").write_text("keep", encoding="utf-8")
    argv = [a.format(ledger=ledger, file=tmp_path / "afile") for a in argv]
    before = ledger.read_bytes()
    assert main([*argv, "--ledger", str(ledger)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("harness: ") and err.count("\n") == 1 and "Traceback" not in err
    assert ledger.read_bytes() == before and (tmp_path / "afile").read_text(encoding="utf-8") == "keep"


def test_guard_compare_with_a_single_model_in_the_ledger_is_a_usage_error(tmp_path, capsys):
    ledger = tmp_path / "l.sqlite"
    with Ledger(ledger) as led:
        add_run(led, "a", model=SMALL)
    assert main(["compare", SMALL, "qwen2.5-coder:1.5b", "--ledger", str(ledger)]) == 2
    assert "two different models" in capsys.readouterr().err


def test_guard_attest_big_notes_and_verify_after_an_idempotent_rescore(tmp_path, monkeypatch, capsys):
    (tmp_path / "s.toml").write_bytes(SCENARIO_FILE.read_bytes())
    cassette = write_cassette(tmp_path / "c.jsonl", IDEAL)
    assert main(["run", "s.toml", "--model", f"replay:{cassette}", "--repeats", "1", *RUN_FLAGS]) == 0
    ledger = tmp_path / "results" / "ledger.sqlite"
    with Ledger(ledger) as led:
        run_id = led.runs()[0].run_id
    from harness.review import attest

    attest(ledger, run_id[:6], reviewer="alice", notes="n" * 1_000_000)
    assert main(["rescore", "--force"]) == 0  # same classifier, same labels: the frame must not change
    assert main(["review", run_id, "--verify"]) == 0
    assert main(["ledger", "verify"]) == 0
    (tmp_path / "s.toml").write_text((tmp_path / "s.toml").read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    assert main(["review", run_id, "--verify"]) == 1  # an edited scenario file is a changed frame
    assert "changed since the run" in review_text_of(ledger, run_id)


def review_text_of(ledger: Path, run_id: str) -> str:
    from harness.review import review_text

    return review_text(ledger, run_id)


def test_guard_reports_of_only_unfinished_or_interrupted_runs(tmp_path):
    ledger = tmp_path / "l.sqlite"
    with Ledger(ledger) as led:
        add_run(led, "u", model=SMALL, outcome=None, turns=[([], "a"), (["code_fence"], "b")])
        add_run(led, "i", model=SMALL, outcome="interrupted", repetition=1)
    written = write_report(ledger, tmp_path / "out", formats=["md", "png", "csv"])
    text = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "**No scored run:**" in text and "n/a (no scored run)" in text
    assert {p.name for p in written} == {"report.md", "summary.csv", "failure_modes.csv", "runs.csv"}  # no empty plots


def test_guard_sixteen_jobs_on_a_replay_model(tmp_path):
    cassette = write_cassette(tmp_path / "c.jsonl", IDEAL)
    with Ledger(tmp_path / "l.sqlite") as ledger:
        result = run_matrix(_plans(f"replay:{cassette}", 48), ledger, RunOptions(runs_dir=tmp_path / "runs", jobs=16, record_dir=tmp_path / "rec"))  # fmt: skip
        assert [s.outcome for s in result.summaries] == ["pass"] * 48
        assert ledger.verify().ok
        assert sorted(ledger.finished_identities().values()) == [1] * 48
    assert len(list((tmp_path / "rec").glob("*.jsonl"))) == 48


def test_guard_rescore_of_runs_recorded_without_prompts_and_of_thousands_of_turns(tmp_path):
    ledger = tmp_path / "l.sqlite"
    with Ledger(ledger) as led:
        for i in range(400):
            add_run(led, f"r{i}", model=SMALL, repetition=i, turns=[([], '{"name": "list_files", "arguments": {}}')] * 5)
    from harness.rescore import rescore

    started = time.perf_counter()
    with Ledger(ledger) as led:
        result = rescore(led)
        again = rescore(led)
    assert result.turns == 2000 and result.history_mismatch == 2000  # no prompts stored: classified, flagged
    assert again.turns == 0 and again.skipped_current == 2000
    assert time.perf_counter() - started < 20


@pytest.mark.parametrize("content, check, passed", [
    ('ticket,category\nT-101,"bill\ning"\n', {"column": "category", "allowed": ["billing"]}, False),
    ("ticket , category \nT-1, bug \n", {"column": "category", "allowed": ["bug"], "rows": 1}, True),
    ("ticket,category\n" + "T,bug\n" * 60_000, {"column": "category", "allowed": ["bug"]}, True),
])  # fmt: skip
def test_guard_csv_checks_on_quoted_newlines_spaces_and_big_files(tmp_path, content, check, passed):
    result = _check(tmp_path, content, {"type": "file_csv_values_in", "path": "t.csv", **check}, name="t.csv")
    assert result.passed is passed, result.detail


def test_guard_checks_on_hostile_json_and_huge_files(tmp_path):
    deep = _check(tmp_path, "[" * 200_000, {"type": "file_json_field", "path": "out.txt", "field": "a", "value": 1})
    assert not deep.passed and "could not evaluate" in deep.detail
    started = time.perf_counter()
    names = _check(tmp_path, ("a." * 400_000) + "\n" + "x-" * 100_000, {"type": "file_names_only_existing", "path": "out.txt"})
    assert time.perf_counter() - started < 5 and names.detail
