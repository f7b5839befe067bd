"""The confirmation's blocked test (search/verdicts/blocked.py): arms against the default with the rounds as
blocks and the start noise pooled over every arm's residuals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from search.verdicts.blocked import compare_blocked, pooled_diff_sd, round_matrix
from search.verdicts.boundaries import _simulate_blocked, blocked_p_threshold, paired_p_threshold
from search.verdicts.sequential import compare_paired, quantisation_sd, rounds_needed

METRIC = "four_streams.decode_tok_s"


def confirmation(rng: np.random.Generator, effects: list[float], rounds: int, start_sd: float = 0.03,
                 run_sd: float = 0.03, drift_sd: float = 0.05, arm_scale: list[float] | None = None
                 ) -> list[list[list[float]]]:
    """Every arm's runs (3 per start) in rounds that share a drift, each arm with its own effect
    (log) and start noise x arm_scale."""
    drift = rng.normal(0, drift_sd, rounds)
    scale = arm_scale or [1.0] * len(effects)
    return [[list(100 * np.exp(e + drift[r] + rng.normal(0, start_sd * s) + rng.normal(0, run_sd, 3)))
             for r in range(rounds)] for e, s in zip(effects, scale, strict=True)]


def sequential(arms: list[list[list[float]]], arm: int, blocked: bool, looks: tuple[int, ...] = (3, 4)) -> str:
    """The verdict at the first look that settles, as the confirmation stops."""
    verdict = "inconclusive"
    for n in looks:
        part = [a[:n] for a in arms]
        v = (compare_blocked(METRIC, part, arm, direction="higher", alpha=0.02, looks=looks) if blocked else
             compare_paired(METRIC, part[0], part[arm], direction="higher", alpha=0.02, looks=looks))
        verdict = v.verdict
        if verdict != "inconclusive":
            break
    return verdict


def test_two_arms_are_the_paired_test() -> None:
    arms = confirmation(np.random.default_rng(1), [0.0, -0.1], 5)
    blocked = compare_blocked(METRIC, arms, 1, direction="higher", looks=(3, 4, 5))
    paired = compare_paired(METRIC, arms[0], arms[1], direction="higher", looks=(3, 4, 5))
    assert (blocked.ratio, blocked.ci_low, blocked.ci_high, blocked.verdict) == \
        (paired.ratio, paired.ci_low, paired.ci_high, paired.verdict)


def test_stored_thresholds_are_the_simulated_ones_and_two_arms_use_the_paired_table() -> None:
    assert blocked_p_threshold((3, 4), 0.02, 3) == _simulate_blocked((3, 4), 0.02, 3)
    assert blocked_p_threshold((3, 4), 0.02, 2) == paired_p_threshold((3, 4), 0.02)
    # More looks, a lower threshold. A single look's is above alpha: judging an arm by the larger of
    # its own and the pooled spread is conservative when the arms are equally noisy, and the
    # simulated threshold takes that back.
    assert blocked_p_threshold(tuple(range(3, 11)), 0.02, 3) < blocked_p_threshold((3, 4), 0.02, 3) < 0.02
    assert 0.02 < blocked_p_threshold((4,), 0.02, 3) == _simulate_blocked((4,), 0.02, 3) < 0.03


def test_pooling_keeps_the_false_alarm_rate_and_finds_a_ten_percent_control_far_more_often() -> None:
    """1000 simulated confirmations of three arms (the demo's shape: default, top config, control),
    4 rounds, start noise 3% and three runs of 3% per start, a 5% drift shared by each round. No
    change: a top config equal to the default is called different in at most 2% of them (the
    budget; 3% allows the simulation's spread). A 10% slowdown control: the blocked test finds it
    in about 3 of 4, the paired test (each arm's own 3 degrees of freedom) in about 2 of 5."""
    rng = np.random.default_rng(20261129)
    false, found_blocked, found_paired = 0, 0, 0
    for _ in range(1000):
        arms = confirmation(rng, [0.0, 0.0, math.log(0.9)], 4)
        false += sequential(arms, 1, blocked=True) != "inconclusive"
        found_blocked += sequential(arms, 2, blocked=True) == "regressed"
        found_paired += sequential(arms, 2, blocked=False) == "regressed"
    assert false <= 30
    assert found_blocked >= 650 and found_paired <= 500, (found_blocked, found_paired)


def test_an_arm_noisier_than_the_rest_is_judged_by_its_own_spread() -> None:
    """A speculative config whose acceptance varies: its own within-round differences, not the
    quieter pooled spread, set its interval."""
    arms = confirmation(np.random.default_rng(3), [0.0, 0.1, 0.0], 4, arm_scale=[0.3, 4.0, 0.3])
    v = compare_blocked(METRIC, arms, 1, direction="higher", looks=(3, 4))
    own = float(np.std(round_matrix(arms)[1] - round_matrix(arms)[0], ddof=1))
    pooled, df = pooled_diff_sd(round_matrix(arms))
    assert own > pooled and v.cv == pytest.approx(own) and df == 6
    assert "its own used" in v.note and "6 df" in v.note


def test_a_round_with_an_arm_missing_is_left_out_for_every_arm() -> None:
    """An arm that failed to start in the last round has no value there: the blocks are the
    complete rounds."""
    arms = confirmation(np.random.default_rng(4), [0.0, 0.05, -0.1], 4)
    arms[2][3] = []
    assert round_matrix(arms).shape == (3, 3)
    assert compare_blocked(METRIC, arms, 1, direction="higher", looks=(3, 4)).n_a == 3


def test_pooled_rounds_needed_are_never_more_than_one_arms() -> None:
    for sd in (0.02, 0.04, 0.06):
        paired, blocked = rounds_needed(sd, 0.1, 0.02, arms=2), rounds_needed(sd, 0.1, 0.02, arms=3)
        assert paired is not None and blocked is not None and blocked <= paired
    assert rounds_needed(0.04, 0.1, 0.02, arms=3) < rounds_needed(0.04, 0.1, 0.02, arms=2)  # type: ignore[operator]


def test_capacities_that_repeat_exactly_are_judged_at_their_resolution_not_as_certain() -> None:
    """A capacity is a whole number of streams found to within 10% of the load or 1 stream, so two
    configs can measure 4 and 4 (or 4 and 8) in every round. With no floor the spread is 0: a point
    interval and a smallest detectable change of 0, "unchanged" claimed for any difference under the
    step. With the floor from the values' resolution the interval has the step's width."""
    from search.confirm.confirm import Arm, judge
    from search.space.schema import CAPACITY

    same = [[4.0]] * 3
    bare = compare_paired(CAPACITY, same, same, direction="higher", min_effect=0.03)
    assert (bare.ci_low, bare.ci_high, bare.mde) == (1.0, 1.0, 0.0)  # what the floor is for
    floor = quantisation_sd([4.0, 4.0], 0.1, 1.0)
    assert floor == pytest.approx(math.sqrt(2) * math.log(1.25) / math.sqrt(12))  # 1 stream of 4: a 25% step
    held = compare_paired(CAPACITY, same, same, direction="higher", min_effect=0.03, floor_sd=floor)
    assert held.ci_low < 0.9 and held.ci_high > 1.1 and held.mde > 0.25 and held.verdict == "inconclusive", held
    assert "the least the values' resolution allows" in held.note
    # A spread the rounds measured above the floor is used as measured.
    noisy = compare_paired(CAPACITY, [[4.0], [8.0], [4.0]], [[8.0], [4.0], [8.0]], min_effect=0.03, floor_sd=floor)
    assert "resolution" not in noisy.note

    # The confirmation's judge applies it to the capacity objective, with three arms (blocked).
    arms = [Arm(0, "default", {}, key="0", runs=[[4.0]] * 3), Arm(1, "#1", {}, key="1", runs=[[8.0]] * 3),
            Arm(2, "#2", {}, key="2", runs=[[4.0]] * 3)]
    verdicts = judge(arms, CAPACITY, "maximize", 0.03, (3,), {CAPACITY: (0.1, 1.0)})
    double, level = verdicts["1"], verdicts["2"]
    assert double.verdict == "improved" and double.ci_low < 2.0 < double.ci_high, double  # 2x, no longer a point
    assert level.verdict == "inconclusive" and level.mde > 0.25, level
    # Continuous metrics keep no floor.
    plain = judge(arms, "w.decode_tok_s", "maximize", 0.03, (3,), {CAPACITY: (0.1, 1.0)})
    assert plain["2"].ci_low == plain["2"].ci_high == 1.0
