"""Which question a verdict answers and which verdicts share a run's alpha (search/verdicts/sequential.py):
one-sided gates where the question is "is B worse?" (regress, nightly, bisect), two-sided for ab and claims, and
alpha only for the tests that can reject at their share (Tarone's rule for the error and quality counts)."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from scipy import special, stats

from search.regress.ab import ABRun, SequentialPlan, report_from_run, run_share, sequential_stop
from search.regress.bisect import bisect_verdict
from search.regress.sides import SideResult
from search.verdicts.boundaries import count_look_level, paired_p_threshold
from search.verdicts.sequential import compare_errors, compare_paired, family_share, least_error_p, least_quality_p

METRIC = "w.output_tok_s"
LOOKS = tuple(range(3, 11))


def null_min_one_sided_p(rng: np.random.Generator, sims: int, looks: tuple[int, ...], shift: float = 0.0) -> np.ndarray:
    """Per simulated run, the smallest one-sided p ("B lower") of the paired t test over the looks."""
    d = shift + rng.standard_normal((sims, looks[-1]))
    out = np.ones(sims)
    for n in looks:
        x = d[:, :n]
        out = np.minimum(out, special.stdtr(n - 1, x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(n))))
    return out


def test_a_one_sided_gate_calls_false_regressed_at_most_alpha_and_finds_more_than_a_two_sided_one() -> None:
    """Looks at 3..10, alpha 0.02: under no change the one-sided rule (the two-sided threshold at 2 alpha, one tail)
    calls "regressed" in at most alpha of 40,000 runs and spends it (at least 1.7%: the two-sided rule's false
    "regressed" is alpha / 2); a -5% change at 2% noise a start is found more often. The product's verdicts follow
    the simulated rule (checked on 60 runs)."""
    rng = np.random.default_rng(20261202)
    one = paired_p_threshold(LOOKS, 0.04) / 2
    two = paired_p_threshold(LOOKS, 0.02) / 2
    null = null_min_one_sided_p(rng, 40_000, LOOKS)
    assert 0.017 <= float((null < one).mean()) <= 0.022
    assert float((null < two).mean()) <= 0.012
    shift = math.log(0.95) / (math.sqrt(2) * 0.02)
    found = null_min_one_sided_p(rng, 40_000, LOOKS, shift)
    assert float((found < one).mean()) > float((found < two).mean()) + 0.02
    for i in range(60):
        d = math.log(0.98) + math.sqrt(2) * 0.02 * rng.standard_normal(LOOKS[-1])
        a, b = [[100.0] for _ in d], [[100.0 * math.exp(x)] for x in d]
        calls = [compare_paired(METRIC, a[:n], b[:n], looks=LOOKS, min_effect=0.0, sides=1).verdict == "regressed"
                 for n in LOOKS]
        t = [special.stdtr(n - 1, d[:n].mean() / (d[:n].std(ddof=1) / math.sqrt(n))) for n in LOOKS]
        expected = np.array(t) < one
        assert any(calls) == bool(expected.any()), i


def test_a_one_sided_verdict_says_so_and_keeps_unchanged_as_the_two_sided_equivalence_test() -> None:
    rng = np.random.default_rng(4)
    d = 0.004 * rng.standard_normal(6)
    a, b = [[100.0] for _ in d], [[100.0 * math.exp(x)] for x in d]
    one, two = (compare_paired(METRIC, a, b, looks=LOOKS, sides=s) for s in (1, 2))
    assert one.verdict == two.verdict == "unchanged"
    assert (one.ci_low, one.ci_high) == (two.ci_low, two.ci_high)  # the equivalence interval is the two-sided one
    assert "one-sided (is B worse?)" in one.describe() and "one-sided" not in two.describe()
    assert one.bound_low > one.ci_low and one.bound_high < one.ci_high  # each end at alpha, not alpha / 2
    # A slowdown the one-sided test finds and the two-sided one does not: regressed, with its bound said.
    t_between = float(special.stdtrit(2, 0.0033))  # one-sided p 0.0033: below the one-sided threshold, not half two's
    d = math.log(0.95) + math.log(0.95) * math.sqrt(3) / t_between * np.array([1.0, -1.0, 0.0])
    a, b = [[100.0] for _ in d], [[100.0 * math.exp(x)] for x in d]
    one, two = (compare_paired(METRIC, a, b, looks=LOOKS, sides=s) for s in (1, 2))
    assert one.p_value < paired_p_threshold(LOOKS, 0.04) / 2 and two.p_value >= paired_p_threshold(LOOKS, 0.02)
    assert (one.verdict, two.verdict) == ("regressed", "inconclusive")
    assert "at least" in one.sided_text and "worse" in one.sided_text
    # bisect's "not regressed" is the one-sided bound's: the same probe data, a bound above -5%.
    pattern = np.array([0.5, -1.0, 0.8, -0.3, 0.1, 0.6])
    pattern = (pattern - pattern.mean()) / pattern.std(ddof=1)
    t_one = float(special.stdtrit(5, 1 - paired_p_threshold(LOOKS, 0.04) / 2))
    d = 0.01 + 0.055 * math.sqrt(6) / t_one * pattern  # the one-sided bound at -4.5% (log), the two-sided below -5%
    a, b = [[100.0] for _ in d], [[100.0 * math.exp(x)] for x in d]
    v = compare_paired(METRIC, a, b, looks=LOOKS, min_effect=0.05, sides=1)
    assert v.verdict == "inconclusive" and v.ci_low < 0.95 < v.bound_low
    assert bisect_verdict(v) == "not regressed"
    assert bisect_verdict(compare_paired(METRIC, a, b, looks=LOOKS, min_effect=0.05)) == "inconclusive"


def side(errors: list[float], requests: list[float], values: list[float]) -> SideResult:
    return SideResult("s", samples={"w.errors": errors, "w.requests": requests},
                      runs={METRIC: [[v] for v in values]})


def test_a_count_that_cannot_reject_at_its_share_takes_none() -> None:
    """Tarone's rule: with no failed request the errors test's smallest p is 1, so the throughput verdict has the
    whole alpha; with failures that could be significant the two share it; quality with no differing check takes
    none. The stop rule and the report use the same share, and the report says so."""
    assert least_error_p(0, 30, 30) == 1.0
    assert least_error_p(8, 30, 30, sides=1) < 0.01 < least_error_p(4, 30, 30, sides=1)
    assert least_error_p(1, 30, 30, sides=1) == 0.5
    assert family_share(0.02, 1, [1.0]) == 0.02
    assert family_share(0.02, 1, [least_error_p(10, 30, 30, 1)], sides=1) == 0.01
    assert family_share(0.02, 1, [least_error_p(4, 30, 30, 1)], sides=1) == 0.02  # 4 failures can't reach 0.01
    assert family_share(0.02, 1, [least_error_p(1, 30, 30, 1), least_quality_p(0)], sides=1) == 0.02
    assert family_share(0.02, 2, [least_error_p(10, 30, 30, 2), least_quality_p(12)]) == 0.005
    values = [100.0, 101.0, 99.0, 100.5]
    quiet = ABRun(side([0] * 4, [10] * 4, values), side([0] * 4, [10] * 4, values), 4)
    assert run_share(quiet, [METRIC], 0.02, sides=1) == 0.02
    failing = ABRun(side([0] * 4, [10] * 4, values), side([3, 2, 4, 3], [10] * 4, values), 4)
    assert run_share(failing, [METRIC], 0.02, sides=1) == 0.01
    assert compare_errors("w.errors", 0, 40, 12, 40, alpha=0.01, sides=1).verdict == "regressed"
    note = next(n for n in report_from_run(quiet, "t", [METRIC], sides=1).notes if "alpha" in n)
    assert "one-sided" in note and "0.02 each (0.02/1: of the 2 gated verdicts" in note
    plan = SequentialPlan((METRIC,), max_rounds=4, sides=1)
    sequential_stop(plan)(quiet)
    assert quiet.looks == [3, 4]


@cache
def fisher_worse(errors_a: int, errors_b: int, requests: int) -> float:
    return float(stats.fisher_exact([[errors_b, requests - errors_b], [errors_a, requests - errors_a]],
                                    alternative="greater").pvalue)


def test_the_run_s_false_calls_stay_at_alpha_when_the_errors_test_joins_mid_run() -> None:
    """8,000 simulated regress runs (one-sided, alpha 0.02, looks 3..8, 10 requests a start a side), no change in
    throughput or failure rate, failures at 0%, 0.5%, 2% and 20% of requests (the first failure then comes early,
    mid-run or rarely at all; at 20% the errors test has its share from the first look): the share is re-decided at
    every look as the product does (`family_share` on `least_error_p`), the errors test judged at the share's
    per-look level (`count_look_level`), and a false call at any look counts (no stop: an upper bound on the run's
    own rate). At most alpha + Monte Carlo slack; at 0% the throughput verdict spends the whole alpha, not half of
    it."""
    rng = np.random.default_rng(7)
    looks, sims, per_start = tuple(range(3, 9)), 8_000, 10
    z = rng.standard_normal((sims, looks[-1]))
    for rate in (0.0, 0.005, 0.02, 0.2):
        ea = np.cumsum(rng.binomial(per_start, rate, (sims, looks[-1])), axis=1)
        eb = np.cumsum(rng.binomial(per_start, rate, (sims, looks[-1])), axis=1)
        false = np.zeros(sims, dtype=bool)
        for n in looks:
            x = z[:, :n]
            p_worse = special.stdtr(n - 1, x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(n)))
            requests = per_start * n
            for i in range(sims):
                a, b = int(ea[i, n - 1]), int(eb[i, n - 1])
                share = family_share(0.02, 1, [least_error_p(a + b, requests, requests, 1)], 1)
                false[i] |= bool(p_worse[i] < paired_p_threshold(looks, 2 * share) / 2) or (
                    b > a and fisher_worse(a, b, requests) < count_look_level(looks, share))
        assert float(false.mean()) <= 0.02 + 0.004, rate
        if rate == 0.0:
            assert float(false.mean()) >= 0.016


@cache
def errors_regressed(errors_a: int, errors_b: int, requests: int, looks: tuple[int, ...] | None) -> bool:
    return compare_errors("w.errors", errors_a, requests, errors_b, requests, alpha=0.01, sides=1,
                          looks=looks).verdict == "regressed"


def test_an_error_count_judged_at_every_look_keeps_its_share_over_the_run() -> None:
    """The errors test alone, as a regress run judges it at each look 3..8 (one-sided at a share of 0.01, 10 requests
    a start a side), no change in the failure rate (5% and 20% of requests): any false "regressed" over the looks in
    at most its share of 8,000 runs. Judged at the share at each look alone, 20% failures gave 1.6% (and the run's
    false calls 2.57% with throughput's): the looks are why the product judges at `count_look_level`."""
    rng = np.random.default_rng(11)
    looks, sims, per_start = tuple(range(3, 9)), 8_000, 10
    for rate in (0.05, 0.2):
        ea = np.cumsum(rng.binomial(per_start, rate, (sims, looks[-1])), axis=1)
        eb = np.cumsum(rng.binomial(per_start, rate, (sims, looks[-1])), axis=1)
        rates = {}
        for plan in (looks, None):
            false = [any(errors_regressed(int(ea[i, n - 1]), int(eb[i, n - 1]), per_start * n, plan) for n in looks)
                     for i in range(sims)]
            rates[plan] = float(np.mean(false))
        assert rates[looks] <= 0.01 + 0.0025, (rate, rates)
        if rate == 0.2:
            assert rates[None] > 0.013, rates  # the test this replaces: a level held at each look alone
    note = compare_errors("w.errors", 3, 60, 9, 60, alpha=0.01, sides=1, looks=looks).note
    assert "at each of the looks 3..8" in note and "at most 0.01" in note
