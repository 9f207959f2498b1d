"""The report's SQL aggregates (one row per run) equal a straightforward Python computation over every turn.

The ledger holds real runs (the replay cassettes through ``harness run``, passing and failing) and built runs
covering the edges: runs with no turns, interrupted, infra_error and unfinished runs, a resumed identity
(unfinished, then infra_error, then pass), a superseded one, relabelled turns (the newest labels win), missing
latencies and a reply stored as a blob.
"""

from __future__ import annotations

import json
import math
import sqlite3
import statistics
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.cli import main
from harness.ledger import Labels, Ledger
from harness.report import CELL_AXES, failure_mode_table, load_frames, summary_table, write_report
from harness.report.frames import grouped_quantiles
from harness.report.grouping import grouped_median
from harness.stats import pass_hat_k
from tests.helpers import CASSETTES, REPO, RUN_FLAGS
from tests.ledger_builders import BIG, SMALL, add_run

MODES = ["raw_json_in_content", "code_fence", "mixed_prose", "repeated_call", "empty_response"]


def _varied_ledger(path: Path) -> Path:
    for scenario in ("list_and_report", "weather_probe"):
        for kind in ("ideal", "broken"):
            cassette = CASSETTES / scenario / f"{kind}.jsonl"
            assert main(["run", str(REPO / "scenarios" / f"{scenario}.toml"), "--model", f"replay:{cassette}",
                         "--ledger", str(path), *RUN_FLAGS]) == 0  # fmt: skip
    outcomes = ["pass", "task_failed", "turn_limit", "infra_error", "interrupted", "context_overflow", None, "token_limit"]
    with Ledger(path) as ledger:
        for i in range(48):
            outcome = outcomes[i % 8]
            n = 0 if outcome == "infra_error" and i % 3 else i % 5 + 1
            turns = [([MODES[(i + k) % 5]] if (i * k) % 3 == 0 else [MODES[k % 5], MODES[(k + 2) % 5]] if k % 4 == 1 else [],
                      "" if (i + k) % 7 == 0 else "reply " * ((i * 7 + k) % 13)) for k in range(n)]  # fmt: skip
            latency = float("nan") if i % 11 == 0 else None if i % 2 else 37.3 + i * 1.7
            add_run(ledger, f"r{i}", model=(SMALL, BIG)[i % 2], temperature=(0.0, 0.7)[i // 2 % 2], repetition=i // 4,
                    outcome=outcome, turns=turns, parser=("lenient", "strict")[i // 8 % 2], latency=latency, day=1 + i % 20)  # fmt: skip
        add_run(ledger, "resumed-1", model=SMALL, outcome=None, turns=[(["code_fence"], "a")], identity="resumed", day=21)
        add_run(ledger, "resumed-2", model=SMALL, outcome="infra_error", turns=[], identity="resumed", day=22)
        add_run(
            ledger, "resumed-3", model=SMALL, outcome="pass", turns=[([], "ok"), (["mixed_prose"], "ok then")], identity="resumed"
        )
        add_run(ledger, "again-1", model=BIG, outcome="pass", identity="again", day=24)
        add_run(ledger, "again-2", model=BIG, outcome="task_failed", turns=[(["empty_response"], "")], identity="again", day=25)
        add_run(
            ledger,
            "blob",
            model=BIG,
            outcome="task_failed",
            turns=[(["code_fence"], '{"name": "x", "arguments": {"p": "' + "z" * 5000 + '"}}')],
        )
        for run_id, turn, modes in (("r3", 1, []), ("r4", 2, ["code_fence", "empty_response"]), ("r4", 2, ["mixed_prose"]),
                                    ("r9", 1, ["repeated_call"]), ("r16", 1, ["code_fence"])):  # fmt: skip
            ledger.record_labels(Labels(run_id=run_id, turn=turn, classifier_version="2", failure_modes=modes,
                                        recovered_calls=[], recovered_by=None, details={}))  # fmt: skip
    return path


@pytest.fixture(scope="module")
def varied(tmp_path_factory) -> Path:
    return _varied_ledger(tmp_path_factory.mktemp("aggregates") / "ledger.sqlite")


def _by_hand(path: Path) -> tuple[list[str], dict[str, list], Counter, dict[str, tuple[int, int, int, str]]]:
    """Every turn read one by one: per run its turns; per (run, mode) its turns; per mode its shortest reply."""
    db = sqlite3.connect(path)
    run_ids = [r for (r,) in db.execute("SELECT run_id FROM runs ORDER BY seq")]
    newest = {(r, t): modes for r, t, modes in db.execute("SELECT run_id, turn, failure_modes FROM labels ORDER BY seq")}
    db.close()
    per_run: dict[str, list] = {r: [] for r in run_ids}
    modes: Counter = Counter()
    shortest: dict[str, tuple[int, int, int, str]] = {}
    with Ledger(path, readonly=True) as ledger:
        for row in ledger.turns():  # the record as the loop wrote it, large payloads put back
            rec = row.record
            per_run[rec.run_id].append(rec)
            text = newest.get((rec.run_id, rec.turn))
            labels = rec.failure_modes if text is None else json.loads(text)
            for mode in labels:
                modes[(rec.run_id, mode)] += 1
                candidate = (len(rec.content or ""), row.seq, rec.turn, rec.run_id)
                shortest[mode] = min(shortest.get(mode, candidate), candidate)
    return run_ids, per_run, modes, shortest


def test_sql_aggregates_equal_python_over_every_turn(varied):
    frames = load_frames(varied)
    run_ids, per_run, modes, shortest = _by_hand(varied)
    runs = frames.runs.set_index("run_id")
    assert runs.index.tolist() == run_ids
    assert frames.turn_count == sum(len(t) for t in per_run.values()) > 100
    assert {r for r, t in per_run.items() if not t} >= {"resumed-2", "r11"}  # runs with no turns are there
    for run_id, turns in per_run.items():
        row = runs.loc[run_id]
        latencies = [t.latency_ms for t in turns if t.latency_ms is not None and not math.isnan(t.latency_ms)]
        assert row["turns_recorded"] == len(turns)
        assert row["latency_ms"] == pytest.approx(sum(latencies), rel=1e-12, abs=0.0)  # SQLite's and Python's summation order
        median = row["latency_ms_median"]
        assert (math.isnan(median) and not latencies) or median == statistics.median(latencies)  # exact: a selection
        if row["outcome"] == "unfinished":  # its totals come from its turns
            assert row["prompt_tokens"] == sum(t.prompt_tokens or 0 for t in turns)
            assert row["completion_tokens"] == sum(t.completion_tokens or 0 for t in turns)
    counted = {(str(r), m): n for r, m, n in frames.run_modes[["run_id", "mode", "turns_with_mode"]].itertuples(index=False)}
    assert counted == dict(modes)
    examples = {
        m: (c, s, t, r)
        for m, s, r, t, c in frames.mode_examples[["mode", "seq", "run_id", "turn", "chars"]].itertuples(index=False)
    }
    assert examples == shortest
    outcomes = set(frames.runs["outcome"])
    assert {"pass", "task_failed", "infra_error", "interrupted", "unfinished"} <= outcomes
    assert frames.runs.set_index("run_id").loc[["resumed-1", "resumed-2", "resumed-3"], "scored"].tolist() == [False, False, True]


@pytest.mark.parametrize("by", [["model"], ["model", "temperature"], ["scenario", "parser"], list(CELL_AXES)])
def test_latency_quantiles_equal_pandas_over_every_turn(varied, by):
    frames = load_frames(varied)
    table = summary_table(frames, by)
    turns = frames.turns  # every turn, read the old way, for the check
    runs = frames.runs.set_index("run_id")
    scored = turns[turns["run_id"].astype(str).map(runs["scored"]).astype(bool)]
    keyed = scored.assign(**{axis: scored["run_id"].astype(str).map(runs[axis]).to_numpy() for axis in by})
    expected = keyed.groupby(by, sort=True)["latency_ms"].quantile([0.5, 0.95]).unstack()
    for row in table.to_dict("records"):
        key = tuple(row[a] for a in by) if len(by) > 1 else row[by[0]]
        want = expected.loc[key] if key in expected.index else pd.Series({0.5: math.nan, 0.95: math.nan})
        for column, q in (("latency_p50_ms", 0.5), ("latency_p95_ms", 0.95)):
            assert row[column] == want[q] or (math.isnan(row[column]) and math.isnan(want[q]))


def test_grouped_quantiles_equal_pandas_exactly():
    rng = np.random.default_rng(0)
    for size in (1, 2, 3, 7, 50, 1000):
        groups = rng.integers(-1, 6, size)
        values = np.round(rng.uniform(0, 3000, size), int(rng.integers(0, 3)))  # ties too
        values[rng.random(size) < 0.1] = np.nan
        qs = (0.0, 0.25, 0.5, 0.9, 0.95, 1.0)
        got = grouped_quantiles(groups, values, qs, 6)
        frame = pd.DataFrame({"g": groups, "x": values})
        want = frame[frame["g"] >= 0].groupby("g")["x"].quantile(list(qs)).unstack().reindex(index=range(6), columns=list(qs))
        np.testing.assert_array_equal(got, want.to_numpy())


def test_grouped_median_equals_pandas_exactly():
    rng = np.random.default_rng(1)
    for size in (1, 2, 3, 8, 51, 1000):
        groups = rng.integers(-1, 5, size)
        values = rng.uniform(0, 3000, size) if size % 2 else rng.integers(0, 40, size).astype(float)  # ties too
        values[rng.random(size) < 0.1] = np.nan
        want = pd.DataFrame({"g": groups, "x": values}).query("g >= 0").groupby("g")["x"].median().reindex(range(5))
        np.testing.assert_array_equal(grouped_median(groups, values, 5), want.to_numpy())


def test_the_report_reads_each_turn_row_in_sql_only(varied, monkeypatch):
    def no_turn_frames(self):
        raise AssertionError("a report loaded every turn into pandas")

    monkeypatch.setattr(Ledger, "turns_frame", no_turn_frames)
    written = write_report(varied, varied.parent / "report", formats=["md", "png", "csv"])
    assert {p.name for p in written} >= {"report.md", "runs.csv"}


def _summary_by_pandas(frames, by: list[str]) -> pd.DataFrame:
    """The summary table as a pandas ``groupby`` over the text columns computes it (the code before ``RunGroups``)."""
    runs = frames.runs
    scored = runs[runs["scored"]]
    counted, outcome = runs["counted"], runs["outcome"]
    flags = runs[by].assign(_run=counted, scored=runs["scored"], passed=runs["passed"], infra_error=counted & (outcome == "infra_error"),
                            interrupted=counted & outcome.isin(("interrupted", "unfinished")),
                            context_overflow=counted & (outcome == "context_overflow"))  # fmt: skip
    table = flags.groupby(by, sort=True).agg(runs=("_run", "sum"), scored=("scored", "sum"), passes=("passed", "sum"),
                                             infra_error=("infra_error", "sum"), interrupted=("interrupted", "sum"),
                                             context_overflow=("context_overflow", "sum")).reset_index()  # fmt: skip
    medians = scored.groupby(by, sort=True).agg(median_turns=("turns", "median"), median_tokens=("tokens", "median"),
                                                ttft_ms=("ttft_ms", "median"), decode_tps=("decode_tps", "median"))  # fmt: skip
    table = table.merge(medians.reset_index(), on=by, how="left")
    cells = scored.groupby([*CELL_AXES, "task_kind"]).agg(
        n=("passed", "size"), c=("passed", "sum"), repeats=("repetition", "nunique")
    )
    max_k = int(min(cells["n"].max(), cells["repeats"].max()))
    for k in range(1, max_k + 1):
        per_cell = cells.assign(
            p=[pass_hat_k(n, c, k) if n >= k else math.nan for n, c in zip(cells["n"], cells["c"], strict=True)]
        )
        per_group = per_cell.reset_index().groupby(by, sort=True)["p"].agg(lambda p: p.mean() if p.notna().all() else math.nan)
        table[f"pass^{k}"] = table.set_index(by).index.map(per_group.to_dict()).to_numpy(dtype=float)
    return table


@pytest.mark.parametrize(
    "by", [["model"], ["model", "temperature"], ["scenario", "parser"], ["task_kind", "model"], list(CELL_AXES)]
)
def test_tables_grouped_in_numpy_equal_pandas_groupby(varied, by):
    frames = load_frames(varied)
    got = summary_table(frames, by)
    want = _summary_by_pandas(frames, by)
    for column in want.columns:
        np.testing.assert_array_equal(got[column].to_numpy(), want[column].to_numpy(), err_msg=column)
        assert got[column].dtype == want[column].dtype, column
    assert got["pass_rate"].tolist() == pytest.approx((want["passes"] / want["scored"]).tolist(), nan_ok=True)
    modes = failure_mode_table(frames, by)
    runs = frames.runs[frames.runs["scored"]]
    merged = frames.run_modes.merge(runs[["run_id", *by]], on="run_id")
    counts = merged.groupby(["mode", *by], sort=True).agg(runs_with=("run_id", "size"), turns_with=("turns_with_mode", "sum"))
    sizes = runs.groupby(by, sort=True).agg(scored_runs=("run_id", "size"), turns=("turns_recorded", "sum"))
    assert len(modes) == merged["mode"].nunique() * len(sizes) > 0
    for row in modes.to_dict("records"):
        key = tuple(row[a] for a in by)
        found = counts.loc[(row["mode"], *key)] if (row["mode"], *key) in counts.index else {"runs_with": 0, "turns_with": 0}
        assert (row["runs_with"], row["turns_with"]) == (found["runs_with"], found["turns_with"])
        assert (row["scored_runs"], row["turns"]) == tuple(sizes.loc[key if len(by) > 1 else key[0]])
    assert modes["spread"].is_monotonic_decreasing


def test_the_mode_counts_without_examples_equal_those_with_them(varied):
    """``harness export --runs`` reads the counts alone (``mode_reads(examples=False)``): same rows, no examples."""
    with Ledger(varied, readonly=True) as ledger:
        (counts, examples), (alone, none) = ledger.mode_reads(), ledger.mode_reads(examples=False)
        assert ledger.run_mode_counts().equals(alone)
    assert len(examples) > 0 and len(none) == 0 and list(none.columns) == list(examples.columns)
    key = ["run_id", "mode"]
    pd.testing.assert_frame_equal(alone.sort_values(key).reset_index(drop=True), counts.sort_values(key).reset_index(drop=True))


def test_run_details_read_as_columns_put_stored_payloads_back(tmp_path):
    """A run end whose checks and final answer went to ``blobs`` reads back whole, as dicts and as columns."""
    path = tmp_path / "l.sqlite"
    answer, detail = "a" * 5000, "d" * 5000
    with Ledger(path) as ledger:
        add_run(ledger, "small", model=SMALL, outcome="pass")
        add_run(ledger, "large", model=BIG, outcome="task_failed", turns=[([], answer)],
                checks=[{"check": "file_exists", "passed": False, "detail": detail}, {"check": "ok", "passed": True, "detail": ""}])  # fmt: skip
        add_run(ledger, "open", model=BIG, outcome=None)
        assert ledger._db.execute("SELECT COUNT(*) FROM run_ends WHERE blob_refs IS NOT NULL").fetchone()[0] == 1
        columns, dicts = ledger.run_detail_columns(), ledger.run_details()
    assert columns["run_id"] == ["small", "large", "open"] and "blob_refs" not in columns
    assert [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)] == dicts
    assert dicts[1]["final_answer"] == answer and json.loads(dicts[1]["checks"])[0]["detail"] == detail
    assert dicts[2]["checks"] is None
    frames = load_frames(path)
    assert frames.runs["checks_failed"].tolist() == [(), ("file_exists",), ()]
    assert frames.run_checks.values.tolist() == [
        ["small", "file_exists", True],
        ["large", "file_exists", False],
        ["large", "ok", True],
    ]
