"""What one run needs from the ledger (:class:`RunLedger`), so the loop can run beside the ledger or far from it.

:class:`~harness.ledger.Ledger` satisfies it as it is; :class:`harness.executors.channel.LedgerProxy` satisfies it in a
worker process by sending each call to the driver, which applies it to its ledger (the only writer). The loop
(:mod:`harness.loop`) sees only this protocol, never which of the two it has.
"""

from __future__ import annotations

from typing import Protocol

from harness.ledger.records import Attempt, RunEnd, RunStart, TurnRecord
from harness.ledger.store import ClaimPolicy

__all__ = ["RunLedger"]


class RunLedger(Protocol):
    """The five calls a run makes on the ledger, in the order a run makes them.

    Each call returns once its row is durable (committed by whoever writes the ledger), or raises
    :class:`~harness.errors.LedgerError` when it cannot be written.
    """

    def start_run(self, record: RunStart, *, claim: ClaimPolicy | None = None) -> bool:
        """Append the run's start row; False when ``claim`` (applied in the row's transaction) refused it."""
        ...

    def record_attempt(self, record: Attempt) -> None:
        """Append one failed model-call attempt."""
        ...

    def record_turn(self, record: TurnRecord, *, defer: bool = False) -> None:
        """Append one turn; ``defer``: it may be committed with a later row (:meth:`harness.ledger.Ledger.record_turn`)."""
        ...

    def cached_turn(self, identity: str, request_hash: str) -> TurnRecord | None:
        """The newest recorded turn of a run with this identity that answered this exact request (``--cache``)."""
        ...

    def end_run(self, record: RunEnd) -> None:
        """Append the run's end row; LedgerError if it already ended."""
        ...
