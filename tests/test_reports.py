"""Reports, compare, statistics: numbers checked against hand computation on ledgers with known contents.

Also holds the red-team regression tests for reports: correct numbers, markdown that no stored
name can break, readable plots, the same bytes from the same ledger, one-sentence usage errors.
"""

from __future__ import annotations

import hashlib
import math
import re
import sqlite3
import struct
from pathlib import Path

import numpy as np
import pytest

from harness import review, stats
from harness.cli import main
from harness.ledger import Ledger
from harness.report import (
    compare,
    compare_models,
    failure_mode_table,
    format_comparison,
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
from harness.stats import mcnemar_midp, pass_hat_k, tango_paired_diff, wilson_interval
from tests.ledger_builders import BIG, RAW, REPEAT, SMALL, add_run, build_two_model_ledger

Z = 1.959963984540054


def wilson_by_hand(k: int, n: int) -> tuple[float, float]:
    p = k / n
    centre, half, den = p + Z * Z / (2 * n), Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)), 1 + Z * Z / n
    return (centre - half) / den, (centre + half) / den


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


def test_pass_hat_k_and_mcnemar_by_definition():
    assert stats.pass_hat_k(10, 3, 2) == 3 / 45 and stats.pass_hat_k(10, 7, 3) == 35 / 120 and stats.pass_hat_k(5, 5, 5) == 1.0
    assert stats.pass_hat_k(10, 3, 1) == 0.3 and stats.pass_hat_k(10, 2, 3) == 0.0
    # mid-p = 2·P(X <= m) - P(X = m), X ~ Binomial(b + c, 1/2), summed by hand: b = 1, c = 7 -> (2·9 - 8)/256
    assert stats.mcnemar_midp(1, 7) == pytest.approx(10 / 256) and stats.mcnemar_midp(7, 1) == pytest.approx(10 / 256)
    assert stats.mcnemar_midp(1, 12) == pytest.approx(15 / 8192) and stats.mcnemar_midp(0, 0) == 1.0
    assert stats.mcnemar_midp(3, 3) == 1.0


def test_wilson_holm_and_mcnemar_agree_with_statsmodels():
    from statsmodels.stats.contingency_tables import mcnemar
    from statsmodels.stats.multitest import multipletests
    from statsmodels.stats.proportion import proportion_confint

    for k, n in [(0, 1), (1, 1), (1, 2), (3, 10), (14, 60), (7, 20), (0, 20), (20, 20), (499, 1000)]:
        assert stats.wilson_interval(k, n) == pytest.approx(proportion_confint(k, n, alpha=0.05, method="wilson"), abs=1e-12)
    for pvalues in ([0.01, 0.04, 0.03, 0.2], [0.5], [0.001, 0.001, 0.9, 0.04, 0.02], [1.0, 0.0, 0.3]):
        assert stats.holm(pvalues) == pytest.approx(list(multipletests(pvalues, method="holm")[1]))
    from scipy.stats import binom

    for b, c in [(1, 7), (2, 0), (4, 5), (3, 11)]:  # b != c: at b = c statsmodels caps the exact p at 1 first
        exact = mcnemar([[0, b], [c, 0]], exact=True).pvalue
        assert stats.mcnemar_midp(b, c) == pytest.approx(exact - binom.pmf(min(b, c), b + c, 0.5))


def test_newcombe_paired_interval_matches_a_published_worked_example():
    # Cavo et al. 2012 (59, 6, 16, 80), Newcombe's square-and-add interval (method 10) as published in the test suite
    # of the R package contingencytables (ocbe-uio/contingencytables, tests/testthat/test-ch8.R, the book's chapter 8):
    # estimate -0.0621, 95% CI -0.1186 to -0.0046.
    diff, low, high = stats.newcombe_paired_diff(59, 6, 16, 80)
    assert (round(diff, 4), round(low, 4), round(high, 4)) == (-0.0621, -0.1186, -0.0046)


@pytest.mark.parametrize("table", [(0, 2, 0, 0), (1, 0, 0, 1), (1, 1, 7, 12), (59, 6, 16, 80), (0, 0, 0, 3), (3, 9, 1, 7),
                                   (0, 1, 1, 0), (10, 0, 4, 10)])  # fmt: skip
def test_tango_interval_inverts_mcnemars_asymptotic_test(table):
    from statsmodels.stats.contingency_tables import mcnemar

    a, b, c, d = table
    diff, low, high = stats.tango_paired_diff(*table)
    assert low < high and low <= diff <= high  # never zero width for n >= 1
    n = a + b + c + d
    for bound, sign in ((low, 1), (high, -1)):  # each finite bound solves T(bound) = ±z
        if -1 < bound < 1:
            assert stats._tango_score(b, c, n, bound) == pytest.approx(sign * Z, abs=1e-6)
    if b + c:
        p_asymptotic = mcnemar([[a, b], [c, d]], exact=False, correction=False).pvalue
        assert (low <= 0 <= high) == (p_asymptotic >= 0.05)


