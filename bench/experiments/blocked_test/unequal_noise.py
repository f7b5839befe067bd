"""What pooling the arms' start noise in a confirmation cost where its assumption is wrong (the arms' starts
unequally noisy), and what the product's test does instead. Simulated confirmations of three arms
(default, top config, positive control) at looks after 3..6 rounds, alpha 0.02, arm 1 against the
default: the rule used until 2026-12-01 (each arm's spread the larger of its own and the pooled one,
judged at the pooled (K - 1)(n - 1) df with a threshold simulated under equal noise), the same with
the pooled df only where the pooled spread is the larger ("own at own df"), and the paired test that
search/verdicts/blocked.py now uses (each arm by its own differences, rounds - 1 df). Prints, per case,
how often arm 1 is called different (equal to the default, or 5% slower).

    python -m bench.experiments.blocked_test.unequal_noise [SIMS]   # 100000: ~40 s
"""

from __future__ import annotations

import math
import sys

import numpy as np

from search.verdicts.boundaries import paired_p_threshold

LOOKS = (3, 4, 5, 6)
ALPHA = 0.02
CASES = [  # name, arm 1's true log ratio to the default, each arm's start noise (log)
    ("equal noise 3%, no change", 0.0, (0.03, 0.03, 0.03)),
    ("equal noise 3%, arm 1 5% slower", math.log(0.95), (0.03, 0.03, 0.03)),
    ("(2%, 3%, 2%), no change", 0.0, (0.02, 0.03, 0.02)),
    ("(2%, 5%, 2%), no change", 0.0, (0.02, 0.05, 0.02)),
    ("(5%, 2%, 2%), no change", 0.0, (0.05, 0.02, 0.02)),
    ("(1.5%, 6%, 1.5%), no change", 0.0, (0.015, 0.06, 0.015)),
    ("(6%, 1.5%, 1.5%), no change", 0.0, (0.06, 0.015, 0.015)),
    ("(2%, 2%, 5%), no change", 0.0, (0.02, 0.02, 0.05)),
]
RULES = ("pooled (until 2026-12-01)", "own at own df", "paired (now)")


def min_p(x: np.ndarray, rule: str) -> np.ndarray:
    """The smallest p value over the looks of arm 1 against arm 0, x: sims x 3 arms x rounds (log)."""
    from scipy import special
    out = np.ones((x.shape[0], len(LOOKS)))
    for i, n in enumerate(LOOKS):
        y = x[:, :, :n]
        resid = y - y.mean(axis=2, keepdims=True) - y.mean(axis=1, keepdims=True) + y.mean(axis=(1, 2), keepdims=True)
        df = (x.shape[1] - 1) * (n - 1)
        pooled = np.sqrt(2 * (resid ** 2).sum(axis=(1, 2)) / df)
        d = y[:, 1] - y[:, 0]
        own, mean = d.std(axis=1, ddof=1), d.mean(axis=1)
        p_own = 2 * special.stdtr(n - 1, -np.abs(mean / (own / math.sqrt(n))))
        if rule == RULES[0]:
            out[:, i] = 2 * special.stdtr(df, -np.abs(mean / (np.maximum(own, pooled) / math.sqrt(n))))
        elif rule == RULES[1]:
            out[:, i] = np.where(own >= pooled, p_own, 2 * special.stdtr(df, -np.abs(mean / (pooled / math.sqrt(n)))))
        else:
            out[:, i] = p_own
    return out.min(axis=1)


def main(sims: int) -> None:
    rng = np.random.default_rng(2026_12_01)
    null = rng.standard_normal((sims, 3, LOOKS[-1]))
    thresholds = {rule: float(np.quantile(min_p(null, rule), ALPHA)) for rule in RULES[:2]}
    thresholds[RULES[2]] = paired_p_threshold(LOOKS, ALPHA)
    print(f"{sims} confirmations a case; thresholds (simulated under equal noise; the paired one stored): "
          + ", ".join(f"{r} {t:.4f}" for r, t in thresholds.items()) + "\n")
    print("| case | " + " | ".join(RULES) + " |\n|---|---|---|---|")
    for name, effect, scale in CASES:
        x = rng.standard_normal((sims, 3, LOOKS[-1])) * np.array(scale)[None, :, None]
        x[:, 1, :] += effect
        rates = [float((min_p(x, rule) < thresholds[rule]).mean()) for rule in RULES]
        print(f"| {name} | " + " | ".join(f"{r:.4f}" for r in rates) + " |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
