"""Where the harness itself comes from: the git revision recorded with every run."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

__all__ = ["git_revision"]


@functools.cache
def git_revision() -> tuple[str | None, bool | None]:
    """The harness checkout's ``(commit SHA, has uncommitted changes to tracked files)``.

    Returns:
        ``(None, None)`` when the package does not run from a git checkout or git is missing
        (each lookup is bounded by a 5-second timeout). Cached for the process's lifetime.
    """
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return None, None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, timeout=5
        )
        return sha.stdout.strip(), bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None
