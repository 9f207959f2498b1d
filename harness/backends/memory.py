"""Will an embedded model fit in memory? A check made before llama.cpp loads it, so a model too big for the machine
gets one sentence instead of an out-of-memory kill halfway through loading.

The estimate (:func:`load_estimate_bytes`) is a documented bound, not a measurement:

* the GGUF file(s), once, plus 10 %: llama.cpp maps the weights into memory and adds its own buffers;
* the KV cache: llama.cpp keeps, for every layer, a K and a V tensor of ``n_embd_k_gqa`` (KV heads x head size)
  elements per context token, in f16 (2 bytes) by default (``llama_kv_cache`` in llama.cpp's
  ``src/llama-kv-cache.cpp``), so ``2 x n_layer x n_kv_heads x head_dim x 2`` bytes per token. Without reading the
  GGUF's header the harness bounds it by :data:`KV_BYTES_PER_TOKEN`, 64 KiB, above every known model's figure:
  Qwen2.5-7B (28 layers, 4 KV heads of 128, its ``config.json``) needs 56 KiB; Qwen2.5-1.5B 28 KiB;
  SmolLM2-135M (30 layers, 3 KV heads of 64) 22.5 KiB. A model without grouped-query attention can need more
  (Llama-2-7B: 512 KiB per token), so the estimate can be low for such a file: the check refuses what clearly
  cannot fit, it does not promise that the rest will;
* :data:`RUNTIME_BYTES`, 128 MiB, for llama.cpp's compute buffers and the server itself.

Measured here for scale: SmolLM2-135M (98 MB file) with a 2048-token context took 73 MB of ``MemAvailable`` beyond
its file pages (already in the page cache); the estimate says 377 MB, file included.

The memory available is ``MemAvailable`` from ``/proc/meminfo`` (Linux), capped by ``HARNESS_MEMORY_LIMIT`` when
that is set (bytes, or a number, decimals allowed, with a ``K``, ``M`` or ``G`` suffix, powers of 1024: ``0.5G``);
messages give sizes in GiB, the same unit. Where neither is known (no
``/proc/meminfo``, no limit set) the check is skipped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from harness.backends.hub import split_parts
from harness.errors import UsageError

__all__ = [
    "KV_BYTES_PER_TOKEN",
    "LIMIT_ENV",
    "RUNTIME_BYTES",
    "check_fit_together",
    "check_fits",
    "gib",
    "load_estimate_bytes",
    "memory_available_bytes",
    "model_files_bytes",
]

KV_BYTES_PER_TOKEN = 64 * 1024
"""Bytes of KV cache per context token assumed for any model (see the module docstring for the source)."""
RUNTIME_BYTES = 128 * 1024 * 1024
"""Bytes assumed for llama.cpp's compute buffers and the server, whatever the model."""
LIMIT_ENV = "HARNESS_MEMORY_LIMIT"
"""Environment variable capping the memory the harness may use for an embedded model, e.g. ``8G``."""

_OVERHEAD = "10 % + 128 MiB overhead"
_MEMINFO = Path("/proc/meminfo")
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def load_estimate_bytes(file_bytes: int, n_ctx: int) -> int:
    """Memory an embedded model needs once loaded, by the rule in the module docstring.

    Args:
        file_bytes: total size of the model's GGUF file(s), bytes (>= 0).
        n_ctx: context tokens of the whole server (``num_ctx x parallel``), >= 0.

    Returns:
        Bytes: ``file_bytes * 1.1 + n_ctx * KV_BYTES_PER_TOKEN + RUNTIME_BYTES``, e.g. 376,634,131 for a
        98,362,432-byte file and 2048 tokens.
    """
    return file_bytes + file_bytes // 10 + max(0, n_ctx) * KV_BYTES_PER_TOKEN + RUNTIME_BYTES


def model_files_bytes(path: Path) -> int:
    """Total size of a GGUF model, bytes: the file, or every part of a split model named by one part
    (``NAME-00001-of-00003.gguf``: the parts present beside it).

    Raises:
        OSError: the file cannot be read.
    """
    try:
        names = split_parts(path.name)
    except UsageError:  # a later part named (a local path): llama.cpp will say what is wrong; count this file
        names = [path.name]
    if len(names) == 1:
        return path.stat().st_size
    return sum(part.stat().st_size for part in map(path.with_name, names) if part.is_file())


