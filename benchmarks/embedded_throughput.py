"""Throughput of the embedded backend: raw httpx vs. ``EmbeddedBackend.generate``.

Starts the embedded smollm2-135m server once (fetching the model into the cache on first
use), then sends the same N chat requests (fixed prompt, ``max_tokens`` 64, temperature 0)
along two paths, alternating request by request: directly with httpx to the server, and through
``EmbeddedBackend.generate``. Prints completion tokens per second for both and the overhead ratio.

Run: ``python benchmarks/embedded_throughput.py [-n 5] [--timeout 600]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from harness.backends import EmbeddedBackend, GenerateOptions  # noqa: E402
from harness.errors import HarnessError  # noqa: E402

__all__ = ["main"]

MESSAGES = [{"role": "user", "content": "Write a short paragraph about why unit tests matter."}]
OPTIONS = GenerateOptions(temperature=0.0, seed=0, max_tokens=64)


def _direct(client: httpx.Client, base_url: str) -> tuple[int, float]:
    """One request straight to the server; returns (completion tokens, seconds)."""
    payload = {
        "model": "smollm2-135m",
        "messages": MESSAGES,
        "temperature": OPTIONS.temperature,
        "seed": OPTIONS.seed,
        "max_tokens": OPTIONS.max_tokens,
        "stream": False,
    }
    start = time.perf_counter()
    response = client.post(f"{base_url}/chat/completions", json=payload)
    response.raise_for_status()
    return response.json()["usage"]["completion_tokens"], time.perf_counter() - start


def _through_backend(backend: EmbeddedBackend) -> tuple[int, float]:
    """One request through ``EmbeddedBackend.generate``; returns (completion tokens, seconds)."""
    start = time.perf_counter()
    tokens = backend.generate(MESSAGES, None, OPTIONS).completion_tokens or 0
    return tokens, time.perf_counter() - start


def _measure(n: int, timeout_s: float) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """Start the server, warm it up, then ``n`` requests per path, the two paths alternating (a change in the
    machine's load then falls on both)."""
    direct, through = [], []
    backend = EmbeddedBackend("smollm2-135m", num_ctx=2048, timeout_s=timeout_s)
    with backend, httpx.Client(timeout=timeout_s) as client:
        t0 = time.perf_counter()
        base_url = backend.start()
        print(f"server start: {time.perf_counter() - t0:.2f} s at {base_url}")
        backend.generate(MESSAGES, None, OPTIONS)  # warm-up (prompt cache, first-load effects)
        for i in range(n):
            pair = [lambda: direct.append(_direct(client, base_url)), lambda: through.append(_through_backend(backend))]
            for measure in pair if i % 2 == 0 else pair[::-1]:
                measure()
    return direct, through


def main() -> int:
    """Run the benchmark and print the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="requests per path (default 5)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default 600: a busy CPU is slow)")
    args = parser.parse_args()
    try:
        direct, through = _measure(args.n, args.timeout)
    except (HarnessError, httpx.HTTPError) as exc:
        print(f"embedded_throughput: {exc} (on a busy machine, raise --timeout)", file=sys.stderr)
        return 1
    direct_tokens, direct_s = map(sum, zip(*direct, strict=True))
    backend_tokens, backend_s = map(sum, zip(*through, strict=True))
    direct_tps = direct_tokens / direct_s
    backend_tps = backend_tokens / backend_s
    print(f"requests per path: {args.n} (alternating), max_tokens {OPTIONS.max_tokens}, temperature {OPTIONS.temperature}")
    print(f"direct httpx:      {direct_tokens} completion tokens in {direct_s:.2f} s = {direct_tps:.1f} tokens/s")
    print(f"EmbeddedBackend:   {backend_tokens} completion tokens in {backend_s:.2f} s = {backend_tps:.1f} tokens/s")
    print(f"overhead ratio (direct / backend tokens/s): {direct_tps / backend_tps:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
