"""Canonical JSON text: the one serialisation used for every hash and every JSON column.

Equal values always give equal text, so ``request_hash`` (the messages a reply answered), a
run's identity, the ledger's hash chain and a review frame's SHA-256 are reproducible.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["canonical_json", "canonical_members", "sha256_of"]

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


def canonical_members(texts: Mapping[str, str] | Iterable[str], *, first: bool = True) -> str:
    """The text between the brackets of a canonical JSON array or object, from its members' :func:`canonical_json`
    texts, without encoding the members again (for text built piece by piece or partly remembered).

    :func:`canonical_json` writes an array as ``[`` + its items' texts joined by ``,`` + ``]`` and an object as ``{`` +
    ``"key":text`` joined by ``,`` in sorted key order + ``}``, with no white space; its escapes of what UTF-8 cannot
    hold act per character, so a member's text is the same alone as inside its container. So
    ``"[" + canonical_members([canonical_json(v) for v in items]) + "]" == canonical_json(items)``, and
    ``"{" + canonical_members({k: canonical_json(v) for k, v in obj.items()}) + "}" == canonical_json(obj)``
    (tests/test_canonical_members.py holds both, for any JSON data). Exact for arrays of any JSON-ready items, and for
    objects whose keys are all ``str`` (JSON's own keys; sorted as ``sort_keys`` sorts them). Not for objects with
    other keys (``canonical_json`` writes ``1`` as ``"1"`` and refuses to sort mixed types).

    Args:
        texts: an array's item texts, in order; or an object's member texts by key.
        first: False when members precede these in the same container (the text then starts with ``,``, unless
            there is no member here).

    Returns:
        The members' text, e.g. ``"a":1,"b":[2]`` or ``,3,4``.
    """
    if type(texts) is not list and isinstance(texts, Mapping):  # a list first: the request hasher's, on every turn
        joined = ",".join(f"{canonical_json(key)}:{texts[key]}" for key in sorted(texts))
    else:
        joined = ",".join(texts)
    return joined if first or not joined else "," + joined
