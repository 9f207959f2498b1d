"""Backends: one protocol (:class:`Backend`), one implementation per server kind."""

from harness.backends.base import Backend, BackendIdentity, GenerateOptions, Reply

__all__ = ["Backend", "BackendIdentity", "GenerateOptions", "Reply"]