def test_compare_on_two_pairs_is_consistent_with_mcnemar():
    # the case: 2 pairs, A passes both, B neither -> mid-p 0.25, and the interval must hold 0
    diff, low, high = stats.tango_paired_diff(0, 2, 0, 0)
    assert diff == 1.0 and low < 0 < high and stats.mcnemar_midp(2, 0) == pytest.approx(0.25)
    # a 1/2 vs 1/2 mode with both members agreeing: no discordant pair, yet no zero-width interval
    diff, low, high = stats.tango_paired_diff(1, 0, 0, 1)
    assert diff == 0.0 and low < -0.5 and high > 0.5


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
        "checks.csv",
        "runs.csv",
        "report.md",
    ]
    md = (tmp_path / "r" / "report.md").read_text()
    low, high = wilson_by_hand(3, 10)
    assert f"30.0% [{100 * low:.1f}, {100 * high:.1f}]" in md  # 30.0% [10.8, 60.3]
    assert "Same in every row: scenario = `s`, tool_mode = `native`, parser = `lenient`, think = `default`, stream = `off`." in md
    write_report(two, tmp_path / "by-model", by=["model"], formats=["md"])
    by_model = (tmp_path / "by-model" / "report.md").read_text()
    assert f"15/20 = 75.0% [{100 * wilson_by_hand(15, 20)[0]:.1f}, {100 * wilson_by_hand(15, 20)[1]:.1f}]" in by_model
    assert "| ollama:qwen2.5-coder:1.5b | 16/20 | `s: file_exists` 16/20 |" in re.sub(" +", " ", by_model)
    assert "run `small-t0.7-r0` turn 1 (39 chars)" in md
    for name in ("pass_rate.png", "failure_modes.png", "outcomes.png", "pass_k.png"):
        assert f"]({name})" in md
        width, height = _png_size(tmp_path / "r" / name)
        assert 500 <= width <= 2000 and 250 <= height <= 1500
    import matplotlib.image

    image = matplotlib.image.imread(tmp_path / "r" / "pass_rate.png")
    assert image.std() > 0.05  # not blank


# newcomer finding: the report's header named a "runs chain head" beside the "Ledger head" line `harness report` printed,
# two different heads; the header now carries that same anchor
def test_the_report_header_carries_the_ledger_head_the_command_prints(two, tmp_path, capsys):
    from tests.helpers import cli

    rc, out, err = cli(capsys, "report", "--ledger", two, "--out", tmp_path / "r", "--format", "md")
    anchor = out.splitlines()[-1].removeprefix("Ledger head (check later with `harness ledger verify --anchor`): ")
    assert (rc, err) == (0, "") and anchor.startswith("hl1:") and len(anchor) > 70
    header = (tmp_path / "r" / "report.md").read_text().splitlines()[2]
    assert header.endswith(f"; ledger head `{anchor}` (as `harness report` prints it last).")
    assert cli(capsys, "ledger", "verify", "--ledger", two, "--anchor", anchor)[0] == 0


def test_report_is_byte_identical(two, tmp_path):
    write_report(two, tmp_path / "a", formats=["md", "png", "csv"])
    write_report(two, tmp_path / "b", formats=["md", "png", "csv"])
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert len(files) == 9
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_empty_ledger_reports_a_note(ledger_path, tmp_path):
    Ledger(ledger_path).close()
    write_report(ledger_path, tmp_path / "r", formats=["md", "png", "csv"])
    md = (tmp_path / "r" / "report.md").read_text()
    assert "The ledger holds no runs yet" in md and not list((tmp_path / "r").glob("*.png"))


