"""Benchmark how LLM agent loops break, model by model.

The public API, for use from Python or a notebook (reports live in :mod:`harness.reports`,
imported separately because it loads pandas and matplotlib)::

    from harness import Ledger, MatrixOverrides, expand_matrix, load_scenario, run_matrix

    scenario = load_scenario("scenarios/list_and_report.toml")
    plans = expand_matrix([scenario], MatrixOverrides(models=["ollama:qwen2.5-coder:7b"], repeats=5))
    with Ledger("results/ledger.sqlite") as ledger:
        result = run_matrix(plans, ledger, runs_dir="results/runs")
"""

__version__ = "0.1.0"  # before the imports: harness.loop records it on every run

from harness.backends import Backend, GenerateOptions, Reply, open_backend, parse_model_spec  # noqa: E402
from harness.classifier import CLASSIFIER_VERSION, FAILURE_MODES, Classification, ToolCall, classify
from harness.errors import HarnessError
from harness.ledger import Ledger
from harness.loop import OUTCOMES, CircuitBreaker, RetryPolicy, RunPlan, RunSummary, run_once
from harness.runner import MatrixOverrides, MatrixResult, expand_matrix, run_matrix
from harness.scenarios import Scenario, load_scenario

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
    "MatrixOverrides",
    "MatrixResult",
    "Reply",
    "RetryPolicy",
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
