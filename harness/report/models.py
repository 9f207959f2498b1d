"""The report's model header: what shaped each model's output, its warm-up, and the warnings it calls for.

Read from the ledger only (:meth:`harness.ledger.Ledger.model_runs`): each run's ``config`` holds the provenance its
server reported (:mod:`harness.backends.server_facts`) and the warm-up time (:mod:`harness.startup`). The warm-up is
shown here and nowhere else: it is not a turn, so it is in no latency figure.

Warnings (each one line, in model order):

* a model with no chat template of its own: the server reported none, or its stand-in (Ollama's ``{{ .Prompt }}``),
  which is what a base model gets;
* a model run in ``native`` tool mode whose template declares no tool support (llama.cpp's
  ``chat_template_caps.supports_tools``, Ollama's ``tools`` capability);
* two model specs whose runs share one digest (the model file's SHA-256, or Ollama's manifest digest) and one chat
  template: one model under two names, counted as two. The same weights with another template (``embedded:smollm2-135m``
  and ``embedded:smollm2-135m-tools``) are two model setups, not warned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["model_header_lines", "model_warnings"]

_FACT_ORDER = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "num_ctx", "stop")


def _value(value: Any) -> str:
    """A sampling value as short text: floats to 6 significant digits (llama.cpp sends 0.800000011920929 for 0.8)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _describe(facts: dict[str, Any]) -> str:
    if not facts:
        return "the server reported no provenance"
    sha = facts.get("template_sha256")
    template = f"chat template sha256 {sha[:12]}" if isinstance(sha, str) else "no chat template"
    if facts.get("template_fallback") and isinstance(sha, str):
        template += " (the server's fallback)"
    declared = facts.get("template_tools")
    tools = (
        "tool support not reported" if declared is None else "declares tool support" if declared else "declares no tool support"
    )
    parts = [f"{template}, {tools}", f"quantisation {facts.get('quantization') or 'not reported'}",
             f"parameters {facts.get('parameters') or 'not reported'}"]  # fmt: skip
    sampling = facts.get("sampling_defaults")
    if isinstance(sampling, dict) and sampling:
        keys = [k for k in _FACT_ORDER if k in sampling] + sorted(k for k in sampling if k not in _FACT_ORDER)
        parts.append("server sampling defaults " + ", ".join(f"{k}={_value(sampling[k])}" for k in keys[:8]))
    return "; ".join(parts) + f" ({facts.get('source', 'server')})"


def model_warnings(rows: list[dict[str, Any]]) -> list[str]:
    """The header's warnings for :meth:`~harness.ledger.Ledger.model_runs` rows, as plain sentences (model order)."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_model.setdefault(row["model"], []).append(row)
    warnings = []
    for model in sorted(by_model):
        reported = [r["provenance"] for r in by_model[model] if r["provenance"]]
        if any(f.get("template_sha256") is None or f.get("template_fallback") for f in reported):
            warnings.append(f"{model} has no chat template of its own (a base model, or the server's fallback template), "
                            "so its replies were not shaped by a chat format.")  # fmt: skip
        if any(r["tool_mode"] == "native" and r["provenance"].get("template_tools") is False for r in by_model[model]):
            warnings.append(f"{model} ran in native tool mode with a chat template that declares no tool support; "
                            "compare it with --tool-mode prompt.")  # fmt: skip
    by_digest: dict[tuple[str, str], set[str]] = {}
    for row in rows:  # the same weights with another chat template are another model setup (e.g. smollm2-135m-tools)
        if row["digest"]:
            template = (row["provenance"] or {}).get("template_sha256")
            by_digest.setdefault((row["digest"], str(template)), set()).add(row["model"])
    for (digest, _template), models in sorted(by_digest.items()):
        if len(models) > 1:
            names = sorted(models)
            warnings.append(f"{', '.join(names[:-1])} and {names[-1]} share one digest ({digest}) and chat template: one model under "
                            f"{len(names)} names, counted separately.")  # fmt: skip
    return warnings


def _no_links(cell: Callable[[str], str]) -> Callable[[str], str]:
    """``cell`` and then ``[``/``]`` escaped: a server's ``[x](url)`` or ``![](url)`` shows as text, not a link or image."""
    return lambda text: cell(text).replace("[", "\\[").replace("]", "\\]")


def model_header_lines(rows: list[dict[str, Any]], cell: Callable[[str], str]) -> list[str]:
    """The ``## Models`` section: one bullet per model (its newest run's provenance, distinct templates, warm-up),
    then the warnings in bold; ``[]`` when the ledger has no runs.

    Args:
        rows: :meth:`~harness.ledger.Ledger.model_runs`.
        cell: escapes stored text for markdown (:func:`harness.report.markdown.cell_text`).
    """
    if not rows:
        return []
    cell = _no_links(cell)
    by_model: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_model.setdefault(row["model"], []).append(row)
    lines = ["## Models", ""]
    for model in sorted(by_model):
        runs = by_model[model]
        text = _describe(runs[-1]["provenance"])
        shas = sorted({str(r["provenance"].get("template_sha256")) for r in runs if r["provenance"].get("template_sha256")})
        if len(shas) > 1:
            text += f"; {len(shas)} different templates over its runs"
        warmups = [r["warmup_ms"] for r in runs if r["warmup_ms"] is not None]
        warm = f"; warm-up {warmups[-1]:.0f} ms before its runs (not a turn, in no latency figure)" if warmups else ""
        lines.append(f"- {cell(model)}: {cell(text)}{warm}")
    lines.append("")
    warnings = model_warnings(rows)
    lines += [f"**Warning:** {cell(w)}" for w in warnings] + ([""] if warnings else [])
    return lines
