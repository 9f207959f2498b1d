"""Canonical JSON text: the one serialisation used for every hash and every JSON column.

Equal values always give equal text, so ``request_hash`` (the messages a reply answered), a
run's identity, the ledger's hash chain and a review frame's SHA-256 are reproducible.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["canonical_json", "sha256_of"]

_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
"""``json.dumps`` with these options builds a new encoder on every call; one is enough (it keeps no state)."""


def canonical_json(value: Any) -> str:
    """Deterministic JSON text: sorted keys, no whitespace, non-ASCII kept.

    Lone surrogates (which UTF-8 cannot hold) are written as ``\\uXXXX`` escapes, which JSON
    decodes back to the same string. Values JSON cannot express are written as ``str(value)``.

    Args:
        value: any JSON-ready value.

    Returns:
        The text.
    """
    text = _ENCODER.encode(value)
    if text.isascii():  # nothing UTF-8 cannot hold (the usual case, and a cheap test)
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def sha256_of(value: Any) -> str:
    """SHA-256 (64 hex digits) of ``value``'s :func:`canonical_json` text, UTF-8 encoded."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()
