"""Reports, compare, review: numbers checked against hand computation on ledgers with known contents."""

from __future__ import annotations

import hashlib
import math
import sqlite3
import struct
from pathlib import Path

import numpy as np
import pytest

from harness import review, stats
from harness.cli import main
from harness.ledger import Labels, Ledger
from harness.report import (
    compare,
    compare_models,
    failure_mode_table,
    lenient_rescue,
    load_frames,
    markdown,
    plots,
    shortest_examples,
    summary_table,
    tables,
    write_report,
)
from harness.report import frames as frames_module
from tests.ledger_builders import BIG, RAW, REPEAT, SMALL, add_run, build_two_model_ledger

Z = 1.959963984540054


def wilson_by_hand(k: int, n: int) -> tuple[float, float]:
    p = k / n
    centre, half, den = p + Z * Z / (2 * n), Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)), 1 + Z * Z / n
    return (centre - half) / den, (centre + half) / den


@pytest.fixture
def two(ledger_path):
    return build_two_model_ledger(ledger_path)


# -- statistics -----------------------------------------------------------------------------------------
def test_wilson_matches_the_closed_form_and_the_edges():
    for k, n in [(3, 10), (14, 60), (1, 1), (7, 20)]:
        low, high = stats.wilson_interval(k, n)
        if 0 < k < n:
            assert (round(low, 4), round(high, 4)) == tuple(round(x, 4) for x in wilson_by_hand(k, n))
    assert stats.wilson_interval(0, 20) == (0.0, pytest.approx(Z * Z / 20 / (1 + Z * Z / 20)))  # upper = z²/(n+z²)
    assert stats.wilson_interval(20, 20)[1] == 1.0
    assert round(stats.wilson_interval(3, 10)[0], 4) == 0.1078 and round(stats.wilson_interval(3, 10)[1], 4) == 0.6032
    with pytest.raises(ValueError):
        stats.wilson_interval(0, 0)


def test_pass_hat_k_holm_mcnemar_newcombe_known_values():
    assert stats.pass_hat_k(10, 3, 2) == 3 / 45 and stats.pass_hat_k(10, 7, 3) == 35 / 120 and stats.pass_hat_k(5, 5, 5) == 1.0
    assert stats.pass_hat_k(10, 3, 1) == 0.3 and stats.pass_hat_k(10, 2, 3) == 0.0
    # Fagerland et al. 2013's worked example: b = 1, c = 7 -> mid-p = 10/256 = 0.039
    assert stats.mcnemar_midp(1, 7) == pytest.approx(10 / 256) and stats.mcnemar_midp(7, 1) == pytest.approx(10 / 256)
    assert (
        stats.mcnemar_midp(1, 12) == pytest.approx(15 / 8192)
        and stats.mcnemar_midp(0, 0) == 1.0
        and stats.mcnemar_midp(3, 3) == 1.0
    )
    assert stats.holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    # Newcombe 1998, method 10, on his example table (36, 12, 2, 0): 0.2000 [0.0569, 0.3404]
    diff, low, high = stats.newcombe_paired_diff(36, 12, 2, 0)
    assert (round(diff, 4), round(low, 4), round(high, 4)) == (0.2, 0.0569, 0.3404)


# -- frames and tables ----------------------------------------------------------------------------------
def test_load_frames_applies_newest_labels_and_counts(two):
    frames = load_frames(two)
    assert len(frames.runs) == 43 and len(frames.turns) == 81
    assert frames.runs.set_index("run_id").loc["small-t0-r10", "outcome"] == "infra_error"
    turns = frames.turns.set_index(["run_id", "turn"])
    assert turns.loc[("small-t0-r3", 1), "failure_modes"] == ()  # relabelled to nothing
    assert turns.loc[("big-t0-r9", 2), "failure_modes"] == ("empty_response",)
    assert turns.loc[("small-t0-r4", 1), "failure_modes"] == (RAW,)
    assert len(frames.turn_modes) == 15 + 10 + 5 + 1
    assert frames.newest_end == "2026-01-02T00:05:00.000+00:00"


