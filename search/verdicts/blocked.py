"""The confirmation's test: several arms against the default, measured in complete rounds (blocks).

A confirmation starts every arm once a round (search/confirm/confirm.py), so its rounds are the blocks of
a randomized complete block design: the log value of arm j in round r is mu_j + b_r + e_jr. The round's
shift b_r (the host's drift, shared by every arm of a round) cancels in each arm's within-round
difference from the default. Each arm is judged by the paired test on those differences
(search/verdicts/sequential.py: their own spread, rounds - 1 degrees of freedom, the paired Pocock
threshold), on the rounds in which every arm was measured.

Why not pool the start noise over the arms (as this test once did: the residuals of the arms x rounds table,
(K - 1)(n - 1) degrees of freedom, each arm's spread the larger of its own and the pooled one). Pooling
is exact only when every arm's starts are equally noisy, and nothing in a confirmation shows that they
are: with three arms, the arms' residual covariance has exactly as many free entries as there are
arm variances, so the heteroscedastic estimate of var(arm j - default) (per-arm variances, the
Satterthwaite route) is the arm's own differences' variance, at its own rounds - 1 df: the paired test.
The pooled spread estimates 2 x the arms' mean variance, below var(default) + var(arm j) when the
default or the arm is the noisy one, and at 4-6 rounds no check can tell a 1.5x noisier arm from an
equal one. Simulated (tests/search/test_blocked.py; bench/experiments/blocked_test/unequal_noise.py),
3 arms, looks at 3..6 rounds, alpha 0.02, no true difference: the pooled rule called 4.4% different at
start noise (2%, 5%, 2%) and 5.9% at (1.5%, 6%, 1.5%); taking the pooled spread's df only when it is
the larger one, 3.7% and 4.4%; 2.8% even at (2%, 3%, 2%); a threshold made safe for noise ratios up
to 4x cost more power than it bought. The paired test holds alpha at every noise ratio (2.0%) and
costs power at equal noise (a -5% change at 3% noise within 6 rounds: 27% instead of 42%): that power
is to come back from noise measured before (a noise store), not from an assumption of equal noise.

The pooled spread is still printed in the note: an arm whose own spread is far from it is noisier or
quieter than the rest, which is worth knowing. With two arms it is the paired test outright.
"""

from __future__ import annotations

import dataclasses
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
from search.verdicts.sequential import compare_paired, start_values


def complete_rounds(arms_runs: Sequence[Sequence[Sequence[float]]]) -> list[int]:
    """The rounds in which every arm has a value (an arm that failed to start leaves its round out)."""
    rounds = min(len(runs) for runs in arms_runs)
    return [r for r in range(rounds) if all(start_values([runs[r]]) for runs in arms_runs)]


def round_matrix(arms_runs: Sequence[Sequence[Sequence[float]]]) -> np.ndarray:
    """K x n start values (log scale) over the rounds in which every arm was measured."""
    kept = complete_rounds(arms_runs)
    return np.array([[start_values([runs[r]])[0] for r in kept] for runs in arms_runs],
                    dtype=float).reshape(len(arms_runs), len(kept))


def pooled_diff_sd(x: np.ndarray) -> tuple[float, int]:
    """The spread of a within-round difference of two arms were every arm equally noisy: sqrt(2) x the
    residual sd of the arms x rounds table with no interaction, and its degrees of freedom (K - 1)(n - 1).
    Shown beside an arm's own spread, not used for the verdict (module docstring)."""
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
    round r of each arm in the same block: the paired test on the rounds where every arm was measured,
    the spread at least `floor_sd`; the arms' pooled spread named in the note."""
    if len(arms_runs) <= 2:
        return compare_paired(metric, arms_runs[0], arms_runs[arm], direction=direction, min_effect=min_effect,
                              alpha=alpha, power=power, looks=looks, gated=gated, floor_sd=floor_sd)
    kept = complete_rounds(arms_runs)
    verdict = compare_paired(metric, [arms_runs[0][r] for r in kept], [arms_runs[arm][r] for r in kept],
                             direction=direction, min_effect=min_effect, alpha=alpha, power=power, looks=looks,
                             gated=gated, floor_sd=floor_sd)
    if len(kept) < 2:
        return verdict
    pooled, df = pooled_diff_sd(round_matrix(arms_runs))
    own = verdict.cv
    return dataclasses.replace(verdict, note=(
        f"{len(arms_runs)} arms, each by its own differences from the default (spread {_pct(own)}, "
        f"{len(kept) - 1} df); pooled over the arms {_pct(pooled)} ({df} df, not used: it holds only "
        f"where every arm is as noisy as the others); {verdict.note}"))


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%" if math.isfinite(v) else "n/a"
