"""The gate over server starts (search/verdicts/sequential.py): error rates under repeated looks, power,
errors judged as rates, quality as a test on checks, and the stop rule of an interleaved run."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from scipy import special

from search.regress.ab import ABRun, SequentialPlan, report_from_run, sequential_stop
from search.regress.gate_report import GateReport
from search.regress.sides import SideResult
from search.verdicts.boundaries import (
    BOUNDARIES,
    OBF_SECTION,
    _null_paired_p,
    _obf_constant,
    _simulate_paired,
    look_p_threshold,
    obrien_fleming_thresholds,
    paired_p_threshold,
    sequential_p_threshold,
)
from search.verdicts.gate import MetricVerdict
from search.verdicts.sequential import (
    compare_errors,
    compare_paired,
    compare_quality,
    compare_starts,
    rounds_needed,
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
    return first_settled(lambda n: compare_starts(METRIC, a[:n], b[:n], looks=looks if threshold_looks else None),
                         looks)


def first_settled(judge: Callable[[int], MetricVerdict], looks: tuple[int, ...]) -> tuple[str, int]:
    """The sequential run: the verdict at the first look that settles it, else at the last look."""
    v = None
    for n in looks:
        v = judge(n)
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
    a, b = draw(rng, 10, 2, 100.0, 0.003, 0.003), draw(rng, 10, 2, 80.0, 0.003, 0.003)
    assert stop(abrun(a[:2], b[:2])) is None  # before min_rounds
    run = abrun(a[:3], b[:3])
    reason = stop(run)
    assert reason and "regressed" in reason and run.looks == list(plan.looks)
    report = report_from_run(run, "t", [METRIC])
    v = next(v for v in report.verdicts if v.metric == METRIC)
    assert v.verdict == "regressed" and v.n_a == 3 and "looks at 3..10" in v.note
    errors = next(v for v in report.verdicts if v.metric == "w.errors")
    assert errors.verdict == "unchanged" and errors.n_a == 12


def drifting_rounds(rng: np.random.Generator, rounds: int, ratio: float, shared: float, per_start: float,
                    within: float = 0.01, runs: int = 3) -> tuple[list[list[float]], list[list[float]]]:
    """Both sides measured in the same rounds: a round moves both by one shared shift (the time of
    day on a shared machine), each start adds its own error, each run its own."""
    a, b = [], []
    for _ in range(rounds):
        shift = rng.normal(0, shared)
        a.append(list(100.0 * np.exp(shift + rng.normal(0, per_start) + rng.normal(0, within, runs))))
        b.append(list(100.0 * ratio * np.exp(shift + rng.normal(0, per_start) + rng.normal(0, within, runs))))
    return a, b


def paired_sequential(rng: np.random.Generator, ratio: float, looks: tuple[int, ...], shared: float,
                      per_start: float, alpha: float = 0.02) -> tuple[str, int]:
    a, b = drifting_rounds(rng, looks[-1], ratio, shared, per_start)
    return first_settled(lambda n: compare_paired(METRIC, a[:n], b[:n], looks=looks, alpha=alpha), looks)


def test_paired_sequential_false_alarms_stay_at_alpha_over_two_under_drift() -> None:
    looks = tuple(range(3, 11))
    rng = np.random.default_rng(21)
    calls = [paired_sequential(rng, 1.0, looks, shared=0.086, per_start=0.02)[0] for _ in range(1000)]
    assert calls.count("regressed") / len(calls) <= 0.015  # alpha 0.02 two-sided
    # the threshold comes from the table stored with the code, and a fresh simulation agrees with it
    stored = json.loads(BOUNDARIES.read_text())["thresholds"]
    assert stored["0.02|3,4,5,6,7,8,9,10"] == paired_p_threshold(looks, 0.02)
    assert paired_p_threshold(looks, 0.02) == pytest.approx(_simulate_paired(looks, 0.02, sims=100_000, seed=3),
                                                             rel=0.1)


def test_pairing_removes_the_drift_that_an_unpaired_test_counts_as_noise() -> None:
    # The round component measured on the CPU (~8.6%, shared by both arms) swamps a 5% change for a
    # two-sample test over starts; the within-round difference does not see it.
    rng = np.random.default_rng(4)
    found_paired = found_unpaired = 0
    for _ in range(200):
        a, b = drifting_rounds(rng, 8, 0.95, shared=0.086, per_start=0.01)
        found_paired += compare_paired(METRIC, a, b).verdict == "regressed"
        found_unpaired += compare_starts(METRIC, a, b).verdict == "regressed"
    assert found_paired / 200 >= 0.9 and found_unpaired / 200 <= 0.3


def test_a_paired_verdict_states_its_level_and_what_it_could_see() -> None:
    rng = np.random.default_rng(2)
    a, b = drifting_rounds(rng, 6, 1.0, shared=0.05, per_start=0.01)
    v = compare_paired(METRIC, a, b, looks=tuple(range(3, 7)))
    # Looks at 3..6 rounds: a repeated 98% interval (it holds at whichever look stops), as wide as one of 1 - p*.
    assert v.paired and v.n_a == 6 and v.level == pytest.approx(0.98) and v.look_level > 0.99
    assert 0 < v.mde < 0.1 and "could detect" in v.describe() and "98% repeated CI" in v.describe()
    assert "shared by a round" in v.note and "removed by pairing" in v.note
    five = compare_paired(METRIC, *drifting_rounds(rng, 6, 0.9, shared=0.05, per_start=0.005))
    assert five.verdict == "regressed" and five.sensitivity() == ""
    # The report's "could detect" column: filled for the "no difference" answer only (beside a settled
    # change a detectable size larger than the change found reads as a contradiction).
    table = GateReport("ab", "A", "B", [v, replace(five, metric="w.other")]).markdown()
    cells = {row.split(" | ")[0]: row.split(" | ")[-2] for row in table.splitlines() if row.startswith("| w.")}
    assert v.verdict in ("unchanged", "inconclusive") and cells[f"| {METRIC}"] == f"±{100 * v.mde:.1f}%", cells
    assert cells["| w.other"] == "-", cells


def test_an_unsettled_verdict_names_the_lever_that_narrows_it() -> None:
    """More runs per start can help only while a start's spread is its runs'; where the starts themselves differ
    (a small model on a fast GPU: 2% per start whatever the window, docs/measurement.md), only rounds do. On
    that GPU the 256-token runs' 4.8% spread hid the starts' 2% (bench/data/gpu_noise_1b_*.json), hence "may"."""
    means_a, means_b = [100, 104, 97, 102, 99, 103], [101, 97, 104, 98, 103, 99]
    noisy_runs = compare_paired(METRIC, [[m * 0.8, m, m * 1.2] for m in means_a],
                                [[m * 0.8, m, m * 1.2] for m in means_b])
    assert noisy_runs.verdict == "inconclusive" and "rounds would settle" in noisy_runs.note
    assert "more runs per start (--repeats) or longer outputs may narrow it" in noisy_runs.note
    differing_starts = compare_paired(METRIC, [[m * 0.999, m, m * 1.001] for m in means_a],
                                      [[m * 0.999, m, m * 1.001] for m in means_b])
    assert differing_starts.verdict == "inconclusive"
    assert "the starts themselves differ" in differing_starts.note and "more rounds will" in differing_starts.note


def test_more_runs_are_priced_in_rounds_unless_the_runs_level_moves_within_a_start() -> None:
    """Where runs are the lever, the note says what twice and four times the runs would need, from the two parts
    it measured. That assumes a start's runs are independent draws around its level; on the 2-core VM 8-run
    vLLM-CPU starts showed their halves differing beyond the runs' spread (F 3.4, p 2e-5: the host's speed
    changes over tens of seconds, bench/data/calibration_vllm_cpu_zen4_r8.json), and then no price is given."""
    rng = np.random.default_rng(3)
    a, b = drifting_rounds(rng, 6, 1.0, shared=0.02, per_start=0.002, within=0.035, runs=4)
    v = compare_paired(METRIC, a, b)
    assert v.verdict == "inconclusive", v.note
    now = int(re.search(r"about (\d+) rounds would settle", v.note).group(1))
    more = {int(n): int(r) for n, r in re.findall(r"--repeats (\d+): about (\d+) rounds", v.note)}
    assert set(more) == {8, 16} and more[16] <= more[8] < now, v.note
    # The same spread, but each start's level steps by 8% between its first and second pair of runs.
    stepped = [[x * (1.08 if (r + i // 2) % 2 else 1.0) for i, x in enumerate(runs)] for r, runs in enumerate(b)]
    moved = compare_paired(METRIC, [[x * (1.08 if i // 2 else 1.0) for i, x in enumerate(runs)] for runs in a],
                           stepped)
    assert "the runs' level moved within starts" in moved.note and "--repeats 8" not in moved.note, moved.note


def test_a_difference_that_moves_over_the_rounds_is_named_and_a_steady_one_is_not() -> None:
    """The demo's winner, confirmed over 13 rounds, led by 1.16x in the first two and 1.11x in the last two; the
    interval (1.11-1.14) was the average. The note says so; the verdict is left as the test gave it."""
    rng = np.random.default_rng(5)
    a, b = drifting_rounds(rng, 13, 1.0, shared=0.03, per_start=0.01)
    fading = [[v * 1.16 * 0.996 ** r for v in runs] for r, runs in enumerate(b)]  # the lead falls 0.4% a round
    moving = compare_paired(METRIC, a, fading)
    steady = compare_paired(METRIC, a, [[v * 1.13 for v in runs] for runs in b])
    assert moving.verdict == steady.verdict == "improved"
    found = re.search(r"moved over the rounds \(([-+]\d+\.\d+)% a round", moving.note)
    assert found and -0.6 < float(found.group(1)) < -0.2, moving.note
    assert "moved over the rounds" not in steady.note, steady.note
    # Too few rounds to tell a trend from noise: not looked for.
    assert "moved over the rounds" not in compare_paired(METRIC, a[:5], fading[:5]).note
    # Under no trend the caution appears in about its nominal 5% of long comparisons, not more.
    notes = sum("moved over the rounds" in compare_paired(METRIC, *drifting_rounds(rng, 10, 1.0, 0.03, 0.01)).note
                for _ in range(100))
    assert notes <= 12, notes


def crossed(d: np.ndarray, looks: range, p_star: float) -> np.ndarray:
    """Which simulated paired runs (rows of round differences) cross p_star at any of these looks."""
    from scipy import special

    hit = np.zeros(len(d), dtype=bool)
    for n in looks:
        x = d[:, :n]
        hit |= 2 * special.stdtr(n - 1, -np.abs(x.mean(axis=1) / (x.std(axis=1, ddof=1) / np.sqrt(n)))) < p_star
    return hit


def sequential_power(sd: float, effect: float, alpha: float, rounds: int, first: int = 3,
                     sims: int = 20_000) -> float:
    """The share of simulated paired runs (looks at first..rounds, that plan's threshold) that find a
    change of `effect` at this spread of within-round differences."""
    p_star = paired_p_threshold(tuple(range(first, rounds + 1)), alpha)
    d = np.random.default_rng(5).standard_normal((sims, rounds)) * sd + np.log1p(effect)
    return float(crossed(d, range(first, rounds + 1), p_star).mean())


@pytest.mark.parametrize("sd", [0.0368, 0.056])
def test_the_rounds_promised_have_the_power_they_promise(sd: float) -> None:
    """The demos' control (11.1%) at the round spreads of demos L (3.7%) and H (5.6%): the count the
    answer promises finds it about 95% of the time in the sequential plan the command runs, one round
    fewer does not (a normal approximation promised 4 and 6 rounds: 64% and 65% power)."""
    need = rounds_needed(sd, 0.1111, 0.02)
    assert need is not None
    assert sequential_power(sd, 0.1111, 0.02, need) >= 0.94
    assert sequential_power(sd, 0.1111, 0.02, need - 1) < 0.95
    assert rounds_needed(0.5, 0.03, 0.02) is None  # beyond the longest stored plan: said, not guessed
    # A continuation after 4 rounds (looks at 5..N on all rounds so far, search/confirm/confirm.py): the same.
    more = rounds_needed(sd, 0.1111, 0.02, first=5)
    assert more is not None and more >= 5
    assert sequential_power(sd, 0.1111, 0.02, more, first=5) >= 0.94
    if more > 5:
        assert sequential_power(sd, 0.1111, 0.02, more - 1, first=5) < 0.95


def test_a_continued_stage_keeps_its_own_false_alarms_at_alpha() -> None:
    """The second stage of a confirmation (looks at 5..9 on all rounds so far, after a first stage
    of 3..4 that did not cross) calls a false change in at most alpha of null runs on its own; with
    the first stage's, at most 2 alpha (the bound the answer states)."""
    d = np.random.default_rng(8).standard_normal((40_000, 9))
    first_p, second_p = paired_p_threshold((3, 4), 0.02), paired_p_threshold(tuple(range(5, 10)), 0.02)
    first, second = crossed(d, range(3, 5), first_p), crossed(d, range(5, 10), second_p)
    assert second.mean() <= 0.023 and (first | second).mean() <= 0.042


def test_a_plan_with_chosen_looks_stops_only_there_and_says_so() -> None:
    rng = np.random.default_rng(8)
    plan = SequentialPlan(metrics=(METRIC,), max_rounds=10, looks_at=(5,))
    assert plan.looks == (5, 10)
    stop = sequential_stop(plan)
    a, b = draw(rng, 10, 2, 100.0, 0.003, 0.003), draw(rng, 10, 2, 80.0, 0.003, 0.003)
    assert stop(abrun(a[:3], b[:3])) is None and stop(abrun(a[:4], b[:4])) is None  # -20%, but no look yet
    run = abrun(a[:5], b[:5])
    assert "regressed" in (stop(run) or "") and run.looks == [5, 10]
    v = next(v for v in report_from_run(run, "t", [METRIC]).verdicts if v.metric == METRIC)
    assert v.verdict == "regressed" and "looks at 5, 10 rounds" in v.note
    # two looks spend the false-alarm budget on fewer chances than eight: a laxer threshold at each
    every = SequentialPlan(metrics=(METRIC,), max_rounds=10)
    assert paired_p_threshold(plan.looks) > paired_p_threshold(every.looks)


def test_an_obrien_fleming_plan_spends_little_early_and_nearly_all_at_the_last_look() -> None:
    looks = tuple(range(3, 11))
    obf = obrien_fleming_thresholds(looks, 0.01)
    pocock = paired_p_threshold(looks, 0.01)
    assert list(obf) == sorted(obf) and obf[0] < pocock / 10 and pocock < obf[-1] < 0.01
    # the plan's false-alarm rate is alpha on fresh null draws, not the ones it was set on
    d = np.random.default_rng(99).standard_normal((100_000, 10))
    crossed = np.zeros(d.shape[0], dtype=bool)
    for k, p_star in zip(looks, obf, strict=True):
        t = d[:, :k].mean(axis=1) / (d[:, :k].std(axis=1, ddof=1) / np.sqrt(k))
        crossed |= 2 * special.stdtr(k - 1, -np.abs(t)) < p_star
    assert 0.008 < crossed.mean() < 0.012
    # a look between two of the plan's (a run stopped early) takes the last look passed
    assert look_p_threshold((3, 6, 10), 8, 0.01, boundary="obrien-fleming") == \
        obrien_fleming_thresholds((3, 6, 10), 0.01)[1]
    # the usual plans' constants are stored with the code, and a fresh simulation agrees with them exactly
    stored = json.loads(BOUNDARIES.read_text())[OBF_SECTION]
    assert stored["0.01|3,4,5,6,7,8,9,10"] == _obf_constant(_null_paired_p(looks), looks, 0.01)
    assert "0.01|3,6,10" not in stored  # another plan is simulated on first use


def test_a_verdict_on_the_obrien_fleming_boundary_carries_its_look_s_level_and_says_so() -> None:
    rng = np.random.default_rng(5)
    a, b = draw(rng, 10, 3, 100.0, 0.01, 0.01), draw(rng, 10, 3, 96.0, 0.01, 0.01)
    looks = tuple(range(3, 11))
    early = compare_paired(METRIC, a[:3], b[:3], looks=looks, boundary="obrien-fleming")
    last = compare_paired(METRIC, a, b, looks=looks, boundary="obrien-fleming")
    pocock = compare_paired(METRIC, a, b, looks=looks)
    thresholds = obrien_fleming_thresholds(looks, 0.02)
    assert math.isclose(early.look_level, 1 - thresholds[0]) and math.isclose(last.look_level, 1 - thresholds[-1])
    assert early.level == last.level == pytest.approx(0.98)  # the plan's repeated level, at either look
    assert "O'Brien-Fleming" in last.note and "O'Brien-Fleming" not in pocock.note
    assert last.ci_high - last.ci_low < pocock.ci_high - pocock.ci_low  # the last look is laxer than Pocock's
    run = abrun(a, b)
    plan = SequentialPlan(metrics=(METRIC,), max_rounds=10, boundary="obrien-fleming")
    sequential_stop(plan)(run)
    assert run.to_dict()["boundary"] == "obrien-fleming"
    report = report_from_run(run, "t", [METRIC])
    assert any("O'Brien-Fleming" in n for n in report.notes)


def test_a_report_cut_before_a_strict_first_look_is_wide_not_an_error() -> None:
    # 2 rounds (1 degree of freedom) at the O'Brien-Fleming first look of 3..12: a t quantile near 1e5
    v = compare_paired(METRIC, [[100.0], [101.0]], [[98.0], [100.5]], looks=tuple(range(3, 13)),
                       boundary="obrien-fleming")
    assert v.verdict == "inconclusive" and v.ci_high == math.inf and v.mde == math.inf


def paired_paths(rng: np.random.Generator, sims: int, rounds: int, effect: float, sd: float) -> np.ndarray:
    """sims x rounds within-round log differences of a paired run: a true effect, each round's difference sd."""
    return effect + sd * rng.standard_normal((sims, rounds))


def test_the_interval_at_the_look_that_stopped_the_run_covers_as_labelled() -> None:
    """Looks at 3..10 rounds, alpha 0.01, 40,000 simulated runs a case stopped at the first look the product's
    rule settles (a crossing, or the interval inside +-3%): the interval at that look covers the true ratio in
    at least its label's 99% (minus the simulation's 0.15%), for no change, a -5% and a -2% change at 4.2% a
    round. One look's 1 - p* (99.8%), the label before, is not what it covers. The simulated intervals are the
    product's: checked against compare_paired on 50 runs."""
    from scipy import special as sp
    looks, alpha, sd = tuple(range(3, 11)), 0.01, 0.042
    rng = np.random.default_rng(20261201)
    p_star = paired_p_threshold(looks, alpha)
    for effect in (0.0, math.log(0.95), math.log(0.98)):
        d = paired_paths(rng, 40_000, looks[-1], effect, sd)
        covered = np.zeros(d.shape[0], dtype=bool)
        alive = np.ones(d.shape[0], dtype=bool)
        for n in looks:
            mean, se = d[:, :n].mean(axis=1), d[:, :n].std(axis=1, ddof=1) / math.sqrt(n)
            half = float(sp.stdtrit(n - 1, 1 - p_star / 2)) * se
            low, high = np.exp(mean - half), np.exp(mean + half)
            p = 2 * sp.stdtr(n - 1, -np.abs(mean) / se)
            stop = alive & ((p < p_star) | ((low > 0.97) & (high < 1.03)) | (n == looks[-1]))
            covered |= stop & (mean - half <= effect) & (effect <= mean + half)
            alive &= ~stop
        assert covered.mean() >= 1 - alpha - 0.0015, (effect, covered.mean())
        if effect == 0.0:
            assert covered.mean() < 1 - p_star - 0.001  # the old label overstated it
    a = [[100.0] for _ in range(10)]
    for i in range(50):
        b = [[float(100 * math.exp(x))] for x in d[i]]
        v = compare_paired(METRIC, a[:6], b[:6], looks=looks, alpha=alpha, min_effect=0.03)
        half = float(sp.stdtrit(5, 1 - p_star / 2)) * d[i, :6].std(ddof=1) / math.sqrt(6)
        assert v.level == pytest.approx(0.99) and v.ci_low == pytest.approx(math.exp(d[i, :6].mean() - half))


def test_a_change_found_early_is_reported_with_its_size_corrected_for_the_stop() -> None:
    """A true -5% at 3% start noise (one run a start), looks at 3..10 rounds, alpha 0.02: the "regressed"
    calls' raw estimate is exaggerated (the run stops when the difference happens to look large), the
    corrected one (median-unbiased for the plan) is not. 200 simulated runs through compare_paired."""
    rng = np.random.default_rng(7)
    looks = tuple(range(3, 11))
    raw, corrected = [], []
    for _ in range(200):
        a = [[100 * math.exp(rng.normal(0, 0.03))] for _ in range(10)]
        b = [[95 * math.exp(rng.normal(0, 0.03))] for _ in range(10)]
        v = next(v for n in looks if (v := compare_paired(METRIC, a[:n], b[:n], looks=looks)).verdict !=
                 "inconclusive" or n == looks[-1])
        if v.verdict == "regressed":
            raw.append(v.ratio)
            corrected.append(v.ratio_adjusted)
            assert "corrected for that" in v.note and "corrected for the early stop" in v.describe()
    assert len(raw) >= 100
    assert float(np.median(raw)) < 0.945, np.median(raw)  # exaggerated: -5.5% or more for a true -5%
    assert abs(float(np.median(corrected)) - 0.95) < 0.004, np.median(corrected)


def test_an_error_count_that_saw_no_excess_says_what_it_could_have_seen() -> None:
    """30 requests a side, none failed on A: a 10% failure rate on B is called "unchanged" most of the time,
    so "unchanged" says what it could have seen: the failure rate found with 95% power, checked by
    simulation (at that rate the test calls "regressed" in at least 95% of 20,000 draws, at half of it
    far less often). A test that no count can make significant says so."""
    rng = np.random.default_rng(3)
    v = compare_errors("w.errors", 0, 30, 0, 30, alpha=0.02)
    assert v.verdict == "unchanged" and v.sensitivity().startswith("no excess seen in 30 requests")
    rate = float(re.search(r"failure rate of ([\d.]+)%", v.sensitivity()).group(1)) / 100  # type: ignore[union-attr]
    ten = [compare_errors("w.errors", 0, 30, int(k), 30, alpha=0.02).verdict for k in rng.binomial(30, 0.1, 400)]
    assert ten.count("unchanged") > 200  # the case the wording is for
    from scipy import stats as sps
    k_min = min(k for k in range(31) if compare_errors("w.errors", 0, 30, k, 30, alpha=0.02).verdict == "regressed")
    assert (rng.binomial(30, rate, 20_000) >= k_min).mean() >= 0.94  # 95%, less the printed rounding and the draws
    assert (rng.binomial(30, rate / 2, 20_000) >= k_min).mean() < 0.6
    assert sps.binom.sf(k_min - 1, 30, rate) == pytest.approx(0.95, abs=0.005)
    few = compare_errors("w.errors", 0, 2, 0, 2, alpha=0.02)
    assert "no excess can be seen in 2 requests" in few.sensitivity()
    quality = compare_quality({f"c{i}": [True] for i in range(12)}, {f"c{i}": [True] for i in range(12)})
    assert quality["seen"] == "no excess seen in 12 checks (a loss shows from 7 checks lost and none gained)"
