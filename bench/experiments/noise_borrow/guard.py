"""Can a comparison borrow a noise store's spread soundly and still gain? (issue 51, item 3)

A paired run estimates the spread of its round differences from its own 2-9 degrees of freedom; a noise store
(search/verdicts/noise_store.py) holds the same setup's earlier hours. Borrowing holds alpha only where this hour is
not noisier than the store. This simulates the paired gate (looks 3..10, two-sided alpha 0.02) with a store of 100
degrees of freedom, the hour's true spread r times the store's, under these rules:

- own: the run's own spread at rounds - 1 df, the stored Pocock threshold (the product without a store);
- borrow (the opt-in rule, FLAGSEARCH_BORROW_NOISE=1): the stored spread at its df where it is at least the run's
  own, else the own; threshold simulated over hours like the store's (tau 0 here);
- F-guarded max / F-guarded pooled: an F test of the run's variance against the store's (one-sided, 10%); where it
  rejects, the own spread alone; where not, max(stored, own) at the stored df, or their pooled variance at the
  summed df. One p threshold for both branches, calibrated so that the false-call rate is at most alpha for EVERY
  hour ratio r in [0.5, R] (a minimax threshold: the guard is sound up to R times noisier hours).

For each rule and R: the threshold, the false-call rate at r = 1, 1.3, 2 and 4, and the power for a -5% change at
3% a start at r = 1 (the hour just like the store: borrowing's best case).

    nice -n 10 python -m bench.experiments.noise_borrow.guard [SIMS]   # 20000: ~1 min; results.txt beside it
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy import special, stats

from search.verdicts import noise_store
from search.verdicts.boundaries import paired_p_threshold

LOOKS = tuple(range(3, 11))
ALPHA = 0.02
STORE_DF = 100
F_LEVEL = 0.10
RATIOS = (0.5, 0.8, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0, 10.0, 20.0)
BOUNDS = (1.0, 1.15, 1.3, 1.5, 2.0, 20.0)
SHOWN = (1.0, 1.3, 2.0, 4.0)
SHIFT = math.log(0.95) / (math.sqrt(2) * 0.03)  # -5% at 3% a start, in sds of a round's difference


def min_p_guarded(d: np.ndarray, s0: np.ndarray, pooled: bool) -> np.ndarray:
    """Per run, the smallest p over the looks of the F-guarded rule (d in units of the store's true sd)."""
    out = np.ones(d.shape[0])
    for n in LOOKS:
        x = d[:, :n]
        mean, own = x.mean(axis=1), x.std(axis=1, ddof=1)
        noisier = own ** 2 / s0 ** 2 > stats.f.ppf(1 - F_LEVEL, n - 1, STORE_DF)
        if pooled:
            sd, df = np.sqrt((STORE_DF * s0 ** 2 + (n - 1) * own ** 2) / (STORE_DF + n - 1)), STORE_DF + n - 1
        else:
            sd, df = np.maximum(s0, own), STORE_DF
        p_own = 2 * special.stdtr(n - 1, -np.abs(mean) / (own / math.sqrt(n)))
        p_store = 2 * special.stdtr(df, -np.abs(mean) / (sd / math.sqrt(n)))
        out = np.minimum(out, np.where(noisier, p_own, p_store))
    return out


def min_p_own(d: np.ndarray) -> np.ndarray:
    out = np.ones(d.shape[0])
    for n in LOOKS:
        x = d[:, :n]
        se = x.std(axis=1, ddof=1) / math.sqrt(n)
        out = np.minimum(out, 2 * special.stdtr(n - 1, -np.abs(x.mean(axis=1)) / se))
    return out


def main(sims: int) -> str:
    rng = np.random.default_rng(2026_12_02)
    z = rng.standard_normal((sims, LOOKS[-1]))
    s0 = np.sqrt(rng.chisquare(STORE_DF, sims) / STORE_DF)
    p_own = paired_p_threshold(LOOKS, ALPHA)
    lines = [f"looks {LOOKS[0]}..{LOOKS[-1]}, alpha {ALPHA} two-sided, a store of {STORE_DF} df, {sims} runs a cell; "
             "false calls at hour ratio r (this hour's spread / the store's); power: -5% at 3% a start, r = 1", "",
             "| rule | sound up to r = | threshold | " + " | ".join(f"false, r = {r:g}" for r in SHOWN)
             + " | power at r = 1 |", "|---|---|---|" + "---|" * len(SHOWN) + "---|"]

    def row(name: str, bound: str, threshold: float, min_p: Callable[[np.ndarray], np.ndarray]) -> None:
        rates = [float((min_p(r * z) < threshold).mean()) for r in SHOWN]
        power = float((min_p(z + SHIFT) < threshold).mean())
        lines.append(f"| {name} | {bound} | {threshold:.3g} | " + " | ".join(f"{100 * x:.2f}%" for x in rates)
                     + f" | {100 * power:.1f}% |")

    row("own spread alone (the product)", "any", p_own, min_p_own)
    prior = noise_store.SpreadPrior(1.0, STORE_DF, 10, 0.0)
    p_store = noise_store.borrowed_threshold(LOOKS, ALPHA, prior)
    row("borrow where the store's is larger (opt-in)", "1 (hours like the store's)", p_store,
        lambda d: np.where(noise_store.borrowed_crossing(d, LOOKS, s0, STORE_DF, p_store, p_own), 0.0, 1.0))
    for pooled in (False, True):
        name = f"F-guarded, {'pooled at summed df' if pooled else 'max(stored, own) at stored df'}"
        by_ratio = {r: min_p_guarded(r * z, s0, pooled) for r in RATIOS}

        def guarded(d: np.ndarray, pooled: bool = pooled) -> np.ndarray:
            return min_p_guarded(d, s0, pooled)

        for bound in BOUNDS:
            threshold = min(float(np.quantile(by_ratio[r], ALPHA)) for r in RATIOS if r <= bound)
            row(name, f"{bound:g}", threshold, guarded)
    return "\n".join(lines)


if __name__ == "__main__":
    text = main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
    print(text)
    (Path(__file__).parent / "results.txt").write_text(text + "\n")
