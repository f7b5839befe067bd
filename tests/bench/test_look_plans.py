"""bench.experiments.look_plans: the vectorised gate agrees with the product's gate, and the O'Brien-Fleming
boundary finds a small change within the cap more often than Pocock at the same false-alarm rate."""

from __future__ import annotations

import numpy as np
import pytest

from bench.calibrate.gate import sequential
from bench.experiments.look_plans import run as lp

LOOKS = tuple(range(3, 11))


@pytest.mark.slow  # a benchmark's agreement with the product over many simulated runs
def test_the_vectorised_gate_matches_the_product_s_on_the_same_noise() -> None:
    rng = np.random.default_rng(4)
    fast = lp.run_plan(LOOKS, lp.p_thresholds(LOOKS, "pocock", lp.ALPHA), 0.03, 0.05, 20_000, rng)
    found = 0
    for _ in range(200):  # the product's own stop rule and report, start by start
        a = [[100.0 * float(np.exp(rng.normal(0, 0.03)))] for _ in range(10)]
        b = [[95.0 * float(np.exp(rng.normal(0, 0.03)))] for _ in range(10)]
        found += sequential("single.output_tok_s", a, b, 10).verdict == "regressed"
    assert abs(found / 200 - fast["regressed"]) < 0.1  # 200 runs (seeded): sd of the rate ~0.035


def test_obrien_fleming_finds_five_percent_more_often_and_twenty_percent_later() -> None:
    rng = np.random.default_rng(6)
    pocock, obf = lp.p_thresholds(LOOKS, "pocock", lp.ALPHA), lp.p_thresholds(LOOKS, "obf", lp.ALPHA)
    small = [lp.run_plan(LOOKS, p, 0.021, 0.05, 20_000, rng) for p in (pocock, obf)]
    large = [lp.run_plan(LOOKS, p, 0.021, 0.20, 20_000, rng) for p in (pocock, obf)]
    null = [lp.run_plan(LOOKS, p, 0.021, 0.0, 40_000, rng) for p in (pocock, obf)]
    assert small[1]["regressed"] > small[0]["regressed"] + 0.05
    assert large[1]["starts"] > large[0]["starts"] and large[1]["regressed"] > 0.99
    assert all(n["regressed"] < 0.01 for n in null)
