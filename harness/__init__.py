"""Benchmark how LLM agent loops break, model by model.

The public API, for use from Python or a notebook (reports live in :mod:`harness.report`,
imported separately because it loads pandas and matplotlib)::

    from pathlib import Path
    from harness import Ledger, MatrixOverrides, RunOptions, expand_matrix, load_scenario, run_matrix

    scenario = load_scenario("scenarios/list_and_report.toml")
    plans = expand_matrix([scenario], MatrixOverrides(models=["ollama:qwen2.5-coder:7b"], repeats=5))
    with Ledger("results/ledger.sqlite") as ledger:
        result = run_matrix(plans, ledger, RunOptions(runs_dir=Path("results/runs")))
"""

__version__ = "0.1.0"

__all__ = [
    "CLASSIFIER_VERSION",
    "FAILURE_MODES",
    "OUTCOMES",
    "Backend",
    "CircuitBreaker",
    "Classification",
    "GenerateOptions",
    "HarnessError",
    "Ledger",
    "MatrixEvents",
    "MatrixOverrides",
    "MatrixResult",
    "Reply",
    "RetryPolicy",
    "RunOptions",
    "RunPlan",
    "RunSummary",
    "Scenario",
    "ToolCall",
    "classify",
    "expand_matrix",
    "load_scenario",
    "open_backend",
    "parse_model_spec",
    "run_matrix",
    "run_once",
]

_HOMES = {
    "harness.backends": ("Backend", "GenerateOptions", "Reply", "open_backend", "parse_model_spec"),
    "harness.classifier": ("CLASSIFIER_VERSION", "FAILURE_MODES", "Classification", "ToolCall", "classify"),
    "harness.errors": ("HarnessError",),
    "harness.ledger": ("Ledger",),
    "harness.loop": ("CircuitBreaker", "RetryPolicy", "RunOptions", "RunPlan", "RunSummary", "run_once"),
    "harness.matrix": ("MatrixOverrides",),
    "harness.runner": ("MatrixEvents", "MatrixResult", "expand_matrix", "run_matrix"),
    "harness.scenarios": ("Scenario", "load_scenario"),
    "harness.vocab": ("OUTCOMES",),
}
_WHERE = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> object:
    """Import the public API lazily, so ``harness --help`` does not load every module."""
    if name in _WHERE:
        import importlib

        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'harness' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
