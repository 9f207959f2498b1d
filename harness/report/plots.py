"""The report's PNG plots, drawn with matplotlib's object API on the Agg canvas (no pyplot state).

Every plot follows ``--by`` (the axes that vary) and stays readable up to at least 20 models × 12 scenarios: pass
rate, failure modes and pass^k are heat maps with one row per group (rows grow the figure, they never squeeze it),
the pass-rate map is split into small multiples by scenario kind (tool-using vs restraint), outcomes are horizontal
stacked bars, and every legend or colour bar sits outside the axes. Colours come from one sequential map
(``viridis``, or ``Reds`` for failure shares) that does not repeat; outcomes have one fixed colour each.

Deterministic: fixed DPI and colours, bundled DejaVu fonts, and ``metadata={"Software": None}`` so no version or date
is written into the files. Each plot has a title, labelled axes with units, a colour bar or legend, and its sample
size in the figure footer and the report caption.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.ticker import MaxNLocator

from harness.report.plot_data import MAX_CELL_TEXTS, MAX_ROWS, PlotData, cell_texts_shown
from harness.report.plot_data import row_axes as rows_of
from harness.vocab import OUTCOMES, plural

__all__ = ["draw_all"]

_OUTCOME_ORDER = (*OUTCOMES, "unfinished")
_OUTCOME_COLOURS = {"pass": "#2ca02c", "task_failed": "#d62728", "turn_limit": "#ff7f0e", "token_limit": "#e377c2",
                    "infra_error": "#7f7f7f", "interrupted": "#bcbd22", "context_overflow": "#17becf",
                    "unfinished": "#c7c7c7"}  # fmt: skip
_DPI = 100
_MAX_WIDTH_IN = 40.0
_MAX_HEIGHT_IN = 60.0
_KIND_TITLES = {"tool": "tool-using scenarios", "restraint": "restraint scenarios (no tool needed)"}


def _label(text: str, width: int = 28, lines: int = 2) -> str:
    """A label wrapped onto at most ``lines`` lines of ``width`` characters (the end kept when cut)."""
    parts = textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]
    if len(parts) > lines:
        parts = parts[: lines - 1] + ["…" + text[-(width - 1) :]]
    return "\n".join(parts)


def _group_labels(table: pd.DataFrame, axes: Sequence[str]) -> list[str]:
    labels = []
    for row in table[list(axes)].to_dict("records"):
        labels.append(", ".join(("T=" + f"{row[a]:g}") if a == "temperature" else str(row[a]) for a in axes) or "all runs")
    return labels


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(min(width, _MAX_WIDTH_IN), min(height, _MAX_HEIGHT_IN)), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _fitted(fig: Figure, text: str, points: float) -> str:
    """``text`` wrapped onto lines that fit the figure's width at ``points`` (an average glyph taken as 0.65 em wide)."""
    return textwrap.fill(text, max(30, int(fig.get_figwidth() * 72 / (points * 0.65))), break_on_hyphens=False)


def _suptitle(fig: Figure, text: str) -> None:
    """The figure's title, wrapped to its width (a long title was cut at both edges: newcomer)."""
    fig.suptitle(_fitted(fig, text, 12.0))


def _save(fig: Figure, path: Path, footer: str) -> None:
    fig.supxlabel(_fitted(fig, footer, 8.0), fontsize=8, color="#555555")
    fig.savefig(path, format="png", dpi=_DPI, metadata={"Software": None})


def draw_all(data: PlotData, out: Path) -> dict[str, tuple[str, str]]:
    """Draw every plot of ``data`` (:func:`harness.report.plot_data.plot_data`) that has data into ``out``.

    Returns:
        ``{file name: (alt text, caption)}`` in drawing order, for the markdown.

    Raises:
        OSError: a file cannot be written.
    """
    written: dict[str, tuple[str, str]] = {}
    for draw in (_pass_rate, _failure_heatmap, _outcomes, _pass_k):
        result = draw(data, out)
        if result:
            written[result[0]] = (result[1], result[2])
    return written


def _no_text_note(cells: int) -> str:
    """The footer's note for a heat map of ``cells`` cells: empty when its cells carry their counts."""
    return "" if cell_texts_shown(cells) else f"; no cell text ({cells} cells, over {MAX_CELL_TEXTS}): counts in the tables"


