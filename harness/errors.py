"""Every error the harness raises on purpose, under one root.

Hierarchy::

    HarnessError                    root: the CLI turns any of these into one sentence + exit code
    ├── UsageError                  bad command-line input (unknown model spec, bad flag value, a model too big for memory)
    ├── ScenarioError               a scenario file is missing, unreadable or has a wrong field
    ├── LedgerError                 the ledger cannot be opened, is corrupt, or fails verification
    │   └── LedgerSwapped           the ledger (or its lock file) was moved, replaced or deleted while a matrix ran
    ├── ModelCacheError             the embedded model cannot be fetched, extracted or verified
    ├── ReportError                 a report's child process died before it answered
    ├── BackendError                the model server failed: ends a run as ``infra_error``
    │   ├── BackendUnavailable      connection refused / DNS / server not running
    │   ├── BackendTimeout          no answer within the timeout
    │   ├── BackendResponseError    HTTP error status or a body that is not the expected JSON
    │   ├── ModelNotFound           the server is up but does not have the model
    │   ├── ServerConfigError       the server's own configuration refuses the request (never retried)
    │   ├── ContextOverflow         the prompt no longer fits the context: ends a run as ``context_overflow``
    │   └── CassetteExhausted       a replay cassette has no more lines for this run
    └── BreakerTripped              the circuit breaker refused the next model call
        ├── TurnLimitExceeded
        └── TokenLimitExceeded

``ToolError`` is deliberately *not* a ``HarnessError``: it is raised by a tool and sent
back to the model as the tool message ``ERROR: ...``; it never stops a run.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "BackendResponseError",
    "BackendTimeout",
    "BackendUnavailable",
    "BreakerTripped",
    "CassetteExhausted",
    "ContextOverflow",
    "HarnessError",
    "LedgerError",
    "LedgerSwapped",
    "ModelCacheError",
    "ModelNotFound",
    "ReportError",
    "ScenarioError",
    "ServerConfigError",
    "TokenLimitExceeded",
    "ToolError",
    "TurnLimitExceeded",
    "UsageError",
]


class HarnessError(Exception):
    """Root of every error the harness raises on purpose.

    ``str(error)`` is a complete sentence meant for the user: what is wrong and what to do.
    """


class UsageError(HarnessError):
    """Bad command-line input, e.g. an unknown model spec or an out-of-range flag, or an embedded model that does not
    fit in the memory available (:func:`harness.backends.memory.check_fits`): refused before anything runs."""


class ScenarioError(HarnessError):
    """A scenario file is missing, unreadable, or has a missing or wrong field.

    The message names the file, the field and what was expected.
    """


class LedgerError(HarnessError):
    """The ledger cannot be opened or written, is not a harness ledger, or fails verification."""


class LedgerSwapped(LedgerError):
    """The ledger's path no longer names the file a writable :class:`~harness.ledger.Ledger` opened, or its lock file is
    not the one the matrix's earlier locks are on (:class:`~harness.ownership.LockFile`): moved, replaced or deleted
    since. Raised before a run's claim or start row, so the matrix stops (runs in flight end in the open file)."""


class ModelCacheError(HarnessError):
    """The embedded model could not be downloaded, extracted, or its SHA-256 does not match."""


class ReportError(HarnessError):
    """A child process of ``harness report`` (the turns' reader or the plotting process) died before it answered,
    e.g. killed by a signal or by the out-of-memory killer; the files it was to give are not written."""


class BackendError(HarnessError):
    """The model server failed (not the model): the run ends as ``infra_error``.

    Attributes:
        retryable: whether trying the same request again may succeed.
    """

    retryable: bool = True


class BackendUnavailable(BackendError):
    """The server could not be reached (connection refused, reset, name not resolved)."""


class BackendTimeout(BackendError):
    """The server accepted the request but did not answer within the timeout."""


class BackendResponseError(BackendError):
    """The server answered with an HTTP error status or a body that is not the expected JSON.

    Attributes:
        status_code: the HTTP status, or ``None`` when the body was the problem.
        retry_after_s: seconds from a ``Retry-After`` header, if the server sent one.
    """

    def __init__(self, message: str, *, status_code: int | None = None, retry_after_s: float | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.retry_after_s = retry_after_s
        self.retryable = status_code is None or status_code == 429 or status_code >= 500


class ModelNotFound(BackendError):
    """The server is up but does not serve the requested model (e.g. not pulled in Ollama)."""

    retryable = False


class ServerConfigError(BackendError):
    """The server refuses the request because of how it was started or set up, the same way every time.

    Examples: llama.cpp's ``tools param requires --jinja flag`` and ``Unsupported param: ...``, Ollama's
    ``"<model>" does not support thinking``. Never retried; the message names the server setting to change.
    """

    retryable = False


class ContextOverflow(BackendError):
    """The conversation no longer fits the model's context and the server refused it (it was asked not to
    truncate): the run ends as ``context_overflow``, neither a model failure nor an infrastructure one.

    Never retried: the same history overflows the same context again.
    """

    retryable = False


class CassetteExhausted(BackendError):
    """A replay cassette was asked for more replies than it holds."""

    retryable = False


class BreakerTripped(HarnessError):
    """The circuit breaker refused the next model call.

    Attributes:
        limit: the configured limit (turns or tokens).
        observed: the count that would have been reached by the refused call.
    """

    outcome = "breaker"

    def __init__(self, message: str, *, limit: int, observed: int):
        super().__init__(message)
        self.limit = limit
        self.observed = observed


class TurnLimitExceeded(BreakerTripped):
    """The next model call would exceed ``turn_limit``; the run ends as ``turn_limit``."""

    outcome = "turn_limit"


class TokenLimitExceeded(BreakerTripped):
    """Tokens already spent exceed ``token_limit``; the run ends as ``token_limit``."""

    outcome = "token_limit"


class ToolError(Exception):
    """A tool refused or failed; sent back to the model as ``ERROR: <message>``.

    Attributes:
        escape_attempt: True when the refusal was a path outside the sandbox.
    """

    def __init__(self, message: str, *, escape_attempt: bool = False):
        super().__init__(message)
        self.escape_attempt = escape_attempt
