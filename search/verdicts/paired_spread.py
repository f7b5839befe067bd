"""The spread of a paired comparison and what narrows it: what a round shares between the sides (removed
by pairing), what each start adds, run to run, whether the runs' level moves within a start, and the lever
an unsettled verdict names (more runs per start, or more rounds)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from harness.measure.stats import LevelShift, level_shift_within_starts, variance_components
from search.verdicts.boundaries import MAX_PLANNED_ROUNDS

# Below this p value the runs' level is taken to move within starts (harness/measure/stats.py:
# level_shift_within_starts); strict, as it only changes the advice: 8-run starts of a small CPU server
# gave p from 2e-5 to 0.13, so a looser cut would call ordinary starts shifting.
SHIFT_P = 0.01
# The most measured runs a start takes (the space's measure.max_repeats default): advice never asks for more.
MAX_RUNS_PER_START = 20


def pool(x: float, y: float) -> float:
    vals = [v for v in (x, y) if math.isfinite(v)]
    return math.sqrt(sum(v * v for v in vals) / len(vals)) if vals else math.nan


def pct(x: float) -> str:
    return f"{100 * x:.1f}%" if math.isfinite(x) else "-"


def rounds_text(need: int | None) -> str:
    return f"about {need} rounds" if need is not None else f"more than {MAX_PLANNED_ROUNDS} rounds"


def _runs_per_start(runs_a: Sequence[Sequence[float]], runs_b: Sequence[Sequence[float]]) -> float:
    counts = [len(r) for r in (*runs_a, *runs_b) if r]
    return sum(counts) / len(counts) if counts else 0.0


@dataclass(frozen=True)
class PairedSpread:
    """The spread of a paired comparison on the log scale: what a round shares between the sides
    (removed by pairing), what each start adds (per start, the runs' share in it) and run to run."""

    shared: float
    per_start: float
    within: float
    runs: float  # runs per start
    shift: LevelShift | None = None  # whether the level moved within starts (4+ runs a start)

    @property
    def between(self) -> float:
        """What the starts add beyond their runs' spread: the part more runs per start cannot average."""
        if not (math.isfinite(self.per_start) and math.isfinite(self.within)) or self.runs <= 0:
            return math.nan
        return math.sqrt(max(0.0, self.per_start ** 2 - self.within ** 2 / self.runs))

    def describe(self) -> str:
        return (f"spread shared by a round {pct(self.shared)} (removed by pairing), per start "
                f"{pct(self.per_start)}, run to run {pct(self.within)}")

    def advice(self, rounds_at: Callable[[float], int | None] | None = None) -> str:
        """Which lever narrows the interval: more runs per start only while the runs' spread is most of a
        start's (a small model on a fast GPU, docs/measurement.md, is the other case: its starts differ).
        rounds_at(sd of a round's difference) -> the rounds that would settle the change asked about:
        given, the advice says what twice and four times the runs would need at this noise."""
        if not math.isfinite(self.between):
            return "more rounds narrow it"
        if self.within ** 2 / self.runs > self.between ** 2:
            if self.shift is not None and self.shift.p < SHIFT_P:
                return (f"the runs' level moved within starts (halves differ F = {self.shift.f:.1f}, p = "
                        f"{self.shift.p:.2g}): the host's speed changes over tens of seconds, so more runs per start "
                        "average less than their spread suggests; more rounds will narrow it")
            return ("most of a start's spread here is run to run: more runs per start (--repeats) or longer outputs "
                    "may narrow it, down to the starts' own spread, which this run noise hides"
                    + (self._with_more_runs(rounds_at) if rounds_at else ""))
        return (f"the starts themselves differ ({pct(self.between)} beyond their runs): more runs per start or longer "
                "outputs will not narrow it, more rounds will")

    def _with_more_runs(self, rounds_at: Callable[[float], int | None]) -> str:
        # A start's value is the mean of its runs: its spread is between^2 + within^2 / runs, twice that a
        # difference. `between` is estimated from few rounds, so the numbers are a guide ("about").
        runs = max(1, round(self.runs))
        options = [n for n in (2 * runs, 4 * runs) if n <= MAX_RUNS_PER_START]
        texts = [f"--repeats {n}: {rounds_text(rounds_at(math.sqrt(2 * (self.between ** 2 + self.within ** 2 / n))))}"
                 for n in options]
        return f" (at this noise, {'; '.join(texts)})" if texts else ""


def paired_spread(la: list[float], lb: list[float], runs_a: Sequence[Sequence[float]],
                  runs_b: Sequence[Sequence[float]]) -> PairedSpread:
    a, b = np.array(la), np.array(lb)
    var_diff = float(np.var(b - a, ddof=1)) if a.size > 1 else math.nan
    var_sum = float(np.var(b + a, ddof=1)) if a.size > 1 else math.nan
    shared = math.sqrt(max(0.0, (var_sum - var_diff) / 4)) if math.isfinite(var_sum) else math.nan
    per_start = math.sqrt(var_diff / 2) if math.isfinite(var_diff) else math.nan
    within = pool(variance_components(runs_a).sd_within, variance_components(runs_b).sd_within)
    shift = level_shift_within_starts([*runs_a, *runs_b])
    return PairedSpread(shared, per_start, within, _runs_per_start(runs_a, runs_b), shift)
