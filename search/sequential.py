"""The gate's statistics over server starts, with sequential stopping; error and quality verdicts on rates.

Unit: a server start. Each start gives several measured runs; the value of a start is the mean of
its runs' log values, so both noise sources are in it: within a start (run to run) and between
starts (a new process, its memory layout, its compiled kernels, the machine's state then). A
two-sample t test on the start values (pooled variance, df = starts - 2) is the exact test of a
hierarchical normal model with equal runs per start, and it never treats runs of one start as
independent (they are not: a start effect of a few percent is shared by all its runs).

Sequential: after each interleaved round (one more start per side) the test is repeated. Looking
many times inflates false alarms, so every look uses one nominal p threshold p* chosen by
simulation so that the chance of any look crossing it under no change is alpha (a Pocock boundary
on p values; the t statistic's null distribution does not depend on the unknown variances). The
interval reported at a look has confidence 1 - p*. A run stops as soon as every gated metric is
settled (regressed, improved or unchanged) or at the cap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import special
from scipy import stats as sps

from harness.stats import clopper_pearson, variance_components
from search.gate import (
    DEFAULT_ALPHA,
    DEFAULT_MIN_EFFECT,
    DEFAULT_POWER,
    Direction,
    MetricVerdict,
    Verdict,
    decide,
    metric_direction,
)

MIN_STARTS = 3  # fewer starts per side leave df <= 2: the t quantile is too wide to settle anything


@lru_cache(maxsize=64)
def sequential_p_threshold(looks: tuple[int, ...], alpha: float = DEFAULT_ALPHA, sims: int = 200_000,
                           seed: int = 7) -> float:
    """Nominal two-sided p threshold for looks at these starts-per-side counts, with an overall
    false-alarm probability alpha under no change (Monte Carlo, seeded: the same plan always gets
    the same threshold)."""
    looks = tuple(sorted(set(n for n in looks if n >= 2)))
    if len(looks) <= 1:
        return alpha
    rng = np.random.default_rng(seed)
    top = looks[-1]
    a, b = rng.standard_normal((sims, top)), rng.standard_normal((sims, top))
    min_p = np.ones(sims)
    for n in looks:
        xa, xb = a[:, :n], b[:, :n]
        pooled = np.sqrt((xa.var(axis=1, ddof=1) + xb.var(axis=1, ddof=1)) / 2 * (2 / n))
        t = (xb.mean(axis=1) - xa.mean(axis=1)) / pooled
        min_p = np.minimum(min_p, 2 * special.stdtr(2 * n - 2, -np.abs(t)))
    return float(np.quantile(min_p, alpha))


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
    ratio, low, high = math.exp(d), math.exp(d - half), math.exp(d + half)
    need = starts_needed(sd, min_effect, p_star, power)
    verdict = decide(direction, ratio, low, high, p < p_star, min_effect)
    vc_a, vc_b = variance_components(runs_a), variance_components(runs_b)
    within = _pool(vc_a.sd_within, vc_b.sd_within)
    between = _pool(vc_a.sd_between, vc_b.sd_between)
    runs = (vc_a.runs + vc_b.runs) / max(1, n_a + n_b)
    note = (f"{n_a}/{n_b} starts x {runs:.1g} runs; start-to-start spread {100 * sd:.1f}% "
            f"(between starts {_pct(between)}, run to run {_pct(within)}); threshold p < {p_star:.3g}"
            + (f" (looks at {plan[0]}..{plan[-1]} starts)" if len(plan) > 1 else ""))
    if verdict == "inconclusive" and need is not None and need > min(n_a, n_b):
        note += f"; about {need} starts per side would settle a {100 * min_effect:.0f}% change at this noise"
    return MetricVerdict(verdict=verdict, median_a=med_a, median_b=med_b, ratio=ratio, ci_low=low, ci_high=high,
                         p_value=p, cv=sd, repeats_needed=need, note=note, **common)


def _pool(x: float, y: float) -> float:
    vals = [v for v in (x, y) if math.isfinite(v)]
    return math.sqrt(sum(v * v for v in vals) / len(vals)) if vals else math.nan


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if math.isfinite(x) else "-"


def starts_needed(sd_start: float, min_effect: float = DEFAULT_MIN_EFFECT, p_threshold: float = DEFAULT_ALPHA,
                  power: float = DEFAULT_POWER) -> int | None:
    """Starts per side for `power` against a change of min_effect, at this start-to-start spread
    (normal approximation at the threshold; the t test needs a little more at small counts)."""
    if not math.isfinite(sd_start):
        return None
    z = float(special.ndtri(1 - p_threshold / 2) + special.ndtri(power))
    return max(MIN_STARTS, math.ceil(2 * (z * sd_start / math.log1p(min_effect)) ** 2))


def settled(verdict: MetricVerdict) -> bool:
    return verdict.verdict != "inconclusive"


# ---- errors: a test on rates ---------------------------------------------------------------------

ERRORS_SUGGEST_P = 0.10  # B's excess errors at one-sided p below this (not significant): say so


def compare_errors(metric: str, errors_a: int, requests_a: int, errors_b: int, requests_b: int,
                   alpha: float = DEFAULT_ALPHA, gated: bool = True) -> MetricVerdict:
    """Failed requests judged as rates (one-sided Fisher exact tests at alpha/2 each way).

    regressed: B's rate is significantly higher; improved: significantly lower; inconclusive: B
    failed more often with p < 0.10 but not significantly (said, not passed silently); unchanged:
    otherwise (one stray error in a hundred requests is no evidence). Under A/A the share called
    inconclusive is at most ~10% and regressed at most alpha/2 (measured: docs/calibration.md).
    median_a / median_b are the error rates."""
    rate_a = errors_a / requests_a if requests_a else math.nan
    rate_b = errors_b / requests_b if requests_b else math.nan
    table = [[errors_b, requests_b - errors_b], [errors_a, requests_a - errors_a]]
    worse = float(sps.fisher_exact(table, alternative="greater").pvalue) if requests_a and requests_b else 1.0
    better = float(sps.fisher_exact(table, alternative="less").pvalue) if requests_a and requests_b else 1.0
    lo_b, hi_b = clopper_pearson(errors_b, requests_b)
    verdict: Verdict
    if worse < alpha / 2:
        verdict = "regressed"
    elif better < alpha / 2:
        verdict = "improved"
    elif rate_b > rate_a and worse < ERRORS_SUGGEST_P:
        verdict = "inconclusive"
    else:
        verdict = "unchanged"
    note = (f"error rates A {errors_a}/{requests_a}, B {errors_b}/{requests_b} (B 95% CI {100 * lo_b:.1f}%.."
            f"{100 * hi_b:.1f}%); one-sided Fisher p {min(worse, better):.3g}, threshold {alpha / 2:g}")
    return MetricVerdict(metric=metric, direction="lower", verdict=verdict, median_a=rate_a, median_b=rate_b,
                         ratio=math.nan, ci_low=math.nan, ci_high=math.nan, p_value=min(worse, better),
                         n_a=requests_a, n_b=requests_b, cv=math.nan, repeats_needed=None, min_effect=0.0,
                         gated=gated, note=note)


# ---- quality: checks passed on each side ---------------------------------------------------------

def compare_quality(passed_a: Mapping[str, Sequence[bool]], passed_b: Mapping[str, Sequence[bool]],
                    alpha: float = DEFAULT_ALPHA) -> dict[str, Any]:
    """The quality verdict from each check's results on A and B (one or more runs per side).

    A check counts as passed on a side when it passed in most of that side's runs. Checks that pass
    on A and fail on B (lost) against the reverse (gained): an exact one-sided McNemar test
    (binomial on the discordant checks) at alpha/2. regressed: significantly more lost than gained;
    inconclusive: some lost, not significantly; unchanged: none lost net. Checks whose result
    differs between runs of one side are listed as flaky: they are noise, not a verdict."""
    names = sorted(set(passed_a) & set(passed_b))

    def majority(v: Sequence[bool]) -> bool:
        return sum(bool(x) for x in v) * 2 > len(v)

    lost = [n for n in names if majority(passed_a[n]) and not majority(passed_b[n])]
    gained = [n for n in names if not majority(passed_a[n]) and majority(passed_b[n])]
    flaky = [n for n in names if len(set(passed_a[n])) > 1 or len(set(passed_b[n])) > 1]
    discordant = len(lost) + len(gained)
    p = float(sps.binom.sf(len(lost) - 1, discordant, 0.5)) if discordant else 1.0
    if p < alpha / 2 and len(lost) > len(gained):
        verdict = "regressed"
    elif len(lost) > len(gained):
        verdict = "inconclusive"
    else:
        verdict = "unchanged"
    return {"verdict": verdict, "p_value": p, "lost": lost, "gained": gained, "flaky": flaky,
            "checks": len(names), "threshold": alpha / 2}