def test_summary_numbers_equal_hand_computation(two):
    table = summary_table(load_frames(two)).set_index(["model", "temperature"])
    for (model, temperature), passes in [((SMALL, 0.0), 3), ((SMALL, 0.7), 1), ((BIG, 0.0), 8), ((BIG, 0.7), 7)]:
        row = table.loc[(model, temperature)]
        assert (row["scored"], row["passes"], row["pass_rate"]) == (10, passes, passes / 10)
        assert round(row["pass_low"], 4) == round(wilson_by_hand(passes, 10)[0], 4)
        assert round(row["pass_high"], 4) == round(wilson_by_hand(passes, 10)[1], 4)
        for k in range(1, 11):
            assert row[f"pass^{k}"] == pytest.approx(math.comb(passes, k) / math.comb(10, k))
        latencies = [100 + r for r in range(10)] + [200 + r for r in range(10)]
        assert row["latency_p50_ms"] == pytest.approx(np.percentile(latencies, 50))
        assert row["latency_p95_ms"] == pytest.approx(np.percentile(latencies, 95))
        assert (row["median_turns"], row["median_tokens"]) == (2, 230)
    assert table.loc[(SMALL, 0.0), "infra_error"] == 2 and table.loc[(SMALL, 0.0), "runs"] == 12
    assert table.loc[(BIG, 0.7), "interrupted"] == 1 and table.loc[(BIG, 0.7), "runs"] == 11
    by_model = summary_table(load_frames(two), ["model"]).set_index("model")
    assert by_model.loc[SMALL, "pass_rate"] == 4 / 20
    assert by_model.loc[SMALL, "pass^2"] == pytest.approx((3 / 45 + 0) / 2)  # mean over the model's two cells


def test_failure_mode_table_sorted_by_spread(two):
    table = failure_mode_table(load_frames(two))
    assert list(dict.fromkeys(table["mode"])) == [RAW, REPEAT, "empty_response"]
    rows = table.set_index(["mode", "model"])
    small_raw = rows.loc[(RAW, SMALL)]
    assert (small_raw["runs_with"], small_raw["scored_runs"], small_raw["turns_with"], small_raw["turns"]) == (15, 20, 15, 40)
    assert round(small_raw["share_low"], 4) == round(wilson_by_hand(15, 20)[0], 4)
    assert round(small_raw["share_high"], 4) == round(wilson_by_hand(15, 20)[1], 4)
    assert rows.loc[(RAW, BIG), "share"] == 0.25 and rows.loc[(RAW, BIG), "spread"] == 0.5
    assert rows.loc[(REPEAT, BIG), "runs_with"] == 0 and rows.loc[(REPEAT, BIG), "share_low"] == 0.0
    assert rows.loc[("empty_response", BIG), "per_turn_rate"] == 1 / 40


def test_shortest_examples(two):
    ex = shortest_examples(load_frames(two)).set_index("mode")
    assert ex.loc[RAW, "excerpt"] == '{"name": "list_files", "arguments": {}}' and ex.loc[RAW, "run_id"] == "small-t0.7-r0"
    assert ex.loc[REPEAT, "chars"] == 20 and ex.loc[REPEAT, "run_id"] == "small-t0-r0"


def test_lenient_rescue(ledger_path):
    with Ledger(ledger_path) as ledger:
        for rep in range(10):
            add_run(
                ledger, f"l{rep}", model=SMALL, repetition=rep, parser="lenient", outcome="pass" if rep < 3 else "task_failed"
            )
            add_run(ledger, f"s{rep}", model=SMALL, repetition=rep, parser="strict", outcome="pass" if rep < 1 else "task_failed")
        add_run(ledger, "big-lenient-only", model=BIG, outcome="pass")
    rescue = lenient_rescue(load_frames(ledger_path))
    assert rescue.to_dict("records") == [{"model": SMALL, "lenient_passes": 3, "lenient_scored": 10, "strict_passes": 1,
                                          "strict_scored": 10, "lenient_rate": 0.3, "strict_rate": 0.1, "rescued": pytest.approx(0.2)}]  # fmt: skip
    write_report(ledger_path, "out", formats=["md"])
    assert f"- {SMALL}: +20.0 points (lenient 3/10 = 30.0% vs strict 1/10 = 10.0%)" in Path("out/report.md").read_text()