def memory_available_bytes() -> tuple[int, str] | None:
    """The memory an embedded model may use now, and where that figure comes from.

    Returns:
        ``(bytes, source)``: the smaller of ``MemAvailable`` (source ``"MemAvailable"``) and ``HARNESS_MEMORY_LIMIT``
        (source ``"HARNESS_MEMORY_LIMIT"``); ``None`` when neither is known.

    Raises:
        UsageError: ``HARNESS_MEMORY_LIMIT`` is set but is not a size like ``512M`` or ``8G``.
    """
    found: list[tuple[int, str]] = []
    available = _mem_available()
    if available is not None:
        found.append((available, "MemAvailable"))
    limit = _limit()
    if limit is not None:
        found.append((limit, LIMIT_ENV))
    return min(found) if found else None


def check_fits(path: Path, n_ctx: int) -> None:
    """Refuse, before loading, a model that does not fit in the memory available.

    Args:
        path: the model's GGUF file (the first part of a split model).
        n_ctx: context tokens of the whole server.

    Raises:
        UsageError: the estimate (:func:`load_estimate_bytes`) exceeds :func:`memory_available_bytes`, or
            ``HARNESS_MEMORY_LIMIT`` is malformed. Nothing is raised when the memory available is unknown or the
            file cannot be read (loading then reports its own error).
    """
    room = memory_available_bytes()
    if room is None:
        return
    try:
        file_bytes = model_files_bytes(path)
    except OSError:
        return
    needed = load_estimate_bytes(file_bytes, n_ctx)
    available, source = room
    if needed > available:
        raise UsageError(
            f"{path.name} needs about {gib(needed)} of memory to load ({gib(file_bytes)} of weights, {_OVERHEAD}, "
            f"and a {n_ctx}-token context) but only {gib(available)} is available ({_where(source)}); choose a smaller "
            f"model, lower num_ctx or --embedded-slots, or free memory."
        )


def check_fit_together(needs: Sequence[tuple[str, Path, int]]) -> None:
    """Refuse models that each fit but not all at once: the embedded servers of one matrix are alive together.

    Args:
        needs: ``(spec, model file, n_ctx)`` for every embedded model that will be loaded at the same time.

    Raises:
        UsageError: the sum of their estimates exceeds :func:`memory_available_bytes`. Nothing is raised for
            fewer than two models, when the memory available is unknown or a file cannot be read.
    """
    room = memory_available_bytes() if len(needs) > 1 else None
    if room is None:
        return
    try:
        estimates = [load_estimate_bytes(model_files_bytes(path), n_ctx) for _, path, n_ctx in needs]
    except OSError:
        return
    available, source = room
    if sum(estimates) > available:
        parts = ", ".join(f"{spec} {gib(size)}" for (spec, _, _), size in zip(needs, estimates, strict=True))
        raise UsageError(
            f"the {len(needs)} embedded models of this matrix are loaded side by side and together need about "
            f"{gib(sum(estimates))} of memory ({parts}; each is weights, {_OVERHEAD}, and its context) but only "
            f"{gib(available)} is available ({_where(source)}); run them in separate matrices, lower num_ctx or "
            f"--embedded-slots, or free memory."
        )


def gib(size: int) -> str:
    """A size in GiB (powers of 1024, the unit ``HARNESS_MEMORY_LIMIT`` is read in), e.g. ``"0.50 GiB"``."""
    return f"{size / 1024**3:.2f} GiB"


def _where(source: str) -> str:
    return "set by HARNESS_MEMORY_LIMIT" if source == LIMIT_ENV else "MemAvailable in /proc/meminfo"


def _mem_available() -> int | None:
    """``MemAvailable`` in bytes, or ``None`` where ``/proc/meminfo`` does not exist or does not say."""
    try:
        text = _MEMINFO.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if name == "MemAvailable" and fields and fields[0].isdigit():
            unit = 1024 if fields[1:] == ["kB"] else 1
            return int(fields[0]) * unit
    return None


def _limit() -> int | None:
    raw = os.environ.get(LIMIT_ENV, "").strip()
    if not raw:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", raw, re.IGNORECASE)
    if match is None:
        raise UsageError(f"{LIMIT_ENV}={raw!r} is not a size; set it like 512M, 0.5G or 8G (powers of 1024), or unset it.")
    return int(min(float(match[1]) * _UNITS[match[2].upper()], 2.0**63))  # 400 digits are a float's inf: no cap
