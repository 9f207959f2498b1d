"""The report's sections beyond the summary: scenario kinds, why runs failed, failure modes by any axis, latency.

Every section follows ``--by`` (its varying axes, :func:`shown_axes`). Tables turn when wide: with more than
:data:`MAX_COLUMN_GROUPS` groups, groups are rows and the measures columns, so 20 models × 12 scenarios stay a
tall table instead of a 40-column one. Every stored string goes through ``cell`` (:func:`harness.report.markdown.cell_text`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd
from tabulate import tabulate

from harness.report.frames import LedgerFrames
from harness.report.tables import check_failure_table, failure_mode_table, summary_table

__all__ = ["MAX_COLUMN_GROUPS", "check_lines", "failure_lines", "group_label", "kind_lines", "latency_lines", "shown_axes"]

MAX_COLUMN_GROUPS = 4
"""A table with at most this many groups shows them as columns; with more, as rows."""
LOAD_NOTE = ("Latency compares only runs made under the same load: on a shared machine it depends on what else ran, "
             "so compare rows of one ledger made in one session, never across machines or days.")  # fmt: skip

ROUGH_MODES = ("fabricated_tool_result", "narration_without_call")
ROUGH_NOTE = ("Read the counts of {modes} as rough: they are judgement calls, and on real replies the classifier was "
              "never tuned on it agreed with a careful annotator on them far less often than on the other modes (README, "
              "\"How far the labels can be trusted\").")  # fmt: skip
TTFT_NOTE = ("Time to first token falls sharply when the server reuses a prompt prefix cached by an earlier run "
             "(llama.cpp keeps one per slot), so it partly measures the order the runs ran in.")  # fmt: skip

Cell = Callable[[str], str]


def _md(rows: list[dict[str, object]]) -> str:
    return tabulate(rows, headers="keys", tablefmt="github", disable_numparse=True)


def _pct(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def _value(axis: str, value: object) -> str:
    return f"{value:g}" if axis == "temperature" and isinstance(value, float) else str(value)


def shown_axes(frames: LedgerFrames, by: Sequence[str]) -> list[str]:
    """The ``by`` axes that take more than one value among the runs (at least the first), in ``by`` order."""
    varying = [a for a in by if frames.groups.nunique(a) > 1]
    return varying or list(by[:1])


def group_label(row: Mapping[Any, object], axes: Sequence[str]) -> str:
    """A group's values as one label, e.g. ``model-a, T=0.7`` (temperature prefixed ``T=``)."""
    return ", ".join(("T=" if a == "temperature" else "") + _value(a, row[a]) for a in axes)


def kind_lines(frames: LedgerFrames, by: Sequence[str], cell: Cell) -> list[str]:
    """Tool-using and restraint scenarios apart: per group, the pass rate on each kind (the headline split)."""
    kinds = frames.groups.ids(["task_kind"], frames.runs["counted"].to_numpy(dtype=bool))[1]["task_kind"].tolist()  # sorted
    axes = [a for a in shown_axes(frames, by) if a != "scenario"] or ["model"]
    lines = ["## Tool-using and restraint scenarios", ""]
    if len(kinds) < 2:
        what = "need a tool" if kinds == ["tool"] else "need no tool (restraint scenarios)"
        return lines + [
            f"All scenarios in this ledger {what} (the scenario's `requires_tool`), so the summary below is one kind.",
            "",
        ]
    table = summary_table(frames, [*axes, "task_kind"], latency=False)
    lines += ["A tool-using scenario cannot be done without a tool; a restraint scenario (`requires_tool = false`) is passed "
              "by answering without one. Mixing them makes a model that only shows restraint look like a low pass rate on "
              "tool use, so they are reported apart (pass rate, 95% Wilson interval).", ""]  # fmt: skip
    rows = []
    for key, group in table.groupby(axes, sort=True):
        values = key if isinstance(key, tuple) else (key,)
        row: dict[str, object] = {a: cell(_value(a, v)) for a, v in zip(axes, values, strict=True)}
        for kind, title in (("tool", "tool-using scenarios"), ("restraint", "restraint scenarios")):
            r = group[group["task_kind"] == kind]
            if r.empty or int(r["scored"].iloc[0]) == 0:
                row[title] = "n/a (no scored run)"
                continue
            r0 = r.iloc[0]
            row[title] = (
                f"{int(r0['passes'])}/{int(r0['scored'])} = {_pct(r0['pass_rate'])} [{100 * r0['pass_low']:.1f}, {100 * r0['pass_high']:.1f}]"
            )
        rows.append(row)
    return lines + [_md(rows), ""]


def check_lines(frames: LedgerFrames, by: Sequence[str], cell: Cell) -> list[str]:
    """Why runs failed: the done checks that failed, per model and per ``--by`` group."""
    lines = ["## Why runs failed: done checks", ""]
    per_model = check_failure_table(frames, ["model"])
    if per_model.empty:
        return lines + ["No done check failed in any scored run.", ""]
    lines += ["Each scored run ends with its scenario's done checks; a run that did not pass failed at least one (or hit a "
              "limit first). `k/n`: scored runs in which the check failed / scored runs that ran it.", ""]  # fmt: skip
    lines += ["### By model", "", _check_table(frames, per_model, ["model"], cell), ""]
    axes = shown_axes(frames, by)
    if axes != ["model"]:
        lines += [f"### By {' × '.join(axes)}", "", _check_table(frames, check_failure_table(frames, axes), axes, cell), ""]
    return lines


