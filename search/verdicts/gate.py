"""Statistics for A/B runs, claims and regressions: the verdict on one metric, and exit codes.

Every decision is made on raw samples, one sample per interleaved round and side:
- the change is the ratio of medians B/A, with a bootstrap confidence interval (each side
  resampled on its own);
- significance is a two-sided Mann-Whitney U test (exact for small samples, no normality assumed);
- a change only counts when it is also at least `min_effect` (default 3%) in size.

Verdict per metric, with "better" meaning higher for throughputs and lower for latencies:
- regressed / improved: significant (p < alpha), the interval excludes no-change, and the
  measured change is at least min_effect in that direction;
- unchanged: the whole interval lies within +-min_effect (any change is too small to matter);
- inconclusive: neither; `repeats_needed` says how many rounds per side would settle it.
Under an A/A comparison whose samples are exchangeable, a false "regressed" has probability at
most alpha/2 (the Mann-Whitney test's size on one side); the min-effect condition lowers it further.

Claims ("+24% tok/s") are judged in search/regress/claims.py; a whole comparison is rendered (Markdown,
JUnit, exit code) by search/regress/gate_report.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from harness.measure.metric_registry import direction_of
from search.exit_codes import Exit

Verdict = Literal["regressed", "improved", "unchanged", "inconclusive"]
Direction = Literal["higher", "lower"]

DEFAULT_MIN_EFFECT = 0.03
# A run's false-alarm budget. Where the question is one-sided (regress, nightly, bisect: did it get worse?) it is
# all on "regressed": at most 2% false "regressed" calls under A/A; where it is two-sided (ab, claims, confirm)
# it is split over both directions: at most 1% false "regressed" and 1% false "improved".
DEFAULT_ALPHA = 0.02
DEFAULT_CONFIDENCE = 0.95
DEFAULT_POWER = 0.95

# The shared table (search/exit_codes.py), named here for the gate's callers.
EXIT_PASS, EXIT_REGRESSION, EXIT_INCONCLUSIVE = Exit.PASS, Exit.REGRESSION, Exit.INCONCLUSIVE
Samples = Sequence[float] | np.ndarray  # raw values of one side


def metric_direction(name: str) -> Direction:
    """Which way is better, as harness/measure/metric_registry.py declares it (rates and scores up, times,
    errors and distances down); ValueError for a metric without a direction."""
    return direction_of(name)


def _clean(values: Samples) -> np.ndarray:
    arr = np.asarray([float(v) for v in values if v is not None and not math.isnan(float(v))], dtype=float)
    return arr


def bootstrap_ratio_ci(a: Samples, b: Samples, confidence: float = DEFAULT_CONFIDENCE,
                       n_resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of median(b) / median(a), each side resampled on its own."""
    arr_a, arr_b = _clean(a), _clean(b)
    rng = np.random.default_rng(seed)
    med_a = np.median(rng.choice(arr_a, size=(n_resamples, arr_a.size), replace=True), axis=1)
    med_b = np.median(rng.choice(arr_b, size=(n_resamples, arr_b.size), replace=True), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = med_b / med_a
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size == 0:
        return math.nan, math.nan
    tail = (1.0 - confidence) / 2.0
    return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1.0 - tail))


def mann_whitney_p(a: Samples, b: Samples) -> float:
    from scipy import stats as sps  # lazily: 0.6 s of every CLI start
    arr_a, arr_b = _clean(a), _clean(b)
    if arr_a.size == 0 or arr_b.size == 0:
        return math.nan
    if np.ptp(np.concatenate([arr_a, arr_b])) == 0:
        return 1.0
    return float(sps.mannwhitneyu(arr_a, arr_b, alternative="two-sided", method="auto").pvalue)


def min_rounds_for_alpha(alpha: float) -> int:
    """Smallest n per side at which an exact two-sided Mann-Whitney test can reach p < alpha at all."""
    n = 1
    while 2.0 / math.comb(2 * n, n) >= alpha:
        n += 1
    return n


def noise_cv(a: Samples, b: Samples) -> float:
    """Pooled relative noise: standard deviation of log samples around each side's own mean."""
    parts = []
    for arr in (_clean(a), _clean(b)):
        arr = arr[arr > 0]
        if arr.size >= 2:
            logs = np.log(arr)
            parts.append(logs - logs.mean())
    if not parts:
        return math.nan
    dev = np.concatenate(parts)
    dof = dev.size - len(parts)
    return float(math.sqrt(float(np.sum(dev**2)) / dof)) if dof > 0 else math.nan


