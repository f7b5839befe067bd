"""Small, explicit statistics on raw samples: median, spread and a bootstrap interval."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps


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
