"""A streamed reply's raw chunks as stored in ``turns.stream_chunks``: compressed canonical JSON, as text.

Reading is bounded: a column edited into a zlib bomb (a few MB that inflate to gigabytes) is refused
as unreadable once it inflates past :data:`MAX_INFLATED_BYTES`, before it can exhaust memory.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Mapping
from typing import Any

from harness.canonical import canonical_json
from harness.errors import LedgerError

__all__ = ["MAX_INFLATED_BYTES", "pack_chunks", "unpack_chunks"]

_PACKED = "zlib+b64:"
MAX_INFLATED_BYTES = 2 * 1024**3
"""The most a stored stream inflates to: a stream holds at most 256 MiB of text (the backends' limit), which its
canonical JSON escapes at most six times over, plus a few dozen bytes per chunk."""


def pack_chunks(chunks: list[dict[str, Any]]) -> str:
    """A stream's raw chunks as stored: ``zlib+b64:`` and the base64 of the zlib-compressed canonical JSON.

    Text, not a BLOB, because the ledger holds no binary cell (``harness ledger verify`` refuses one).
    """
    return _PACKED + base64.b64encode(zlib.compress(canonical_json(chunks).encode("utf-8", "surrogatepass"), 6)).decode("ascii")


def unpack_chunks(text: Any, row: Mapping[str, Any], table: str, *, limit: int = MAX_INFLATED_BYTES) -> list[dict[str, Any]]:
    """The chunks :func:`pack_chunks` stored.

    Args:
        text: the column's value.
        row: the row it was read from (its ``run_id`` and ``turn`` name it in the error).
        table: the table's name, for the error.
        limit: the most bytes the chunks may inflate to.

    Raises:
        LedgerError: the column does not hold packed chunks, or they inflate past ``limit`` (the file was edited).
    """
    try:
        if not isinstance(text, str) or not text.startswith(_PACKED):
            raise ValueError("not packed")
        inflater = zlib.decompressobj()
        data = inflater.decompress(base64.b64decode(text[len(_PACKED) :], validate=True), limit)
        if inflater.unconsumed_tail or not inflater.eof:
            raise ValueError("inflates past the limit, or is cut short")
        chunks = json.loads(data.decode("utf-8", "surrogatepass"))
        if not isinstance(chunks, list) or not all(isinstance(c, dict) for c in chunks):
            raise ValueError("not a list of chunks")
    except (ValueError, RecursionError, zlib.error) as exc:
        where = f"run {row.get('run_id')}, turn {row.get('turn')}"
        raise LedgerError(
            f"the {table} row of {where} has stream chunks that cannot be read; run `harness ledger verify`."
        ) from exc
    return chunks
