"""The confirmation's test: several arms against the default, measured in complete rounds (blocks).

A confirmation starts every arm once a round (search/confirm/confirm.py), so its rounds are the blocks of
a randomized complete block design: the log value of arm j in round r is mu_j + b_r + e_jr. The
round's shift b_r (the host's drift, shared by every arm of a round) cancels in each arm's
within-round difference from the default, as in the paired test (search/verdicts/sequential.py); but the
start noise e_jr is estimated from all K arms' residuals, (K - 1)(n - 1) degrees of freedom, where
one arm's differences alone have n - 1. At 4 rounds of 3 arms that is 6 instead of 3: the t
quantile of a 98.9% interval falls from 5.6 to 3.6 and the interval narrows about 1.5x at the same
noise (docs/search.md, "The confirmation's test").

Pooling assumes every arm's starts are as noisy as the others'. An arm noisier than the rest (a
speculative config whose acceptance varies) would get too narrow an interval: each arm's spread
is the larger of its own within-round differences' and the pooled one, so no arm is judged quieter
than it measured. Under equal noise that is conservative; the sequential threshold (a Pocock
boundary on p values, as the paired test's) is simulated for exactly this statistic, so the chance
that any look crosses it under no change is alpha. The interval's label, 1 - p*, is then a lower
bound on its coverage at a look (simulated: a single look labelled 97.4% covers 98.0%; a plan
of looks at 3 and 4 rounds, labelled 98.5%, covers 98.8% at each). With two arms it is the paired test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from search.verdicts.gate import (
    DEFAULT_ALPHA,
    DEFAULT_MIN_EFFECT,
    DEFAULT_POWER,
    Direction,
    MetricVerdict,
)
from search.verdicts.sequential import (
    RoundSpread,
    compare_paired,
    start_values,
    verdict_on_differences,
)


def round_matrix(arms_runs: Sequence[Sequence[Sequence[float]]]) -> np.ndarray:
    """K x n start values (log scale) over the rounds in which every arm was measured."""
    rounds = min(len(runs) for runs in arms_runs)
    kept: list[list[float]] = []
    for r in range(rounds):
        values = [start_values([runs[r]]) for runs in arms_runs]
        if all(values):
            kept.append([v[0] for v in values])
    return np.array(kept, dtype=float).T.reshape(len(arms_runs), len(kept))


def pooled_diff_sd(x: np.ndarray) -> tuple[float, int]:
    """The spread of a within-round difference of two arms, sqrt(2) x the residual sd of the
    arms x rounds table with no interaction, and its degrees of freedom (K - 1)(n - 1)."""
    k, n = x.shape
    df = (k - 1) * (n - 1)
    if df <= 0:
        return math.nan, 0
    resid = x - x.mean(axis=1, keepdims=True) - x.mean(axis=0, keepdims=True) + x.mean()
    return math.sqrt(2 * float((resid ** 2).sum()) / df), df


def compare_blocked(metric: str, arms_runs: Sequence[Sequence[Sequence[float]]], arm: int,
                    direction: Direction | None = None, min_effect: float = DEFAULT_MIN_EFFECT,
                    alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER,
                    looks: Sequence[int] | None = None, gated: bool = True, floor_sd: float = 0.0) -> MetricVerdict:
    """The verdict for arm `arm` against arm 0 (the default) from every arm's runs grouped by start,
    round r of each arm in the same block; the spread at least `floor_sd`. Two arms: `compare_paired`."""
    if len(arms_runs) <= 2:
        return compare_paired(metric, arms_runs[0], arms_runs[arm], direction=direction, min_effect=min_effect,
                              alpha=alpha, power=power, looks=looks, gated=gated, floor_sd=floor_sd)
    x = round_matrix(arms_runs)
    k, n = x.shape

    def spread(diffs: np.ndarray) -> RoundSpread:
        own, (pooled, df) = float(diffs.std(ddof=1)), pooled_diff_sd(x)
        which = "its own" if own >= pooled else "the arms' pooled"
        return RoundSpread(max(own, pooled), df, f"{n} rounds x {k} arms (blocks); spread of a round's difference "
                           f"{_pct(own)} for this arm, {_pct(pooled)} pooled over the arms ({df} df): {which} used")

    return verdict_on_differences(metric, list(x[0]), list(x[arm]), spread, k,
                                  "fewer than 2 rounds with every arm measured", direction, min_effect, alpha, power,
                                  looks, gated, floor_sd)


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%" if math.isfinite(v) else "n/a"
