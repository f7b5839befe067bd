"""A regress run's false calls when an error count takes a share of alpha only where it can reject at it (Tarone's
rule, search/verdicts/sequential.py `family_share`), the share re-decided at every look as the product does.

Throughput (the paired one-sided t test, looks 3..8, alpha 0.02) and one workload's error count (Fisher's test at
its share, judged at the share's per-look level `count_look_level` as the product does; the last column judges it at
the share at each look alone, as the product did before), 10 requests a start a side, no change in either; a false
call at any look counts (no stop: an upper bound on a run's own rate, which stops only once every gated verdict is
settled).

    nice -n 10 python -m bench.experiments.family_share.run [SIMS]   # 20000: ~10 s
"""

from __future__ import annotations

import math
import sys
from functools import cache

import numpy as np
from scipy import special, stats

from search.verdicts.boundaries import count_look_level, paired_p_threshold
from search.verdicts.sequential import family_share, least_error_p

LOOKS = tuple(range(3, 9))
ALPHA = 0.02
PER_START = 10
RATES = (0.0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.2)


@cache
def fisher_worse(errors_a: int, errors_b: int, requests: int) -> float:
    return float(stats.fisher_exact([[errors_b, requests - errors_b], [errors_a, requests - errors_a]],
                                    alternative="greater").pvalue)


def main(sims: int) -> None:
    rng = np.random.default_rng(3)
    z = rng.standard_normal((sims, LOOKS[-1]))
    print(f"{sims} null runs a row, looks {LOOKS[0]}..{LOOKS[-1]}, alpha {ALPHA} one-sided, {PER_START} requests a "
          "start a side\n\n| failed requests | any false call | of it the throughput verdict | any false call, errors "
          "at the share at each look alone |\n|---|---|---|---|")
    for rate in RATES:
        ea = np.cumsum(rng.binomial(PER_START, rate, (sims, LOOKS[-1])), axis=1)
        eb = np.cumsum(rng.binomial(PER_START, rate, (sims, LOOKS[-1])), axis=1)
        false, throughput = np.zeros(sims, dtype=bool), np.zeros(sims, dtype=bool)
        per_look_alone = np.zeros(sims, dtype=bool)
        for n in LOOKS:
            x = z[:, :n]
            p_worse = special.stdtr(n - 1, x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(n)))
            requests = PER_START * n
            for i in range(sims):
                a, b = int(ea[i, n - 1]), int(eb[i, n - 1])
                share = family_share(ALPHA, 1, [least_error_p(a + b, requests, requests, 1)], 1)
                hit = bool(p_worse[i] < paired_p_threshold(LOOKS, 2 * share) / 2)
                throughput[i] |= hit
                p_errors = fisher_worse(a, b, requests) if b > a else 1.0
                false[i] |= hit or p_errors < count_look_level(LOOKS, share)
                per_look_alone[i] |= hit or p_errors < share
        print(f"| {100 * rate:g}% | {100 * false.mean():.2f}% | {100 * throughput.mean():.2f}% | "
              f"{100 * per_look_alone.mean():.2f}% |", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
