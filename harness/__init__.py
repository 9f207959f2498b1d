"""Benchmark how LLM agent loops break, model by model."""

__version__ = "0.1.0"