def _check_table(frames: LedgerFrames, table: pd.DataFrame, axes: list[str], cell: Cell) -> str:
    runs = frames.runs[["run_id", "passed", *axes]][frames.runs["scored"]]
    sizes = runs.groupby(axes, sort=True).agg(scored=("run_id", "size"), failed=("passed", lambda p: int((~p).sum())))
    rows = []
    for key, size in sizes.iterrows():
        values = key if isinstance(key, tuple) else (key,)
        mine = table
        for a, v in zip(axes, values, strict=True):
            mine = mine[mine[a] == v]
        checks = "; ".join(f"`{cell(str(r['check']))}` {int(r['failed'])}/{int(r['checked'])}" for r in mine.to_dict("records"))
        row: dict[str, object] = {a: cell(_value(a, v)) for a, v in zip(axes, values, strict=True)}
        row["runs not passing / scored"] = f"{int(size['failed'])}/{int(size['scored'])}"
        row["failed checks (runs failing / runs checked)"] = checks or "none"
        rows.append(row)
    return _md(rows)


def failure_lines(frames: LedgerFrames, by: Sequence[str], cell: Cell, table: pd.DataFrame | None = None) -> list[str]:
    """The failure-mode table by the ``--by`` groups; groups as columns when few, as rows when many (``table``:
    :func:`failure_mode_table` by :func:`shown_axes`, when already computed)."""
    axes = shown_axes(frames, by)
    table = failure_mode_table(frames, axes) if table is None else table
    lines = ["## Failure modes", ""]
    if table.empty:
        return lines + ["No failure mode was labelled in any scored run.", ""]
    groups = table.drop_duplicates(axes)[axes].sort_values(axes, kind="stable").to_dict("records")
    modes = list(dict.fromkeys(table["mode"]))
    note = " Only one group has scored runs, so the spread is 0 and modes are in name order." if len(groups) < 2 else ""
    lines += [f"By {' × '.join(axes)}: share of scored runs with at least one turn showing the mode (95% Wilson interval). "
              f"Modes sorted by spread = max − min share across the groups, largest first.{note} Per-turn rates are in "
              "`failure_modes.csv` (`--format csv`).", ""]  # fmt: skip
    rough = [m for m in ROUGH_MODES if m in modes]
    if rough:
        lines += [ROUGH_NOTE.format(modes=" and ".join(f"`{m}`" for m in rough)), ""]
    index = {(str(r["mode"]), *(r[a] for a in axes)): r for r in table.to_dict("records")}
    if len(groups) <= MAX_COLUMN_GROUPS:
        rows = []
        for mode in modes:
            row: dict[str, object] = {"failure mode": f"`{cell(str(mode))}`"}
            for g in groups:
                r = index[(str(mode), *(g[a] for a in axes))]
                row[cell(group_label(g, axes))] = (f"{int(r['runs_with'])}/{int(r['scored_runs'])} = {_pct(r['share'])} "
                                                   f"[{100 * r['share_low']:.1f}, {100 * r['share_high']:.1f}]")  # fmt: skip
            row["spread (points)"] = f"{100 * float(table[table['mode'] == mode]['spread'].iloc[0]):.1f}"
            rows.append(row)
        return lines + [_md(rows), ""]
    lines += [f"{len(groups)} groups: one row each, one column per mode (`k/n` runs with the mode).", ""]
    rows = []
    for g in groups:
        row = {a: cell(_value(a, g[a])) for a in axes}
        for mode in modes:
            r = index[(str(mode), *(g[a] for a in axes))]
            row[f"`{cell(str(mode))}`"] = f"{int(r['runs_with'])}/{int(r['scored_runs'])}"
        rows.append(row)
    return lines + [_md(rows), ""]


def latency_lines(frames: LedgerFrames, by: Sequence[str], cell: Cell, grouped: pd.DataFrame | None = None) -> list[str]:
    """Wall latency beside time to first token and decode rate, per ``--by`` group, and the load caveat
    (``grouped``: :func:`summary_table` by :func:`shown_axes`, when already computed)."""
    axes = shown_axes(frames, by)
    table = summary_table(frames, axes) if grouped is None else grouped
    table = table[table["scored"] > 0]
    lines = ["## Latency", "", LOAD_NOTE + " Model start-up is kept apart: each model's warm-up request is in the Models "
             "section above and in no figure here.", ""]  # fmt: skip
    if table.empty:
        return lines
    has_ttft, has_tps = table["ttft_ms"].notna().any(), table["decode_tps"].notna().any()
    if has_ttft:
        lines += [TTFT_NOTE, ""]
    if not (has_ttft or has_tps):
        lines += ["The servers reported no time to first token or decode rate for these runs (streamed runs measure both).", ""]
    rows = []
    for r in table.to_dict("records"):
        row: dict[str, object] = {a: cell(_value(a, r[a])) for a in axes}
        row["scored runs"] = int(r["scored"])
        row["wall p50 / p95 per turn (ms)"] = (
            f"{r['latency_p50_ms']:.0f} / {r['latency_p95_ms']:.0f}" if r["latency_p50_ms"] == r["latency_p50_ms"] else "–"
        )
        if has_ttft:
            row["time to first token, median (ms)"] = "–" if math.isnan(r["ttft_ms"]) else f"{r['ttft_ms']:.0f}"
        if has_tps:
            row["decode, median (tokens/s)"] = "–" if math.isnan(r["decode_tps"]) else f"{r['decode_tps']:.1f}"
        rows.append(row)
    return lines + [_md(rows), ""]
