"""bench.experiments.gate_power.starts: the gate's starts per side for 95% power at -5% beside a known-noise z
test's; its vectorised gate is the product's (compare_paired, stopped at the first settled look)."""

from __future__ import annotations

import math

import numpy as np

from bench.experiments.gate_power import starts
from search.verdicts.sequential import compare_paired


def test_the_simulated_gate_is_the_products_and_needs_more_starts_than_a_known_noise_test() -> None:
    rng = np.random.default_rng(1)
    # 200 runs at 1.08% a start, looks 3..6, alpha 0.02: the product's calls (min_effect 0, so a crossing is a
    # call) match the vectorised rule's.
    found_product = 0
    for _ in range(200):
        a = [[100 * math.exp(rng.normal(0, 0.0108))] for _ in range(6)]
        b = [[95 * math.exp(rng.normal(0, 0.0108))] for _ in range(6)]
        for n in range(3, 7):
            v = compare_paired("w.output_tok_s", a[:n], b[:n], looks=tuple(range(3, 7)), min_effect=0.0)
            if v.verdict != "inconclusive":
                break
        found_product += v.verdict == "regressed"
    assert starts.gate_starts(0.0108, 0.02, 20_000, np.random.default_rng(2)) == 6
    # at cap 6 the vectorised rule finds it in >= 95% of runs: so does the product, within the draws' spread
    assert found_product >= 180, found_product
    assert starts.z_starts(0.0108, 20_000, np.random.default_rng(3)) == 2
    # Closed form of the z test: 2 sd^2 (z_0.99 + z_0.95)^2 / ln(1/0.95)^2 rounds.
    closed = 2 * 0.0328 ** 2 * (2.3263 + 1.6449) ** 2 / math.log(1 / 0.95) ** 2
    assert starts.z_starts(0.0328, 20_000, np.random.default_rng(4)) == math.ceil(closed)
