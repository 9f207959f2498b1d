"""What the report's plots draw, computed from :class:`~harness.report.frames.LedgerFrames` without matplotlib.

:func:`plot_data` reduces the runs to the few small tables the plots show (:class:`PlotData`: at most a row per group
of the ``--by`` axes), so :mod:`harness.report.plots` can draw them in another process
(:class:`harness.report.plot_worker.PlotWorker`) while this one writes the CSV and markdown; the tables pickle in
milliseconds where the 125,000-run frame would not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from harness.report.frames import LedgerFrames
from harness.report.tables import summary_table

__all__ = ["MAX_CELL_TEXTS", "MAX_ROWS", "PlotData", "cell_texts_shown", "plot_data", "row_axes"]

MAX_ROWS = 40
"""A plot with more groups than this draws one row per model (the first axis) instead: small multiples per failure
mode, outcomes and pass^k pooled over the other axes (the caption says so)."""
MAX_CELL_TEXTS = 100
"""A heat map with more cells than this (over all its panels) is drawn without the count written on each cell: at that
density the texts are hard to read, and drawing them took most of the plotting time of a 1,000,000-turn report (480
cells); the footer and caption say so, and the counts are in the report's tables."""


def cell_texts_shown(cells: int) -> bool:
    """Whether a heat map of ``cells`` cells (over all its panels) writes its count on each cell (:data:`MAX_CELL_TEXTS`)."""
    return cells <= MAX_CELL_TEXTS


@dataclass(frozen=True)
class PlotData:
    """The tables behind the report's plots (small: one row per group; picklable).

    Attributes:
        axes: the ``--by`` axes that vary (:func:`harness.report.sections.shown_axes`).
        pass_rate: :func:`~harness.report.tables.summary_table` (no latency) by the row axis (model, or the first
            axis), the other axes and ``task_kind``, groups with scored runs only.
        failures: :func:`~harness.report.tables.failure_mode_table` by ``axes``.
        outcome_axes: the outcome plot's axes (``axes``, or the row axis alone when too many groups: :func:`_few_rows`)
            and its caption note.
        outcomes: counted runs per group of ``outcome_axes[0]`` (sorted index) × outcome (columns), a count each.
        outcome_runs: counted runs, and how many of them ended ``infra_error``.
        pass_k: :func:`~harness.report.tables.summary_table` by ``outcome_axes[0]``, groups with scored runs only.
    """

    axes: list[str]
    pass_rate: pd.DataFrame
    failures: pd.DataFrame
    outcome_axes: tuple[list[str], str]
    outcomes: pd.DataFrame
    outcome_runs: tuple[int, int]
    pass_k: pd.DataFrame


def plot_data(frames: LedgerFrames, axes: Sequence[str], failures: pd.DataFrame, grouped: pd.DataFrame | None = None) -> PlotData:
    """The tables every plot draws (:class:`PlotData`).

    Args:
        frames: :class:`harness.report.frames.LedgerFrames` with at least one scored run.
        axes: the ``--by`` axes that vary: one row per group of them.
        failures: :func:`harness.report.tables.failure_mode_table` by ``axes``.
        grouped: :func:`harness.report.tables.summary_table` by ``axes``, when already computed.
    """
    axes = list(axes)
    rows = row_axes(axes)
    rates = summary_table(frames, [*rows, *(a for a in axes if a not in rows), "task_kind"], latency=False)
    outcome_axes = _few_rows(frames, axes)
    few = outcome_axes[0]
    runs = frames.runs[[*few, "outcome"]][frames.runs["counted"]]
    counts = runs.groupby([*few, "outcome"]).size().unstack("outcome", fill_value=0).sort_index()
    table = grouped if grouped is not None and few == axes else summary_table(frames, few, latency=False)
    return PlotData(
        axes=axes,
        pass_rate=rates[rates["scored"] > 0],
        failures=failures,
        outcome_axes=outcome_axes,
        outcomes=counts,
        outcome_runs=(len(runs), int((runs["outcome"] == "infra_error").sum())),
        pass_k=table[table["scored"] > 0].reset_index(drop=True),
    )


def row_axes(axes: Sequence[str]) -> list[str]:
    """The axes a plot puts on its rows: the model when it varies, else the first axis (none for no axes)."""
    return ["model"] if "model" in axes else list(axes[:1])


def _few_rows(frames: LedgerFrames, axes: list[str]) -> tuple[list[str], str]:
    """``axes``, or only the model (first axis) when that gives more than :data:`MAX_ROWS` rows; and a caption note.

    Counts the rows the plots draw: a run with no value on an axis (NaN) is in no group, as pandas' ``groupby`` leaves
    it out of the outcome bars. (Before :class:`~harness.report.grouping.RunGroups` the count came from
    ``drop_duplicates``, which counted such runs as one more row that was never drawn.)"""
    if len(frames.groups.ids(axes)[1]) <= MAX_ROWS or len(axes) < 2:
        return axes, ""
    rows = row_axes(axes)
    return rows, f" (pooled over {' × '.join(a for a in axes if a not in rows)}: {MAX_ROWS}+ rows would not be readable)"
