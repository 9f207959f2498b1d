"""Where a matrix's runs execute, the driver (the calling process) staying the only writer of the ledger.

``threads`` (the default) is :class:`harness.runner._MatrixRun`, a thread pool per model endpoint in this process;
``processes`` is :class:`harness.executors.processes.ProcessMatrixRun`, worker processes that reach the ledger through
:mod:`harness.executors.channel`; ``ray`` is :class:`harness.executors.ray_cluster.RayMatrixRun`, Ray actors speaking
the same channel. Only this package's names are imported with it: the executors' modules (and Ray) load only when
their executor is chosen.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from harness.errors import UsageError

if TYPE_CHECKING:
    from harness.loop import RunPlan

EXECUTORS = ("threads", "processes", "ray")

__all__ = ["EXECUTORS", "check_executor", "worker_count", "worker_cpu"]


def check_executor(plans: Sequence[RunPlan], executor: str) -> None:
    """Refuse a spec listing replicas with an executor other than ``threads``: the replicas' rotation lives in the
    driver's threads (:mod:`harness.replicas`). Read from the specs, before any server is asked.

    Raises:
        UsageError: a model spec lists replicas and ``executor`` is not ``threads``; ``ray`` where Ray cannot be
            imported (so ``--dry-run`` says so too, and a refused run creates no ledger).
    """
    if executor == "threads":
        return
    from harness.backends import replica_specs  # here: importing this package stays cheap (the CLI's --help)

    listed = next((model for model in sorted({p.model for p in plans}) if len(replica_specs(model)) > 1), None)
    if listed is not None:
        raise UsageError(f"--model {listed} lists replicas, which run with --executor threads only; "
                         "drop --executor, or give each replica its own --shard job.")  # fmt: skip
    if executor == "ray":  # last: the matrix's own mistakes are said first, with or without Ray
        try:
            importlib.import_module("ray")
        except ImportError as exc:
            raise UsageError(f"--executor ray needs Ray ({exc}): pip install 'agent-loop-harness[ray]'.") from exc


def worker_count(workers: int | None, runs: int, jobs: int, models: int) -> int:
    """The worker processes ``--executor processes`` starts: ``--workers`` (default: the CPU count), but no more than
    can run at once (``runs`` to do, ``jobs`` for each of ``models``)."""
    return min(workers or os.cpu_count() or 1, runs, jobs * models)


def worker_cpu(index: int, workers: int) -> int | None:
    """The CPU the ``processes`` executor pins its ``index``-th worker process to (0-based), or None: not pinned.

    When ``workers`` is a multiple of the CPUs this process may run on (``os.sched_getaffinity``), worker ``index``
    runs on the ``index mod n``-th of them: it keeps its CPU's caches instead of following the scheduler from CPU to
    CPU between its socket and pipe waits, which measured 4-12 % less CPU per turn and 3-13 % more turns per second
    at 64 and 256 runs in flight on 2 CPUs (``benchmarks/concurrency.py --baseline``). Any other count is not pinned:
    fewer workers would stack on the first CPUs (two harness processes on the same ones), and a count that is no
    multiple would put more workers on some CPUs than on others (red team: 3 workers on 2 CPUs ran 40 % slower
    pinned). None too where the platform cannot pin. A pinned worker cannot move off a CPU that another job keeps
    busy: on a machine shared that way, ``--workers`` with a count that is no multiple of the CPUs leaves them free.
    """
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is None:
        return None
    cpus = sorted(affinity(0))
    return cpus[index % len(cpus)] if cpus and workers % len(cpus) == 0 else None
