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
_MAKE_C_ENCODER = getattr(json.encoder, "c_make_encoder", None)  # CPython's _json accelerator (untyped)
_C_ENCODER = (
    _MAKE_C_ENCODER(None, str, json.encoder.encode_basestring, None, ":", ",", True, False, True)
    if _MAKE_C_ENCODER is not None
    else None
)
"""The C encoder ``_ENCODER.encode`` builds anew on every call, made once: the same options and the same text, but
without the circular-reference check (its table of ids cannot be shared by threads); a value that holds itself
(never JSON-ready data) raises RecursionError instead of ValueError."""


def canonical_json(value: Any) -> str:
    """Deterministic JSON text: sorted keys, no whitespace, non-ASCII kept.

    Lone surrogates (which UTF-8 cannot hold) are written as ``\\uXXXX`` escapes, which JSON
    decodes back to the same string. Values JSON cannot express are written as ``str(value)``.

    Args:
        value: any JSON-ready value.

    Returns:
        The text.
    """
    text = "".join(_C_ENCODER(value, 0)) if _C_ENCODER is not None else _ENCODER.encode(value)
    if text.isascii():  # nothing UTF-8 cannot hold (the usual case, and a cheap test)
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def sha256_of(value: Any) -> str:
    """SHA-256 (64 hex digits) of ``value``'s :func:`canonical_json` text, UTF-8 encoded."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()
