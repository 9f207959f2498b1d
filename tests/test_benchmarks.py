"""The benchmark scripts still run against the current API (small sizes; their figures are not asserted).

A newcomer found two of them broken after the restructure: an import that had moved and a
keyword argument that had become part of RunOptions. These runs catch that kind of drift.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

from tests.helpers import REPO


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_matrix_scale_overhead_runs(tmp_path, capsys):
    _load("matrix_scale").overhead(tmp_path, runs=3)
    assert "3 runs, 12 turns" in capsys.readouterr().out


def test_report_scale_builds_a_ledger_that_verifies_and_reports(tmp_path):
    ledger = tmp_path / "l.sqlite"
    proc = subprocess.run([sys.executable, "benchmarks/report_scale.py", "--turns", "800", "--ledger", str(ledger),
                           "--out", str(tmp_path / "out"), "--rebuild"], cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "report.md").exists()
    verify = subprocess.run([sys.executable, "-m", "harness", "ledger", "verify", "--ledger", str(ledger)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_label_agreement_prints_every_part():
    proc = subprocess.run([sys.executable, "benchmarks/label_agreement.py", "--json"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)) == {"all", "tune", "held-out"}


def test_classifier_speed_adversarial_table_has_a_row_per_input(capsys, monkeypatch):
    module = _load("classifier_speed")
    monkeypatch.setattr(module, "SIZES_KB", (1, 2))
    module.adversarial()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + len(module.ADVERSARIAL) + len(module.ADVERSARIAL_WEATHER)
    assert all(float(line.split()[-1]) > 0 for line in lines[1:])  # the per-KB ratio column


def test_kill_resume_passes_on_a_tiny_matrix():
    """12 runs, 2 SIGKILLs (as pid 1 in a new pid namespace where available), every check of the full benchmark."""
    proc = subprocess.run([sys.executable, "benchmarks/kill_resume.py", "--runs", "12", "--kills", "2", "--latency-ms", "10",
                           "--seed", "7"], cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith("PASS: 12 runs, 2 kills"), proc.stdout
    assert "  --dry-run: 12 runs planned, 12 already done, 0 to run." in proc.stdout
    assert sum(" verify exit 1" in line or "verify --anchor exit 1" in line for line in lines) >= 14, proc.stdout


def test_stream_overhead_measures_both_settings(tmp_path, capsys):
    bench = _load("stream_overhead")
    turns = bench.measure(tmp_path, runs=2, piece_chars=8)
    assert len(turns[False]) == len(turns[True]) == 6  # 2 runs of 3 turns each, after a warm-up run per setting
    assert all(chunks is None for _, chunks in turns[False]) and all(chunks[-1]["data"] == "[DONE]" for _, chunks in turns[True])
    bench.report(turns)
    out = capsys.readouterr().out
    assert "6 turns per setting" in out and "streaming overhead per turn:" in out


def test_concurrency_runs_a_case_against_its_server_process(tmp_path):
    figures = _load("concurrency").measure(2, 20.0, 4, tmp_path)
    assert figures["turns"] == 12 and figures["runs"] == 4
    assert 0 < figures["ideal"] <= 1.0 and figures["cpu_s"] > 0
