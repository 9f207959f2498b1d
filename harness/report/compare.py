"""Paired comparison of two models (``harness compare``) over the runs they share.

Two runs pair when they agree on scenario, temperature, tool mode, parser, think, stream, repetition and seed
(:data:`PAIR_KEY_TEXT`): the same task under the same conditions, so per-pair differences isolate the model.
Only scored runs pair (``infra_error``, ``interrupted`` and unfinished runs say nothing about
the model); when a model has several scored runs for one key (a re-run), the newest counts.

Statistics (see :mod:`harness.stats` for formulas and sources): the difference in pass rate
with Tango's asymptotic score interval for paired proportions (Tango 1998; it inverts the score test, so at
any n it excludes 0 exactly when McNemar's asymptotic test rejects, and it never has zero width), the
exact McNemar mid-p test on the discordant pairs (Fagerland, Lydersen, Laake 2013), and the
same per failure mode ("the run showed the mode at least once") with Holm's step-down
adjustment across modes (Holm 1979).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pandas as pd
from tabulate import tabulate

from harness.errors import UsageError
from harness.report.frames import LedgerFrames
from harness.report.markdown import cell_text
from harness.stats import holm, mcnemar_midp, tango_paired_diff
from harness.vocab import printable

__all__ = ["PAIR_KEYS", "PAIR_KEY_TEXT", "Comparison", "ModeComparison", "compare_models", "format_comparison", "resolve_model"]

PAIR_KEYS = ("scenario", "temperature", "tool_mode", "parser", "think", "stream", "repetition", "seed")
"""Run attributes that must match for two runs of different models to form a pair."""
PAIR_KEY_TEXT = "scenario, temperature, tool mode, parser, think, stream, repetition and seed"
""":data:`PAIR_KEYS` in words, as the "Pairs:" line, the README and docs/reports.md say it."""


@dataclass(frozen=True)
class ModeComparison:
    """One failure mode compared over the pairs ("the run showed it at least once").

    Attributes:
        mode: failure-mode name.
        a_runs: paired runs of model A showing it (count).
        b_runs: paired runs of model B showing it (count).
        only_a: discordant pairs where only A's run showed it.
        only_b: discordant pairs where only B's run showed it.
        diff: A's share minus B's share, in [-1, 1].
        low: lower bound of the 95% Tango score interval of ``diff``.
        high: upper bound.
        midp: exact McNemar mid-p on ``(only_a, only_b)``, in [0, 1].
        holm_p: ``midp`` after Holm's adjustment across all modes compared, in [0, 1].
    """

    mode: str
    a_runs: int
    b_runs: int
    only_a: int
    only_b: int
    diff: float
    low: float
    high: float
    midp: float
    holm_p: float


@dataclass(frozen=True)
class Comparison:
    """Result of :func:`compare_models`.

    Attributes:
        model_a: first model spec as stored.
        model_b: second model spec as stored.
        scenario: the scenario compared, or None for all shared scenarios.
        scenarios: scenario names among the pairs, sorted.
        pairs: number of pairs n.
        both_pass: pairs where both passed (a).
        only_a_pass: pairs where only A passed (b).
        only_b_pass: pairs where only B passed (c).
        neither_pass: pairs where neither passed (d).
        diff: A's pass rate minus B's, in [-1, 1]; NaN without pairs.
        low: 95% Tango score lower bound of ``diff``.
        high: 95% Tango score upper bound of ``diff``.
        midp: exact McNemar mid-p on ``(only_a_pass, only_b_pass)``.
        modes: per failure mode, sorted by ``midp`` then name.
        unpaired_a: scored runs of A without a partner.
        unpaired_b: scored runs of B without a partner.
    """

    model_a: str
    model_b: str
    scenario: str | None
    scenarios: list[str]
    pairs: int
    both_pass: int
    only_a_pass: int
    only_b_pass: int
    neither_pass: int
    diff: float
    low: float
    high: float
    midp: float
    modes: list[ModeComparison] = field(default_factory=list)
    unpaired_a: int = 0
    unpaired_b: int = 0

    @property
    def a_failures(self) -> int:
        """Paired runs of A that did not pass."""
        return self.only_b_pass + self.neither_pass

    @property
    def b_failures(self) -> int:
        """Paired runs of B that did not pass."""
        return self.only_a_pass + self.neither_pass

    def sentence(self) -> str:
        """The one plain sentence that heads the comparison."""
        a, b, n = self.model_a, self.model_b, self.pairs
        if n == 0:
            return (f"{a} and {b} share no scored runs with the same scenario, temperature, tool mode, parser, repetition "
                    "and seed, so there is nothing to compare.")  # fmt: skip
        where = "this scenario" if len(self.scenarios) == 1 else f"these {len(self.scenarios)} scenarios"
        p = _p(self.midp)
        fa, fb = self.a_failures, self.b_failures
        if fa == fb:
            return f"{a} and {b} fail {where} equally often ({fa}/{n} runs each; McNemar p {p})."
        (worse, fw), (better, fbt) = sorted([(a, fa), (b, fb)], key=lambda t: -t[1])
        if fbt == 0:
            return f"{worse} fails {where} in {fw}/{n} paired runs and {better} in none (McNemar p {p})."
        return f"{worse} fails {where} {fw / fbt:.1f} times as often as {better} ({fw}/{n} vs {fbt}/{n} runs; McNemar p {p})."


def _p(p: float) -> str:
    return "< 0.0001" if p < 0.0001 else f"= {p:.4f}"


def resolve_model(frames: LedgerFrames, name: str) -> str:
    """Find a model spec in the ledger by exact spec or by the name without ``backend:`` and ``@URL``.

    Raises:
        UsageError: no model or more than one model matches.
    """
    models = frames.models
    if name in models:
        return name
    matches = [m for m in models if m.split(":", 1)[-1].split("@", 1)[0] == name]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(models) or "none"
    if not matches:
        raise UsageError(f"no runs of model '{name}' in the ledger; models: {known}.")
    raise UsageError(f"'{name}' matches several models ({', '.join(matches)}); give the full spec.")


def _latest_scored(runs: pd.DataFrame, model: str, scenario: str | None) -> pd.DataFrame:
    mine = runs[(runs["model"] == model) & runs["scored"]]
    if scenario is not None:
        mine = mine[mine["scenario"] == scenario]
    return mine.drop_duplicates(list(PAIR_KEYS), keep="last")


def compare_models(frames: LedgerFrames, model_a: str, model_b: str, *, scenario: str | None = None) -> Comparison:
    """Paired comparison of two models over the scored runs they share (see the module docstring).

    Args:
        frames: from :func:`harness.report.load_frames`.
        model_a: spec (or name without backend prefix) of the first model.
        model_b: the second model.
        scenario: restrict to one scenario name.

    Returns:
        :class:`Comparison`; ``pairs == 0`` when the models share no scored run.

    Raises:
        UsageError: an unknown or ambiguous model, the same model twice, or an unknown scenario.
    """
    a, b = resolve_model(frames, model_a), resolve_model(frames, model_b)
    if a == b:
        raise UsageError(f"compare needs two different models; both name {a}.")
    if scenario is not None and scenario not in set(frames.runs["scenario"]):
        raise UsageError(
            f"no runs of scenario '{scenario}' in the ledger; scenarios: {', '.join(sorted(set(frames.runs['scenario'])))}."
        )
    runs_a, runs_b = _latest_scored(frames.runs, a, scenario), _latest_scored(frames.runs, b, scenario)
    pairs = runs_a.merge(runs_b, on=list(PAIR_KEYS), suffixes=("_a", "_b"), sort=True)
    n = len(pairs)
    pa, pb = pairs["passed_a"].to_numpy(bool), pairs["passed_b"].to_numpy(bool)
    counts = (int((pa & pb).sum()), int((pa & ~pb).sum()), int((~pa & pb).sum()), int((~pa & ~pb).sum()))
    diff, low, high = tango_paired_diff(*counts) if n else (float("nan"),) * 3
    modes = _mode_comparisons(frames, pairs) if n else []
    return Comparison(
        model_a=a, model_b=b, scenario=scenario, scenarios=sorted(set(pairs["scenario"])), pairs=n,
        both_pass=counts[0], only_a_pass=counts[1], only_b_pass=counts[2], neither_pass=counts[3],
        diff=diff, low=low, high=high, midp=mcnemar_midp(counts[1], counts[2]), modes=modes,
        unpaired_a=len(runs_a) - n, unpaired_b=len(runs_b) - n,
    )  # fmt: skip


def _mode_comparisons(frames: LedgerFrames, pairs: pd.DataFrame) -> list[ModeComparison]:
    rm = frames.run_modes
    shows = {str(mode): set(group["run_id"]) for mode, group in rm.groupby("mode", sort=True)}
    ids_a, ids_b = pairs["run_id_a"].tolist(), pairs["run_id_b"].tolist()
    raw: list[tuple[str, int, int, int, int, float, float, float, float]] = []
    for mode, runs_with in shows.items():
        ha = [r in runs_with for r in ids_a]
        hb = [r in runs_with for r in ids_b]
        if not any(ha) and not any(hb):
            continue
        both = sum(x and y for x, y in zip(ha, hb, strict=True))
        only_a = sum(x and not y for x, y in zip(ha, hb, strict=True))
        only_b = sum(y and not x for x, y in zip(ha, hb, strict=True))
        neither = len(ha) - both - only_a - only_b
        diff, low, high = tango_paired_diff(both, only_a, only_b, neither)
        raw.append((mode, sum(ha), sum(hb), only_a, only_b, diff, low, high, mcnemar_midp(only_a, only_b)))
    adjusted = holm([r[-1] for r in raw])
    out = [ModeComparison(*r, holm_p=h) for r, h in zip(raw, adjusted, strict=True)]
    return sorted(out, key=lambda m: (m.midp, m.mode))


def format_comparison(c: Comparison) -> str:
    """Render a comparison as markdown: the sentence, the pass table, then per-mode rows.

    Model specs and mode names are escaped (pipes, newlines, backticks; control characters as
    :func:`harness.vocab.printable` does), so no stored string can break the table or reach the terminal raw.
    """
    c = dataclasses.replace(c, model_a=printable(cell_text(c.model_a)), model_b=printable(cell_text(c.model_b)),
                            modes=[dataclasses.replace(m, mode=printable(cell_text(m.mode))) for m in c.modes])  # fmt: skip
    lines = [c.sentence(), ""]
    if c.pairs == 0:
        return "\n".join(lines)
    n = c.pairs
    lines.append(f"Pairs: {n} (same {PAIR_KEY_TEXT}; scored runs only; "
                 f"unpaired scored runs: {c.unpaired_a} of {c.model_a}, {c.unpaired_b} of {c.model_b}).")  # fmt: skip
    lines.append("")
    rows = [
        ["pass rate", f"{c.both_pass + c.only_a_pass}/{n} = {100 * (c.both_pass + c.only_a_pass) / n:.1f}%",
         f"{c.both_pass + c.only_b_pass}/{n} = {100 * (c.both_pass + c.only_b_pass) / n:.1f}%",
         f"{100 * c.diff:+.1f} [{100 * c.low:+.1f}, {100 * c.high:+.1f}]", f"{c.only_a_pass} / {c.only_b_pass}", f"{c.midp:.4f}", ""],
    ]  # fmt: skip
    for m in c.modes:
        rows.append([f"`{m.mode}`", f"{m.a_runs}/{n} = {100 * m.a_runs / n:.1f}%", f"{m.b_runs}/{n} = {100 * m.b_runs / n:.1f}%",
                     f"{100 * m.diff:+.1f} [{100 * m.low:+.1f}, {100 * m.high:+.1f}]", f"{m.only_a} / {m.only_b}",
                     f"{m.midp:.4f}", f"{m.holm_p:.4f}"])  # fmt: skip
    headers = ["measure (runs with ≥1 for modes)", c.model_a, c.model_b, "A − B, points [95% Tango score]",
               "discordant (only A / only B)", "McNemar mid-p", "Holm-adjusted p"]  # fmt: skip
    lines.append(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
    lines.append("")
    lines.append("Interval: Tango's score interval for paired proportions (Tango 1998), the inverse of McNemar's asymptotic "
                 "test. Test: exact McNemar mid-p (Fagerland, Lydersen, Laake 2013). Failure-mode p-values are Holm-adjusted "
                 "across the modes listed (Holm 1979).")  # fmt: skip
    lines.append("The interval and the mid-p test are different methods: near p = 0.05 one may exclude 0 while the other "
                 "does not; with few pairs trust neither alone.")  # fmt: skip
    return "\n".join(lines)