def _heat(ax: Axes, values: np.ndarray, texts: list[list[str]], cmap: str) -> AxesImage:
    """One heat map panel: values in [0, 100] (NaN: no run, shown light grey), each cell's text on it."""
    from matplotlib import colormaps

    colours = colormaps[cmap].with_extremes(bad="#eeeeee")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=colours, vmin=0, vmax=100, aspect="auto")
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            if texts[i][j]:
                dark = not np.isnan(values[i, j]) and (values[i, j] < 55 if cmap == "viridis" else values[i, j] > 60)
                ax.text(j, i, texts[i][j], ha="center", va="center", fontsize=7, color="white" if dark else "black")
    return image


def _pass_rate(data: PlotData, out: Path) -> tuple[str, str, str] | None:
    """Heat map: rows = model (or the first axis), columns = the other axes, one panel per scenario kind."""
    axes, table = data.axes, data.pass_rate
    row_axes = rows_of(axes)
    col_axes = [a for a in axes if a not in row_axes]
    rows = table.drop_duplicates(row_axes)[row_axes].sort_values(row_axes, kind="stable")
    row_labels = [_label(x) for x in _group_labels(rows, row_axes)]
    kinds = [k for k in ("tool", "restraint") if k in set(table["task_kind"])]
    panels = []
    for kind in kinds:
        mine = table[table["task_kind"] == kind]
        cols = mine.drop_duplicates(col_axes)[col_axes].sort_values(col_axes, kind="stable") if col_axes else None
        col_labels = _group_labels(cols, col_axes) if cols is not None else ["all"]
        keyed = {tuple(r[a] for a in [*row_axes, *col_axes]): r for r in mine.to_dict("records")}
        col_keys = [tuple(r.values()) for r in cols.to_dict("records")] if cols is not None else [()]
        values = np.full((len(rows), len(col_keys)), np.nan)
        texts = [["" for _ in col_keys] for _ in range(len(rows))]
        for i, rk in enumerate(tuple(r.values()) for r in rows.to_dict("records")):
            for j, ck in enumerate(col_keys):
                r = keyed.get((*rk, *ck))
                if r is not None:
                    values[i, j] = 100 * r["pass_rate"]
                    texts[i][j] = f"{int(r['passes'])}/{int(r['scored'])}"
        panels.append((kind, col_labels, values, texts))
    cells = sum(p[2].size for p in panels)
    if not cell_texts_shown(cells):
        panels = [(kind, col_labels, values, [["" for _ in row] for row in texts]) for kind, col_labels, values, texts in panels]
    width = 3.0 + 0.12 * max(len(x) for x in row_labels) * 1.0 + sum(0.75 * len(p[1]) + 0.8 for p in panels)
    fig = _figure(max(6.0, width), 2.2 + 0.32 * len(rows) + 0.06 * max(len(c) for p in panels for c in p[1]))
    grid = fig.add_gridspec(1, len(panels), width_ratios=[max(1, len(p[1])) for p in panels])
    image: AxesImage | None = None
    for n, (kind, col_labels, values, texts) in enumerate(panels):
        ax = fig.add_subplot(grid[0, n])
        image = _heat(ax, values, texts, "viridis")
        ax.set_xticks(
            range(len(col_labels)), [_label(c, 24) for c in col_labels], rotation=90 if len(col_labels) > 3 else 0, fontsize=8
        )
        ax.set_yticks(range(len(row_labels)), row_labels if n == 0 else [""] * len(row_labels), fontsize=8)
        ax.set_title(_KIND_TITLES[kind], fontsize=10)
        ax.set_xlabel(" × ".join(col_axes) if col_axes else "all runs of the kind")
        if n == 0:
            ax.set_ylabel(" × ".join(row_axes))
    assert image is not None  # at least one kind has scored runs
    fig.colorbar(image, ax=fig.axes, label="pass rate (% of scored runs)", location="right", shrink=0.9)
    what = " (cell text: passes/scored runs)" if cell_texts_shown(cells) else ""
    _suptitle(fig, f"Pass rate{what}, tool-using and restraint scenarios apart")
    n = int(table["scored"].sum())
    footer = (f"n = {plural(n, 'scored run')} over {plural(len(rows), 'row')}; grey: no scored run; 95% Wilson intervals in "
              f"the summary table{_no_text_note(cells)}")  # fmt: skip
    _save(fig, out / "pass_rate.png", footer)
    return (
        "pass_rate.png",
        "Pass rate heat map by scenario kind",
        f"Pass rate per {' × '.join(axes)}, tool-using and restraint scenarios apart; {footer}.",
    )


