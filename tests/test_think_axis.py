"""``think`` as a full matrix axis downstream, the way ``stream`` is: the run summary, the report (cells, ``--by``,
pass^k, the CSVs), ``harness compare``'s pairing, ``harness review``'s header and ``harness export``; and ledgers
recorded before ``think`` existed read it as ``default``.

Every ledger here is real: ``harness run`` over the replay cassettes of ``list_and_report``.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from harness.ledger import EXPORT_COLUMNS, Ledger
from harness.report import load_frames, summary_table
from harness.report.compare import PAIR_KEY_TEXT, compare_models, format_comparison
from harness.review import review_text
from tests.helpers import CASSETTES, REPO, RUN_FLAGS, cli

SCENARIO = REPO / "scenarios" / "list_and_report.toml"
IDEAL = f"replay:{CASSETTES / 'list_and_report' / 'ideal.jsonl'}"
BROKEN = f"replay:{CASSETTES / 'list_and_report' / 'broken.jsonl'}"
OLD_LEDGER = REPO / "tests" / "data" / "ledger_m006_replay.sqlite"
"""Recorded before ``runs.think`` (m007) existed (see tests/test_streaming.py)."""


def _run(capsys, ledger: Path, *flags: str, models=(IDEAL,)) -> str:
    model_flags = [f for m in models for f in ("--model", m)]
    rc, out, err = cli(capsys, "run", SCENARIO, *model_flags, *RUN_FLAGS, *flags, "--ledger", ledger)
    assert rc == 0, err
    return out


@pytest.fixture
def on_off(tmp_path, capsys) -> tuple[Path, str]:
    """A ledger with one model run twice (repetitions 0 and 1) under think=on and twice under think=off."""
    ledger = tmp_path / "l.sqlite"
    out = _run(capsys, ledger, "--repeats", "2", "--think", "on", "--think", "off")
    return ledger, out


def _table_rows(out: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if line.startswith("| ")]


def test_the_run_summary_has_a_think_row_per_setting(on_off):
    _, out = on_off
    header, *rows = _table_rows(out)
    assert "think" in header and "stream" not in header  # stream only when some run streamed
    think, runs = header.index("think"), header.index("runs")
    assert sorted((r[think], r[runs]) for r in rows) == [("off", "2"), ("on", "2")]


def test_the_run_summary_shows_no_think_column_when_every_run_is_default(tmp_path, capsys):
    out = _run(capsys, tmp_path / "l.sqlite", "--repeats", "1")
    header, *rows = _table_rows(out)
    assert "think" not in header and len(rows) == 1


def test_the_report_keeps_think_apart_in_cells_by_and_pass_k(on_off, tmp_path, capsys):
    ledger, _ = on_off
    frames = load_frames(ledger)
    assert sorted(frames.runs["think"]) == ["off", "off", "on", "on"]
    table = summary_table(frames)
    assert table["think"].tolist() == ["off", "on"]
    assert table["runs"].tolist() == [2, 2] and table["scored"].tolist() == [2, 2]
    assert table["pass^2"].tolist() == [1.0, 1.0] and "pass^3" not in table  # 2 trials per cell, not 4
    rc, _, err = cli(capsys, "report", "--ledger", ledger, "--out", tmp_path / "r", "--by", "think", "--format", "csv")
    assert rc == 0, err
    summary = (tmp_path / "r" / "summary.csv").read_text().splitlines()
    assert summary[0].startswith("think,runs,") and summary[1].startswith("off,2,") and summary[2].startswith("on,2,")
    rc, _, err = cli(capsys, "report", "--ledger", ledger, "--out", tmp_path / "all", "--format", "csv,md")
    assert rc == 0, err
    cells = list(csv.DictReader(io.StringIO((tmp_path / "all" / "summary.csv").read_text())))
    assert [(c["think"], c["runs"]) for c in cells] == [("off", "2"), ("on", "2")]
    runs = list(csv.DictReader(io.StringIO((tmp_path / "all" / "runs.csv").read_text())))
    assert sorted(r["think"] for r in runs) == ["off", "off", "on", "on"]
    report = (tmp_path / "all" / "report.md").read_text()
    assert "\n| think   | runs " in report and ", stream = `off`." in report  # it varies, so it is a column


def test_by_think_is_not_refused_and_an_unknown_axis_lists_think(on_off, tmp_path, capsys):
    ledger, _ = on_off
    rc, _, err = cli(capsys, "report", "--ledger", ledger, "--out", tmp_path / "r", "--by", "nope", "--format", "csv")
    assert rc == 2 and "tool_mode, parser, think, stream" in err


def test_compare_pairs_by_think(tmp_path, capsys):
    ledger = tmp_path / "l.sqlite"
    _run(capsys, ledger, "--repeats", "1", "--think", "on", "--think", "off", models=(IDEAL, BROKEN))
    result = compare_models(load_frames(ledger), IDEAL, BROKEN)
    assert (result.pairs, result.unpaired_a, result.unpaired_b) == (2, 0, 0)
    assert (result.only_a_pass, result.both_pass) == (2, 0)
    text = format_comparison(result)
    assert f"Pairs: 2 (same {PAIR_KEY_TEXT}; scored runs only; unpaired scored runs: 0 of" in text


def test_the_pairing_key_reads_the_same_in_compare_the_readme_and_the_docs():
    assert PAIR_KEY_TEXT == "scenario, temperature, tool mode, parser, think, stream, repetition and seed"
    flat = {name: " ".join((REPO / name).read_text().split()) for name in ("README.md", "docs/reports.md")}
    assert all(PAIR_KEY_TEXT in text for text in flat.values()), [n for n, t in flat.items() if PAIR_KEY_TEXT not in t]


def test_the_review_header_names_think_and_stream(on_off):
    ledger, _ = on_off
    with Ledger(ledger, readonly=True) as db:
        runs = {r.start.think: r.run_id for r in db.runs()}
    assert "native/lenient · think on · stream off · repetition" in review_text(ledger, runs["on"])
    assert "native/lenient · think off · stream off · repetition" in review_text(ledger, runs["off"])


def test_export_has_seed_and_think_and_writes_stream_as_on_off(on_off, capsys):
    ledger, _ = on_off
    rc, out, _ = cli(capsys, "export", "--ledger", ledger, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rc == 0 and out.splitlines()[0] == ",".join(EXPORT_COLUMNS)
    assert {"seed", "think"} <= set(EXPORT_COLUMNS)
    assert sorted({(r["think"], r["repetition"], r["seed"]) for r in rows}) == [
        ("off", "0", "0"), ("off", "1", "1"), ("on", "0", "0"), ("on", "1", "1"),
    ]  # fmt: skip
    assert {r["stream"] for r in rows} == {"off"}
    rc, out, _ = cli(capsys, "export", "--ledger", ledger, "--format", "jsonl")
    assert rc == 0 and '"think": "on"' in out and '"stream": "off"' in out and '"seed": 1' in out


def test_a_ledger_recorded_before_think_reads_default_everywhere(tmp_path, capsys):
    ledger = tmp_path / "old.sqlite"
    ledger.write_bytes(OLD_LEDGER.read_bytes())
    with Ledger(ledger, readonly=True) as db:
        rows = list(db.export_rows())
    assert rows and {(r["think"], r["stream"]) for r in rows} == {("default", "off")}
    frames = load_frames(ledger)
    assert set(frames.runs["think"]) == {"default"} and set(summary_table(frames)["think"]) == {"default"}
    rc, _, err = cli(capsys, "report", "--ledger", ledger, "--out", tmp_path / "r", "--by", "think", "--format", "csv")
    assert rc == 0, err
    assert (tmp_path / "r" / "summary.csv").read_text().splitlines()[1].startswith("default,16,")


def test_a_default_unstreamed_run_keeps_its_review_frame_and_so_its_attestation(tmp_path, capsys):
    from harness.review import review_frame

    ledger = tmp_path / "l.sqlite"
    _run(capsys, ledger, "--repeats", "1")
    with Ledger(ledger, readonly=True) as db:
        [run] = db.runs()
    frame = review_frame(ledger, run.run_id)
    assert set(frame["run"]) == {"run_id", "scenario", "model", "temperature", "seed", "tool_mode", "parser", "repetition"}
    assert "native/lenient · think default · stream off · repetition 0" in review_text(ledger, run.run_id)
