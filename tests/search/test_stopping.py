"""The "nothing left to win" rule (search/sampling/stopping.py) on studies told as the loop tells them."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import TrialState

from search.sampling.sampler import FAILED_KEY, FAILED_VIOLATION, failure_values, make_sampler
from search.sampling.stopping import study_observations, study_should_stop
from search.sampling.surrogate import Observation, likely_to_fail, repeat_spread
from search.space.space import Space, parse_space
from search.store.trial_index import RECORD_ATTR

optuna.logging.set_verbosity(optuna.logging.ERROR)
ABC = {"a": [0, 1, 2], "b": ["x", "y", "z"], "c": [16, 64, 256]}


def make_space(direction: str = "maximize") -> Space:
    params = {k: {"type": "categorical", "choices": v} for k, v in ABC.items()}
    return parse_space({"name": "t", "engines": {"llamacpp": {"command": ["llama-server"]}},
                        "models": [{"name": "m", "path": "m.gguf"}], "params": params,
                        "workloads": [{"name": "w", "streams": ["qa"]}],
                        "objectives": [{"metric": "w.output_tok_s", "direction": direction}]})


def configs() -> list[dict[str, Any]]:
    return [dict(zip(ABC, v, strict=True)) for v in itertools.product(*ABC.values())]


def study_of(space: Space, measured: list[dict[str, Any]], value: Callable[[dict[str, Any]], float | None]
             ) -> optuna.Study:
    """A study holding `measured`, each told as the loop tells it (None = failed)."""
    study = optuna.create_study(directions=[space.m.objectives[0].direction], sampler=make_sampler(space, 0))
    for config in measured:
        tell(study, space, config, value(config))
    return study


def tell(study: optuna.Study, space: Space, config: dict[str, Any], v: float | None,
         attrs: dict[str, Any] | None = None) -> None:
    """One trial of `config`, told as the loop tells it (None = failed), with the loop's user attrs."""
    study.enqueue_trial(config)
    trial = study.ask()
    space.sample(trial)
    for key, attr in (attrs or {}).items():
        trial.set_user_attr(key, attr)
    if v is None:
        trial.set_constraint(FAILED_KEY, FAILED_VIOLATION)
        study.tell(trial, failure_values(study.directions))
    else:
        trial.set_constraint(FAILED_KEY, 0.0)
        study.tell(trial, v)


def speed(config: dict[str, Any], seed: int = 0) -> float:
    """Throughput set by `a` (x2 per step); b and c within 1% noise."""
    noise = random.Random(repr(sorted(config.items())) + str(seed)).uniform(-0.01, 0.01)
    return 10.0 * 2 ** config["a"] * (1 + noise)


def test_keeps_going_while_a_value_is_unexplored() -> None:
    """a = 2 never measured: the model cannot rule out that it doubles the speed."""
    space = make_space()
    measured = [c for c in configs() if c["a"] < 2]
    decision = study_should_stop(study_of(space, measured, speed), space, noise_floor=0.03)
    assert not decision.stop, decision
    assert decision.best_candidate is not None and decision.best_candidate["a"] == 2


def test_stops_when_no_untried_config_can_win() -> None:
    """Every value of every param measured, speed set by `a` alone: what is left is within the
    noise of the incumbent."""
    space = make_space()
    rng = random.Random(0)
    measured = rng.sample(configs(), 15)
    measured += [c for c in configs() if c["a"] == 2 and c not in measured][:4]
    assert {c["a"] for c in measured} == {0, 1, 2} and {c["b"] for c in measured} == {"x", "y", "z"}
    # The stated floor is the schema's default (5%): with noise-free values the model's noise stays
    # near half of it, and what is left is below a share of what a confirmation could detect.
    decision = study_should_stop(study_of(space, measured, speed), space, noise_floor=0.05)
    assert decision.stop, decision
    assert "nothing left to win" in decision.reason


def test_same_study_with_a_strong_untried_effect_keeps_going() -> None:
    """The same measured configs, but c = 256 (never measured with a = 2) doubles the speed in
    the measured ones: a config with a = 2 and c = 256 may still win."""
    space = make_space()
    measured = [c for c in configs() if not (c["a"] == 2 and c["c"] == 256)][:20]

    def interacting(config: dict[str, Any]) -> float:
        return speed(config) * (2.0 if config["c"] == 256 else 1.0)

    decision = study_should_stop(study_of(space, measured, interacting), space, noise_floor=0.03)
    assert not decision.stop, decision


