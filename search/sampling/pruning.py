"""Stopping a trial's measurement early: after a load point where it is clearly worse than the
incumbent there, the remaining points are not measured (the trial is PRUNED)."""

from __future__ import annotations

from collections.abc import Iterable

import optuna

from search.space.space import Space
from search.store.results import TrialRecord, TrialState


def clearly_worse(space: Space, finished: Iterable[TrialRecord], trial: optuna.Trial, record: TrialRecord,
                  point: str, step: int) -> bool:
    """Below the incumbent at this load point by more than the prune margin (single objective,
    curve objectives only). Reported to Optuna as an intermediate value (ratio to the incumbent)."""
    objective = space.m.objectives
    if len(objective) != 1 or "@" in objective[0].metric:
        return False
    base, _, leaf = objective[0].metric.partition(".")
    key = f"{base}@{point}.{leaf}"
    mine = record.metrics.get(key)
    maximize = objective[0].direction == "maximize"
    best = incumbent_at(finished, key, maximize)
    if mine is None or best is None or best <= 0 or mine <= 0:
        return False
    ratio = mine / best if maximize else best / mine
    trial.report(ratio, step)
    return ratio < 1.0 - space.m.measure.prune_margin


def incumbent_at(finished: Iterable[TrialRecord], key: str, maximize: bool) -> float | None:
    """The best feasible measured value of `key` so far (None before any)."""
    values = [r.metrics[key] for r in finished
              if r.state == TrialState.COMPLETE and key in r.metrics and all(c <= 0 for c in r.constraint_values)]
    if not values:
        return None
    return max(values) if maximize else min(values)
