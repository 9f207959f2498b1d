"""Where a matrix's runs execute, the driver (the calling process) staying the only writer of the ledger.

``threads`` (the default) is :class:`harness.runner._MatrixRun`, a thread pool per model endpoint in this process;
``processes`` is :class:`harness.executors.processes.ProcessMatrixRun`, worker processes that reach the ledger through
:mod:`harness.executors.channel`; ``ray`` is :class:`harness.executors.ray_cluster.RayMatrixRun`, Ray actors speaking
the same channel. Only this package's names are imported with it: the executors' modules (and Ray) load only when
their executor is chosen.
"""

EXECUTORS = ("threads", "processes", "ray")

__all__ = ["EXECUTORS"]
