"""Small, explicit statistics on raw samples: median, spread and a bootstrap interval."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Stat:
    """A metric over repeats: every raw value kept, with the median and its spread."""

    median: float
    min: float
    max: float
    ci_low: float
    ci_high: float
    n: int
    values: tuple[float, ...]

    @property
    def spread_pct(self) -> float:
        """(max - min) / median, in percent: the honest one-line noise figure."""
        return 100.0 * (self.max - self.min) / self.median if self.median else math.nan

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["values"] = list(self.values)
        return out


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def bootstrap_median_ci(values: Sequence[float], confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    from scipy import stats as sps  # lazily: 0.6 s of every CLI start
    arr = np.asarray(values, dtype=float)
    if arr.size < 3 or np.all(arr == arr[0]):
        return float(arr.min()), float(arr.max())
    res = sps.bootstrap((arr,), np.median, confidence_level=confidence, n_resamples=2000,
                        method="percentile", random_state=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def summarize(values: Sequence[float]) -> Stat | None:
    clean = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not clean:
        return None
    low, high = bootstrap_median_ci(clean)
    return Stat(median=float(np.median(clean)), min=min(clean), max=max(clean), ci_low=low, ci_high=high,
                n=len(clean), values=tuple(clean))


# ---- steady state, outliers, intervals on rates --------------------------------------------------

def robust_z(values: Sequence[float]) -> list[float]:
    """(x - median) / (1.4826 * MAD) per value: a z-score that one stall cannot inflate.

    0 for every value when the MAD is 0 (all but outliers equal): then any deviation is reported by
    the caller's ratio rule instead."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return []
    med = float(np.median(arr))
    mad = 1.4826 * float(np.median(np.abs(arr - med)))
    if mad == 0:
        return [0.0] * int(arr.size)
    return [float(x) for x in (arr - med) / mad]


def log_mean_rel_halfwidth(values: Sequence[float], confidence: float = 0.95) -> float:
    """Half-width of the t interval of the mean of log(values), as a relative change (0.02 = +-2%).

    Used to decide when a measurement is long enough: unlike a bootstrap of the median it is honest
    at n = 2-5 (the t quantile is wide there). inf with fewer than 2 positive values."""
    from scipy import stats as sps  # lazily: 0.6 s of every CLI start
    arr = np.asarray([v for v in values if v is not None and v > 0], dtype=float)
    if arr.size < 2:
        return math.inf
    logs = np.log(arr)
    sd = float(np.std(logs, ddof=1))
    t = float(sps.t.ppf(0.5 + confidence / 2, arr.size - 1))
    return math.expm1(t * sd / math.sqrt(arr.size))


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact two-sided interval of a binomial rate (k successes of n)."""
    from scipy import stats as sps  # lazily: 0.6 s of every CLI start
    if n <= 0:
        return 0.0, 1.0
    tail = (1 - confidence) / 2
    low = 0.0 if k == 0 else float(sps.beta.ppf(tail, k, n - k + 1))
    high = 1.0 if k == n else float(sps.beta.ppf(1 - tail, k + 1, n - k))
    return low, high


def clopper_pearson_upper(k: int, n: int, confidence: float = 0.95) -> float:
    """One-sided upper confidence bound of a binomial rate: 0 of 20 gives 13.9% at 95%."""
    from scipy import stats as sps  # lazily: 0.6 s of every CLI start
    if n <= 0:
        return 1.0
    return 1.0 if k >= n else float(sps.beta.ppf(confidence, k + 1, n - k))


@dataclass(frozen=True)
class VarianceComponents:
    """Noise of a metric on the log scale (0.02 ~ 2%), split by where it arises."""

    sd_within: float  # between runs of one server start
    sd_between: float  # between server starts, beyond what the runs' noise explains
    starts: int
    runs: int  # all runs over all starts

    def sd_start_mean(self, runs_per_start: int) -> float:
        """Spread of one start's mean over `runs_per_start` runs: what a start-level test sees."""
        return math.sqrt(self.sd_between**2 + self.sd_within**2 / max(1, runs_per_start))

    def best_runs_per_start(self, start_cost_s: float, run_cost_s: float) -> int:
        """Runs per start that minimise the cost of a given precision (the classic two-stage
        sampling optimum sqrt(c_start / c_run * s_within^2 / s_between^2)), 1..20."""
        if self.sd_between <= 0:
            return 20
        r = math.sqrt(start_cost_s / max(run_cost_s, 1e-9)) * self.sd_within / self.sd_between
        return int(min(20, max(1, round(r))))


def variance_components(groups: Sequence[Sequence[float]]) -> VarianceComponents:
    """One-way random-effects estimate (method of moments) on log values; groups = starts."""
    logs = [[math.log(v) for v in g if v > 0] for g in groups]
    logs = [g for g in logs if g]
    n_runs = sum(len(g) for g in logs)
    k = len(logs)
    if k == 0:
        return VarianceComponents(math.nan, math.nan, 0, 0)
    means = np.array([sum(g) / len(g) for g in logs])
    ss_within = float(sum((x - m) ** 2 for g, m in zip(logs, means, strict=True) for x in g))
    df_within = n_runs - k
    var_within = ss_within / df_within if df_within > 0 else 0.0
    if k < 2:
        return VarianceComponents(math.sqrt(var_within), math.nan, k, n_runs)
    sizes = np.array([len(g) for g in logs], dtype=float)
    grand = float(np.sum(means * sizes) / n_runs)
    ms_between = float(np.sum(sizes * (means - grand) ** 2)) / (k - 1)
    n0 = (n_runs - float(np.sum(sizes**2)) / n_runs) / (k - 1)  # effective runs per start
    var_between = max(0.0, (ms_between - var_within) / n0) if n0 > 0 else 0.0
    return VarianceComponents(math.sqrt(var_within), math.sqrt(var_between), k, n_runs)


@dataclass(frozen=True)
class LevelShift:
    """Whether a start's level moves while its runs go on: the first half of each start's runs against its
    second half, beside what the runs' spread within the halves predicts (F ~ 1: the runs are independent
    draws around one level; F >> 1: the level moved, e.g. a host whose speed changes over tens of seconds).
    Only then does averaging more runs per start narrow a start's value as their spread says."""

    f: float
    p: float
    starts: int


def level_shift_within_starts(groups: Sequence[Sequence[float]]) -> LevelShift | None:
    """The F test of half-means on log values over every start with at least 4 runs (None: fewer than 3 such).
    Each start's shift is scaled by its halves' size, so starts with re-measured runs count alike."""
    from scipy import stats  # lazily: scipy costs every CLI start ~0.25 s

    scaled, ss, df = [], 0.0, 0
    for g in groups:
        x = np.log([v for v in g if v > 0])
        h = len(x) // 2
        if h < 2:
            continue
        first, second = x[:h], x[h:2 * h]
        scaled.append(float(second.mean() - first.mean()) ** 2 * h / 2)  # var(shift) = 2 w^2 / h
        ss += float(np.sum((first - first.mean()) ** 2) + np.sum((second - second.mean()) ** 2))
        df += 2 * (h - 1)
    if len(scaled) < 3 or ss == 0.0:
        return None
    f = float(np.mean(scaled)) / (ss / df)
    return LevelShift(f, float(stats.f.sf(f, len(scaled), df)), len(scaled))