# -- the report -----------------------------------------------------------------------------------------
def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_report_markdown_plots_and_csv(two, tmp_path):
    written = write_report(two, tmp_path / "r", formats=["md", "png", "csv"])
    names = [p.name for p in written]
    assert names == [
        "pass_rate.png",
        "failure_modes.png",
        "outcomes.png",
        "pass_k.png",
        "summary.csv",
        "failure_modes.csv",
        "runs.csv",
        "report.md",
    ]
    md = (tmp_path / "r" / "report.md").read_text()
    low, high = wilson_by_hand(3, 10)
    assert f"30.0% [{100 * low:.1f}, {100 * high:.1f}]" in md  # 30.0% [10.8, 60.3]
    assert "Same in every row: scenario = `s`, tool_mode = `native`, parser = `lenient`." in md
    assert f"15/20 = 75.0% [{100 * wilson_by_hand(15, 20)[0]:.1f}, {100 * wilson_by_hand(15, 20)[1]:.1f}]" in md
    assert "run `small-t0.7-r0` turn 1 (39 chars)" in md
    for name in ("pass_rate.png", "failure_modes.png", "outcomes.png", "pass_k.png"):
        assert f"]({name})" in md
        width, height = _png_size(tmp_path / "r" / name)
        assert 500 <= width <= 2000 and 250 <= height <= 1500
    assert _png_size(tmp_path / "r" / "pass_rate.png") == (800, 500)
    import matplotlib.image

    image = matplotlib.image.imread(tmp_path / "r" / "pass_rate.png")
    assert image.shape[:2] == (500, 800) and image.std() > 0.05  # not blank


def test_report_is_byte_identical(two, tmp_path):
    write_report(two, tmp_path / "a", formats=["md", "png", "csv"])
    write_report(two, tmp_path / "b", formats=["md", "png", "csv"])
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert len(files) == 8
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_empty_ledger_reports_a_note(ledger_path, tmp_path):
    Ledger(ledger_path).close()
    write_report(ledger_path, tmp_path / "r", formats=["md", "png", "csv"])
    md = (tmp_path / "r" / "report.md").read_text()
    assert "The ledger holds no runs yet" in md and not list((tmp_path / "r").glob("*.png"))


def test_only_infra_errors(ledger_path, tmp_path):
    with Ledger(ledger_path) as ledger:
        for i in range(3):
            add_run(ledger, f"r{i}", model=SMALL, repetition=i, outcome="infra_error", turns=[])
    write_report(ledger_path, tmp_path / "r", formats=["md", "png", "csv"])
    md = (tmp_path / "r" / "report.md").read_text()
    assert "**No scored run:**" in md and "n/a (no scored run)" in md and "1 row(s) have no scored run" in md
    assert main(["compare", SMALL, BIG, "--ledger", str(ledger_path)]) == 2  # BIG is unknown: a usage error


