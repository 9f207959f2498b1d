"""A run's total writes are capped (the scenario's ``write_limit_bytes``, default 16 MiB): the
issue-11 finding was one reply writing 20 files of 1 MiB, a 21 MB sandbox and a 61 MB ledger."""

from __future__ import annotations

import pytest

from harness.errors import ScenarioError
from harness.scenarios import load_scenario
from harness.tools import BUILTIN_TOOLS, DEFAULT_WRITE_LIMIT_BYTES, MAX_WRITE_BYTES, Sandbox
from tests.helpers import SCENARIO_FILE, run_replay, structured_writes, text_line

MIB = 1024 * 1024


def _writes(count: int, size: int) -> dict:
    return structured_writes({f"big{i:02d}.txt": "x" * size for i in range(count)})


def test_twenty_mebibyte_writes_stop_at_the_default_limit(tmp_path, scenario):
    assert DEFAULT_WRITE_LIMIT_BYTES == 16 * MIB and scenario.write_limit_bytes == DEFAULT_WRITE_LIMIT_BYTES
    summary, facts = run_replay(tmp_path, scenario, [_writes(20, MAX_WRITE_BYTES), text_line("done")])
    assert facts["verify"].ok
    outputs = [c["output"] for c in facts["turn_rows"][0].record.executed_calls]
    assert outputs[:16] == [f"wrote {MIB} bytes to big{i:02d}.txt" for i in range(16)]
    assert all(o.startswith(f"ERROR: this run has written {16 * MIB} bytes;") for o in outputs[16:]), outputs[16]
    assert sum(p.stat().st_size for p in summary.sandbox.iterdir() if p.name.startswith("big")) == 16 * MIB


def test_a_scenario_sets_its_own_limit_and_rewrites_count(tmp_path, scenario):
    _summary, facts = run_replay(tmp_path, scenario, [_writes(3, 40), text_line("done")], write_limit_bytes=100)
    outputs = [c["output"] for c in facts["turn_rows"][0].record.executed_calls]
    assert outputs[:2] == ["wrote 40 bytes to big00.txt", "wrote 40 bytes to big01.txt"]
    assert (
        outputs[2]
        == "ERROR: this run has written 80 bytes; 40 more would pass its limit of 100 bytes (the scenario's write_limit_bytes)"
    )
    box = Sandbox(tmp_path / "box", write_limit=10)
    assert not BUILTIN_TOOLS["write_file"].call(box, {"path": "a.txt", "content": "123456"}).error
    assert BUILTIN_TOOLS["write_file"].call(box, {"path": "a.txt", "content": "123456"}).error  # the same file again counts


@pytest.mark.parametrize("value", ["0", "-1", '"big"', "true", "9223372036854775807"])
def test_a_bad_write_limit_is_one_sentence(tmp_path, value):
    text = SCENARIO_FILE.read_text(encoding="utf-8")
    path = tmp_path / "s.toml"
    path.write_text(f"write_limit_bytes = {value}\n" + text, encoding="utf-8")
    with pytest.raises(ScenarioError, match="write_limit_bytes"):
        load_scenario(path)


def test_a_write_limit_past_the_largest_names_the_bound(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text("write_limit_bytes = 9223372036854775807\n" + SCENARIO_FILE.read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(ScenarioError, match="an integer from 1 to 2147483647"):
        load_scenario(path)
