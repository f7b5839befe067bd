"""The confirmation's test: several arms against the default, measured in complete rounds (blocks).

A confirmation starts every arm once a round (search/confirm.py), so its rounds are the blocks of
a randomized complete block design: the log value of arm j in round r is mu_j + b_r + e_jr. The
round's shift b_r (the host's drift, shared by every arm of a round) cancels in each arm's
within-round difference from the default, as in the paired test (search/sequential.py); but the
start noise e_jr is estimated from all K arms' residuals, (K - 1)(n - 1) degrees of freedom, where
one arm's differences alone have n - 1. At 4 rounds of 3 arms that is 6 instead of 3: the t
quantile of a 98.9% interval falls from 5.6 to 3.6 and the interval narrows about 1.5x at the same
noise (the two demos of 2026-11-29 re-analysed: docs/search.md, "The confirmation's test").

Pooling assumes every arm's starts are as noisy as the others'. An arm noisier than the rest (a
speculative config whose acceptance varies) would get too narrow an interval: each arm's spread
is the larger of its own within-round differences' and the pooled one, so no arm is judged quieter
than it measured. Under equal noise that is conservative; the sequential threshold (a Pocock
boundary on p values, as the paired test's) is simulated for exactly this statistic, so the chance
that any look crosses it under no change is alpha. The interval's label, 1 - p*, is then a lower
bound on its coverage at a look (simulated: a single look labelled 97.4% covers 98.0%; the demo's plan
of looks at 3 and 4 rounds, labelled 98.5%, covers 98.8% at each). With two arms it is the paired test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from search.gate import (
    DEFAULT_ALPHA,
    DEFAULT_MIN_EFFECT,
    DEFAULT_POWER,
    Direction,
    MetricVerdict,
    decide,
    metric_direction,
)
from search.sequential import (
    MAX_PLANNED_ROUNDS,
    MIN_STARTS,
    _plan_key,
    _stored_boundaries,
    compare_paired,
    paired_p_threshold,
    rounds_needed,
    start_values,
)

BLOCKED_SIMS = 200_000
CHUNK = 25_000


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


def p_values(x: np.ndarray, looks: tuple[int, ...]) -> np.ndarray:
    """sims x len(looks) p values of the blocked statistic for arm 1 against arm 0 at each look, from
    x: sims x arms x rounds start values (log scale)."""
    from scipy import special  # lazily: scipy costs every CLI start ~0.25 s
    arms = x.shape[1]
    out = np.ones((x.shape[0], len(looks)))
    for i, n in enumerate(looks):
        y = x[:, :, :n]
        resid = y - y.mean(axis=2, keepdims=True) - y.mean(axis=1, keepdims=True) + y.mean(axis=(1, 2), keepdims=True)
        df = (arms - 1) * (n - 1)
        pooled = np.sqrt(2 * (resid ** 2).sum(axis=(1, 2)) / df)
        d = y[:, 1] - y[:, 0]
        spread = np.maximum(d.std(axis=1, ddof=1), pooled)
        out[:, i] = 2 * special.stdtr(df, -np.abs(d.mean(axis=1) / (spread / math.sqrt(n))))
    return out


def _null_p_values(looks: tuple[int, ...], arms: int, sims: int = BLOCKED_SIMS, seed: int = 13) -> np.ndarray:
    """`p_values` of simulated null confirmations (the arms are exchangeable under no change, so arm 1
    against arm 0 stands for every arm). Every plan draws the same MAX_PLANNED_ROUNDS rounds, so a
    plan's threshold is the same whether simulated alone or within the stored table."""
    # In chunks (the same draws as one: the generator fills them in order): one array of all of them
    # took 720 MB at 4 arms, too much for a CLI on a small box.
    rng = np.random.default_rng(seed)
    rounds = max(MAX_PLANNED_ROUNDS, looks[-1])
    return np.concatenate([p_values(rng.standard_normal((min(CHUNK, sims - i), arms, rounds)), looks)
                           for i in range(0, sims, CHUNK)])


def _simulate_blocked(looks: tuple[int, ...], alpha: float, arms: int) -> float:
    """Pocock threshold: the alpha quantile of the smallest p value over the plan's looks."""
    return float(np.quantile(_null_p_values(looks, arms).min(axis=1), alpha))


def blocked_table(alphas: Sequence[float], arms_counts: Sequence[int], firsts: Sequence[int]) -> dict[str, float]:
    """Thresholds of the plans "looks at first..cap rounds" (cap up to MAX_PLANNED_ROUNDS) and of single
    looks, for the search/data/paired_boundaries.json table: one simulation per (arms, first). A
    single look's threshold is above alpha: the larger-spread rule is conservative under equal noise."""
    table: dict[str, float] = {}
    for arms in arms_counts:
        singles = tuple(range(2, MAX_PLANNED_ROUNDS + 1))  # one look (a verdict with no plan)
        once = _null_p_values(singles, arms)
        table |= {blocked_key((n,), alpha, arms): float(np.quantile(once[:, i], alpha))
                  for i, n in enumerate(singles) for alpha in alphas}
        for first in firsts:
            looks = tuple(range(first, MAX_PLANNED_ROUNDS + 1))
            running = np.minimum.accumulate(_null_p_values(looks, arms), axis=1)
            for i in range(1, len(looks)):
                for alpha in alphas:
                    table[blocked_key(looks[:i + 1], alpha, arms)] = float(np.quantile(running[:, i], alpha))
    return table


