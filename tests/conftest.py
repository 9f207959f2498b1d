"""Shared fixtures: every test gets its own ledger and results folder; nothing touches the user's data.

Helpers that tests import (cassette builders, paths) live in ``tests/helpers.py``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from harness.scenarios import load_scenario
from tests.helpers import SCENARIO_FILE
from tests.ledger_builders import build_two_model_ledger

# Tests send Ctrl-C (SIGINT) to harness processes they start. A shell that starts pytest in the
# background (`nohup pytest &`) ignores SIGINT, and children inherit an ignored signal, so those
# processes would never see it. Children get the default action when this process handles it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# huggingface_hub reads its settings once, when first imported: its cache folder (HF_HOME), whether it is offline
# and whether it sends telemetry (which in 2.x includes fetching an agent registry from the endpoint and caching it
# in HF_HOME). Fix them for the whole session before anything imports it, so no test touches the user's hub cache
# or contacts the hub; tests/test_hub.py points HF_ENDPOINT (read at call time) at a local stand-in.
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="harness-tests-hf-home-")
atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)  # one folder per pytest process: gone after it
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
for _name in ("HF_HUB_OFFLINE", "HF_ENDPOINT", "HF_TOKEN"):
    os.environ.pop(_name, None)


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path, monkeypatch):
    """Run each test in its own folder so default paths (results/, reports/) land in tmp."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture
def ledger_path(tmp_path) -> Path:
    return tmp_path / "results" / "ledger.sqlite"


@pytest.fixture
def scenario():
    """The reference scenario, list_and_report.toml, loaded."""
    return load_scenario(SCENARIO_FILE)


@pytest.fixture
def two(ledger_path):
    """A ledger with two models' runs of known outcomes and failure modes (tests/ledger_builders.py)."""
    return build_two_model_ledger(ledger_path)


def pytest_make_parametrize_id(config, val, argname):
    """Short ids for long string parameters (a 1 MB pathological input made a 1 MB test id): the head and the length."""
    if isinstance(val, (str, bytes)) and len(val) > 60:
        head = val[:40] if isinstance(val, str) else val[:40].decode("latin-1")
        return f"{head}...({len(val)} chars)".encode("unicode_escape").decode("ascii")
    return None