def test_stops_when_exhausted_and_on_the_roofline() -> None:
    space = make_space()
    done = study_should_stop(study_of(space, configs(), speed), space, noise_floor=0.03)
    assert done.stop and "every config" in done.reason
    few = study_of(space, configs()[:3], speed)
    assert not study_should_stop(few, space, noise_floor=0.03).stop
    roof = study_should_stop(few, space, noise_floor=0.03, roofline_fraction=0.985)
    assert roof.stop and "roofline" in roof.reason


def test_failing_region_does_not_keep_the_study_going() -> None:
    """b = x always fails: untried b = x configs are judged likely to fail, not possible winners."""
    space = make_space()
    rng = random.Random(1)
    measured = rng.sample(configs(), 17)

    def value(config: dict[str, Any]) -> float | None:
        return None if config["b"] == "x" else speed(config)

    study = study_of(space, measured, value)
    decision = study_should_stop(study, space, noise_floor=0.03)
    assert decision.stop, decision
    observed = [Observation(t.params, None if t.constraints.get(FAILED_KEY, 0) > 0 else t.values[0])
                for t in study.trials if t.state == TrialState.COMPLETE]
    dists = {k: optuna.distributions.CategoricalDistribution(v) for k, v in ABC.items()}
    untried = [c for c in configs() if c not in measured]
    assert [c for c in untried if likely_to_fail(c, observed, dists)] == [c for c in untried if c["b"] == "x"]


def test_minimize_direction() -> None:
    """Latency: the same rule with the direction flipped."""
    space = make_space("minimize")
    measured = [c for c in configs() if c["a"] < 2]
    keeps = study_should_stop(study_of(space, measured, lambda c: 1.0 / speed(c)), space, 0.03)
    assert not keeps.stop and keeps.best_candidate is not None and keeps.best_candidate["a"] == 2
    rng = random.Random(0)
    measured = rng.sample(configs(), 15) + [c for c in configs() if c["a"] == 2][:4]
    stops = study_should_stop(study_of(space, measured, lambda c: 1.0 / speed(c)), space, 0.05)
    assert stops.stop, stops


def test_configs_the_sampler_may_not_propose_are_not_untried() -> None:
    """Every config with a < 2 measured (a doubles the speed); a = 2 is ruled out (a memory fit, a
    table cut short): nothing is left to try, so the study stops instead of waiting for configs
    no trial will run."""
    space = make_space()
    measured = [c for c in configs() if c["a"] < 2]
    study = study_of(space, measured, speed)
    assert not study_should_stop(study, space, noise_floor=0.03).stop  # a = 2 may double it again
    decision = study_should_stop(study, space, noise_floor=0.03, allowed=lambda c: c["a"] < 2)
    assert decision.stop and "every config" in decision.reason


def test_a_reused_result_is_no_second_measurement() -> None:
    """A config suggested again is not started again: the loop tells the earlier result a second
    time (search/study/scoring.py: copy_duplicate). The model must not read that as a repeat that agreed
    exactly, which would shrink the noise it learns from real repeats towards nothing."""
    space = make_space()
    measured = configs()[:6]
    study = study_of(space, measured, speed)
    # A real repeat of the first config on another start, 10% apart, then three reuses of it.
    tell(study, space, measured[0], speed(measured[0]) * 1.1)
    for _ in range(3):
        tell(study, space, measured[0], speed(measured[0]), {RECORD_ATTR: {"duplicate_of": 0}})
    observed, _ = study_observations(study, space)
    assert len(observed) == 7  # six configs and the one real repeat; the reuses are left out
    ss, df = repeat_spread(observed)
    assert df == 1 and ss > 0.004  # (log 1.1)^2 / 2 = 0.0045: the real repeat's spread, undiluted


def test_the_stop_rule_prices_the_confirmation_at_the_setup_s_paired_noise_where_the_store_has_it() -> None:
    """The study that stops at the model's noise (above) keeps going when this setup's paired runs measured a start
    noise of 0.2%: a confirmation then detects far smaller differences, and what is left is worth a start. The
    decision says which noise it used."""
    space = make_space()
    rng = random.Random(0)
    measured = rng.sample(configs(), 15)
    measured += [c for c in configs() if c["a"] == 2 and c not in measured][:4]
    study = study_of(space, measured, speed)
    by_model = study_should_stop(study, space, noise_floor=0.05)
    by_store = study_should_stop(study, space, noise_floor=0.05, paired_noise=(0.002, "from 9 earlier paired runs"))
    assert by_model.stop and not by_store.stop, (by_model, by_store)
    assert by_store.noise == 0.002 and by_store.detectable is not None and by_model.detectable is not None
    assert by_store.detectable < by_model.detectable / 5
    assert "0.20% per start from 9 earlier paired runs" in by_store.reason
