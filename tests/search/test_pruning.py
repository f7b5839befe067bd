"""Stopping a trial after a load point where it is clearly worse than the incumbent there
(search/sampling/pruning.py): the ratio is reported to Optuna, and only feasible measured trials count as
the incumbent."""

from __future__ import annotations

from typing import Any

import optuna
import pytest

from search.sampling.pruning import clearly_worse, incumbent_at
from search.space.space import Space, parse_space
from search.store.results import TrialRecord, TrialState

KEY = "single@concurrency=1.output_tok_s"


def space(objective: str = "single.output_tok_s", direction: str = "maximize") -> Space:
    doc: dict[str, Any] = {
        "name": "prune",
        "engines": {"llamacpp": {"command": ["llama-server"], "args": {"parallel": 2}}},
        "models": [{"name": "m", "path": "/models/m.gguf"}],
        "params": {"threads": {"type": "categorical", "choices": [1, 2], "default": 2},
                   "concurrency": {"type": "categorical", "choices": [1, 2], "side": "request"}},
        "measure": {"prune_margin": 0.3},
        "workloads": [{"name": "single", "streams": ["qa"], "max_tokens": 16}],
        "quality": {"suite": None},
        "objectives": [{"metric": objective, "direction": direction}],
    }
    return parse_space(doc, "prune")


def record(number: int, value: float, state: TrialState = TrialState.COMPLETE,
           constraints: list[float] | None = None) -> TrialRecord:
    return TrialRecord(number=number, state=state, params={}, engine="llamacpp", model="m",
                       metrics={KEY: value}, constraint_values=constraints or [])


def test_the_incumbent_is_the_best_feasible_measured_trial() -> None:
    finished = [record(0, 10.0), record(1, 30.0, constraints=[0.5]), record(2, 25.0, TrialState.FAILED),
                record(3, 12.0)]
    assert incumbent_at(finished, KEY, maximize=True) == 12.0  # #1 infeasible, #2 failed
    assert incumbent_at(finished, KEY, maximize=False) == 10.0
    assert incumbent_at([], KEY, maximize=True) is None


@pytest.mark.parametrize(("mine", "worse"), [(6.0, True), (8.0, False), (12.0, False)])
def test_clearly_worse_beyond_the_margin_and_reported_to_optuna(mine: float, worse: bool) -> None:
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    assert clearly_worse(space(), [record(0, 10.0)], trial, record(1, mine), "concurrency=1", 0) is worse
    assert study.trials[0].intermediate_values == {0: pytest.approx(mine / 10.0)}


def test_minimized_objectives_compare_the_other_way_and_point_objectives_never_prune() -> None:
    study = optuna.create_study(direction="minimize")
    slow = space(direction="minimize")
    assert clearly_worse(slow, [record(0, 10.0)], study.ask(), record(1, 20.0), "concurrency=1", 0)
    assert not clearly_worse(slow, [record(0, 10.0)], study.ask(), record(1, 11.0), "concurrency=1", 0)
    # An objective at one load point is measured there only: nothing to stop early.
    fixed = space(objective=KEY)
    assert not clearly_worse(fixed, [record(0, 10.0)], study.ask(), record(1, 1.0), "concurrency=1", 0)
