"""The model knows the noise (search/sampling/surrogate.py, search/sampling/stopping.py): it learns the start-to-start
spread from the study's own repeats, its incumbent is its estimate rather than the highest single
observation, and the stop rule weighs the gain left against what a confirmation could detect."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest
from optuna.distributions import BaseDistribution, CategoricalDistribution

from search.sampling.stopping import CONFIRM_ROUNDS, STOP_SHARE, nothing_left_to_win
from search.sampling.surrogate import Observation, detectable, fit_gp, learned_noise

ABC: dict[str, list[Any]] = {"a": [0, 1, 2], "b": ["x", "y", "z"], "c": [16, 64, 256]}
DISTS: dict[str, BaseDistribution] = {k: CategoricalDistribution(v) for k, v in ABC.items()}


def configs() -> list[dict[str, Any]]:
    return [dict(zip(ABC, v, strict=True)) for v in itertools.product(*ABC.values())]


def speed(c: dict[str, Any]) -> float:
    return 100.0 * (1 + 0.2 * c["a"]) * (1.1 if c["b"] == "y" else 1.0)


def noisy(c: dict[str, Any], rng: random.Random, sd: float) -> Observation:
    return Observation(c, speed(c) * math.exp(rng.gauss(0.0, sd)))


@pytest.mark.parametrize("sd", [0.02, 0.08])
def test_noise_is_learnt_from_repeats(sd: float) -> None:
    rng = random.Random(1)
    repeated = configs()[:4]
    observed = [noisy(c, rng, sd) for c in repeated for _ in range(6)]
    noise, weight = learned_noise(observed, noise_floor=0.05)
    assert weight == pytest.approx(20 + 2)
    assert 0.6 * sd < noise < 1.5 * sd
    model = fit_gp(observed, DISTS, noise_floor=0.05)
    assert model is not None and 0.4 * sd < model.noise < 2.2 * sd


def test_without_repeats_the_noise_is_half_the_stated_floor() -> None:
    observed = [Observation(c, speed(c)) for c in configs()[:8]]
    assert learned_noise(observed, noise_floor=0.06)[0] == pytest.approx(0.03)


def test_the_incumbent_is_the_models_estimate_not_a_lucky_start() -> None:
    """Every config once at 8% noise, measured noise from repeats of one config: the highest single
    observation overstates its config; the model's estimate of the incumbent is below it."""
    rng = random.Random(3)
    observed = [noisy(c, rng, 0.08) for c in configs()]
    observed += [noisy(configs()[0], rng, 0.08) for _ in range(6)]
    model = fit_gp(observed, DISTS, noise_floor=0.05)
    assert model is not None
    _, estimate, _ = model.incumbent()
    assert estimate < max(math.log(o.value or 1.0) for o in observed)


def test_stop_rule_weighs_the_gain_left_against_what_confirmation_detects() -> None:
    rng = random.Random(0)
    measured = rng.sample(configs(), 15)
    observed = [Observation(c, speed(c)) for c in measured]
    untried = [c for c in configs() if c not in measured]
    decision = nothing_left_to_win(observed, untried, DISTS, noise_floor=0.03, min_results=5)
    assert decision.noise is not None and decision.gain_left is not None and decision.detectable is not None
    assert decision.detectable == pytest.approx(detectable(decision.noise, CONFIRM_ROUNDS))
    assert decision.detectable is not None and decision.stop == (decision.gain_left < STOP_SHARE * decision.detectable)
    # The same study, measured at 10% noise: each config's values mean less, so the rule does not
    # need more proof than a confirmation could give, and says what it learnt.
    noisy_obs = [noisy(c, rng, 0.10) for c in measured for _ in range(3)]
    loud = nothing_left_to_win(noisy_obs, untried, DISTS, noise_floor=0.03, min_results=5)
    assert loud.noise is not None and loud.noise > decision.noise
    assert "noise" in loud.reason