def repeats_needed(cv: float, min_effect: float = DEFAULT_MIN_EFFECT, alpha: float = DEFAULT_ALPHA,
                   power: float = DEFAULT_POWER) -> int | None:
    """Rounds per side to detect a change of min_effect at this noise with the given power.

    Normal approximation for two samples on the log scale, divided by the Mann-Whitney test's
    asymptotic relative efficiency (3/pi), and never below what the exact test needs to reach alpha.
    """
    from scipy import stats as sps  # lazily: 0.6 s of every CLI start
    if not math.isfinite(cv):
        return None
    delta = math.log1p(min_effect)
    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    n = 2.0 * (z * cv / delta) ** 2 / (3.0 / math.pi)
    return max(math.ceil(n), min_rounds_for_alpha(alpha))


@dataclass(frozen=True)
class MetricVerdict:
    metric: str
    direction: Direction
    verdict: Verdict
    median_a: float
    median_b: float
    ratio: float  # median(B) / median(A)
    ci_low: float
    ci_high: float
    p_value: float
    n_a: int
    n_b: int
    cv: float
    repeats_needed: int | None
    min_effect: float
    gated: bool = True
    note: str = ""
    samples_a: tuple[float, ...] = ()
    samples_b: tuple[float, ...] = ()
    # The interval's confidence as it holds at whichever look stopped the run: with several looks a repeated
    # confidence interval, 1 - alpha over the plan (its width that of one look at 1 - p*, `look_level`).
    level: float = DEFAULT_CONFIDENCE
    mde: float = math.nan  # smallest relative change this comparison had `power` to detect, at its noise
    paired: bool = False  # judged on within-round differences
    look_level: float = math.nan  # 1 - p* of this look: the interval's level at a look fixed in advance
    # A change found at a look of a sequential plan: the ratio corrected for stopping on a crossing (median-
    # unbiased given that the plan crossed in this direction); the raw `ratio` is biased away from 1.
    ratio_adjusted: float = math.nan
    seen: str = ""  # what a count's "unchanged" could have seen ("no excess seen in N requests (...)")
    # 1: the question is one-sided, "is B worse?" (regress, nightly, bisect): "regressed" is the one-sided test at the
    # whole alpha, and (bound_low, bound_high) are its one-sided 1 - alpha bounds (repeated over the looks), each end
    # on its own; "improved" and "unchanged" stay on the two-sided interval (ci_low, ci_high). 2: both ways (ab).
    sides: int = 2
    bound_low: float = math.nan
    bound_high: float = math.nan

    @property
    def change_pct(self) -> float:
        return 100.0 * (self.ratio - 1.0)

    @property
    def repeated(self) -> bool:
        """The interval is a repeated confidence interval (several looks): its level holds at any of them."""
        return math.isfinite(self.look_level) and self.look_level > self.level

    @property
    def level_text(self) -> str:
        return f"{100 * self.level:.3g}% {'repeated ' if self.repeated else ''}CI"

    def sensitivity(self) -> str:
        """What an unchanged or inconclusive answer could have seen: '' for a change found."""
        if self.verdict in ("regressed", "improved"):
            return ""
        if self.seen:
            return self.seen
        if not math.isfinite(self.mde):
            return ""
        return f"could detect a change of {100 * self.mde:.1f}% or more ({100 * DEFAULT_POWER:.0f}% power)"

    @property
    def sided_text(self) -> str:
        """Which question the verdict answered: '' for both ways; for a one-sided gate, what its bound says."""
        if self.sides != 1:
            return ""
        if not (math.isfinite(self.bound_low) and math.isfinite(self.bound_high)):
            return "one-sided: is B worse?"
        sign = 1.0 if self.direction == "higher" else -1.0
        _, worst, best = sorted_gain(sign, self.ratio, self.bound_low, self.bound_high)
        level = f"{100 * self.level:.3g}%{' repeated' if self.repeated else ''}"
        if best < 0:
            return f"one-sided (is B worse?): at least {100 * -best:.1f}% worse, {level} bound"
        return (f"one-sided (is B worse?): at most {100 * -worst:.1f}% worse, {level} bound" if worst < 0
                else f"one-sided (is B worse?): not worse, {level} bound")

    def describe(self) -> str:
        ci = f"[{100 * (self.ci_low - 1):+.1f}%, {100 * (self.ci_high - 1):+.1f}%]"
        seen = self.sensitivity()
        adjusted = (f", {100 * (self.ratio_adjusted - 1):+.1f}% corrected for the early stop"
                    if math.isfinite(self.ratio_adjusted) else "")
        sided = self.sided_text
        return (f"{self.metric}: {self.verdict} ({self.change_pct:+.1f}%{adjusted}, {self.level_text} {ci}, "
                + (f"{sided}, one-sided " if sided else "") + f"p={self.p_value:.3g}, n={self.n_a}/{self.n_b}"
                + (f"; {seen}" if seen else "") + ")")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["samples_a"], out["samples_b"] = list(self.samples_a), list(self.samples_b)
        out["change_pct"] = self.change_pct
        return out


