"""What the confirmation's blocked test (search/verdicts/blocked.py) costs where its assumption is wrong: the
arms' starts unequally noisy. Simulated confirmations of three arms (default, top config, positive
control) at the demo's plan (looks at 3 and 4 rounds, alpha 0.02), the product's statistic and
stored threshold, against the paired test's on the same draws; prints, per case, how often arm 1
(equal to the default, or 10% slower) is called different.

    python -m bench.experiments.blocked_test.unequal_noise [SIMS]   # 100000: ~2 s
"""

from __future__ import annotations

import math
import sys

import numpy as np

from search.verdicts.boundaries import blocked_p_threshold, p_values, paired_p_threshold

LOOKS = (3, 4)
ALPHA = 0.02
START_SD = 0.03 * math.sqrt(1 + 1 / 3)  # a start: 3% of its own, three runs of 3% averaged
CASES = [  # name, arm 1's true log ratio to the default, each arm's start noise x START_SD
    ("equal noise, no change", 0.0, (1.0, 1.0, 1.0)),
    ("equal noise, arm 1 10% slower", math.log(0.9), (1.0, 1.0, 1.0)),
    ("arm 1 twice as noisy, no change", 0.0, (1.0, 2.0, 1.0)),
    ("default twice as noisy, no change", 0.0, (2.0, 1.0, 1.0)),
    ("the other arm 3.3x quieter, no change", 0.0, (1.0, 1.0, 0.3)),
    ("the other arm 3x noisier, no change", 0.0, (1.0, 1.0, 3.0)),
]


def paired_p(x: np.ndarray) -> np.ndarray:
    """The paired test's p values (arm 1 against arm 0, its own n - 1 degrees of freedom) per look."""
    from scipy import special
    out = np.ones((x.shape[0], len(LOOKS)))
    for i, n in enumerate(LOOKS):
        d = x[:, 1, :n] - x[:, 0, :n]
        out[:, i] = 2 * special.stdtr(n - 1, -np.abs(d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))))
    return out


def main(sims: int) -> None:
    rng = np.random.default_rng(2026_11_29)
    blocked_star, paired_star = blocked_p_threshold(LOOKS, ALPHA, 3), paired_p_threshold(LOOKS, ALPHA)
    print(f"{sims} confirmations a case; thresholds: blocked {blocked_star:.4f}, paired {paired_star:.4f}\n")
    print("| case | called different: blocked | paired |\n|---|---|---|")
    for name, effect, scale in CASES:
        x = rng.standard_normal((sims, 3, LOOKS[-1])) * START_SD * np.array(scale)[None, :, None]
        x[:, 1, :] += effect
        blocked = float((p_values(x, LOOKS).min(axis=1) < blocked_star).mean())
        paired = float((paired_p(x).min(axis=1) < paired_star).mean())
        print(f"| {name} | {blocked:.4f} | {paired:.4f} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
