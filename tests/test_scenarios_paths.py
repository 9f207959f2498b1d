"""Scenario files: check paths obey the fixture path rules; a UTF-8 byte-order mark is accepted.

Red-team findings (issue 11): ``harness scenarios check`` accepted check paths such as
``../../x`` or ``/etc/passwd`` although fixtures with such paths are refused; a scenario file
starting with a UTF-8 byte-order mark (as some Windows editors save it) was "not a valid TOML file".
"""

from __future__ import annotations

import hashlib

import pytest

from harness.errors import ScenarioError
from harness.scenarios import load_scenario
from tests.helpers import SCENARIO_FILE, cli, scenario_toml


@pytest.mark.parametrize("bad", ["../../x", "/etc/passwd", "~/notes.txt", "a/../b.txt", "./report.txt", "a//b.txt"])
def test_a_check_path_outside_the_sandbox_is_refused_like_a_fixture_path(tmp_path, capsys, bad):
    check = f'[[checks]]\ntype = "file_exists"\npath = "{bad}"\n'
    path = scenario_toml(tmp_path, checks=check)
    with pytest.raises(ScenarioError, match=r"checks\[0\]': parameter 'path' is unusable"):
        load_scenario(path)
    rc, _, err = cli(capsys, "scenarios", "check", path)
    assert rc == 1 and "checks[0]" in err and "Traceback" not in err


def test_a_usable_check_path_in_a_subfolder_is_accepted(tmp_path):
    check = '[[checks]]\ntype = "file_contains"\npath = "out/report.txt"\ntext = "3"\n'
    assert load_scenario(scenario_toml(tmp_path, checks=check)).checks[0]["path"] == "out/report.txt"


def test_a_scenario_file_with_a_byte_order_mark_loads_like_the_same_file_without_it(tmp_path, capsys):
    raw = SCENARIO_FILE.read_bytes()
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + raw)
    with_bom, plain = load_scenario(path), load_scenario(SCENARIO_FILE)
    assert (with_bom.name, with_bom.task, with_bom.checks, with_bom.fixtures) == (
        plain.name,
        plain.task,
        plain.checks,
        plain.fixtures,
    )
    assert with_bom.content_hash == hashlib.sha256(path.read_bytes()).hexdigest()  # the hash covers the bytes as they are
    rc, out, err = cli(capsys, "scenarios", "check", path)
    assert rc == 0, err
