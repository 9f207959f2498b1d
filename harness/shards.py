"""Shards of a matrix (``harness run --shard I/N``): which planned runs one job of a cluster array runs.

A cluster without a network between its nodes (a SLURM job array, a Kubernetes indexed Job) runs one
matrix as N independent jobs, each into its own ledger, and ``harness ledger merge`` joins the ledgers
afterwards. Every job plans the whole matrix as usual and keeps the runs of its shard:

    shard of a run = int(key, 16) % N,   key = the run's plan identity (hex SHA-256)

where the plan identity is :meth:`harness.loop.RunPlan.identity` without a server's model digest or
slot count: the scenario file's content, tool schemas, system prompt, model spec, options, tool mode,
parser policy and repetition. A job needs no server to compute it, so every job computes the same
partition from the same scenario files and flags: the N shards of a plan are disjoint and together
hold every planned run exactly once (the same modulo rule as Kubernetes' completion indexes: 0 to N-1).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.errors import UsageError

if TYPE_CHECKING:
    from harness.loop import RunPlan

__all__ = ["MAX_SHARDS", "Shard", "parse_shard"]

MAX_SHARDS = 100_000
"""The largest N accepted (a SLURM array or an indexed Job far bigger than any matrix needs)."""

_FORM = re.compile(r"\s*([0-9]{1,30})\s*/\s*([0-9]{1,30})\s*", re.ASCII)  # longer numbers: not I/N


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (``0 <= index < count``).

    Attributes:
        index: this job's shard, from 0 (``$SLURM_ARRAY_TASK_ID``, ``$JOB_COMPLETION_INDEX``).
        count: how many shards the matrix is cut into.
    """

    index: int
    count: int

    def owns(self, plan: RunPlan) -> bool:
        """Whether ``plan`` falls in this shard: its plan identity, read as a hex integer, modulo ``count``."""
        return int(plan.identity(), 16) % self.count == self.index

    def select(self, plans: Sequence[RunPlan]) -> list[RunPlan]:
        """The plans of this shard, in the planned order."""
        return [plan for plan in plans if self.owns(plan)]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """Read ``--shard I/N``.

    Raises:
        UsageError: not two whole numbers ``I/N`` with ``0 <= I < N <= MAX_SHARDS``.
    """
    match = _FORM.fullmatch(text)
    if match is None:
        raise UsageError(f"--shard {text!r} is not I/N; pass this job's index and the shard count, e.g. --shard 0/4.")
    index, count = int(match.group(1)), int(match.group(2))
    if not 1 <= count <= MAX_SHARDS:
        raise UsageError(f"--shard {text}: the shard count must be from 1 to {MAX_SHARDS:,}.")
    if index >= count:
        raise UsageError(
            f"--shard {text}: the index must be from 0 to {count - 1} (shards count from 0, as Kubernetes indexes its Jobs)."
        )
    return Shard(index, count)