def compare(metric: str, a: Sequence[float], b: Sequence[float], direction: Direction | None = None,
            min_effect: float = DEFAULT_MIN_EFFECT, alpha: float = DEFAULT_ALPHA,
            confidence: float = DEFAULT_CONFIDENCE, power: float = DEFAULT_POWER, gated: bool = True,
            seed: int = 0) -> MetricVerdict:
    """The verdict for one metric from raw samples of A (baseline) and B (candidate)."""
    direction = direction or metric_direction(metric)
    arr_a, arr_b = _clean(a), _clean(b)
    common = dict(metric=metric, direction=direction, min_effect=min_effect, gated=gated,
                  samples_a=tuple(arr_a.tolist()), samples_b=tuple(arr_b.tolist()), n_a=int(arr_a.size),
                  n_b=int(arr_b.size))
    if arr_a.size < 2 or arr_b.size < 2:
        return MetricVerdict(verdict="inconclusive", median_a=_median(arr_a), median_b=_median(arr_b),
                             ratio=math.nan, ci_low=math.nan, ci_high=math.nan, p_value=math.nan, cv=math.nan,
                             repeats_needed=min_rounds_for_alpha(alpha),
                             note="fewer than 2 samples on a side", **common)  # type: ignore[arg-type]
    med_a, med_b = float(np.median(arr_a)), float(np.median(arr_b))
    if med_a == 0:
        return _zero_baseline(arr_a, arr_b, common, min_effect, alpha)
    ratio = med_b / med_a
    low, high = bootstrap_ratio_ci(arr_a, arr_b, confidence, seed=seed)
    p = mann_whitney_p(arr_a, arr_b)
    cv = noise_cv(arr_a, arr_b)
    need = repeats_needed(cv, min_effect, alpha, power)
    # Orient so that a positive "gain" is always better.
    verdict = decide(direction, ratio, low, high, p < alpha, min_effect)
    note = ""
    if verdict == "inconclusive":
        if need is not None and need > min(arr_a.size, arr_b.size):
            note = f"about {need} rounds per side would settle a {100 * min_effect:.0f}% change at this noise"
        else:
            note = "the interval straddles the minimum effect; more rounds would narrow it"
    return MetricVerdict(verdict=verdict, median_a=med_a, median_b=med_b, ratio=ratio, ci_low=low, ci_high=high,
                         p_value=p, cv=cv, repeats_needed=need, note=note, **common)  # type: ignore[arg-type]


def decide(direction: Direction, ratio: float, low: float, high: float, significant: bool,
           min_effect: float) -> Verdict:
    """The verdict from a ratio B/A, its interval and the test: a change must be significant, its
    whole interval on one side and at least min_effect; "unchanged" needs the interval inside
    +-min_effect."""
    sign = 1.0 if direction == "higher" else -1.0
    gain, gain_lo, gain_hi = sorted_gain(sign, ratio, low, high)
    if significant and gain_lo > 0 and gain >= min_effect:
        return "improved"
    if significant and gain_hi < 0 and gain <= -min_effect:
        return "regressed"
    if (1 - min_effect) < low and high < (1 + min_effect):
        return "unchanged"
    return "inconclusive"


def sorted_gain(sign: float, ratio: float, low: float, high: float) -> tuple[float, float, float]:
    """(gain, low, high) of the relative change, oriented so that positive is better."""
    ends = sorted((sign * (low - 1.0), sign * (high - 1.0)))
    return sign * (ratio - 1.0), ends[0], ends[1]


def _median(arr: np.ndarray) -> float:
    return float(np.median(arr)) if arr.size else math.nan


def _zero_baseline(arr_a: np.ndarray, arr_b: np.ndarray, common: dict[str, Any], min_effect: float,
                   alpha: float) -> MetricVerdict:
    """Counts such as errors: 0 in the baseline. Any candidate error is a change, no ratio exists."""
    med_b = float(np.median(arr_b))
    worse_if_up = common["direction"] == "lower"
    if float(arr_b.max()) == 0:
        verdict: Verdict = "unchanged"
    elif med_b > 0 or mann_whitney_p(arr_a, arr_b) < alpha:
        verdict = "regressed" if worse_if_up else "improved"
    else:
        verdict = "inconclusive"
    return MetricVerdict(verdict=verdict, median_a=0.0, median_b=med_b, ratio=math.nan, ci_low=math.nan,
                         ci_high=math.nan, p_value=mann_whitney_p(arr_a, arr_b), cv=math.nan,
                         repeats_needed=None, note="baseline median is 0: judged on counts, not a ratio",
                         **common)  # type: ignore[arg-type]

