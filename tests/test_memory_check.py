"""The memory check before an embedded model loads: the estimate with real numbers, the sources of the memory
available, and the one sentence the CLI prints for a model that does not fit (on sparse files: no real weights)."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from harness.backends import EmbeddedBackend, open_backend
from harness.backends import memory as mem
from harness.errors import UsageError
from harness.executors.worker import BackendRecipe
from harness.ledger import Ledger
from harness.loop import RunOptions, RunPlan
from harness.ownership import take_lock
from harness.runner import plan_matrix, run_matrix
from tests.helpers import SCENARIO_FILE, assert_one_sentence_error, cli
from tests.ledger_builders import add_run

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
    monkeypatch.setenv(mem.LIMIT_ENV, "0.5G")  # a decimal, as the newcomer wrote it
    assert mem.memory_available_bytes() == (512 * 1024**2, mem.LIMIT_ENV)
    monkeypatch.setenv(mem.LIMIT_ENV, "1.5GiB")
    assert mem.memory_available_bytes() == (1536 * 1024**2, mem.LIMIT_ENV)
    for bad in ("lots", "0.5.1G", ".5G"):
        monkeypatch.setenv(mem.LIMIT_ENV, bad)
        with pytest.raises(UsageError, match=rf"HARNESS_MEMORY_LIMIT='{re.escape(bad)}' is not a size; set it like 512M, 0.5G"):
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
        UsageError, match=r"^huge\.gguf needs about 1126\.\d\d GiB of memory to load .* \(MemAvailable in /proc/meminfo\)"
    ):
        EmbeddedBackend(str(huge), num_ctx=512).start()  # opening it checks nothing: a done matrix never loads it


def test_the_cli_says_one_sentence_and_records_nothing_for_a_model_over_the_limit(tmp_path, capsys, monkeypatch):
    model = sparse(tmp_path / "model.gguf", 600 * 1024**2)
    monkeypatch.setenv(mem.LIMIT_ENV, "512M")
    ledger = tmp_path / "ledger.sqlite"
    rc, out, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"embedded:{model}", "--repeats", "1", "--temperature", "0",
                       "--ledger", ledger)  # fmt: skip
    assert_one_sentence_error(rc, err)
    assert rc == 2
    # sizes in GiB, the unit the limit is read in; the estimate says what it is made of
    assert err == (
        "harness: model.gguf needs about 1.02 GiB of memory to load (0.59 GiB of weights, 10 % + 128 MiB overhead, "
        "and a 4096-token context) but only 0.50 GiB is available (set by HARNESS_MEMORY_LIMIT); choose a smaller "
        "model, lower num_ctx or --embedded-slots, or free memory.\n"
    )
    assert not ledger.exists()  # nothing ran: no fresh empty ledger is left behind
    # the dry run says the same before anything would run
    rc, out, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"embedded:{model}", "--dry-run")
    assert rc == 2 and "needs about 1.02 GiB of memory to load" in err


def test_memory_taken_after_the_backend_opened_stops_the_matrix_before_any_run(tmp_path, monkeypatch, scenario):
    """The second check, just before the server starts: e.g. another model of the matrix took the memory meanwhile."""
    monkeypatch.delenv(mem.LIMIT_ENV, raising=False)
    model = sparse(tmp_path / "model.gguf", 600 * 1024**2)

    def open_then_shrink(spec, **kwargs):
        backend = open_backend(spec, **kwargs)  # fits the real MemAvailable when opened
        monkeypatch.setenv(mem.LIMIT_ENV, "512M")
        return backend

    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        with pytest.raises(UsageError, match=r"^model\.gguf needs about 1\.02 GiB .* \(set by HARNESS_MEMORY_LIMIT\)"):
            run_matrix([RunPlan(scenario, f"embedded:{model}", 0.0)], ledger, RunOptions(runs_dir=tmp_path / "runs"),
                       backend_factory=open_then_shrink)  # fmt: skip
        assert ledger.runs() == []  # refused before loading: no run recorded as an infrastructure failure


def test_the_dry_run_checks_memory_with_the_slots_of_the_real_run(tmp_path, capsys, monkeypatch):
    """``--embedded-slots 4`` gives the server 4 slots of context: the dry run must refuse what the real run would;
    ``--jobs 4`` alone keeps one slot (its requests queue), so it fits."""
    model = sparse(tmp_path / "model.gguf", 100 * 1024**2)  # 1 slot: 0.48 GiB; 4 slots: 1.23 GiB
    monkeypatch.setenv(mem.LIMIT_ENV, "1G")
    ledger = tmp_path / "ledger.sqlite"
    args = ("run", SCENARIO_FILE, "--model", f"embedded:{model}", "--repeats", "1", "--temperature", "0", "--ledger", ledger)
    rc, out, err = cli(capsys, *args, "--dry-run")
    assert rc == 0 and "1 run planned" in out, err
    rc, out, err = cli(capsys, *args, "--jobs", "4", "--dry-run")
    assert rc == 0 and "1 run planned" in out, err
    rc, out, err = cli(capsys, *args, "--embedded-slots", "4", "--dry-run")
    assert_one_sentence_error(rc, err)
    assert rc == 2 and "needs about 1.23 GiB of memory to load" in err and "16384-token context" in err
    rc, out, err = cli(capsys, *args, "--embedded-slots", "4")  # the real run refuses with the same sentence
    assert rc == 2 and "needs about 1.23 GiB of memory to load" in err
    assert not ledger.exists()


def test_embedded_models_that_fit_one_by_one_but_not_together_are_refused(tmp_path, capsys, monkeypatch):
    """Every model's server is alive until the matrix ends, so the check is on their sum (the dry run's too)."""
    first, second = (sparse(tmp_path / f"{name}.gguf", 100 * 1024**2) for name in ("first", "second"))
    monkeypatch.setenv(mem.LIMIT_ENV, "0.75G")  # each needs 0.48 GiB; both 0.96 GiB
    ledger = tmp_path / "ledger.sqlite"
    args = ("run", SCENARIO_FILE, "--model", f"embedded:{first}", "--model", f"embedded:{second}", "--repeats", "1",
            "--temperature", "0", "--ledger", ledger)  # fmt: skip
    for extra in ((), ("--dry-run",)):
        rc, out, err = cli(capsys, *args, *extra)
        assert_one_sentence_error(rc, err)
        assert rc == 2
        assert err == (
            f"harness: the 2 embedded models of this matrix are loaded side by side and together need about 0.96 GiB of "
            f"memory (embedded:{first} 0.48 GiB, embedded:{second} 0.48 GiB; each is weights, 10 % + 128 MiB overhead, "
            f"and its context) but only 0.75 GiB is available (set by HARNESS_MEMORY_LIMIT); run them in separate "
            f"matrices, lower num_ctx or --embedded-slots, or free memory.\n"
        )
        assert not ledger.exists()
    monkeypatch.setenv(mem.LIMIT_ENV, "1G")  # both fit: the dry run plans them
    rc, out, err = cli(capsys, *args, "--dry-run")
    assert rc == 0 and "2 runs planned" in out, err


def test_a_refused_start_keeps_a_ledger_that_existed_before(tmp_path, capsys, monkeypatch):
    ledger = tmp_path / "ledger.sqlite"
    Ledger(ledger).close()  # an existing (empty) ledger: not this command's to delete
    model = sparse(tmp_path / "model.gguf", 600 * 1024**2)
    monkeypatch.setenv(mem.LIMIT_ENV, "512M")
    rc, out, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"embedded:{model}", "--ledger", ledger)
    assert rc == 2 and "needs about" in err
    assert ledger.is_file()
    with Ledger(ledger, readonly=True) as db:
        assert db.runs() == []


_OTHER_PROCESS = """
import sys
from harness.ledger import Ledger
ledger = Ledger(sys.argv[1])  # another `harness run` on the same new path: opened, its model still loading
ledger.record_template("first")
print("open", flush=True)
sys.stdin.readline()
ledger.record_template("second")  # what it records after our refused start
ledger.close()
"""


def test_a_refused_start_never_deletes_a_ledger_another_process_has_open(tmp_path, capsys, monkeypatch):
    """Red-team finding: the refused start deleted 'its' new empty ledger while another process had it open, so
    everything that process recorded afterwards went to an unlinked file (lost)."""
    ledger = tmp_path / "new" / "ledger.sqlite"
    model = sparse(tmp_path / "model.gguf", 600 * 1024**2)
    monkeypatch.setenv(mem.LIMIT_ENV, "512M")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    other = subprocess.Popen([sys.executable, "-c", _OTHER_PROCESS, str(ledger)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    real = mem.memory_available_bytes

    def check_while_the_other_has_it_open():  # the other process opens the ledger just before our check refuses
        if other.stdout is not None and not getattr(check_while_the_other_has_it_open, "done", False):
            check_while_the_other_has_it_open.done = True  # type: ignore[attr-defined]
            assert other.stdout.readline() == "open\n"
        return real()

    monkeypatch.setattr(mem, "memory_available_bytes", check_while_the_other_has_it_open)
    try:
        rc, out, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"embedded:{model}", "--ledger", ledger)
        assert rc == 2 and "needs about" in err
    finally:
        other.communicate("go\n", timeout=30)
    assert other.returncode == 0
    with sqlite3.connect(ledger) as db:  # both templates the other process recorded are in the ledger on disk
        assert db.execute("SELECT count(*) FROM templates").fetchone() == (2,)


# red-13 finding: a limit of 310 digits overflowed the float to inf and int(inf) raised OverflowError (a traceback)
def test_a_limit_too_large_for_a_float_is_no_cap_not_a_traceback(tmp_path, capsys, monkeypatch):
    model = sparse(tmp_path / "model.gguf", 100 * 1024**2)
    for huge in ("9" * 400 + "G", "9999999999999999999999T"):
        monkeypatch.setenv(mem.LIMIT_ENV, huge)
        assert mem._limit() == 2**63  # beyond any machine: no cap (MemAvailable still applies)
        rc, out, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"embedded:{model}", "--repeats", "1",
                           "--temperature", "0", "--ledger", tmp_path / "l.sqlite", "--dry-run")  # fmt: skip
        assert rc == 0 and "1 run planned" in out, err


def test_a_matrix_with_nothing_left_to_run_loads_no_model_so_checks_no_memory(tmp_path, monkeypatch, scenario):
    """newcomer (this stop): with every run already in the ledger, a low HARNESS_MEMORY_LIMIT still refused the matrix
    (and its dry run) for a model it would never load: the check ran when the backend was opened, before planning."""
    model = sparse(tmp_path / "model.gguf", 100 * 1024**2)  # 0.48 GiB with one slot
    plan = RunPlan(scenario, f"embedded:{model}", 0.0)
    ident = EmbeddedBackend(str(model)).identity()
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        add_run(ledger, "done", model=plan.model, identity=plan.identity(ident.identity_digest, ident.identity_slots))
        monkeypatch.setenv(mem.LIMIT_ENV, "50M")
        planned = plan_matrix([plan], ledger)
        assert [item.done for item in planned.planned] == [True] and not planned.skipped
        result = run_matrix([plan], ledger, RunOptions(runs_dir=tmp_path / "runs"))
        assert (result.summaries, result.already_done) == ([], 1)
        with pytest.raises(UsageError, match=r"^model\.gguf needs about 0\.48 GiB"):  # a run to do: refused as before
            run_matrix([plan], ledger, RunOptions(runs_dir=tmp_path / "runs"), resume=False)
        assert [r.run_id for r in ledger.runs()] == ["done"]


def test_dry_run_and_real_run_agree_on_memory_for_a_model_whose_runs_another_process_holds(tmp_path, monkeypatch, scenario):
    """red team (this stop): plan_matrix checked the models with runs ``to_do and not running``; run_matrix those with runs ``to_do``: with the
    model's only run held by another process, the dry run said it could go on and the real run refused."""
    model = sparse(tmp_path / "model.gguf", 100 * 1024**2)  # 0.48 GiB with one slot
    plan = RunPlan(scenario, f"embedded:{model}", 0.0)
    ident = EmbeddedBackend(str(model)).identity()
    path = tmp_path / "ledger.sqlite"
    Ledger(path).close()
    held = take_lock(path, plan.identity(ident.identity_digest, ident.identity_slots))  # another process runs it now
    assert held is not None
    monkeypatch.setenv(mem.LIMIT_ENV, "50M")
    try:
        with Ledger(path) as ledger:
            dry_refused = real_refused = False
            try:
                dry = plan_matrix([plan], ledger)
                assert dry.running_elsewhere == 1
            except UsageError:
                dry_refused = True
            try:
                run_matrix([plan], ledger, RunOptions(runs_dir=tmp_path / "runs"))
            except UsageError:
                real_refused = True
    finally:
        held.release()
    assert dry_refused == real_refused, f"--dry-run refused: {dry_refused}; the real run refused: {real_refused}"


def test_a_worker_on_another_machine_refuses_a_model_too_large_for_its_memory_before_any_run(tmp_path, monkeypatch):
    """red team (this stop): once the check left EmbeddedBackend's constructor, a Ray worker on another node (which
    loads the model itself) opened it unchecked, and each run became an infra_error called a harness bug."""
    model = sparse(tmp_path / "model.gguf", 100 * 1024**2)  # 0.48 GiB with one slot
    monkeypatch.setenv(mem.LIMIT_ENV, "50M")
    recipe = BackendRecipe(f"embedded:{model}", open_backend)
    with pytest.raises(UsageError, match=r"^model\.gguf needs about 0\.48 GiB .* \(set by HARNESS_MEMORY_LIMIT\)"):
        recipe.open(remote=True)
    monkeypatch.setenv(mem.LIMIT_ENV, "1G")
    assert isinstance(recipe.open(remote=True), EmbeddedBackend)  # it fits: opened, not started
