"""A run's sandbox folder is made before its start row, at a path joined without looking (the runs folder's real path
is remembered): the start row still records the folder's real path, and a run that does not start leaves no folder."""

from __future__ import annotations

import contextlib
import os
import sqlite3

import pytest

from harness.backends import open_backend
from harness.ledger import Ledger
from harness.loop import IdentityTaken, RunOptions, RunPlan, run_once
from harness.ownership import Claim
from harness.run_facts import run_folder
from harness.sandbox import Sandbox
from harness.scenarios import load_scenario
from tests.helpers import IDEAL, SCENARIO_FILE, write_cassette


def test_the_folder_made_at_run_folder_is_the_real_path_of_the_run_folder(tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "runs").symlink_to(real)  # the runs folder is a symlink
    (real / "linked").symlink_to(tmp_path / "elsewhere")  # a run folder that is one, there before the run
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    for runs_dir in (tmp_path / "runs", "runs", str(tmp_path / "missing")):
        for run_id in ("0123abcd", "linked", "a/../b", "a b", str(tmp_path / "abs")):
            for round_ in range(2):  # the second time from the remembered runs folder (and the folder there already)
                expected = os.path.realpath(os.path.join(runs_dir, run_id))
                sandbox = Sandbox(run_folder(runs_dir, run_id), real=True)
                assert str(sandbox.root) == expected, (runs_dir, run_id, round_)
                assert os.path.isdir(expected)


def ledger_rows(path, sql, *params):
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(sql, params).fetchall()


def _plan(tmp_path):
    cassette = write_cassette(tmp_path / "c.jsonl", IDEAL)
    return RunPlan(load_scenario(SCENARIO_FILE), f"replay:{cassette}", 0.0)


def test_the_start_row_records_the_sandbox_the_tools_used(tmp_path):
    plan = _plan(tmp_path)
    with open_backend(plan.model) as backend, Ledger(tmp_path / "l.sqlite") as ledger:
        for _ in range(3):
            summary = run_once(plan, backend, ledger, RunOptions(runs_dir=tmp_path / "runs"))
            [(recorded,)] = ledger_rows(tmp_path / "l.sqlite", "SELECT sandbox FROM runs WHERE run_id = ?", summary.run_id)
            assert recorded == str(summary.sandbox) == os.path.realpath(tmp_path / "runs" / summary.run_id)
            assert (summary.sandbox / "report.txt").is_file()


@pytest.mark.parametrize("there_before", [False, True])
def test_a_run_refused_by_its_claims_policy_leaves_no_new_folder(tmp_path, there_before):
    plan = _plan(tmp_path)
    runs = tmp_path / "runs"
    refuse = RunOptions(runs_dir=runs, claim=lambda identity: Claim(lambda holders: False))
    with open_backend(plan.model) as backend, Ledger(tmp_path / "l.sqlite") as ledger:
        run_once(plan, backend, ledger, RunOptions(runs_dir=runs))  # the runs folder exists and is remembered
        before = sorted(os.listdir(runs))
        if there_before:
            (runs / "fixed").mkdir()
            before.append("fixed")
        with pytest.raises(IdentityTaken):
            run_once(plan, backend, ledger, refuse, run_id="fixed")
        assert sorted(os.listdir(runs)) == sorted(before)
