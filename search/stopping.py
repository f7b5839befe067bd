"""Stop when there is nothing left to win: no untried config can plausibly beat the incumbent
by more than the noise floor.

The judgement is search/surrogate.py's Gaussian process over the searched params, on log
objective values (so the noise floor is relative): every untried config gets an upper bound,
mean + BETA x std; when the highest bound is within the noise floor of the incumbent, or every
config has been tried, or the incumbent sits at the memory-bandwidth roofline, the study can stop, with the reason.

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

from search.sampler import design_space, enumerate_configs, observation
from search.space import Space
from search.surrogate import FailureModel, Observation, gp_posterior

BETA = 2.0  # upper bound = mean + BETA x std (about 97.7% one-sided under the model)


@dataclass(frozen=True)
class StopDecision:
    stop: bool
    reason: str
    incumbent: float | None = None
    best_bound: float | None = None  # the highest upper bound of an untried config
    best_candidate: dict[str, Any] | None = None  # the config with that bound


def nothing_left_to_win(observed: Sequence[Observation], untried: Sequence[dict[str, Any]],
                        dists: dict[str, BaseDistribution], noise_floor: float, maximize: bool = True,
                        min_results: int = 6, roofline_fraction: float | None = None) -> StopDecision:
    """Stop when no untried config can plausibly beat the incumbent by more than `noise_floor`
    (relative, e.g. 0.03). `observed`: every finished config (value None = failed);
    `untried`: the configs not yet measured; `roofline_fraction`: the incumbent's share of the
    memory-bandwidth ceiling, when known."""
    values = [o.value for o in observed if o.usable and o.value is not None]
    if not untried:
        return StopDecision(True, "every config of the space has been tried",
                            (max(values) if maximize else min(values)) if values else None)
    if not values:
        return StopDecision(False, "no result yet")
    incumbent = max(values) if maximize else min(values)
    if roofline_fraction is not None and roofline_fraction >= 1 - noise_floor:
        return StopDecision(True, f"the incumbent is at {100 * roofline_fraction:.0f}% of the memory-bandwidth "
                                  "roofline: no config can be faster by more than the noise", incumbent)
    if len(values) < min_results:
        return StopDecision(False, f"{len(values)} results; at least {min_results} before judging", incumbent)
    failures = FailureModel(observed, dists)
    untried = [c for c in untried if not failures.fails(c)] or list(untried)
    mu, sd = gp_posterior(observed, untried, dists, noise_floor, maximize)
    upper = mu + BETA * sd
    i = int(np.argmax(upper))
    sign = 1.0 if maximize else -1.0
    bound = math.exp(sign * float(upper[i]))
    threshold = math.log(incumbent * (1 + noise_floor)) if maximize else -math.log(incumbent * (1 - noise_floor))
    if float(upper[i]) <= threshold:
        return StopDecision(True, f"nothing left to win: the best untried config's upper bound ({bound:.4g}) is "
                                  f"within the noise floor ({100 * noise_floor:.1f}%) of the incumbent "
                                  f"({incumbent:.4g}); {len(untried)} configs left untried", incumbent, bound,
                            dict(untried[i]))
    return StopDecision(False, f"an untried config may still reach {bound:.4g} (incumbent {incumbent:.4g})",
                        incumbent, bound, dict(untried[i]))


def study_observations(study: Study, space: Space, allowed: Callable[[dict[str, Any]], bool] | None = None,
                       ) -> tuple[list[Observation], list[dict[str, Any]]]:
    """(finished configs, untried configs) of a study over a discrete space, on its first
    objective; failures (see search.sampler) as value None. Running and queued configs are
    neither: they are not untried. `allowed`: the configs the sampler may propose at all (as
    make_sampler's); the others are not untried either, since no trial will ever run them."""
    dists = design_space(space)
    observed: list[Observation] = []
    taken: set[str] = set()
    for t in study.get_trials(deepcopy=False):
        params = t.params or t.system_attrs.get("fixed_params", {})
        if not set(dists) <= set(params):
            continue
        key = repr([(k, params[k]) for k in dists])
        if t.state in (TrialState.RUNNING, TrialState.WAITING):
            taken.add(key)
        elif t.state == TrialState.COMPLETE:
            taken.add(key)
            observed.append(observation(t, dists))
        elif t.state == TrialState.PRUNED:  # stopped early for performance: measured, not a winner
            taken.add(key)
    configs = enumerate_configs(dists) or []
    untried = [c for c in configs if repr([(k, c[k]) for k in dists]) not in taken and (allowed is None or allowed(c))]
    return observed, untried


def study_should_stop(study: Study, space: Space, noise_floor: float,
                      roofline_fraction: float | None = None, min_results: int | None = None,
                      allowed: Callable[[dict[str, Any]], bool] | None = None) -> StopDecision:
    """The loop's entry point: call after each finished trial; stop with `reason` when `stop`.
    Single objective only (with several objectives it stops only when the space is exhausted);
    spaces too large or continuous to enumerate never stop here (their budget does)."""
    dists = design_space(space)
    if enumerate_configs(dists) is None:
        return StopDecision(False, "the space is too large or continuous to judge what is left")
    observed, untried = study_observations(study, space, allowed)
    maximize = study.directions[0] == StudyDirection.MAXIMIZE
    if len(study.directions) > 1 and untried:
        return StopDecision(False, "several objectives: the study runs to its budget")
    n_min = min_results if min_results is not None else len(dists) + 2
    return nothing_left_to_win(observed, untried, dists, noise_floor, maximize, n_min, roofline_fraction)
