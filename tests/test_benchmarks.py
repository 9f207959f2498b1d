"""The benchmark scripts still run against the current API (small sizes; their figures are not asserted).

A newcomer found two of them broken after the restructure: an import that had moved and a
keyword argument that had become part of RunOptions. These runs catch that kind of drift.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

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


def test_batch_agreement_reports_each_tuning_batch_and_never_the_held_out_one():
    from harness.corpus import HELD_OUT_BATCH, load_corpus

    proc = subprocess.run([sys.executable, "benchmarks/batch_agreement.py", "--json"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout)
    sizes: dict[int, int] = {}
    for entry in load_corpus(REPO / "tests" / "corpus" / "entries"):
        sizes[entry.batch] = sizes.get(entry.batch, 0) + 1
    assert str(HELD_OUT_BATCH) not in figures
    assert {int(b): f["replies"] for b, f in figures.items()} == {b: n for b, n in sizes.items() if b != HELD_OUT_BATCH}
    for f in figures.values():
        assert 0 <= f["exact"] <= f["replies"]
        assert set(f["modes"]) == {"fabricated_tool_result", "narration_without_call"}


def test_viewer_scale_serves_a_small_ledger(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/viewer_scale.py", "--turns", "800", "--ledger", str(tmp_path / "l.sqlite"),
                           "--repeats", "1"], cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "rows on the first page 50" in proc.stdout and "harness view on 800 turns, median of 1" in proc.stdout


def test_peer_inspect_without_a_peer_measures_the_harness_side_and_says_so():
    """No venv: the harness's 3-turn runs pass in their child (9 turns for 3 runs) and no ratio is claimed."""
    proc = subprocess.run([sys.executable, "benchmarks/peer_inspect.py", "--rounds", "1", "--runs", "3"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "(3 runs, 9 turns," in proc.stdout
    assert "inspect_ai was not measured" in proc.stdout and "ratio harness" not in proc.stdout
    assert (
        f"work folders in {tempfile.gettempdir()} (" in proc.stdout
    )  # with its file system: slow inode creation moves the figure
    assert re.search(r"\(\w+: a new folder and file in it \d+\.\d\d ms; TMPDIR=DIR picks another\)", proc.stdout)


def test_peer_inspect_times_a_new_folder_and_file_and_leaves_nothing_behind(tmp_path):
    """What a run's sandbox costs the disk before any code runs: a positive time, the scratch folder removed."""
    bench = _load("peer_inspect")
    assert 0 < bench.new_file_ms(str(tmp_path), count=5) < 10_000
    assert list(tmp_path.iterdir()) == []


def test_peer_inspect_names_the_file_system_of_a_folder(tmp_path):
    """The file system's type from /proc/mounts, by the longest mount point holding the folder."""
    bench = _load("peer_inspect")
    mounts = {fields[1]: fields[2] for fields in (line.split() for line in Path("/proc/mounts").read_text().splitlines())}
    assert bench.file_system("/proc/self") == mounts["/proc"] == "proc"
    assert bench.file_system(str(tmp_path)) in set(mounts.values())
    assert bench.file_system("/") == mounts["/"]
    # red team: a mount point with a space is listed as \040; the later of two mounts at one point is the one on top
    table = "/dev/vda / ext4 rw 0 0\nnone /mnt/a\\040b tmpfs rw 0 0\nnone /mnt/c proc rw 0 0\nnone /mnt/c tmpfs rw 0 0\n"
    assert [bench.file_system(p, table) for p in ("/mnt/a b/x", "/mnt/a\\040b", "/mnt/c", "/mnt/cd")] == [
        "tmpfs",
        "ext4",
        "tmpfs",
        "ext4",
    ]


def test_peer_inspect_refuses_a_venv_without_inspect_ai(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/peer_inspect.py", "--venv", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode != 0
    assert proc.stderr.strip() == f"{tmp_path} holds no importable inspect_ai; make it with --install {tmp_path}"


def test_peer_inspect_summary_takes_medians_and_judges_the_ratio():
    bench = _load("peer_inspect")

    def row(ms, rss=40.0, startup=0.2):
        return {"ms_per_turn": ms, "cpu_ms_per_turn": ms / 2, "turns": 600, "runs": 200, "elapsed_s": ms * 0.6,
                "peak_rss_mib": rss, "startup_s": startup}  # fmt: skip

    peer = [row(30.0, 150, 5.0), row(20.0, 160, 4.0), row(25.0, 155, 4.5)]
    for harness_ms, verdict in ((1.0, "met"), (3.0, "NOT met")):
        mine = [row(harness_ms * 3), row(harness_ms), row(harness_ms * 0.5)]
        medians = bench.summarise({"harness": mine, "inspect_ai": peer})
        assert medians["harness"]["ms_per_turn"] == harness_ms and medians["inspect_ai"]["peak_rss_mib"] == 155
        assert medians["ratio"]["ms_per_turn"] == harness_ms / 25.0
        lines = bench.report_lines(medians, rounds=3, peer="0.3.285")
        assert lines[-1].startswith(f"   target per turn <= 0.05 of inspect_ai's: {verdict} ({harness_ms / 25:.3f};")
        assert any(line.startswith("   inspect_ai 0.3.285") for line in lines)


def test_peer_inspect_checks_on_the_peer_side_match_the_scenarios(tmp_path):
    """inspect_ai's scorer (run only with the venv) applies list_and_report's checks; here on real folders."""
    bench = _load("peer_inspect")
    fixtures = ["config.json", "hello.txt", "memo.md"]
    for name in fixtures:
        (tmp_path / name).write_text("x")
    assert not bench._report_ok(tmp_path, fixtures)  # no report yet
    for text, ok in ((bench.REPORT, True), (bench.REPORT + "notes.txt\n", False), (bench.REPORT.replace("3", "4"), False),
                     ("config.json\nhello.txt\n", False)):  # fmt: skip
        (tmp_path / "report.txt").write_text(text)
        assert bench._report_ok(tmp_path, fixtures) is ok, text
    assert bench._inside(tmp_path.resolve(), "memo.md") == tmp_path.resolve() / "memo.md"
    with pytest.raises(ValueError):
        bench._inside(tmp_path.resolve(), "../outside.txt")


def test_concurrency_runs_a_case_against_its_server_process(tmp_path):
    figures = _load("concurrency").measure(2, 20.0, 4, tmp_path)
    assert figures["turns"] == 12 and figures["runs"] == 4
    assert 0 < figures["ideal"] <= 1.0 and figures["cpu_s"] > 0
    assert 0 < figures["sustained_s"] <= figures["wall_s"]  # the first start row to the last end row: inside the case
    driver, workers, server = figures["sustained_cpu_s"]  # sampled from /proc within that window
    assert driver >= 0 and workers == 0 and server >= 0  # threads: no worker process (the server is not counted as one)


def test_concurrency_measures_the_workers_cpu_in_the_sustained_window(tmp_path):
    figures = _load("concurrency").measure(4, 0.0, 64, tmp_path, executor="processes", workers=2)
    assert figures["turns"] == 192 and 0 < figures["sustained_s"] < figures["wall_s"]
    driver, workers, server = figures["sustained_cpu_s"]
    assert 0 < workers < figures["workers_cpu_s"]  # the workers' start (importing the harness) is outside the window


def test_concurrency_verdict_bounds_a_case_by_the_cpu_it_used(monkeypatch):
    """The target is judged on the sustained rate; the ceiling is CPUs / (driver + workers + server CPU per turn within
    the sustained window); a target above it is said to need less CPU."""
    bench = _load("concurrency")
    monkeypatch.setattr(bench.os, "sched_getaffinity", lambda pid: {0, 1})
    case = {"jobs": 64, "latency_ms": 0.0, "turns": 1000, "turns_per_s": 700.0, "sustained_s": 1.25,
            "sustained_cpu_s": (0.5, 1.5, 0.5)}  # fmt: skip
    assert bench._verdict(case) == (
        "target >= 1,000 turns/s, sustained: NOT met (800 turns/s; 700 with the workers' start and end); sustained, 2 CPUs"
        " at 2.50 ms of CPU per turn (driver 0.50 + workers 1.50 + server 0.50) allow at most 800 turns/s, below the"
        " target: it needs at most 2.00 ms per turn; this case reached 1.00 of that ceiling"
    )
    fast = {**case, "turns_per_s": 900.0, "sustained_s": 1000 / 1100, "sustained_cpu_s": (0.5, 0.5, 0.5)}  # 1,333 at most
    assert bench._verdict(fast).startswith("target >= 1,000 turns/s, sustained: met (1100 turns/s; 900 with the workers'")
    assert bench._verdict(fast).endswith("allow at most 1333 turns/s; this case reached 0.83 of that ceiling")
    slow = {**case, "jobs": 256, "latency_ms": 200.0, "turns_per_s": 500.0, "sustained_s": 1000 / 550}  # ideal 1,280
    assert bench._verdict(slow).startswith("target >= 0.85 x ideal, sustained: NOT met (0.43; 0.39 with the workers'")
    assert bench._verdict(slow).endswith(
        "allow at most 0.62 x ideal, below the target: it needs at most 1.84 ms per turn; this case reached 0.69 of that ceiling"
    )
    idle = {**slow, "jobs": 4, "sustained_s": 1000 / 19}  # ideal 20 turns/s, far below the CPU ceiling: the ideal bounds it
    assert bench._verdict(idle).endswith("allow at most 1.00 x ideal; this case reached 0.95 of that ceiling")
    assert bench._verdict({**case, "jobs": 8}).startswith("sustained, 2 CPUs at 2.50 ms")  # the 1,000 target: at 64


def test_replicas_benchmark_runs_and_outlives_a_replica():
    proc = subprocess.run([sys.executable, "benchmarks/replicas.py", "--jobs", "1", "--latency-ms", "5", "--runs-per-slot", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "4 replicas:   8 runs" in proc.stdout and "4 runs in" in proc.stdout and "all pass" in proc.stdout


def test_shard_merge_agrees_on_a_tiny_matrix(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/shard_merge.py", "--runs", "16", "--shards", "3", "--merges", "1",
                           "--work", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "merged report equals the unsharded one (timing columns and run ids left out): yes" in proc.stdout


@pytest.mark.slow
def test_ray_executor_benchmark_measures_both_parts():
    """2 fast servers, 1 run per slot; 4 replay runs per executor, 1 round (threads, processes, ray)."""
    pytest.importorskip("ray")
    proc = subprocess.run([sys.executable, "benchmarks/ray_executor.py", "--servers", "2", "--latency-ms", "20",
                           "--runs-per-slot", "1", "--runs", "4", "--rounds", "1"], cwd=REPO, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "ideal 8 in flight = 400 turns/s" in out
    assert all(f"   {executor:9} 8 runs, 24 turns in" in out for executor in ("threads", "ray")), out
    assert all(f"   median {executor:9}" in out for executor in ("threads", "processes", "ray")), out


def test_ledger_appends_replays_the_peer_task_and_times_each_statement():
    proc = subprocess.run([sys.executable, "benchmarks/ledger_appends.py", "--runs", "30", "--statements"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "every ledger verifies: True" in proc.stdout
    assert "INSERT INTO turns" in proc.stdout and "COMMIT:" in proc.stdout