def test_single_run_model_and_extreme_cells(ledger_path, tmp_path, capsys):
    with Ledger(ledger_path) as ledger:
        add_run(ledger, "one", model=BIG, outcome="pass")
        for i in range(4):
            add_run(ledger, f"s{i}", model=SMALL, repetition=i, outcome="task_failed", turns=[([RAW], "{")])
    assert main(["report", "--ledger", str(ledger_path), "--out", str(tmp_path / "r"), "--format", "md,png,csv"]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    table = summary_table(load_frames(ledger_path)).set_index("model")
    assert table.loc[BIG, "pass_rate"] == 1.0 and table.loc[BIG, "pass_low"] == pytest.approx(Z * 0 + 1 / (1 + Z * Z))
    assert table.loc[SMALL, "pass_rate"] == 0.0 and table.loc[SMALL, "pass_high"] == pytest.approx(Z * Z / (4 + Z * Z))
    assert f"{BIG} has a single scored run." in md and "2 row(s) pass 0% or 100%" in md
    capsys.readouterr()
    assert main(["compare", SMALL, BIG, "--ledger", str(ledger_path)]) == 0  # only repetition 0 pairs
    assert (
        capsys.readouterr().out.splitlines()[0]
        == f"{SMALL} fails this scenario in 1/1 paired runs and {BIG} in none (McNemar p = 0.5000)."
    )
    assert main(["compare", SMALL, BIG, "--ledger", str(ledger_path), "--scenario", "s"]) == 0
    with Ledger(ledger_path) as ledger:
        add_run(ledger, "other", model=BIG, scenario="t", outcome="pass")
    assert main(["compare", SMALL, BIG, "--ledger", str(ledger_path), "--scenario", "t"]) == 1
    assert "share no scored runs" in capsys.readouterr().out


def test_cli_errors_are_one_sentence(tmp_path, capsys):
    assert main(["report", "--ledger", str(tmp_path / "missing.sqlite")]) == 1
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"garbage" * 200)
    assert main(["report", "--ledger", str(bad)]) == 1
    assert main(["report", "--ledger", str(bad), "--by", "colour"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("harness: ") for line in err)
    assert "no ledger at" in err[0] and "not a readable SQLite ledger" in err[1] and "unknown axis 'colour'" in err[2]


# -- compare --------------------------------------------------------------------------------------------
def test_compare_pairs_and_tests(two, capsys):
    c = compare_models(load_frames(two), "qwen2.5-coder:1.5b", "qwen2.5-coder:7b")
    assert (c.pairs, c.both_pass, c.only_a_pass, c.only_b_pass, c.neither_pass) == (20, 3, 1, 12, 4)
    assert c.midp == pytest.approx(15 / 8192)
    assert c.diff == pytest.approx(-0.55)
    assert c.sentence() == f"{SMALL} fails this scenario 3.2 times as often as {BIG} (16/20 vs 5/20 runs; McNemar p = 0.0018)."
    modes = {m.mode: m for m in c.modes}
    assert [m.mode for m in c.modes] == [REPEAT, RAW, "empty_response"]
    assert (modes[REPEAT].only_a, modes[REPEAT].only_b, modes[REPEAT].midp) == (10, 0, pytest.approx(1 / 1024))
    assert (modes[RAW].only_a, modes[RAW].only_b, modes[RAW].midp) == (11, 1, pytest.approx(14 / 4096))
    assert modes["empty_response"].midp == pytest.approx(0.5)
    assert modes[REPEAT].holm_p == pytest.approx(3 / 1024) and modes[RAW].holm_p == pytest.approx(28 / 4096)
    assert modes["empty_response"].holm_p == pytest.approx(0.5)
    assert main(["compare", SMALL, BIG, "--ledger", str(two), "--scenario", "s"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == c.sentence() and "| pass rate" in out and "0.0018" in out
    assert main(["compare", SMALL, SMALL, "--ledger", str(two)]) == 2
    assert main(["compare", SMALL, BIG, "--ledger", str(two), "--scenario", "nope"]) == 2


# -- review and attest ----------------------------------------------------------------------------------
def test_review_frame_has_five_parts_and_reads_the_promise(ledger_path, tmp_path, capsys):
    scenario = tmp_path / "sc.toml"
    scenario.write_text(
        'what_it_does = "lists files"\nwhat_it_does_not = "deletes"\ndone_looks_like = "report.txt has 3 lines"\n'
    )
    digest = hashlib.sha256(scenario.read_bytes()).hexdigest()
    with Ledger(ledger_path) as ledger:
        add_run(ledger, "abc123", model=SMALL, scenario_path=str(scenario), scenario_hash=digest, outcome="task_failed",
                turns=[([RAW], '{"name": "x"}'), ([], "done")], files_written=["report.txt"],
                checks=[{"check": "file_exists", "passed": True, "detail": "ok"}, {"check": "file_states_count", "passed": False, "detail": "2 lines, wanted 3"}])  # fmt: skip
    frame = review.review_frame(ledger_path, "abc")
    assert list(frame) == ["run", "promise", "acceptance", "diff", "evidence", "open_questions"]
    assert frame["promise"]["status"] == "unchanged" and frame["promise"]["done_looks_like"] == "report.txt has 3 lines"
    assert frame["diff"]["first_input_sha256"] == "req-abc123-1" and frame["diff"]["files_written"] == ["report.txt"]
    assert [t["labels"] for t in frame["evidence"]] == [[RAW], []]
    assert frame["open_questions"] == [
        f"`{RAW}` on turn 1: is the label right, and did it change the outcome?",
        "Check `file_states_count` failed (2 lines, wanted 3): is the check right, or did the model miss the task?",
    ]
    assert main(["review", "abc123", "--ledger", str(ledger_path)]) == 0
    text = capsys.readouterr().out
    for part in (
        "## 1. The promise",
        "## 2. The acceptance criteria",
        "## 3. The diff",
        "## 4. The evidence",
        "## 5. The open questions",
    ):
        assert part in text
    assert "- Done looks like: report.txt has 3 lines" in text and f"Frame SHA-256: {review.frame_sha256(frame)}" in text

    assert main(["review", "abc123", "--verify", "--ledger", str(ledger_path)]) == 1
    assert "has no attestation" in capsys.readouterr().err
    assert main(["attest", "abc123", "--reviewer", "ann", "--notes", "label ok", "--ledger", str(ledger_path)]) == 0
    assert review.frame_sha256(frame) in capsys.readouterr().out
    assert main(["review", "abc123", "--verify", "--ledger", str(ledger_path)]) == 0
    assert "unchanged since attested by ann" in capsys.readouterr().out
    with Ledger(ledger_path) as ledger:
        rows = [(a.reviewer, a.notes, a.frame_sha256) for a in ledger.attestations("abc123")]
        assert rows == [("ann", "label ok", review.frame_sha256(frame))]
        ledger.record_labels(
            Labels(
                run_id="abc123",
                turn=2,
                classifier_version="2",
                failure_modes=["empty_response"],
                recovered_calls=[],
                recovered_by=None,
                details={},
            )
        )
        assert ledger.verify().ok
    assert main(["review", "abc123", "--verify", "--ledger", str(ledger_path)]) == 1
    assert "the frame CHANGED since attested by ann" in capsys.readouterr().err
    scenario.write_text("changed")
    assert review.review_frame(ledger_path, "abc123")["promise"]["status"] == "changed"


def test_review_unknown_run_is_a_usage_error(two, capsys):
    assert main(["review", "nope", "--ledger", str(two)]) == 2
    assert main(["review", "small", "--ledger", str(two)]) == 2  # ambiguous prefix
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("harness: no run 'nope'") and "matches several runs" in err[1]


def test_reports_open_the_ledger_read_only(two):
    before = two.read_bytes()
    write_report(two, "out", formats=["md", "csv"])
    load_frames(two)
    assert two.read_bytes() == before
    db = sqlite3.connect(two)
    assert db.execute("SELECT COUNT(*) FROM attestations").fetchone() == (0,)
    db.close()


@pytest.mark.parametrize("module", [frames_module, tables, markdown, stats, compare, review, plots])
def test_all_names_exist(module):
    assert all(hasattr(module, name) for name in module.__all__)
    assert len(set(module.__all__)) == len(module.__all__) > 0


def test_a_run_identity_counts_once_the_newest_run(tmp_path):
    # the same identity finished twice (a --no-resume re-run): same seed and options, not a new sample
    path = tmp_path / "dup.sqlite"
    with Ledger(path) as ledger:
        add_run(ledger, "old", model=SMALL, outcome="task_failed", identity="same", day=1)
        add_run(ledger, "new", model=SMALL, outcome="pass", identity="same", day=2)
        add_run(ledger, "other", model=SMALL, outcome="task_failed", repetition=1, day=3)
    frames = load_frames(path)
    assert frames.runs.set_index("run_id")["superseded"].to_dict() == {"old": True, "new": False, "other": False}
    [row] = summary_table(frames, ["model"]).to_dict("records")
    assert (row["runs"], row["scored"], row["passes"]) == (3, 2, 1)
    assert row["pass_rate"] == 0.5
    write_report(path, tmp_path / "out", formats=["md"])
    text = (tmp_path / "out" / "report.md").read_text()
    assert "1 run(s) repeat a run identity that finished again later" in text