def test_one_run_is_one_run_not_1_runs(ledger_path, tmp_path):
    with Ledger(ledger_path) as ledger:
        add_run(ledger, "one", model=BIG, outcome="pass")
    assert main(["report", "--ledger", str(ledger_path), "--out", str(tmp_path / "r"), "--format", "md"]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert f"Ledger `{ledger_path.name}`: 1 run (1 scored" in md and "1 runs" not in md


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
    assert f"Ledger `{ledger_path.name}`: 5 runs (5 scored" in md
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
    assert (row["runs"], row["scored"], row["passes"]) == (2, 2, 1)  # the identity's repeat is no second run
    assert row["pass_rate"] == 0.5
    write_report(path, tmp_path / "out", formats=["md"])
    text = (tmp_path / "out" / "report.md").read_text()
    assert "1 run(s) repeat a run identity recorded again" in text and "2 runs (and 1 other attempt" in text

    # stop 29: a later, interrupted re-run of a scored identity was called an "earlier attempt"
    with Ledger(path) as ledger:
        add_run(ledger, "later-cut", model=SMALL, outcome="interrupted", identity="same", day=4)
    assert load_frames(path).runs.set_index("run_id")["counted"].to_dict()["later-cut"] is False
    write_report(path, tmp_path / "out", formats=["md"])
    text = (tmp_path / "out" / "report.md").read_text()
    assert "2 runs (and 2 other attempts of the same run identities" in text and "earlier attempt" not in text


def test_an_interrupted_then_resumed_run_counts_once(tmp_path):
    path = tmp_path / "resumed.sqlite"
    with Ledger(path) as ledger:
        add_run(ledger, "cut", model=SMALL, outcome="interrupted", identity="same", day=1)
        add_run(ledger, "resumed", model=SMALL, outcome="pass", identity="same", day=2)
        add_run(ledger, "still-cut", model=SMALL, outcome="interrupted", identity="other", day=3)
    frames = load_frames(path)
    assert frames.runs.set_index("run_id")["counted"].to_dict() == {"cut": False, "resumed": True, "still-cut": True}
    [row] = summary_table(frames, ["model"]).to_dict("records")
    assert (row["runs"], row["scored"], row["passes"], row["interrupted"]) == (2, 1, 1, 1)


# finding: the header said "23 runs (and 2 earlier attempts ... not counted) ..., 31 turns" while the 23 runs had 30
# turns: the 31st was the interrupted attempt's, which resume ran again
def test_the_headers_turn_count_covers_the_runs_it_counts(tmp_path):
    path = tmp_path / "resumed.sqlite"
    with Ledger(path) as ledger:
        add_run(ledger, "cut", model=SMALL, outcome="interrupted", identity="same", turns=[([], "hm")], day=1)
        add_run(ledger, "resumed", model=SMALL, outcome="pass", identity="same", turns=[([], "a"), ([], "b")], day=2)
        add_run(ledger, "other", model=SMALL, outcome="task_failed", repetition=1, turns=[([], "c")] * 3, day=3)
    write_report(path, tmp_path / "out", formats=["md"])
    [header] = [line for line in (tmp_path / "out" / "report.md").read_text().splitlines() if line.startswith("Ledger `")]
    assert header.startswith("Ledger `resumed.sqlite`: 2 runs (and 1 other attempt of the same run identities, with "
                             "1 turn, not counted) (2 scored, 0 infra_error, 0 interrupted or unfinished, 0 "
                             "context_overflow), 5 turns; "), header  # fmt: skip


# -- red-team: names cannot break the markdown, plots stay readable, numbers stay right -------------------
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


# red-team finding: unescaped names broke the markdown
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


# red-team finding: unescaped names broke the markdown
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


# red-team finding: `harness compare` left model names unescaped
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


# red-team finding: long model specs made the plots unreadable
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


# red-team finding: long model specs made the plots unreadable
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
    # Tango on (1, 3, 0, 1): McNemar's asymptotic statistic 3/sqrt(3) = 1.73 < 1.96, so the interval holds 0
    diff, lo, hi = tango_paired_diff(1, 3, 0, 1)
    assert diff == pytest.approx(0.6) and lo < 0 < hi


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


def test_guard_reports_of_only_unfinished_or_interrupted_runs(tmp_path):
    ledger = tmp_path / "l.sqlite"
    with Ledger(ledger) as led:
        add_run(led, "u", model=SMALL, outcome=None, turns=[([], "a"), (["code_fence"], "b")])
        add_run(led, "i", model=SMALL, outcome="interrupted", repetition=1)
    written = write_report(ledger, tmp_path / "out", formats=["md", "png", "csv"])
    text = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "**No scored run:**" in text and "n/a (no scored run)" in text
    assert {p.name for p in written} == {
        "report.md",
        "summary.csv",
        "failure_modes.csv",
        "checks.csv",
        "runs.csv",
    }  # no empty plots


# newcomer: the pass-rate map's title ran past both edges of a 6-inch figure
@pytest.mark.parametrize("width", [6.0, 9.0])
def test_a_long_plot_title_and_footer_are_wrapped_inside_the_figure(width):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from harness.report import plots

    fig = Figure(figsize=(width, 3.0), layout="constrained")
    FigureCanvasAgg(fig)
    fig.add_subplot(1, 1, 1).imshow(np.zeros((2, 2)))
    plots._suptitle(fig, "Pass rate (cell text: passes/scored runs), tool-using and restraint scenarios apart " * 2)
    footer = "n = 5 scored runs over 3 rows; grey: no scored run; 95% Wilson intervals in the summary table; " * 2
    fig.supxlabel(plots._fitted(fig, footer, 8.0), fontsize=8)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for text in (fig._suptitle, fig._supxlabel):
        box = text.get_window_extent(renderer)
        assert "\n" in text.get_text() and box.x0 >= 0 and box.x1 <= fig.bbox.x1, (text.get_text(), box, fig.bbox)