def _failure_heatmap(data: PlotData, out: Path) -> tuple[str, str, str] | None:
    """Heat map: rows = the ``--by`` groups, columns = failure modes (sorted by spread)."""
    axes, failures = data.axes, data.failures
    if failures.empty:
        return None
    row_axes = rows_of(axes)
    firsts = failures.drop_duplicates(axes)  # one row per group
    if len(firsts) > MAX_ROWS and len(axes) > 1:
        return _failure_multiples(failures, row_axes, [a for a in axes if a not in row_axes], out)
    modes = list(dict.fromkeys(failures["mode"]))
    groups = firsts[axes].sort_values(axes, kind="stable")
    labels = [_label(x) for x in _group_labels(groups, axes)]
    keyed = {(str(r["mode"]), *(r[a] for a in axes)): r for r in failures.to_dict("records")}
    values = np.full((len(groups), len(modes)), np.nan)
    texts = [["" for _ in modes] for _ in range(len(groups))]
    for i, g in enumerate(groups.to_dict("records")):
        for j, mode in enumerate(modes):
            r = keyed[(str(mode), *(g[a] for a in axes))]
            values[i, j] = 100 * r["share"]
            if cell_texts_shown(values.size):
                texts[i][j] = f"{int(r['runs_with'])}/{int(r['scored_runs'])}"
    # at least 4 in high: a shorter axes cut its colour bar's label (newcomer)
    fig = _figure(max(6.0, 3.5 + 0.12 * max(len(x) for x in labels) + 0.8 * len(modes)), max(4.0, 2.8 + 0.32 * len(groups)))
    ax = fig.add_subplot()
    image = _heat(ax, values, texts, "Reds")
    ax.set_xticks(
        range(len(modes)), [_label(m, 40, 1) for m in modes], rotation=60, ha="right", rotation_mode="anchor", fontsize=8
    )
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("failure mode (sorted by spread across the rows)")
    ax.set_ylabel(" × ".join(axes))
    what = " (cell text: runs with it/scored runs)" if cell_texts_shown(values.size) else ""
    ax.set_title(_fitted(fig, f"Share of scored runs showing each failure mode{what}", 12.0))  # cut at both edges: newcomer
    fig.colorbar(image, ax=ax, label="runs with ≥1 occurrence (%)", location="right", shrink=0.9)
    total = int(groups.merge(firsts, on=axes)["scored_runs"].sum())
    footer = f"n = {plural(total, 'scored run')} over {plural(len(groups), 'row')}; Wilson intervals in the report's table{_no_text_note(values.size)}"
    _save(fig, out / "failure_modes.png", footer)
    return (
        "failure_modes.png",
        "Failure-mode shares",
        f"Share of scored runs with at least one turn showing each mode, per {' × '.join(axes)}; {footer}.",
    )