def blocked_key(looks: tuple[int, ...], alpha: float, arms: int) -> str:
    return f"{_plan_key(looks, alpha)}|arms={arms}"


@lru_cache(maxsize=256)
def blocked_p_threshold(looks: tuple[int, ...], alpha: float = DEFAULT_ALPHA, arms: int = 2) -> float:
    """Nominal two-sided p threshold of the blocked statistic with `arms` arms looked at after these
    round counts, overall false-alarm probability alpha under no change: the stored table, else
    simulated (seeded). Two arms: the paired test's threshold."""
    looks = tuple(sorted(set(n for n in looks if n >= 2)))
    if arms <= 2:
        return paired_p_threshold(looks, alpha)
    if not looks:
        return alpha
    stored = _stored_boundaries().get(blocked_key(looks, alpha, arms))
    return stored if stored is not None else _simulate_blocked(looks, alpha, arms)


def compare_blocked(metric: str, arms_runs: Sequence[Sequence[Sequence[float]]], arm: int,
                    direction: Direction | None = None, min_effect: float = DEFAULT_MIN_EFFECT,
                    alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER,
                    looks: Sequence[int] | None = None, gated: bool = True) -> MetricVerdict:
    """The verdict for arm `arm` against arm 0 (the default) from every arm's runs grouped by start,
    round r of each arm in the same block. Two arms: `compare_paired`."""
    if len(arms_runs) <= 2:
        return compare_paired(metric, arms_runs[0], arms_runs[arm], direction=direction, min_effect=min_effect,
                              alpha=alpha, power=power, looks=looks, gated=gated)
    from scipy import special  # lazily: scipy costs every CLI start ~0.25 s
    direction = direction or metric_direction(metric)
    x = round_matrix(arms_runs)
    k, n = x.shape
    la, lb = x[0], x[arm]
    common: dict[str, Any] = dict(metric=metric, direction=direction, min_effect=min_effect, gated=gated,
                                  samples_a=tuple(math.exp(v) for v in la), samples_b=tuple(math.exp(v) for v in lb),
                                  n_a=n, n_b=n, paired=True)
    med_a = math.exp(float(la.mean())) if n else math.nan
    med_b = math.exp(float(lb.mean())) if n else math.nan
    if n < 2:
        return MetricVerdict(verdict="inconclusive", median_a=med_a, median_b=med_b, ratio=math.nan, ci_low=math.nan,
                             ci_high=math.nan, p_value=math.nan, cv=math.nan, repeats_needed=MIN_STARTS,
                             note="fewer than 2 rounds with every arm measured", **common)
    diffs = lb - la
    d, own = float(diffs.mean()), float(diffs.std(ddof=1))
    pooled, df = pooled_diff_sd(x)
    sd = max(own, pooled)
    se = sd / math.sqrt(n)
    plan = tuple(looks) if looks else (n,)
    p_star = blocked_p_threshold(tuple(sorted(set(plan))), alpha, k)
    t_crit = float(special.stdtrit(df, 1 - p_star / 2))
    p = float(2 * special.stdtr(df, -abs(d) / se)) if se > 0 else (1.0 if d == 0 else 0.0)
    half = t_crit * se
    ratio, low, high = math.exp(d), math.exp(d - half), math.exp(d + half)
    mde = math.expm1((t_crit + float(special.stdtrit(df, power))) * se)
    need = rounds_needed(sd, min_effect, alpha, power, first=plan[0], arms=k)
    verdict = decide(direction, ratio, low, high, p < p_star, min_effect)
    which = "its own" if own >= pooled else "the arms' pooled"
    note = (f"{n} rounds x {k} arms (blocks); spread of a round's difference {_pct(own)} for this arm, "
            f"{_pct(pooled)} pooled over the arms ({df} df): {which} used; threshold p < {p_star:.3g}"
            + (f" (looks at {plan[0]}..{plan[-1]} rounds)" if len(plan) > 1 else ""))
    if verdict == "inconclusive" and (need is None or need > n):
        note += (f"; about {need} rounds would settle a {100 * min_effect:.0f}% change at this noise" if need
                 else f"; more rounds than the longest plan would settle a {100 * min_effect:.0f}% change")
    return MetricVerdict(verdict=verdict, median_a=med_a, median_b=med_b, ratio=ratio, ci_low=low, ci_high=high,
                         p_value=p, cv=sd, repeats_needed=need, note=note, level=1 - p_star, mde=mde, **common)


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%" if math.isfinite(v) else "n/a"
