"""How infrastructure errors are retried (:class:`RetryPolicy`); the loop (:mod:`harness.loop`) applies it."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["DEFAULT_RETRY", "RetryPolicy"]


@dataclass(frozen=True)
class RetryPolicy:
    """How infrastructure errors are retried: exponential backoff with jitter, honouring ``Retry-After``.

    Attempt ``a`` (from 1) that fails with a retryable :class:`~harness.errors.BackendError` waits
    ``Retry-After`` seconds when the server sent one (capped at ``max_delay_s``), else a uniformly
    jittered ``[0.5, 1] x min(max_delay_s, base_delay_s x 2^(a-1))`` seconds ("equal jitter"),
    then tries again, up to ``max_attempts`` attempts in all.

    Attributes:
        max_attempts: attempts per model call, >= 1 (1 means no retry).
        base_delay_s: first backoff, seconds.
        max_delay_s: cap on any single wait, seconds.
    """

    max_attempts: int = 4
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0

    def delay_s(self, attempt: int, retry_after_s: float | None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (from 1)."""
        if retry_after_s is not None:
            return max(0.0, min(self.max_delay_s, retry_after_s))
        return min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)


DEFAULT_RETRY = RetryPolicy()
