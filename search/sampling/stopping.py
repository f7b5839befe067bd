"""Stop when there is nothing left to win that a confirmation could see.

The judgement is search/sampling/surrogate.py's Gaussian process over the searched params, on log
objective values (a relative scale), with its noise learnt from the study's own repeated
measurements (noise probes of the default: the same config on several fresh starts). The
incumbent is the model's estimate of the best measured config (its posterior mean), not the
highest single observation, so one lucky start neither ends the study nor wins it. The expected
gain left is the highest expected improvement of an untried config over that estimate; the study
can stop when it is below STOP_SHARE of the smallest difference a confirmation of CONFIRM_ROUNDS
fresh starts per arm could detect at the learnt noise, when every config has been tried, or when
the incumbent sits at the memory-bandwidth roofline, with the reason. What a confirmation detects is set by
the start noise its paired test will see: where the noise store (search/verdicts/noise_store.py) holds this
setup's paired runs, their spread per start is used (`paired_noise`), not the model's noise, which also
holds what the model cannot fit (on an H200 the model learnt 2.5% a start where `search ab` measured
0.3-1.9%, and the study stopped at 6 of 8 starts).

Failed configs stay out of the model; an untried config is judged likely to fail, and is not
counted as a possible winner, when at least two of the finished configs that differ from it in
one param failed and more of them failed than succeeded (a region that crashes, such as a
quantized V cache without flash attention, does not keep the study going).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.study import Study, StudyDirection
from optuna.trial import TrialState

from search.sampling.sampler import (
    config_key,
    is_reused,
    launch_configs,
    model_space,
    observation,
    probe_observations,
    set_values,
)
from search.sampling.surrogate import FailureModel, Observation, detectable, expected_improvement, fit_gp
from search.space.space import Space

STOP_SHARE = 0.1  # stop when the expected gain left is below this share of what confirmation detects
CONFIRM_ROUNDS = 3  # the fewest fresh starts per arm a confirmation runs (search/confirm/confirm.py)


@dataclass(frozen=True)
class StopDecision:
    stop: bool
    reason: str
    incumbent: float | None = None  # the model's estimate of the best measured config (the metric's units)
    best_bound: float | None = None  # the most promising untried config's mean + 2 std (the metric's units)
    best_candidate: dict[str, Any] | None = None  # that config
    gain_left: float | None = None  # its expected improvement over the incumbent (relative)
    detectable: float | None = None  # the smallest relative difference confirmation could detect
    # The start noise a confirmation was priced at (sd of log values): `paired_noise` where given, else the model's.
    noise: float | None = None


def nothing_left_to_win(observed: Sequence[Observation], untried: Sequence[dict[str, Any]],
                        dists: dict[str, BaseDistribution], noise_floor: float, maximize: bool = True,
                        min_results: int = 6, roofline_fraction: float | None = None,
                        rounds: int = CONFIRM_ROUNDS, share: float = STOP_SHARE,
                        paired_noise: tuple[float, str] | None = None) -> StopDecision:
    """Stop when the expected gain of the most promising untried config over the model's
    incumbent is below `share` x what a confirmation of `rounds` starts per arm could detect.
    `observed`: every finished config, repeats included (value None = failed); `untried`: the
    configs not yet measured; `noise_floor`: the stated relative floor (the noise prior until
    the study has repeats); `roofline_fraction`: the incumbent's share of the memory-bandwidth
    ceiling, when known; `paired_noise`: (per-start noise, where it comes from) of this setup's stored paired
    runs, which prices the confirmation in place of the model's noise."""
    values = [o.value for o in observed if o.usable and o.value is not None]
    sign = 1.0 if maximize else -1.0
    model = fit_gp(observed, dists, noise_floor, maximize)
    incumbent = math.exp(sign * model.incumbent()[1]) if model is not None else None
    if not untried:
        return StopDecision(True, "every config of the space has been tried", incumbent)
    if model is None or incumbent is None:
        return StopDecision(False, "no result yet")
    if roofline_fraction is not None and roofline_fraction >= 1 - noise_floor:
        return StopDecision(True, f"the incumbent is at {100 * roofline_fraction:.0f}% of the memory-bandwidth "
                                  "roofline: no config can be faster by more than the noise", incumbent)
    if len(model.configs) < min_results:
        return StopDecision(False, f"{len(model.configs)} configs measured; at least {min_results} before judging",
                            incumbent)
    failures = FailureModel(observed, dists)
    untried = [c for c in untried if not failures.fails(c)] or list(untried)
    mu, sd = model.predict(untried)
    best = model.incumbent()[1]
    gain = expected_improvement(mu, sd, best)
    i = int(np.argmax(gain))
    bound = math.exp(sign * float(mu[i] + 2 * sd[i]))
    noise = paired_noise[0] if paired_noise is not None else model.noise
    delta = detectable(noise, rounds)
    noise_text = (f"noise {100 * noise:.2f}% per start {paired_noise[1]}, the model's own {100 * model.noise:.1f}%"
                  if paired_noise is not None else f"noise {100 * model.noise:.1f}% per start")
    said = (f"the most promising untried config's expected gain ({100 * float(gain[i]):.2f}%) over the model's "
            f"incumbent ({incumbent:.4g}; {len(values)} results, {noise_text})")
    stop = float(gain[i]) < share * delta
    reason = (f"nothing left to win: {said} is below {100 * share:g}% of what a {rounds}-round confirmation "
              f"detects ({100 * delta:.1f}%); {len(untried)} configs left untried" if stop
              else f"{said} is worth a start (it may reach {bound:.4g})")
    return StopDecision(stop, reason, incumbent, bound, set_values(untried[i]), float(gain[i]), delta, noise)


