"""The report's PNG plots, drawn with matplotlib's object API on the Agg canvas (no pyplot state).

Deterministic: fixed size, DPI and colours, bundled DejaVu fonts, and ``metadata={"Software": None}``
so no version or date is written into the files. Each plot has a title, labelled axes with units,
a legend (or colour bar) and its sample size in the figure footer and the report caption.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from harness.report.frames import LedgerFrames
from harness.stats import pass_hat_k, wilson_interval
from harness.vocab import OUTCOMES, plural

__all__ = ["write_all"]

_Drawn = tuple[str, str, str]
"""``(file name, alt text, caption)`` of one plot drawn."""

_OUTCOME_ORDER = (*OUTCOMES, "unfinished")
_OUTCOME_COLOURS = {"pass": "#2ca02c", "task_failed": "#d62728", "turn_limit": "#ff7f0e", "token_limit": "#e377c2",
                    "infra_error": "#7f7f7f", "interrupted": "#bcbd22", "context_overflow": "#17becf",
                    "unfinished": "#c7c7c7"}  # fmt: skip
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
_DPI = 100


_MAX_WIDTH_IN = 40.0


def _label(text: str, width: int = 22, lines: int = 4) -> str:
    """A model spec wrapped onto at most ``lines`` lines of ``width`` characters (middle elided)."""
    parts = textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]
    if len(parts) > lines:
        parts = parts[: lines - 1] + ["…" + text[-(width - 1) :]]
    return "\n".join(parts)


def _figure(width: float = 8.0, height: float = 5.0) -> Figure:
    fig = Figure(figsize=(min(width, _MAX_WIDTH_IN), height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path, footer: str) -> None:
    fig.supxlabel(footer, fontsize=8, color="#555555")
    fig.savefig(path, format="png", dpi=_DPI, metadata={"Software": None})


def write_all(frames: LedgerFrames, cells: pd.DataFrame, failures: pd.DataFrame, out: Path) -> dict[str, tuple[str, str]]:
    """Draw every plot that has data into ``out``.

    Args:
        frames: :class:`harness.report.frames.LedgerFrames`.
        cells: :func:`harness.report.tables.summary_table` by every cell axis.
        failures: :func:`harness.report.tables.failure_mode_table` by model.
        out: folder to write into.

    Returns:
        ``{file name: (alt text, caption)}`` in drawing order, for the markdown.
    """
    models = sorted(frames.runs["model"].unique())
    colours = {m: _PALETTE[i % len(_PALETTE)] for i, m in enumerate(models)}
    written: dict[str, tuple[str, str]] = {}
    for draw in (_pass_rate, _failure_heatmap, _outcomes, _pass_k):
        result = draw(frames, cells, failures, out, colours)
        if result:
            written[result[0]] = (result[1], result[2])
    return written


def _pass_rate(
    frames: LedgerFrames, cells: pd.DataFrame, failures: pd.DataFrame, out: Path, colours: dict[str, str]
) -> _Drawn | None:
    scored = frames.runs[frames.runs["scored"]]
    rates = scored.groupby(["model", "temperature"], sort=True)["passed"].agg(["sum", "size"]).reset_index()
    temps = sorted(rates["temperature"].unique())
    models = sorted(rates["model"].unique())
    fig = _figure()
    ax = fig.add_subplot()
    step = (min(np.diff(temps)) if len(temps) > 1 else 1.0) * 0.08
    for i, model in enumerate(models):
        r = rates[rates["model"] == model]
        bounds = np.array([wilson_interval(int(k), int(n)) for k, n in zip(r["sum"], r["size"], strict=True)])
        rate = r["sum"].to_numpy() / r["size"].to_numpy()
        x = r["temperature"].to_numpy() + (i - (len(models) - 1) / 2) * step / max(1, len(models) - 1)
        ax.errorbar(x, 100 * rate, yerr=[100 * (rate - bounds[:, 0]), 100 * (bounds[:, 1] - rate)], fmt="o-", capsize=4,
                    color=colours[model], label=f"{_label(model, 40, 2)} (n = {int(r['size'].sum())})")  # fmt: skip
    ax.set_xticks(temps, [f"{t:g}" for t in temps])
    ax.set_ylim(-3, 103)
    ax.set_xlabel("sampling temperature (unitless)")
    ax.set_ylabel("pass rate (% of scored runs)")
    ax.set_title("Pass rate by model and temperature, 95% Wilson intervals")
    ax.legend(title="model (scored runs)", fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    n = len(scored)
    footer = f"n = {plural(n, 'scored run')}; per point {int(rates['size'].min())}–{int(rates['size'].max())}; pooled over scenarios, tool modes and parsers"
    _save(fig, out / "pass_rate.png", footer)
    return "pass_rate.png", "Pass rate by model and temperature", f"Pass rate with 95% Wilson intervals; {footer}."


def _failure_heatmap(
    frames: LedgerFrames, cells: pd.DataFrame, failures: pd.DataFrame, out: Path, colours: dict[str, str]
) -> _Drawn | None:
    if failures.empty:
        return None
    modes = list(dict.fromkeys(failures["mode"]))
    models = sorted(failures["model"].unique())
    share = failures.pivot(index="mode", columns="model", values="share").reindex(index=modes, columns=models)
    counts = failures.pivot(index="mode", columns="model", values="runs_with").reindex(index=modes, columns=models)
    totals = failures.drop_duplicates("model").set_index("model")["scored_runs"].reindex(models)
    fig = _figure(max(6.0, 2.0 + 1.6 * len(models)), max(3.0, 1.5 + 0.45 * len(modes)))
    ax = fig.add_subplot()
    image = ax.imshow(100 * share.to_numpy(dtype=float), cmap="Reds", vmin=0, vmax=100, aspect="auto")
    for i in range(len(modes)):
        for j in range(len(models)):
            value = float(share.to_numpy(dtype=float)[i, j])
            ax.text(j, i, f"{100 * value:.0f}%\n{int(counts.to_numpy()[i, j])}/{int(totals.to_numpy()[j])}", ha="center", va="center",
                    fontsize=7, color="white" if value > 0.6 else "black")  # fmt: skip
    ax.set_xticks(range(len(models)), [f"{_label(m)}\n(n = {int(totals[m])})" for m in models], fontsize=8)
    ax.set_yticks(range(len(modes)), modes, fontsize=8)
    ax.set_xlabel("model (scored runs)")
    ax.set_ylabel("failure mode")
    ax.set_title("Share of runs showing each failure mode")
    fig.colorbar(image, ax=ax, label="runs with ≥1 occurrence (%)")
    footer = (
        f"n = {plural(int(totals.sum()), 'scored run')} over {plural(len(models), 'model')}; modes sorted by spread across models"
    )
    _save(fig, out / "failure_modes.png", footer)
    return (
        "failure_modes.png",
        "Failure-mode shares by model",
        f"Share of scored runs with at least one turn showing each mode; {footer}.",
    )


def _outcomes(
    frames: LedgerFrames, cells: pd.DataFrame, failures: pd.DataFrame, out: Path, colours: dict[str, str]
) -> _Drawn | None:
    runs = frames.runs
    counts = runs.groupby(["model", "outcome"]).size().unstack("outcome", fill_value=0)
    models = sorted(counts.index)
    fig = _figure(max(8.0, 2.5 + 1.8 * len(models)))
    ax = fig.add_subplot()
    bottom = np.zeros(len(models))
    for outcome in _OUTCOME_ORDER:
        if outcome not in counts.columns:
            continue
        values = counts[outcome].reindex(models).to_numpy()
        ax.bar(range(len(models)), values, bottom=bottom, color=_OUTCOME_COLOURS[outcome], label=outcome, edgecolor="white")
        bottom = bottom + values
    ax.set_xticks(range(len(models)), [f"{_label(m)}\n(n = {int(t)})" for m, t in zip(models, bottom, strict=True)], fontsize=8)
    ax.set_xlabel("model (all runs)")
    ax.set_ylabel("runs (count)")
    ax.set_title("Run outcomes by model")
    ax.legend(title="outcome", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    footer = f"n = {plural(len(runs), 'run')}, including {int((runs['outcome'] == 'infra_error').sum())} infra_error (never a model failure)"
    _save(fig, out / "outcomes.png", footer)
    return "outcomes.png", "Run outcomes by model", f"Run outcomes stacked per model; {footer}."


def _pass_k(
    frames: LedgerFrames, cells: pd.DataFrame, failures: pd.DataFrame, out: Path, colours: dict[str, str]
) -> _Drawn | None:
    cells = cells[cells["scored"] > 0]
    scored = frames.runs[frames.runs["scored"]]
    repeats = (
        scored.groupby(["model", "scenario", "temperature", "tool_mode", "parser", "think", "stream"])["repetition"]
        .nunique()
        .groupby("model")
        .max()
    )
    fig = _figure()
    ax = fig.add_subplot()
    total_cells = 0
    for model in sorted(cells["model"].unique()):
        mine = cells[cells["model"] == model]
        max_k = int(min(mine["scored"].min(), repeats.get(model, 1)))
        ks = np.arange(1, max_k + 1)
        values = [
            np.mean([pass_hat_k(int(n), int(c), int(k)) for n, c in zip(mine["scored"], mine["passes"], strict=True)]) for k in ks
        ]
        ax.plot(
            ks,
            100 * np.array(values),
            "o-",
            color=colours[model],
            label=f"{_label(model, 40, 2)} ({plural(len(mine), 'cell')}, {plural(int(mine['scored'].sum()), 'run')})",
        )
        total_cells += len(mine)
    ax.set_ylim(-3, 103)
    ax.set_xlabel("k (runs of one cell that must all pass)")
    ax.set_ylabel("pass^k (%)")
    ax.set_title("pass^k: reliability over k repeated runs (tau-bench)")
    locator = ax.xaxis.get_major_locator()
    if isinstance(locator, MaxNLocator):  # matplotlib's default AutoLocator is one
        locator.set_params(integer=True)
    ax.legend(title="model", fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    footer = f"n = {plural(total_cells, 'cell')}, {plural(int(cells['scored'].sum()), 'scored run')}; mean over a model's cells of C(c,k)/C(n,k), k up to its repetitions per cell"
    _save(fig, out / "pass_k.png", footer)
    return "pass_k.png", "pass^k against k per model", f"pass^k curves; {footer}."
