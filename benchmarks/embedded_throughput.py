"""Throughput of the embedded backend: raw httpx vs. ``EmbeddedBackend.generate``.

Starts the embedded smollm2-135m server once (fetching the model into the cache on first
use), then sends the same N chat requests (fixed prompt, ``max_tokens`` 64, temperature 0)
twice: directly with httpx to the server, and through ``EmbeddedBackend.generate``. Prints
completion tokens per second for both and the overhead ratio.

Run: ``python benchmarks/embedded_throughput.py [-n 5]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from harness.backends import EmbeddedBackend, GenerateOptions  # noqa: E402

__all__ = ["main"]

MESSAGES = [{"role": "user", "content": "Write a short paragraph about why unit tests matter."}]
OPTIONS = GenerateOptions(temperature=0.0, seed=0, max_tokens=64)


def _direct(base_url: str, n: int) -> tuple[int, float]:
    """N requests straight to the server; returns (completion tokens, seconds)."""
    payload = {
        "model": "smollm2-135m",
        "messages": MESSAGES,
        "temperature": OPTIONS.temperature,
        "seed": OPTIONS.seed,
        "max_tokens": OPTIONS.max_tokens,
        "stream": False,
    }
    tokens = 0
    with httpx.Client(timeout=120) as client:
        start = time.perf_counter()
        for _ in range(n):
            response = client.post(f"{base_url}/chat/completions", json=payload)
            response.raise_for_status()
            tokens += response.json()["usage"]["completion_tokens"]
        return tokens, time.perf_counter() - start


def _through_backend(backend: EmbeddedBackend, n: int) -> tuple[int, float]:
    """N requests through ``EmbeddedBackend.generate``; returns (completion tokens, seconds)."""
    tokens = 0
    start = time.perf_counter()
    for _ in range(n):
        tokens += backend.generate(MESSAGES, None, OPTIONS).completion_tokens or 0
    return tokens, time.perf_counter() - start


def main() -> int:
    """Run the benchmark and print the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="requests per path (default 5)")
    args = parser.parse_args()
    with EmbeddedBackend("smollm2-135m", num_ctx=2048) as backend:
        t0 = time.perf_counter()
        base_url = backend.start()
        print(f"server start: {time.perf_counter() - t0:.2f} s at {base_url}")
        backend.generate(MESSAGES, None, OPTIONS)  # warm-up (prompt cache, first-load effects)
        direct_tokens, direct_s = _direct(base_url, args.n)
        backend_tokens, backend_s = _through_backend(backend, args.n)
    direct_tps = direct_tokens / direct_s
    backend_tps = backend_tokens / backend_s
    print(f"requests per path: {args.n}, max_tokens {OPTIONS.max_tokens}, temperature {OPTIONS.temperature}")
    print(f"direct httpx:      {direct_tokens} completion tokens in {direct_s:.2f} s = {direct_tps:.1f} tokens/s")
    print(f"EmbeddedBackend:   {backend_tokens} completion tokens in {backend_s:.2f} s = {backend_tps:.1f} tokens/s")
    print(f"overhead ratio (direct / backend tokens/s): {direct_tps / backend_tps:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
