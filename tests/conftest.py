"""Shared fixtures: every test gets its own ledger and results folder; nothing touches the user's data.

Helpers that tests import (cassette builders, paths) live in ``tests/helpers.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path, monkeypatch):
    """Run each test in its own folder so default paths (results/, reports/) land in tmp."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture
def ledger_path(tmp_path) -> Path:
    return tmp_path / "results" / "ledger.sqlite"