def study_observations(study: Study, space: Space, allowed: Callable[[dict[str, Any]], bool] | None = None,
                       ) -> tuple[list[Observation], list[dict[str, Any]]]:
    """(finished configs, untried configs) of a study over a discrete space, on its first
    objective; failures (see search.sampling.sampler) as value None. Running and queued configs are
    neither: they are not untried. `allowed`: the configs the sampler may propose at all (as
    make_sampler's); the others are not untried either, since no trial will ever run them."""
    dists = model_space(space)
    observed: list[Observation] = []
    taken: set[str] = set()
    for t in study.get_trials(deepcopy=False):
        key = config_key(t.params or t.system_attrs.get("fixed_params", {}), dists)
        if key is None:
            continue
        if t.state in (TrialState.RUNNING, TrialState.WAITING):
            taken.add(key)
        elif t.state == TrialState.COMPLETE:
            taken.add(key)
            if not is_reused(t):
                observed.append(observation(t, dists))
        elif t.state == TrialState.PRUNED:  # stopped early for performance: measured, not a winner
            taken.add(key)
    observed += probe_observations(study, dists)
    configs = launch_configs(space) or []
    untried = [c for c in configs if config_key(c, dists) not in taken and (allowed is None or allowed(set_values(c)))]
    return observed, untried


def study_should_stop(study: Study, space: Space, noise_floor: float,
                      roofline_fraction: float | None = None, min_results: int | None = None,
                      allowed: Callable[[dict[str, Any]], bool] | None = None,
                      paired_noise: tuple[float, str] | None = None) -> StopDecision:
    """The loop's entry point: call after each finished trial; stop with `reason` when `stop`.
    Single objective only (with several objectives it stops only when the space is exhausted);
    spaces too large or continuous to enumerate never stop here (their budget does)."""
    if launch_configs(space) is None:
        return StopDecision(False, "the space is too large or continuous to judge what is left")
    dists = model_space(space)
    observed, untried = study_observations(study, space, allowed)
    maximize = study.directions[0] == StudyDirection.MAXIMIZE
    if len(study.directions) > 1 and untried:
        return StopDecision(False, "several objectives: the study runs to its budget")
    n_min = min_results if min_results is not None else len(dists) + 2
    return nothing_left_to_win(observed, untried, dists, noise_floor, maximize, n_min, roofline_fraction,
                               paired_noise=paired_noise)
