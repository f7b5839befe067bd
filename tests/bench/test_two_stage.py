"""The two-stage confirmation (bench/two_stage.py): the best-looking arm carried after stage 1 keeps the study's
false-call rate under equal and unequal start noise."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.two_stage import CASES, PLANS, TwoStagePlan, case_scale, simulated_false_calls, two_stage_confirmation


def real_calls(x: np.ndarray, plan: TwoStagePlan) -> bool:
    """Whether the product-side function (two_stage_confirmation, min_effect 0) calls some arm different on the
    simulated log values x (arms x rounds)."""
    taken = [0] * x.shape[0]

    def measure(number: int) -> float:
        value = float(math.exp(x[number, taken[number]]))
        taken[number] += 1
        return value

    result = two_stage_confirmation(measure, 0, list(range(1, x.shape[0])), plan, min_effect=0.0)
    return any(v.verdict != "inconclusive" for v in result.verdicts.values())


def test_the_best_looking_arm_carried_on_keeps_the_false_call_rate_under_unequal_noise() -> None:
    """40,000 simulated confirmations a case (bench/two_stage.py CASES: equal noise, the default or a top config
    noisier) and plan, no true difference: some arm called different in at most 2.3% at alpha 0.02 (the estimate's
    own spread is 0.07%). The simulated statistic is checked against the function's own verdicts on 150
    confirmations a plan. (Judging the carried arm at the whole alpha instead reached 2.0-2.5% in the same
    simulation, `python -m bench.two_stage`: the selection's bias is small here, but nothing bounds it by alpha.)"""
    rng = np.random.default_rng(20261202)
    for plan in PLANS:
        for case in CASES:
            rate = float(simulated_false_calls(case_scale(case, plan), plan, 40_000, rng).mean())
            assert rate <= 0.023, (plan, case, rate)
        calls = simulated_false_calls((0.03,) * (plan.top_k + 1), plan, 150, np.random.default_rng(0))
        x = np.random.default_rng(0).standard_normal((150, plan.top_k + 1, plan.max_rounds)) * 0.03
        assert [real_calls(x[i], plan) for i in range(150)] == calls.tolist(), plan


def test_stage_two_starts_only_the_default_and_the_best_looking_arm() -> None:
    """After stage 1 the arm with the best mean difference from the default goes on alone with it, every arm is
    judged at the study's alpha over the stage-1 configs, and a clearly better carried arm is confirmed; the
    starts are within the plan's."""
    plan = TwoStagePlan(2, 2, 5)
    truth = {0: 100.0, 1: 103.0, 2: 125.0}
    taken = {0: 0, 1: 0, 2: 0}
    rng = np.random.default_rng(5)

    def measure(number: int) -> float:
        taken[number] += 1
        return float(truth[number] * math.exp(rng.normal(0, 0.02)))

    result = two_stage_confirmation(measure, 0, [1, 2], plan)
    assert result.carried == "2" and result.winner == 2 and result.answer.startswith("confirmed: #2")
    assert taken[1] == 2 and taken[0] == taken[2] == result.rounds >= 3
    assert result.starts == sum(taken.values()) <= plan.max_starts() == 12
    assert result.verdicts["2"].level == pytest.approx(1 - 0.02 / 2)  # alpha 0.02 over the 2 stage-1 configs
    assert "threshold p <" in result.verdicts["2"].note and result.verdicts["1"].verdict == "inconclusive"
    assert "dropped after 2 rounds" in result.verdicts["1"].note
