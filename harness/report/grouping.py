"""Runs grouped by any subset of the cell axes with integer codes, so every table groups 125,000 runs in numpy.

:class:`RunGroups` factorizes each axis of :attr:`harness.report.frames.LedgerFrames.runs` once (codes in sorted
order of the values, as ``groupby(..., sort=True)`` orders its groups); :meth:`RunGroups.ids` then gives each run the
number of its group for any ``by``, and the groups' keys in that order. Counts and sums per group are
``np.bincount`` over those ids, medians and quantiles sort once (:func:`sort_by_group`). This replaced a pandas
``groupby`` over the text columns in each table (hashing every run's strings again for each of the report's five
summary tables); the results are the same values in the same order (tests/test_report_aggregates.py compares them
with the pandas computation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

__all__ = ["RunGroups", "grouped_median", "sort_by_group"]


@dataclass
class RunGroups:
    """Per-run integer codes of the grouping axes of a runs frame (read-only: build after the frame is final).

    Attributes:
        runs: the runs frame (one row per run).
        codes: axis -> per run, the code of its value (int64, 0 .. k - 1 in sorted order of the values; -1 for NaN).
        uniques: axis -> the distinct values, sorted (``uniques[axis][codes[axis]]`` is the column).
        memo: tables derived from the runs alone, kept for the next table that needs them (e.g. pass^k's cells).
    """

    runs: pd.DataFrame
    codes: dict[str, np.ndarray] = field(default_factory=dict)
    uniques: dict[str, pd.Index] = field(default_factory=dict)
    memo: dict[str, pd.DataFrame] = field(default_factory=dict)

    def _axis(self, axis: str) -> np.ndarray:
        if axis not in self.codes:
            codes, uniques = pd.factorize(self.runs[axis], sort=True)
            self.codes[axis], self.uniques[axis] = codes.astype(np.int64), pd.Index(uniques)
        return self.codes[axis]

    def isin(self, column: str, values: Sequence[object]) -> np.ndarray:
        """Per run, whether its ``column`` is one of ``values`` (bool array; compares codes, not strings)."""
        codes = self._axis(column)
        wanted = [i for i, v in enumerate(self.uniques[column]) if v in values]
        return np.isin(codes, wanted)

    def nunique(self, axis: str) -> int:
        """Distinct values of ``axis`` among the runs, NaN counting as one (``Series.nunique(dropna=False)``)."""
        codes = self._axis(axis)
        return len(self.uniques[axis]) + int(bool((codes < 0).any()))

    def ids(self, by: Sequence[str], mask: np.ndarray | None = None) -> tuple[np.ndarray, pd.DataFrame]:
        """Each run's group by ``by`` among the runs ``mask`` selects (all when None).

        Args:
            by: column names of the runs frame (at least one).
            mask: bool per run; runs outside it (and runs with a NaN value on an axis) get -1.

        Returns:
            ``(ids, keys)``: ``ids`` (int64 per run, 0 .. len(keys) - 1 or -1) and ``keys``, one row per group with
            the ``by`` columns (the frame's dtypes), sorted by them as ``groupby(by, sort=True)`` sorts.
        """
        keep = np.ones(len(self.runs), dtype=bool) if mask is None else np.asarray(mask, dtype=bool).copy()
        combined, size = np.zeros(len(self.runs), dtype=np.int64), 1
        for axis in by:
            codes, values = self._axis(axis), max(len(self.uniques[axis]), 1)
            keep &= codes >= 0
            if size * values >= 2**62:  # re-densify first, so the combined code cannot overflow 64 bits
                combined = np.unique(combined, return_inverse=True)[1].astype(np.int64)
                size = int(combined.max(initial=0)) + 1
            combined, size = combined * values + codes, size * values
        ids = np.full(len(self.runs), -1, dtype=np.int64)
        _, first, inverse = np.unique(combined[keep], return_index=True, return_inverse=True)
        ids[keep] = inverse
        rows = np.flatnonzero(keep)[first]
        keys = pd.DataFrame({axis: self.uniques[axis].take(self.codes[axis][rows]) for axis in by})
        return ids, keys


def sort_by_group(groups: np.ndarray, values: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """``values`` sorted by group, ascending within each (one ``lexsort``), NaN and values in no group left out.

    Args:
        groups: group of each value (int, 0 .. n_groups - 1; negative: in no group).
        values: the values (float).
        n_groups: number of groups.

    Returns:
        ``(sorted_values, sizes)``: group 0's ``sizes[0]`` values ascending, then group 1's, ...; ``sizes`` per group.
    """
    keep = (groups >= 0) & ~np.isnan(values)
    groups, values = groups[keep], values[keep]
    return values[np.lexsort((values, groups))], np.bincount(groups, minlength=n_groups)[:n_groups]


def grouped_median(ids: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    """Median of ``values`` per group as pandas' ``groupby(...).median()`` computes it (NaN skipped; the mean of the
    two middle values for an even count).

    Args:
        ids: group of each value (int, 0 .. n_groups - 1; negative: in no group).
        values: the values (converted to float64).
        n_groups: number of groups.

    Returns:
        float64 array of ``n_groups``; NaN for a group without values.
    """
    values, sizes = sort_by_group(ids, np.asarray(values, dtype=np.float64), n_groups)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    out = np.full(n_groups, np.nan)
    has = sizes > 0
    low = values[(starts + (sizes - 1) // 2)[has]]
    high = values[(starts + sizes // 2)[has]]
    out[has] = np.where(sizes[has] % 2 == 1, high, (low + high) / 2)
    return out
