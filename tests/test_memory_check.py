"""The memory check before an embedded model loads: the estimate with real numbers, the sources of the memory
available, and the one sentence the CLI prints for a model that does not fit (on sparse files: no real weights)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.backends import EmbeddedBackend, open_backend
from harness.backends import memory as mem
from harness.errors import UsageError
from harness.ledger import Ledger
from harness.loop import RunOptions, RunPlan
from harness.runner import run_matrix
from tests.helpers import SCENARIO_FILE, assert_one_sentence_error, cli

SMOLLM2_BYTES = 98_362_432
GiB = 1024**3


def sparse(path: Path, size: int) -> Path:
    """A file of ``size`` bytes that takes no disk space (the check reads only its size)."""
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


def test_the_estimate_is_the_file_plus_a_tenth_plus_the_kv_bound_plus_the_runtime():
    # SmolLM2-135M (98,362,432 bytes) at 2048 tokens: 98,362,432 + 9,836,243 + 2048 x 65,536 + 134,217,728
    assert mem.load_estimate_bytes(SMOLLM2_BYTES, 2048) == 376_634_131
    # a 4.68 GB file at 4096 tokens: 4,683,073,952 + 468,307,395 + 4096 x 65,536 + 134,217,728
    assert mem.load_estimate_bytes(4_683_073_952, 4096) == 5_554_034_531
    # the KV bound covers the known models' real figure: 2 (K, V) x layers x KV heads x head size x 2 bytes (f16)
    qwen7b, smollm2 = 2 * 28 * 4 * 128 * 2, 2 * 30 * 3 * 64 * 2
    assert (qwen7b, smollm2) == (57_344, 23_040) and max(qwen7b, smollm2) < mem.KV_BYTES_PER_TOKEN
    assert mem.load_estimate_bytes(0, 0) == mem.RUNTIME_BYTES


def test_the_memory_available_is_memavailable_capped_by_the_limit(monkeypatch):
    monkeypatch.delenv(mem.LIMIT_ENV, raising=False)
    found = mem.memory_available_bytes()
    if Path("/proc/meminfo").is_file():
        assert found is not None and found[1] == "MemAvailable" and found[0] > 0
        line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemAvailable:"))
        assert abs(found[0] - int(line.split()[1]) * 1024) < 2 * GiB  # read moments apart; the same figure in bytes
    monkeypatch.setenv(mem.LIMIT_ENV, "512M")
    assert mem.memory_available_bytes() == (512 * 1024**2, mem.LIMIT_ENV)
    monkeypatch.setenv(mem.LIMIT_ENV, "1000")
    assert mem.memory_available_bytes() == (1000, mem.LIMIT_ENV)
    monkeypatch.setenv(mem.LIMIT_ENV, "lots")
    with pytest.raises(UsageError, match=r"HARNESS_MEMORY_LIMIT='lots' is not a size; set it like 512M or 8G"):
        mem.memory_available_bytes()


def test_without_meminfo_or_a_limit_the_check_is_skipped(tmp_path, monkeypatch):
    monkeypatch.delenv(mem.LIMIT_ENV, raising=False)
    monkeypatch.setattr(mem, "_MEMINFO", tmp_path / "no-meminfo")  # a system without /proc/meminfo
    assert mem.memory_available_bytes() is None
    mem.check_fits(sparse(tmp_path / "huge.gguf", 1 << 40), 4096)  # nothing to compare with: no refusal


def test_a_split_model_counts_every_part(tmp_path):
    parts = [sparse(tmp_path / f"m-{i:05d}-of-00003.gguf", i * GiB) for i in (1, 2, 3)]
    assert mem.model_files_bytes(parts[0]) == 6 * GiB
    assert mem.model_files_bytes(sparse(tmp_path / "single.gguf", 5)) == 5


def test_a_model_larger_than_the_memory_available_is_refused_before_loading(tmp_path, monkeypatch):
    monkeypatch.delenv(mem.LIMIT_ENV, raising=False)
    if mem.memory_available_bytes() is None:
        pytest.skip("this system reports no MemAvailable")
    huge = sparse(tmp_path / "huge.gguf", 1 << 40)  # 1 TiB: more than this test machine's MemAvailable
    with pytest.raises(
        UsageError, match=r"^huge\.gguf needs about 1209\.\d\d GB of memory to load .* \(MemAvailable in /proc/meminfo\)"
    ):
        EmbeddedBackend(str(huge), num_ctx=512)


def test_the_cli_says_one_sentence_and_records_nothing_for_a_model_over_the_limit(tmp_path, capsys, monkeypatch):
    model = sparse(tmp_path / "model.gguf", 600 * 1024**2)
    monkeypatch.setenv(mem.LIMIT_ENV, "512M")
    ledger = tmp_path / "ledger.sqlite"
    rc, out, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"embedded:{model}", "--repeats", "1", "--temperature", "0",
                       "--ledger", ledger)  # fmt: skip
    assert_one_sentence_error(rc, err)
    assert rc == 2
    assert err == (
        "harness: model.gguf needs about 1.09 GB of memory to load (0.63 GB of weights plus a 4096-token context) but "
        "only 0.54 GB is available (set by HARNESS_MEMORY_LIMIT); choose a smaller model, lower num_ctx or --jobs, "
        "or free memory.\n"
    )
    if ledger.exists():  # nothing ran, so nothing is recorded as an infrastructure failure
        with Ledger(ledger, readonly=True) as db:
            assert db.runs() == []
    # the dry run says the same before anything would run
    rc, out, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"embedded:{model}", "--dry-run")
    assert rc == 2 and "needs about 1.09 GB of memory to load" in err


def test_memory_taken_after_the_backend_opened_stops_the_matrix_before_any_run(tmp_path, monkeypatch, scenario):
    """The second check, just before the server starts: e.g. another model of the matrix took the memory meanwhile."""
    monkeypatch.delenv(mem.LIMIT_ENV, raising=False)
    model = sparse(tmp_path / "model.gguf", 600 * 1024**2)

    def open_then_shrink(spec, **kwargs):
        backend = open_backend(spec, **kwargs)  # fits the real MemAvailable when opened
        monkeypatch.setenv(mem.LIMIT_ENV, "512M")
        return backend

    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        with pytest.raises(UsageError, match=r"^model\.gguf needs about 1\.09 GB .* \(set by HARNESS_MEMORY_LIMIT\)"):
            run_matrix([RunPlan(scenario, f"embedded:{model}", 0.0)], ledger, RunOptions(runs_dir=tmp_path / "runs"),
                       backend_factory=open_then_shrink)  # fmt: skip
        assert ledger.runs() == []  # refused before loading: no run recorded as an infrastructure failure