def _failure_multiples(failures: pd.DataFrame, row_axes: list[str], col_axes: list[str], out: Path) -> tuple[str, str, str]:
    """Small multiples: one heat map per failure mode, rows = model (first axis), columns = the other axes."""
    modes = list(dict.fromkeys(failures["mode"]))
    rows = failures.drop_duplicates(row_axes)[row_axes].sort_values(row_axes, kind="stable")
    cols = failures.drop_duplicates(col_axes)[col_axes].sort_values(col_axes, kind="stable")
    row_labels, col_labels = [_label(x) for x in _group_labels(rows, row_axes)], _group_labels(cols, col_axes)
    keyed = {(str(r["mode"]), *(r[a] for a in [*row_axes, *col_axes])): r for r in failures.to_dict("records")}
    per_line = 2 if len(modes) > 1 else 1
    lines = -(-len(modes) // per_line)
    panel_w, panel_h = 1.5 + 0.45 * len(col_labels), 1.2 + 0.28 * len(rows) + 0.06 * max(len(c) for c in col_labels)
    fig = _figure(1.5 + 0.12 * max(len(x) for x in row_labels) + per_line * panel_w, 1.2 + lines * panel_h)
    image: AxesImage | None = None
    cells = len(modes) * len(rows) * len(cols)
    for n, mode in enumerate(modes):
        ax = fig.add_subplot(lines, per_line, n + 1)
        values = np.full((len(rows), len(cols)), np.nan)
        texts = [["" for _ in range(len(cols))] for _ in range(len(rows))]
        for i, rk in enumerate(rows.to_dict("records")):
            for j, ck in enumerate(cols.to_dict("records")):
                r = keyed.get((str(mode), *rk.values(), *ck.values()))
                if r is not None:
                    values[i, j] = 100 * r["share"]
                    texts[i][j] = f"{int(r['runs_with'])}/{int(r['scored_runs'])}" if cell_texts_shown(cells) else ""
        image = _heat(ax, values, texts, "Reds")
        ax.set_title(mode, fontsize=10)
        ax.set_xticks(range(len(col_labels)), [_label(c, 24) for c in col_labels], rotation=90, fontsize=7)
        ax.set_yticks(range(len(row_labels)), row_labels if n % per_line == 0 else [""] * len(row_labels), fontsize=7)
    assert image is not None
    fig.colorbar(image, ax=fig.axes, label="runs with ≥1 occurrence (%)", location="right", shrink=0.6)
    _suptitle(
        fig,
        f"Share of scored runs showing each failure mode: one panel per mode, {' × '.join(row_axes)} by {' × '.join(col_axes)}",
    )
    total = int(failures.drop_duplicates([*row_axes, *col_axes])["scored_runs"].sum())
    what = _no_text_note(cells) or "; cell text: runs with the mode/scored runs"
    footer = f"n = {plural(total, 'scored run')}{what}; grey: no scored run"
    _save(fig, out / "failure_modes.png", footer)
    return ("failure_modes.png", "Failure-mode shares, one panel per mode",
            f"Share of scored runs with at least one turn showing each mode, per {' × '.join([*row_axes, *col_axes])}; {footer}.")  # fmt: skip


def _outcomes(data: PlotData, out: Path) -> tuple[str, str, str] | None:
    """Horizontal stacked bars: one bar per ``--by`` group (counted runs), the legend outside on the right."""
    (axes, pooled), counts = data.outcome_axes, data.outcomes
    groups = counts.index.to_frame(index=False)
    labels = [_label(x) for x in _group_labels(groups, axes)]
    fig = _figure(max(8.0, 5.0 + 0.12 * max(len(x) for x in labels)), 2.0 + 0.3 * len(labels))
    ax = fig.add_subplot()
    left = np.zeros(len(labels))
    y = np.arange(len(labels))
    for outcome in _OUTCOME_ORDER:
        if outcome not in counts.columns:
            continue
        values = counts[outcome].to_numpy()
        ax.barh(y, values, left=left, color=_OUTCOME_COLOURS[outcome], label=outcome, edgecolor="white")
        left = left + values
    ax.set_yticks(y, [f"{lab} (n = {int(t)})" for lab, t in zip(labels, left, strict=True)], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("runs (count)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # run counts are whole: no 0.25 ticks
    ax.set_ylabel(" × ".join(axes))
    ax.set_title("Run outcomes")
    ax.legend(title="outcome", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    footer = f"n = {plural(data.outcome_runs[0], 'run')}, including {data.outcome_runs[1]} infra_error (never a model failure)"
    _save(fig, out / "outcomes.png", footer)
    return "outcomes.png", "Run outcomes", f"Run outcomes stacked per {' × '.join(axes)}{pooled}; {footer}."


def _pass_k(data: PlotData, out: Path) -> tuple[str, str, str] | None:
    """Heat map: rows = the ``--by`` groups, columns = k; pass^k as tau-bench defines it (mean over the group's cells)."""
    (axes, pooled), table = data.outcome_axes, data.pass_k
    ks = [c for c in table.columns if c.startswith("pass^")]
    if table.empty or not ks:
        return None
    labels = [_label(x) for x in _group_labels(table, axes)]
    values = 100 * table[ks].to_numpy(dtype=float)
    shown = cell_texts_shown(values.size)
    texts = [["" if np.isnan(v) or not shown else f"{v:.0f}" for v in row] for row in values]
    fig = _figure(max(6.0, 3.5 + 0.12 * max(len(x) for x in labels) + 0.6 * len(ks)), 2.4 + 0.3 * len(labels))
    ax = fig.add_subplot()
    image = _heat(ax, values, texts, "viridis")
    ax.set_xticks(range(len(ks)), [k.split("^")[1] for k in ks], fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("k (runs of one cell that must all pass)")
    ax.set_ylabel(" × ".join(axes))
    ax.set_title("pass^k: reliability over k repeated runs (tau-bench), %")
    fig.colorbar(image, ax=ax, label="pass^k (%)", location="right", shrink=0.9)
    footer = (f"n = {plural(int(table['scored'].sum()), 'scored run')}; mean over a row's cells of C(c,k)/C(n,k); "
              f"grey: a cell has fewer than k scored runs{_no_text_note(values.size)}")  # fmt: skip
    _save(fig, out / "pass_k.png", footer)
    return "pass_k.png", "pass^k against k", f"pass^k per {' × '.join(axes)}{pooled}; {footer}."
