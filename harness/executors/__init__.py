"""Where a matrix's runs execute, the driver (the calling process) staying the only writer of the ledger.

``threads`` (the default) is :class:`harness.runner._MatrixRun`, a thread pool per model endpoint in this process;
``processes`` is :class:`harness.executors.processes.ProcessMatrixRun`, worker processes that reach the ledger through
:mod:`harness.executors.channel`. Nothing here is imported unless ``processes`` is chosen.
"""

EXECUTORS = ("threads", "processes")

__all__ = ["EXECUTORS"]
