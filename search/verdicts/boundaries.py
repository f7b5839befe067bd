"""The sequential thresholds every paired and blocked verdict uses, simulated once and stored with
the code (search/data/paired_boundaries.json, written by `python -m search.verdicts.sequential`), or simulated
on first use for a plan the table lacks.

A plan looks after several round counts; looking many times inflates false alarms, so every look
uses one nominal p threshold p* chosen by simulation so that the chance of any look crossing it under
no change is alpha (a Pocock boundary on p values; the t statistic's null distribution does not
depend on the unknown variances). The paired test (search/verdicts/sequential.py) uses them, and so does
the confirmation (search/verdicts/blocked.py: each arm against the default by its own differences).
The paired test can instead take an O'Brien-Fleming shaped boundary (a threshold per look, growing with the
look): its constant for the usual plans is stored in the same file, other plans are simulated on first use.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from search.verdicts.gate import DEFAULT_ALPHA

MIN_STARTS = 3  # fewer starts per side leave df <= 2: the t quantile is too wide to settle anything
MAX_PLANNED_ROUNDS = 20  # the longest plan stored in search/data/paired_boundaries.json
BOUNDARIES = Path(__file__).resolve().parents[1] / "data" / "paired_boundaries.json"
PAIRED_SIMS = 200_000


def looks_text(looks: Sequence[int]) -> str:
    """"3..10" for a look after every round, "5, 10" otherwise."""
    if list(looks) == list(range(looks[0], looks[-1] + 1)):
        return f"{looks[0]}..{looks[-1]}"
    return ", ".join(str(n) for n in looks)


@lru_cache(maxsize=64)
def sequential_p_threshold(looks: tuple[int, ...], alpha: float = DEFAULT_ALPHA, sims: int = 200_000,
                           seed: int = 7) -> float:
    """Nominal two-sided p threshold for looks at these starts-per-side counts, with an overall
    false-alarm probability alpha under no change (Monte Carlo, seeded: the same plan always gets
    the same threshold)."""
    from scipy import special  # lazily: scipy costs every CLI start ~0.25 s
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


@lru_cache(maxsize=256)
def count_look_level(looks: tuple[int, ...], level: float, sims: int = 200_000, seed: int = 13) -> float:
    """The one-sided level at which a test of counts summed over the rounds so far (the errors test: Fisher's on
    the failed requests up to this look) is judged at each of these looks, so that under no change the chance of
    any look crossing it is `level` (a Pocock boundary for a statistic whose increments are independent, as a
    count's are: simulated on the z statistic of cumulative sums, seeded). One look: `level` itself. Fisher's test
    is discrete and conservative, so the run's rate stays at or below `level` (simulated:
    bench/experiments/family_share)."""
    from scipy import special  # lazily: scipy costs every CLI start ~0.25 s
    looks = tuple(sorted(set(n for n in looks if n >= 1)))
    if len(looks) <= 1 or level <= 0:
        return level
    sums = np.cumsum(np.random.default_rng(seed).standard_normal((sims, looks[-1])), axis=1)
    z = np.stack([sums[:, n - 1] / math.sqrt(n) for n in looks], axis=1)
    return float(np.quantile(special.ndtr(-z.max(axis=1)), level))


def _plan_key(looks: tuple[int, ...], alpha: float) -> str:
    return f"{alpha:.6g}|{','.join(map(str, looks))}"


@lru_cache(maxsize=2)
def _stored_boundaries(section: str = "thresholds") -> dict[str, float]:
    """One section of the stored table: "thresholds" (Pocock p thresholds) or OBF_SECTION (constants)."""
    try:
        return {str(k): float(v) for k, v in json.loads(BOUNDARIES.read_text())[section].items()}
    except (OSError, ValueError, KeyError):
        return {}


def _null_paired_p(looks: tuple[int, ...], sims: int = PAIRED_SIMS, seed: int = 11) -> np.ndarray:
    """sims x len(looks) two-sided p values of the paired t test at each look, on simulated null rounds."""
    from scipy import special  # lazily: scipy costs every CLI start ~0.25 s
    d = np.random.default_rng(seed).standard_normal((sims, looks[-1]))
    return np.stack([2 * special.stdtr(n - 1, -np.abs(d[:, :n].mean(axis=1) / (d[:, :n].std(axis=1, ddof=1)
                                                                           / math.sqrt(n)))) for n in looks], axis=1)


def _pocock_threshold(null_p: np.ndarray, alpha: float) -> float:
    """The one p threshold whose chance of any crossing on these null p values (one row a run) is alpha."""
    return float(np.quantile(null_p.min(axis=1), alpha))


def _simulate_paired(looks: tuple[int, ...], alpha: float, sims: int = PAIRED_SIMS, seed: int = 11) -> float:
    return _pocock_threshold(_null_paired_p(looks, sims, seed), alpha)


@lru_cache(maxsize=256)
def paired_p_threshold(looks: tuple[int, ...], alpha: float = DEFAULT_ALPHA) -> float:
    """Nominal two-sided p threshold of the paired t test looked at after these round counts, with
    an overall false-alarm probability alpha under no change: the stored table, else simulated
    (seeded: the same plan always gets the same threshold)."""
    looks = tuple(sorted(set(n for n in looks if n >= 2)))
    if len(looks) <= 1:
        return alpha
    stored = _stored_boundaries().get(_plan_key(looks, alpha))
    return stored if stored is not None else _simulate_paired(looks, alpha)


# Pocock: one threshold for every look (stops early on moderate changes). O'Brien-Fleming: the z boundary
# c * sqrt(N / k) at look k of a plan ending at N (early looks stop only on large changes; the last is close to
# a single look's): at 2-3.7% noise a start it finds a 5% change within 10 starts 8-20 points more often than
# Pocock, and a 20% one ~1.5 rounds later (simulated: bench/experiments/look_plans).
BOUNDARY_KINDS = ("pocock", "obrien-fleming")
OBF_SECTION = "obrien_fleming"  # alpha|looks -> c, in the stored table


def _obf_shape(looks: tuple[int, ...]) -> np.ndarray:
    return np.sqrt(looks[-1] / np.array(looks, dtype=float))


def _obf_constant(null_p: np.ndarray, looks: tuple[int, ...], alpha: float) -> float:
    """c of the z boundary c * sqrt(N / k) whose chance of any crossing on these null p values is alpha."""
    from scipy import stats  # lazily: scipy costs every CLI start ~0.25 s
    shape = _obf_shape(looks)
    lo, hi = 1.0, 8.0
    for _ in range(50):  # bisection on c: more crossings than alpha means the boundary is too low
        mid = (lo + hi) / 2
        crossed = float((null_p < 2 * stats.norm.sf(mid * shape)).any(axis=1).mean())
        lo, hi = (mid, hi) if crossed > alpha else (lo, mid)
    return hi


@lru_cache(maxsize=64)
def obrien_fleming_thresholds(looks: tuple[int, ...], alpha: float = DEFAULT_ALPHA) -> tuple[float, ...]:
    """Each look's nominal two-sided p threshold of the paired t test on an O'Brien-Fleming shaped boundary,
    2 * sf(c * sqrt(N / k)), with c set so that the chance of any crossing under no change is alpha: the
    stored constant, else simulated with the null draws of `_simulate_paired` (seeded: the same plan always
    gets the same; a `rounds_needed` hint walks several plans, ~1 s each when simulated)."""
    from scipy import stats  # lazily: scipy costs every CLI start ~0.25 s
    looks = tuple(sorted(set(n for n in looks if n >= 2)))
    if len(looks) <= 1:
        return (alpha,) * len(looks)
    c = _stored_boundaries(OBF_SECTION).get(_plan_key(looks, alpha))
    if c is None:
        c = _obf_constant(_null_paired_p(looks), looks, alpha)
    return tuple(float(x) for x in 2 * stats.norm.sf(c * _obf_shape(looks)))


def _usual_plans(caps: Sequence[int], min_rounds: int) -> list[tuple[int, ...]]:
    """The stored plans: looks after every round from min_rounds to each cap."""
    plans = [tuple(range(min(min_rounds, cap), cap + 1)) for cap in caps]
    return [looks for looks in plans if len(looks) > 1]


def paired_tables(alphas: Sequence[float], caps: Sequence[int],
                  min_rounds: int = MIN_STARTS) -> tuple[dict[str, float], dict[str, float]]:
    """The Pocock thresholds and O'Brien-Fleming constants of the usual plans, for the stored table: one
    null simulation per plan (the one `_simulate_paired` draws), shared by every alpha and both boundaries."""
    pocock: dict[str, float] = {}
    obf: dict[str, float] = {}
    for looks in _usual_plans(caps, min_rounds):
        null_p = _null_paired_p(looks)
        for alpha in alphas:
            pocock[_plan_key(looks, alpha)] = _pocock_threshold(null_p, alpha)
            obf[_plan_key(looks, alpha)] = _obf_constant(null_p, looks, alpha)
    return pocock, obf


def look_p_threshold(looks: Sequence[int], n: int, alpha: float = DEFAULT_ALPHA, boundary: str = "pocock") -> float:
    """The p threshold of the look after `n` rounds in a plan with these looks. An O'Brien-Fleming plan's
    threshold grows with the look; between looks (a run stopped early) the last look passed applies."""
    plan = tuple(sorted(set(k for k in looks if k >= 2)))
    if boundary == "pocock" or len(plan) <= 1:
        return paired_p_threshold(plan, alpha)
    if boundary not in BOUNDARY_KINDS:
        raise ValueError(f"boundary {boundary!r}: one of {', '.join(BOUNDARY_KINDS)}")
    thresholds = obrien_fleming_thresholds(plan, alpha)
    return thresholds[max((i for i, k in enumerate(plan) if k <= n), default=0)]


def write_boundaries(alphas: Sequence[float], caps: Sequence[int], min_rounds: int = MIN_STARTS) -> dict[str, float]:
    """Simulate the paired thresholds of the usual plans (looks at min_rounds..cap) and store them."""
    table, obf = paired_tables(alphas, caps, min_rounds)
    write_table({"thresholds": table, OBF_SECTION: obf})
    return table


def write_table(sections: dict[str, dict[str, float]]) -> None:
    """Replace these sections of the stored table, keeping the others."""
    try:
        doc = json.loads(BOUNDARIES.read_text())
    except (OSError, ValueError):
        doc = {}
    doc.update(sections)
    doc.update({"method": f"thresholds: Pocock boundary on the paired t test's p values, {PAIRED_SIMS} simulated null "
                          "runs per plan, seed 11 (search/verdicts/boundaries.py); "
                          f"{OBF_SECTION}: c of the O'Brien-Fleming z boundary "
                          "c * sqrt(N / k), on the paired null runs (seed 11)",
                "key": "alpha|looks (rounds at each look)"})
    BOUNDARIES.parent.mkdir(parents=True, exist_ok=True)
    BOUNDARIES.write_text(json.dumps(doc, indent=1))
    _stored_boundaries.cache_clear()
