"""The gate over server starts (search/sequential.py): error rates under repeated looks, power,
errors judged as rates, quality as a test on checks, and the stop rule of an interleaved run."""

from __future__ import annotations

import numpy as np

from search.ab import ABRun, SequentialPlan, SideResult, report_from_run, sequential_stop
from search.sequential import (
    compare_errors,
    compare_quality,
    compare_starts,
    sequential_p_threshold,
    settled,
)

METRIC = "w.output_tok_s"


def draw(rng: np.random.Generator, starts: int, runs: int, level: float, between: float,
         within: float) -> list[list[float]]:
    """Runs grouped by start: a start effect shared by its runs, plus run-to-run noise."""
    return [list(level * np.exp(rng.normal(0, between) + rng.normal(0, within, runs))) for _ in range(starts)]


def sequential_verdict(rng: np.random.Generator, ratio: float, looks: tuple[int, ...], threshold_looks: bool,
                       between: float = 0.02, within: float = 0.01) -> tuple[str, int]:
    a = draw(rng, looks[-1], 2, 100.0, between, within)
    b = draw(rng, looks[-1], 2, 100.0 * ratio, between, within)
    v = None
    for n in looks:
        v = compare_starts(METRIC, a[:n], b[:n], looks=looks if threshold_looks else None)
        if settled(v):
            return v.verdict, n
    assert v is not None
    return v.verdict, looks[-1]


def test_repeated_looks_keep_false_alarms_at_alpha_over_two() -> None:
    looks = tuple(range(3, 11))
    rng = np.random.default_rng(11)
    plan = [sequential_verdict(rng, 1.0, looks, True)[0] for _ in range(800)]
    rng = np.random.default_rng(11)
    naive = [sequential_verdict(rng, 1.0, looks, False)[0] for _ in range(800)]
    # alpha 0.02 two-sided: at most 1% false "regressed". Looking 8 times at the single-look
    # threshold is what this replaces: it alarms several times as often.
    assert plan.count("regressed") / len(plan) <= 0.015
    assert naive.count("regressed") > 2 * max(1, plan.count("regressed"))
    assert sequential_p_threshold(looks) < 0.02 / 2


def test_a_five_percent_slowdown_is_found_in_few_starts_at_low_noise() -> None:
    looks = tuple(range(3, 7))
    rng = np.random.default_rng(5)
    found = [sequential_verdict(rng, 0.95, looks, True, between=0.01, within=0.01) for _ in range(300)]
    assert sum(v == "regressed" for v, _ in found) / len(found) >= 0.95
    assert np.mean([n for _, n in found]) < 5


def test_a_start_effect_is_not_mistaken_for_precision() -> None:
    # Many runs per start, big start effect: pooling runs as if independent would "detect" the
    # start effect; the start-level test does not.
    rng = np.random.default_rng(3)
    a = draw(rng, 3, 20, 100.0, 0.05, 0.005)
    b = draw(rng, 3, 20, 100.0, 0.05, 0.005)
    v = compare_starts(METRIC, a, b)
    assert v.n_a == 3 and v.verdict in ("inconclusive", "unchanged") and v.ci_high / v.ci_low > 1.05


def test_error_rates_not_counts_decide() -> None:
    assert compare_errors("w.errors", 0, 100, 0, 100).verdict == "unchanged"
    assert compare_errors("w.errors", 0, 100, 1, 100).verdict == "unchanged"  # one error is no evidence
    assert compare_errors("w.errors", 0, 100, 5, 100).verdict == "inconclusive"  # suggestive, said so
    assert compare_errors("w.errors", 0, 100, 9, 100).verdict == "regressed"
    assert compare_errors("w.errors", 9, 100, 0, 100).verdict == "improved"
    assert compare_errors("w.errors", 5, 1000, 6, 1000).verdict == "unchanged"
    assert compare_errors("w.errors", 5, 1000, 25, 1000).verdict == "regressed"
    assert compare_errors("w.errors", 5, 100, 10, 1000).verdict == "improved"  # more errors, a lower rate


def test_quality_lost_checks_are_tested() -> None:
    names = [f"c{i}" for i in range(10)]
    a = {n: [True] for n in names}
    assert compare_quality(a, {**a, "c0": [False]})["verdict"] == "inconclusive"
    worse = compare_quality(a, {n: [i >= 8] for i, n in enumerate(names)})
    assert worse["verdict"] == "regressed" and len(worse["lost"]) == 8
    flaky = compare_quality({"c0": [True, False, True]}, {"c0": [True, True, True]})
    assert flaky["flaky"] == ["c0"] and flaky["verdict"] == "unchanged"


def abrun(a_runs: list[list[float]], b_runs: list[list[float]]) -> ABRun:
    sides = []
    for label, runs in (("A", a_runs), ("B", b_runs)):
        side = SideResult(label)
        side.runs[METRIC] = runs
        side.samples[METRIC] = [float(np.median(r)) for r in runs]
        side.samples["w.errors"] = [0.0] * len(runs)
        side.samples["w.requests"] = [4.0] * len(runs)
        sides.append(side)
    return ABRun(sides[0], sides[1], len(a_runs))


def test_stop_rule_and_report_use_the_same_plan() -> None:
    rng = np.random.default_rng(8)
    plan = SequentialPlan(metrics=(METRIC,), max_rounds=10)
    stop = sequential_stop(plan)
    a, b = draw(rng, 10, 2, 100.0, 0.01, 0.01), draw(rng, 10, 2, 80.0, 0.01, 0.01)
    assert stop(abrun(a[:2], b[:2])) is None  # before min_rounds
    run = abrun(a[:3], b[:3])
    reason = stop(run)
    assert reason and "regressed" in reason and run.looks == list(plan.looks)
    report = report_from_run(run, "t", [METRIC])
    v = next(v for v in report.verdicts if v.metric == METRIC)
    assert v.verdict == "regressed" and v.n_a == 3 and "looks at 3..10" in v.note
    errors = next(v for v in report.verdicts if v.metric == "w.errors")
    assert errors.verdict == "unchanged" and errors.n_a == 12
