"""The gate's statistics over server starts, paired by round, with sequential stopping; error and
quality verdicts on rates.

Unit: a server start. Each start gives several measured runs; its value is the mean of its runs'
log values, so both noise sources are in it: within a start (run to run) and between starts (a new
process, its memory layout, its compiled kernels, the machine's state then).

Paired by round (`compare_paired`, the test of every verb that interleaves: ab, regress, confirm,
bisect, nightly). A round starts both sides back to back, in alternating order. On a shared or
thermally varying machine both sides of a round move with the time of day (a round component of
~8.6% shared by both arms was measured on the CPU, lag-1 autocorrelation 0.5-0.7): an unpaired test
counts that shared drift as noise. The within-round difference d_r = log B_r - log A_r removes it;
the test is a one-sample t test on the d_r (df = rounds - 1), the exact test of a model in which a
round adds one shared shift to both sides and each start adds its own error (runs averaged in).
The note splits the spread into its parts: shared by the round (removed), per start, run to run.

Sequential: after each round the test is repeated. Looking many times inflates false alarms, so
every look uses one nominal p threshold p* chosen by simulation so that the chance of any look
crossing it under no change is alpha (a Pocock boundary on p values; the t statistic's null
distribution does not depend on the unknown variances). The thresholds of the usual plans are
simulated once and stored with the code (search/data/paired_boundaries.json, written by
`python -m search.verdicts.sequential`); other plans are simulated on first use. `boundary="obrien-fleming"`
(`--boundary`) replaces the one threshold by one per look that grows with the look (search/verdicts/boundaries.py):
early stops only on large changes, nearly a single look's power at the cap (its constants stored beside them).
The interval reported at a look is a repeated confidence interval: 1 - p* wide at each look, so the chance that
every look's interval covers the true ratio is 1 - alpha (`level`), and the one at whichever look stops the run
covers with at least that (at a look fixed in advance it would be 1 - p*: `look_level`). A change found at a
look also carries its size corrected for the stop (`ratio_adjusted`: `median_unbiased_log_ratio`). A run stops as soon
as every gated metric is settled (regressed, improved or unchanged) or at the cap. Every answer carries the
smallest change it could have seen (`mde`): an "unchanged" or "inconclusive" is only as strong as that.

`compare_starts` (unpaired, two-sample t over starts) remains for samples that were not measured
in the same rounds, e.g. a stored baseline against today's measurement.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from harness.measure.stats import clopper_pearson, variance_components
from search.verdicts.boundaries import (
    BOUNDARIES,
    MAX_PLANNED_ROUNDS,
    MIN_STARTS,
    count_look_level,
    look_p_threshold,
    looks_text,
    sequential_p_threshold,
    write_boundaries,
)
from search.verdicts.gate import (
    DEFAULT_ALPHA,
    DEFAULT_MIN_EFFECT,
    DEFAULT_POWER,
    Direction,
    MetricVerdict,
    Verdict,
    decide,
    metric_direction,
)
from search.verdicts.noise_store import SpreadPrior, borrowed_threshold
from search.verdicts.paired_spread import paired_spread, pct, pool, rounds_text


def paired_logs(runs_a: Sequence[Sequence[float]], runs_b: Sequence[Sequence[float]]) -> list[tuple[float, float]]:
    """(log A, log B) start values of the rounds in which both sides were measured."""
    out = []
    for ra, rb in zip(runs_a, runs_b, strict=False):
        la, lb = start_values([ra]), start_values([rb])
        if la and lb:
            out.append((la[0], lb[0]))
    return out


def compare_paired(metric: str, runs_a: Sequence[Sequence[float]], runs_b: Sequence[Sequence[float]],
                   direction: Direction | None = None, min_effect: float = DEFAULT_MIN_EFFECT,
                   alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER,
                   looks: Sequence[int] | None = None, gated: bool = True, floor_sd: float = 0.0,
                   boundary: str = "pocock", prior: SpreadPrior | None = None, sides: int = 2) -> MetricVerdict:
    """The verdict for one metric from runs grouped by start, round r of A paired with round r of B.

    ratio: exp(mean within-round log difference); interval 1 - p* wide, a repeated 1 - alpha one; mde: the
    smallest change this many rounds detect with `power` at the measured spread of differences.
    floor_sd: the least spread a difference can have (coarse values: `quantisation_sd`). prior: the spread this
    setup's earlier runs measured (search/verdicts/noise_store.py), used where it is at least this run's own, at its
    degrees of freedom and the threshold simulated for that rule (Pocock plans only). sides: 1 where the question is
    one-sided, "is B worse?" (regress, nightly, bisect; `verdict_on_differences`), 2 both ways (ab, claims)."""
    pairs = paired_logs(runs_a, runs_b)
    la, lb = [a for a, _ in pairs], [b for _, b in pairs]

    def spread(diffs: np.ndarray) -> RoundSpread:
        parts = paired_spread(la, lb, runs_a, runs_b)
        own = float(diffs.std(ddof=1))
        note = f"{diffs.size} rounds paired x {parts.runs:.2g} runs; {parts.describe()}"

        def advice() -> str:
            return parts.advice(lambda sd: rounds_needed(sd, min_effect, alpha, power, boundary=boundary))

        if prior is not None and boundary == "pocock" and diffs.size >= 2:
            plan = tuple(looks) if looks else (diffs.size,)
            if prior.sd >= own:
                return RoundSpread(prior.sd, prior.df, f"{note}; spread {100 * prior.sd:.2f}% borrowed from this "
                                   f"setup's earlier runs ({prior.describe()}; this run's own {100 * own:.2f}% is "
                                   "below it)", advice, lambda level: borrowed_threshold(plan, level, prior))
            return RoundSpread(own, diffs.size - 1, f"{note}; this run's own spread, above the {100 * prior.sd:.2f}% "
                               "its setup's earlier runs measured, used alone", advice)
        return RoundSpread(own, diffs.size - 1, note, advice)

    return verdict_on_differences(metric, la, lb, spread, "fewer than 2 rounds with both sides measured",
                                  direction, min_effect, alpha, power, looks, gated, floor_sd, boundary, sides)


@dataclass(frozen=True)
class RoundSpread:
    """The spread of a round's log difference a verdict uses, its degrees of freedom, what it is made of
    (for the note) and the lever an inconclusive answer names (None for none; called only for an unsettled
    answer, since pricing more runs costs two more plans' thresholds)."""

    sd: float
    df: int
    note: str
    advice: Callable[[], str] | None = None
    # This look's two-sided threshold at a level, where the spread's rule has its own (a borrowed spread).
    threshold: Callable[[float], float] | None = None


def verdict_on_differences(metric: str, la: Sequence[float], lb: Sequence[float],
                           spread: Callable[[np.ndarray], RoundSpread], missing: str,
                           direction: Direction | None, min_effect: float, alpha: float, power: float,
                           looks: Sequence[int] | None, gated: bool, floor_sd: float = 0.0,
                           boundary: str = "pocock", sides: int = 2) -> MetricVerdict:
    """The verdict on the within-round differences lb - la (log start values, round by round) at the
    spread `spread` gives, with the paired test's sequential threshold.
    sides 2: "regressed" and "improved" are the two-sided test at alpha (each direction's false calls at most
    alpha / 2). sides 1, the question "is B worse?": "regressed" is the one-sided test at the whole alpha, whose
    threshold is the two-sided one at 2 alpha on one tail (a path of the sequential t statistic that crosses both
    ways within one plan is too rare to matter at these levels: tests/search/test_sequential.py checks the
    one-sided rate), its one-sided bounds are kept (`bound_low`, `bound_high`), and "improved" and "unchanged" keep
    the two-sided test and interval at alpha ("unchanged" is the equivalence test at alpha / 2 a side either way).
    The spread is never taken below `floor_sd`: values that move in coarse steps can repeat exactly
    round after round, and a zero spread would claim a point interval and a zero smallest detectable
    change that the values' resolution cannot support."""
    from scipy import special  # lazily: scipy costs every CLI start ~0.25 s

    direction = direction or metric_direction(metric)
    n = len(la)
    common: dict[str, Any] = dict(metric=metric, direction=direction, min_effect=min_effect, gated=gated,
                                  samples_a=tuple(math.exp(v) for v in la), samples_b=tuple(math.exp(v) for v in lb),
                                  n_a=n, n_b=n, paired=True)
    med_a = math.exp(float(np.mean(la))) if n else math.nan
    med_b = math.exp(float(np.mean(lb))) if n else math.nan
    if n < 2:
        return MetricVerdict(verdict="inconclusive", median_a=med_a, median_b=med_b, ratio=math.nan, ci_low=math.nan,
                             ci_high=math.nan, p_value=math.nan, cv=math.nan, repeats_needed=MIN_STARTS,
                             note=missing, **common)
    diffs = np.array(lb) - np.array(la)
    d, used = float(diffs.mean()), spread(diffs)
    if floor_sd > used.sd:
        used = RoundSpread(floor_sd, used.df, f"{used.note}; taken as {100 * floor_sd:.1f}%, the least the values' "
                                              f"resolution allows", used.advice)
    se = used.sd / math.sqrt(n)
    plan = tuple(looks) if looks else (n,)

    def threshold(level: float) -> float:
        return used.threshold(level) if used.threshold is not None else look_p_threshold(plan, n, level, boundary)

    p_star = threshold(alpha)
    t_crit = float(special.stdtrit(used.df, 1 - p_star / 2))
    p = float(2 * special.stdtr(used.df, -abs(d) / se)) if se > 0 else (1.0 if d == 0 else 0.0)
    half = t_crit * se
    ratio, low, high = math.exp(d), exp_or_inf(d - half), exp_or_inf(d + half)
    mde = exp_or_inf((t_crit + float(special.stdtrit(used.df, power))) * se) - 1
    need = rounds_needed(used.sd, min_effect, alpha, power, first=plan[0], boundary=boundary)
    verdict = decide(direction, ratio, low, high, p < p_star, min_effect)
    test_alpha, bound_low, bound_high = alpha, math.nan, math.nan
    if sides == 1:  # "is B worse?": the one-sided test at alpha, the two-sided threshold at 2 alpha on one tail
        test_alpha = 2 * alpha
        p_worse_star = threshold(test_alpha) / 2
        t_one = float(special.stdtrit(used.df, 1 - p_worse_star))
        bound_low, bound_high = exp_or_inf(d - t_one * se), exp_or_inf(d + t_one * se)
        sign = 1.0 if direction == "higher" else -1.0
        p = float(special.stdtr(used.df, sign * d / se)) if se > 0 else (0.5 if d == 0 else float(sign * d > 0))
        if p < p_worse_star and sign * (ratio - 1) <= -min_effect:  # the two-sided call implies it
            verdict = "regressed"
        mde = exp_or_inf((t_one + float(special.stdtrit(used.df, power))) * se) - 1
        need = rounds_needed(used.sd, min_effect, test_alpha, power, first=plan[0], boundary=boundary)
    note = (f"{used.note}; threshold p < {p_star:.3g}"
            + (f" (looks at {looks_text(plan)} rounds{boundary_text(boundary)}: the interval is a repeated "
               f"{100 * (1 - alpha):.3g}% one, which holds at whichever look stops the run; at a look fixed in "
               f"advance it would be {100 * (1 - p_star):.3g}%)" if len(plan) > 1 else ""))
    if sides == 1:
        note += (f"; one-sided (the question is whether B is worse): regressed at one-sided p < "
                 f"{threshold(test_alpha) / 2:.3g}, the whole alpha {alpha:g} on that side; improved and unchanged "
                 "on the two-sided interval")
    note += drift_note(diffs)
    adjusted = math.nan
    if verdict in ("regressed", "improved") and len(plan) > 1 and n in plan and se > 0 and used.threshold is None:
        level = test_alpha if verdict == "regressed" else alpha
        thresholds = [look_p_threshold(plan, k, level, boundary) for k in plan]
        adjusted = exp_or_inf(median_unbiased_log_ratio(d, used.sd, n, plan, thresholds))
        note += (f"; a sequential plan stops when the difference happens to look large, so the measured "
                 f"{100 * (ratio - 1):+.1f}% is biased away from no change: corrected for that, "
                 f"{100 * (adjusted - 1):+.1f}% (median-unbiased for this plan)")
    if verdict == "inconclusive" and (need is None or need > n):
        note += (f"; {rounds_text(need)} would settle a {100 * min_effect:.0f}% change at this noise"
                 + (f"; {used.advice()}" if used.advice else ""))
    return MetricVerdict(verdict=verdict, median_a=med_a, median_b=med_b, ratio=ratio, ci_low=low, ci_high=high,
                         p_value=p, cv=used.sd, repeats_needed=need, note=note, level=1 - alpha if len(plan) > 1
                         else 1 - p_star, mde=mde, look_level=1 - p_star, ratio_adjusted=adjusted, sides=sides,
                         bound_low=bound_low, bound_high=bound_high, **common)


ESTIMATE_SIMS = 20_000  # simulated plans behind a corrected estimate (its Monte Carlo error ~0.01 sd of a round)


@lru_cache(maxsize=8)
def _null_paths(rounds: int, sims: int = ESTIMATE_SIMS, seed: int = 17) -> tuple[np.ndarray, np.ndarray]:
    """(running mean, running sd) of `sims` standard normal rounds, one column a round count 1..rounds (sd from 2
    on): every t statistic of a plan under any true difference follows from them (the sd does not move with it)."""
    z = np.random.default_rng(seed).standard_normal((sims, rounds))
    counts = np.arange(1, rounds + 1)
    mean = np.cumsum(z, axis=1) / counts
    sq = np.cumsum(z * z, axis=1)
    var = np.where(counts > 1, (sq - counts * mean ** 2) / np.maximum(counts - 1, 1), np.nan)
    return mean, np.sqrt(np.maximum(var, 0.0))


def median_unbiased_log_ratio(d: float, sd: float, n: int, plan: Sequence[int], thresholds: Sequence[float]) -> float:
    """The log ratio corrected for the early stop: the median-unbiased estimate of a group sequential plan, the
    true difference under which half the runs of this plan end more extreme than this one (stagewise ordering:
    a crossing this way at an earlier look is more extreme, at this look a larger t). A sequential test stops
    when the difference happens to look large, so its raw estimate is biased away from zero the earlier it
    stops (simulated, a true -5% at 3% noise a start, looks at 3..10 rounds: the "regressed" calls read -5.8%
    in the median, this estimate -5.0%). Where the power is low, the selection every significant result has
    (a change found is one that measured large) can still lean it away from zero. `thresholds`: each look's
    p threshold; simulated with the measured spread in place of the true one (seeded: the same data always
    give the same estimate)."""
    from scipy import special  # lazily: scipy costs every CLI start ~0.25 s

    sign = 1.0 if d >= 0 else -1.0
    t_obs = abs(d) / (sd / math.sqrt(n))
    mean, spread = _null_paths(max(plan))
    crit = [float(special.stdtrit(k - 1, 1 - p / 2)) for k, p in zip(plan, thresholds, strict=True)]

    def share_more_extreme(theta: float) -> float:
        """The share of simulated runs at a true difference of theta sds (this direction) that end more extreme
        than this one: crossing this way at an earlier look, or still running here with a larger t."""
        alive = np.ones(mean.shape[0], dtype=bool)
        more = 0
        for k, c in zip(plan, crit, strict=True):
            t = (mean[:, k - 1] + theta) * math.sqrt(k) / spread[:, k - 1]
            if k == n:
                more += int((alive & (t >= t_obs)).sum())
                break
            more += int((alive & (t > c)).sum())
            alive &= np.abs(t) <= c
        return more / mean.shape[0]

    theta_obs = t_obs / math.sqrt(n)
    lo, hi = -theta_obs, theta_obs + 1.0
    for _ in range(40):  # the share grows with theta: bisect for one half
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if share_more_extreme(mid) > 0.5 else (mid, hi)
    return sign * (lo + hi) / 2 * sd


def exp_or_inf(x: float) -> float:
    """exp, infinite past a float's range: at 1 degree of freedom a strict look's t quantile is ~1e6, and an
    interval that wide says "no information", not an overflow error (a report cut after 2 rounds)."""
    return math.exp(x) if x < 709.0 else math.inf


def boundary_text(boundary: str) -> str:
    return ", O'Brien-Fleming boundary" if boundary != "pocock" else ""


# A trend in the rounds' differences is looked for from this many rounds on, and named below this p value
# (unadjusted: a caution, not a verdict; under no trend it appears in 5% of comparisons that long).
TREND_MIN_ROUNDS = 6
TREND_P = 0.05


def drift_note(diffs: np.ndarray) -> str:
    """A caution where the difference moved over the rounds (a linear trend in the round's log difference):
    the interval is then the average of a moving difference, and depends on how long the run was (over a
    13-round confirmation a winner's lead can fall from 1.16x to 1.11x, docs/search.md). The verdict stands."""
    if diffs.size < TREND_MIN_ROUNDS or float(np.ptp(diffs)) == 0.0:
        return ""
    from scipy import stats  # lazily: scipy costs every CLI start ~0.25 s

    fit = stats.linregress(np.arange(diffs.size), diffs)
    if not fit.pvalue < TREND_P:
        return ""
    return (f"; the difference moved over the rounds ({100 * math.expm1(fit.slope):+.2f}% a round, p = "
            f"{fit.pvalue:.2g}, unadjusted): the interval is their average, not a fixed difference")


def rounds_needed(sd_diff: float, min_effect: float = DEFAULT_MIN_EFFECT, alpha: float = DEFAULT_ALPHA,
                  power: float = DEFAULT_POWER, first: int = MIN_STARTS,
                  boundary: str = "pocock") -> int | None:
    """The fewest rounds N whose plan (looks at `first`..N rounds, its `boundary`'s threshold at the last look,
    alpha) detects a change of min_effect with `power` at this spread of within-round differences:
    the smallest N whose `mde` is at most min_effect (t quantiles at N - 1 degrees of freedom).
    None: not within MAX_PLANNED_ROUNDS. (A normal approximation at the current threshold promised
    "about 4 rounds" right after 4 rounds had missed a control: at 3 df and p* = 0.011 the
    t quantile is 2.2x the normal one, and a longer plan lowers p*.) A confirmation's arms are each judged
    this way against the default (search/verdicts/blocked.py), so the count holds for them too."""
    from scipy import special  # lazily: scipy costs every CLI start ~0.25 s

    if not math.isfinite(sd_diff) or min_effect <= 0:
        return None
    target = math.log1p(min_effect)
    first = max(first, MIN_STARTS)

    def detects(n: int, p_star: float) -> bool:
        df = n - 1
        return float((special.stdtrit(df, 1 - p_star / 2) + special.stdtrit(df, power)) * sd_diff
                     / math.sqrt(n)) <= target

    # No plan ending at N has a higher threshold than one look at N (alpha): a lower bound found without
    # simulating. Above it a bisection (N = MAX_PLANNED_ROUNDS + 1 stands for "none"): walking every count took
    # 9-10 s for one hint.
    low = next((n for n in range(first, MAX_PLANNED_ROUNDS + 1) if detects(n, alpha)), None)
    if low is None:
        return None
    lo, hi = low, MAX_PLANNED_ROUNDS + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if detects(mid, look_p_threshold(tuple(range(first, mid + 1)), mid, alpha, boundary)):
            hi = mid
        else:
            lo = mid + 1
    return hi if hi <= MAX_PLANNED_ROUNDS else None


def family_alpha(alpha: float, gated: int) -> float:
    """Each gated metric's share of a run's false-alarm budget (Bonferroni): the chance of any false
    call over all of them together stays at most alpha."""
    return alpha / max(1, gated)


def quantisation_sd(values: Sequence[float], relative_step: float, unit_step: float = 0.0) -> float:
    """The spread (log scale) a within-round difference has from rounding alone, for values known
    only to within a step above them: `relative_step` of the value, or `unit_step` units where that
    is coarser (a capacity search stops bisecting at 10% of the load or 1 stream apart). Each value
    is then uniform within its step on the log scale (sd log(1 + step) / sqrt(12)); a difference has
    two of them. The smallest positive value sets the step; 0 when no value is positive."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    if not positive:
        return 0.0
    step = max(relative_step, unit_step / min(positive))
    return math.sqrt(2.0) * math.log1p(step) / math.sqrt(12.0)


def start_values(runs: Sequence[Sequence[float]]) -> list[float]:
    """Each start's value on the log scale: the mean of its runs' logs (non-positive runs dropped)."""
    out = []
    for start in runs:
        logs = [math.log(v) for v in start if v is not None and v > 0 and math.isfinite(v)]
        if logs:
            out.append(sum(logs) / len(logs))
    return out


def compare_starts(metric: str, runs_a: Sequence[Sequence[float]], runs_b: Sequence[Sequence[float]],
                   direction: Direction | None = None, min_effect: float = DEFAULT_MIN_EFFECT,
                   alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER,
                   looks: Sequence[int] | None = None, gated: bool = True) -> MetricVerdict:
    """The verdict for one metric from runs grouped by server start (A baseline, B candidate).

    ratio: geometric mean of B's starts over A's; the interval and the test use the boundary of
    the look plan `looks` (starts per side at each look; None: this single look). n_a / n_b and
    samples_a / samples_b are starts (each start's geometric-mean value)."""
    from scipy import special  # lazily: scipy costs every CLI start ~0.25 s
    direction = direction or metric_direction(metric)
    la, lb = start_values(runs_a), start_values(runs_b)
    n_a, n_b = len(la), len(lb)
    common: dict[str, Any] = dict(metric=metric, direction=direction, min_effect=min_effect, gated=gated,
                                  samples_a=tuple(math.exp(v) for v in la), samples_b=tuple(math.exp(v) for v in lb),
                                  n_a=n_a, n_b=n_b)
    med_a = math.exp(float(np.mean(la))) if la else math.nan
    med_b = math.exp(float(np.mean(lb))) if lb else math.nan
    if min(n_a, n_b) < 2:
        return MetricVerdict(verdict="inconclusive", median_a=med_a, median_b=med_b, ratio=math.nan, ci_low=math.nan,
                             ci_high=math.nan, p_value=math.nan, cv=math.nan, repeats_needed=MIN_STARTS,
                             note="fewer than 2 server starts on a side", **common)
    df = n_a + n_b - 2
    ss = float(np.sum((np.array(la) - np.mean(la)) ** 2) + np.sum((np.array(lb) - np.mean(lb)) ** 2))
    sd = math.sqrt(ss / df)
    d = float(np.mean(lb) - np.mean(la))
    se = sd * math.sqrt(1 / n_a + 1 / n_b)
    plan = tuple(looks) if looks else (min(n_a, n_b),)
    p_star = sequential_p_threshold(plan, alpha)
    if se > 0:
        p = float(2 * special.stdtr(df, -abs(d) / se))  # scalar t functions: fast in loops
        half = float(special.stdtrit(df, 1 - p_star / 2)) * se
    else:
        p, half = (1.0 if d == 0 else 0.0), 0.0
    ratio, low, high = math.exp(d), exp_or_inf(d - half), exp_or_inf(d + half)
    need = starts_needed(sd, min_effect, p_star, power)
    verdict = decide(direction, ratio, low, high, p < p_star, min_effect)
    vc_a, vc_b = variance_components(runs_a), variance_components(runs_b)
    within = pool(vc_a.sd_within, vc_b.sd_within)
    between = pool(vc_a.sd_between, vc_b.sd_between)
    runs = (vc_a.runs + vc_b.runs) / max(1, n_a + n_b)
    note = (f"{n_a}/{n_b} starts x {runs:.1g} runs; start-to-start spread {100 * sd:.1f}% "
            f"(between starts {pct(between)}, run to run {pct(within)}); threshold p < {p_star:.3g}"
            + (f" (looks at {looks_text(plan)} starts)" if len(plan) > 1 else ""))
    if verdict == "inconclusive" and need is not None and need > min(n_a, n_b):
        note += f"; about {need} starts per side would settle a {100 * min_effect:.0f}% change at this noise"
    return MetricVerdict(verdict=verdict, median_a=med_a, median_b=med_b, ratio=ratio, ci_low=low, ci_high=high,
                         p_value=p, cv=sd, repeats_needed=need, note=note, **common)


def starts_needed(sd_start: float, min_effect: float = DEFAULT_MIN_EFFECT, p_threshold: float = DEFAULT_ALPHA,
                  power: float = DEFAULT_POWER) -> int | None:
    """Starts per side for `power` against a change of min_effect, at this start-to-start spread
    (normal approximation at the threshold; the t test needs a little more at small counts)."""
    from scipy import special  # lazily: scipy costs every CLI start ~0.25 s
    if not math.isfinite(sd_start):
        return None
    z = float(special.ndtri(1 - p_threshold / 2) + special.ndtri(power))
    return max(MIN_STARTS, math.ceil(2 * (z * sd_start / math.log1p(min_effect)) ** 2))


def settled(verdict: MetricVerdict) -> bool:
    return verdict.verdict != "inconclusive"


# ---- errors: a test on rates ---------------------------------------------------------------------

ERRORS_SUGGEST_P = 0.10  # B's excess errors at one-sided p below this (not significant): say so


def compare_errors(metric: str, errors_a: int, requests_a: int, errors_b: int, requests_b: int,
                   alpha: float = DEFAULT_ALPHA, gated: bool = True, sides: int = 2,
                   looks: tuple[int, ...] | None = None) -> MetricVerdict:
    """Failed requests judged as rates (one-sided Fisher exact tests: at alpha / 2 each way; where the question is
    one-sided, sides 1, "regressed" at the whole alpha and "improved" at alpha / 2). With the looks of a sequential
    plan, each of those levels is the per-look level that keeps any look's crossing at it (`count_look_level`):
    the counts are judged again at every look, and a level held at each look alone is exceeded by the run.

    regressed: B's rate is significantly higher; improved: significantly lower; inconclusive: B
    failed more often with p < 0.10 but not significantly (said, not passed silently); unchanged:
    otherwise (one stray error in a hundred requests is no evidence). Under A/A the share called
    inconclusive is at most ~10% and regressed at most its level (measured: docs/calibration.md).
    median_a / median_b are the error rates."""
    from scipy import stats as sps  # lazily: 0.6 s of every CLI start
    worse_run, better_run = (alpha if sides == 1 else alpha / 2), alpha / 2
    worse_level, better_level = worse_run, better_run
    if looks is not None and len(set(looks)) > 1:
        plan = tuple(looks)
        worse_level, better_level = count_look_level(plan, worse_run), count_look_level(plan, better_run)
    rate_a = errors_a / requests_a if requests_a else math.nan
    rate_b = errors_b / requests_b if requests_b else math.nan
    table = [[errors_b, requests_b - errors_b], [errors_a, requests_a - errors_a]]
    worse = float(sps.fisher_exact(table, alternative="greater").pvalue) if requests_a and requests_b else 1.0
    better = float(sps.fisher_exact(table, alternative="less").pvalue) if requests_a and requests_b else 1.0
    lo_b, hi_b = clopper_pearson(errors_b, requests_b)
    verdict: Verdict
    if worse < worse_level:
        verdict = "regressed"
    elif better < better_level:
        verdict = "improved"
    elif rate_b > rate_a and worse < ERRORS_SUGGEST_P:
        verdict = "inconclusive"
    else:
        verdict = "unchanged"
    note = (f"error rates A {errors_a}/{requests_a}, B {errors_b}/{requests_b} (B 95% CI {100 * lo_b:.1f}%.."
            f"{100 * hi_b:.1f}%); one-sided Fisher p {min(worse, better):.3g}, threshold "
            + (f"{worse_level:.3g} for an excess (the question is one-sided), {better_level:.3g} for fewer"
               if sides == 1 else f"{worse_level:.3g}"))
    if worse_level != worse_run:
        note += (f" at each of the looks {looks_text(sorted(set(looks or ())))} (so that over all of them an excess"
                 f" is called falsely at most {worse_run:g})")
    seen = ""
    if verdict != "regressed":
        rate = detectable_error_rate(errors_a, requests_a, requests_b, worse_level)
        what = "no excess seen" if not rate_b > rate_a else "no significant excess"
        seen = (f"{what} in {requests_b} requests (a failure rate of {100 * rate:.1f}% or more would have "
                f"been seen with {100 * DEFAULT_POWER:.0f}% power)" if rate is not None else
                f"no excess can be seen in {requests_b} requests against {errors_a}/{requests_a}: even all of them "
                f"failing would not be significant at {worse_level:g}")
        note += f"; {seen}"
    return MetricVerdict(metric=metric, direction="lower", verdict=verdict, median_a=rate_a, median_b=rate_b,
                         ratio=math.nan, ci_low=math.nan, ci_high=math.nan, p_value=min(worse, better),
                         n_a=requests_a, n_b=requests_b, cv=math.nan, repeats_needed=None, min_effect=0.0,
                         gated=gated, note=note, seen=seen, sides=sides)


def fewest_significant_errors(errors_a: int, requests_a: int, requests_b: int, level: float) -> int | None:
    """The fewest failed requests of B's `requests_b` that the one-sided Fisher test at `level` calls an excess
    over A's errors_a of requests_a; None when no count can (too few requests for that level)."""
    from scipy import stats as sps  # lazily: 0.6 s of every CLI start
    if requests_a <= 0 or requests_b <= 0:
        return None
    k = np.arange(requests_b + 1)
    # P(B has k or more of the errors) given the total: Fisher's one-sided p for each count k.
    p = sps.hypergeom.sf(k - 1, requests_a + requests_b, k + errors_a, requests_b)
    hits = np.flatnonzero(p < level)
    return int(hits[0]) if hits.size else None


def detectable_error_rate(errors_a: int, requests_a: int, requests_b: int, level: float,
                          power: float = DEFAULT_POWER) -> float | None:
    """The failure rate of B that the errors test at one-sided `level` finds with `power` against A's count: B's
    errors are then at least `fewest_significant_errors` with that probability (binomial). None: no rate can."""
    from scipy import stats as sps  # lazily: 0.6 s of every CLI start
    k = fewest_significant_errors(errors_a, requests_a, requests_b, level)
    if k is None:
        return None
    if k == 0:
        return 0.0
    return float(sps.beta.ppf(power, k, requests_b - k + 1))


# ---- which verdicts share a run's alpha: only those that can reject at their share ----------------

@lru_cache(maxsize=4096)
def least_error_p(errors: int, requests_a: int, requests_b: int, sides: int = 2) -> float:
    """The smallest p value the errors test can reach at these request counts with `errors` failed requests in
    all (Fisher's test holds that total fixed): all of them on B (sides 1: only an excess is asked about), or
    on either side (2). 1 with no failed request: no allocation of nothing is evidence. Compared with the
    level the test would be judged at (`family_share`)."""
    from scipy import stats as sps  # lazily: 0.6 s of every CLI start
    if errors <= 0 or requests_a <= 0 or requests_b <= 0:
        return 1.0
    total = requests_a + requests_b
    most_on_b, least_on_b = min(errors, requests_b), max(0, errors - requests_a)
    worse = float(sps.hypergeom.sf(most_on_b - 1, total, errors, requests_b))
    better = float(sps.hypergeom.cdf(least_on_b, total, errors, requests_b))
    return worse if sides == 1 else min(worse, better)


def least_quality_p(discordant: int) -> float:
    """The smallest p value the quality test (exact McNemar on the checks whose result differs between the sides)
    can reach: every differing check lost."""
    return 0.5 ** max(0, discordant)


def family_share(alpha: float, continuous: int, least_p: Sequence[float], sides: int = 2) -> float:
    """Each verdict's share of a run's alpha, counting only the verdicts that can reject at it (Tarone's
    modified Bonferroni for discrete tests): `continuous` tests (throughput, latency: any p is possible) and
    discrete ones (error counts, quality checks) with the smallest p value each can reach at the counts seen
    (`least_error_p`, `least_quality_p`). The share is alpha / K for the smallest K such that at most K tests
    can reject at it (a discrete test is judged at its share, sides 1, or half of it each way, sides 2). A
    discrete test that cannot reach its share can make no false call, so the chance of any false call stays
    at most alpha (tests/search/test_sequential.py simulates it over a run's looks); with no failed request
    and no differing check, the throughput verdict has the whole alpha. Every verdict is judged at the share,
    the ones left out too (they cannot reject at it either)."""
    tests = continuous + len(least_p)
    for k in range(1, max(1, tests) + 1):
        each = alpha / k
        level = each if sides == 1 else each / 2
        if continuous + sum(1 for p in least_p if p < level) <= k:
            return each
    return alpha / max(1, tests)


# ---- quality: checks passed on each side ---------------------------------------------------------

def compare_quality(passed_a: Mapping[str, Sequence[bool]], passed_b: Mapping[str, Sequence[bool]],
                    alpha: float = DEFAULT_ALPHA, sides: int = 2) -> dict[str, Any]:
    """The quality verdict from each check's results on A and B (one or more runs per side).

    A check counts as passed on a side when it passed in most of that side's runs. Checks that pass
    on A and fail on B (lost) against the reverse (gained): an exact one-sided McNemar test
    (binomial on the discordant checks) at alpha/2 (at alpha where the question is one-sided, sides 1: a
    loss is all it asks about). regressed: significantly more lost than gained;
    inconclusive: some lost, not significantly; unchanged: none lost net. Checks whose result
    differs between runs of one side are listed as flaky: they are noise, not a verdict."""
    from scipy import stats as sps  # lazily: 0.6 s of every CLI start
    names = sorted(set(passed_a) & set(passed_b))
    level = alpha if sides == 1 else alpha / 2

    def majority(v: Sequence[bool]) -> bool:
        return sum(bool(x) for x in v) * 2 > len(v)

    lost = [n for n in names if majority(passed_a[n]) and not majority(passed_b[n])]
    gained = [n for n in names if not majority(passed_a[n]) and majority(passed_b[n])]
    flaky = [n for n in names if len(set(passed_a[n])) > 1 or len(set(passed_b[n])) > 1]
    discordant = len(lost) + len(gained)
    p = float(sps.binom.sf(len(lost) - 1, discordant, 0.5)) if discordant else 1.0
    if p < level and len(lost) > len(gained):
        verdict = "regressed"
    elif len(lost) > len(gained):
        verdict = "inconclusive"
    else:
        verdict = "unchanged"
    # What "unchanged" could have seen: the fewest checks lost (none gained) the test calls a loss.
    needed = next((k for k in range(1, len(names) + 1) if 0.5 ** k < level), None)
    seen = "" if verdict == "regressed" else (
        f"no excess seen in {len(names)} checks (a loss shows from {needed} checks lost and none gained)"
        if needed is not None else
        f"no excess can be seen in {len(names)} checks: even all of them lost would not be significant at "
        f"{level:g}")
    return {"verdict": verdict, "p_value": p, "lost": lost, "gained": gained, "flaky": flaky,
            "checks": len(names), "threshold": level, "seen": seen,
            "discordant": discordant}


if __name__ == "__main__":  # python -m search.verdicts.sequential: rewrite the stored boundary table
    from search.verdicts.gate import DEFAULT_ALPHA as _A

    # Each verdict's share of the default alpha (1 to 8 gated), and twice it: a one-sided gate's threshold is the
    # two-sided one at 2 alpha on one tail.
    written = write_boundaries(sorted({round(m * _A / k, 12) for m in (1, 2) for k in range(1, 9)}), range(3, 21))
    print(f"wrote {len(written)} thresholds to {BOUNDARIES}", file=sys.stderr)
