"""The circuit breaker: a run's turn and token budget, checked before every model call (:mod:`harness.loop` uses it)."""

from __future__ import annotations

from harness.errors import TokenLimitExceeded, TurnLimitExceeded

__all__ = ["CircuitBreaker"]


class CircuitBreaker:
    """Refuses a model call that would exceed the run's turn or token budget.

    The check runs *before* each call: with ``turn_limit = 8`` the 8th call is allowed and
    the 9th trips; with ``token_limit = 1000`` a run that has spent exactly 1000 tokens may
    call again, one that has spent 1001 may not.

    Args:
        turn_limit: maximum model calls in a run (>= 1).
        token_limit: maximum prompt + completion tokens spent before a call (>= 1).
    """

    def __init__(self, *, turn_limit: int, token_limit: int):
        self.turn_limit = turn_limit
        self.token_limit = token_limit

    def before_call(self, *, turns_done: int, tokens_used: int) -> None:
        """Check the next call against both limits.

        Args:
            turns_done: model calls already made in this run.
            tokens_used: tokens (prompt + completion) already spent in this run.

        Raises:
            TurnLimitExceeded: the next call would be call ``turn_limit + 1``.
            TokenLimitExceeded: ``tokens_used`` exceeds ``token_limit``.
        """
        if turns_done + 1 > self.turn_limit:
            raise TurnLimitExceeded(
                f"turn limit reached: call {turns_done + 1} refused (turn_limit = {self.turn_limit})",
                limit=self.turn_limit,
                observed=turns_done + 1,
            )
        if tokens_used > self.token_limit:
            raise TokenLimitExceeded(
                f"token limit reached: {tokens_used} tokens spent (token_limit = {self.token_limit})",
                limit=self.token_limit,
                observed=tokens_used,
            )
