"""Optuna's behaviour that flagsearch relies on, pinned on Optuna itself (not through our sampler).

search/sampling/sampler.py tells a failed trial as COMPLETE with a constraint violation larger than any real
one, and relies on Optuna ranking trials for TPE's good/bad split, and for NSGA-II's constrained
domination, as: feasible COMPLETE (by value) > PRUNED > infeasible (by total violation, ascending),
reading only the violation of an infeasible trial, never its values. pyproject.toml bounds Optuna
below the next major version; if a minor release changes any of this, these tests fail first.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.samplers._tpe.sampler import _split_trials
from optuna.samplers.nsgaii._constraints_evaluation import _constrained_dominates
from optuna.study import StudyDirection
from optuna.trial import TrialState, create_trial

ROOT = Path(__file__).resolve().parents[2]
HUGE = 1e15  # the violation search/sampling/sampler.py gives a failed trial


def _trial(number: int, value: float | None, state: TrialState = TrialState.COMPLETE,
           violation: float = 0.0) -> optuna.trial.FrozenTrial:
    t = create_trial(params={"x": float(number)}, distributions={"x": FloatDistribution(0, 100)}, value=value,
                     state=state, constraints={"c": violation})
    t.number = number
    return t


def _below_order(study: optuna.Study, trials: list[optuna.trial.FrozenTrial]) -> list[int]:
    """The order in which trials join TPE's "good" group as it grows."""
    order: list[int] = []
    for n_below in range(1, len(trials) + 1):
        below, _ = _split_trials(study, trials, n_below)
        order += [t.number for t in below if t.number not in order]
    return order


def test_optuna_is_within_the_bounds_of_pyproject() -> None:
    pinned = re.search(r'"optuna>=([0-9.]+),<([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pinned, "pyproject.toml must bound optuna from above"
    low, high = (tuple(int(x) for x in v.split(".")) for v in pinned.groups())
    installed = tuple(int(x) for x in importlib.metadata.version("optuna").split(".")[:2])
    assert low[:2] <= installed < high[:2] + (() if len(high) > 1 else (0,)), (installed, low, high)


def test_tpe_ranks_feasible_then_pruned_then_infeasible_by_violation() -> None:
    study = optuna.create_study(direction="maximize")
    trials = [
        _trial(0, 10.0),  # feasible
        _trial(1, 30.0),  # feasible, best
        _trial(2, None, TrialState.PRUNED),
        _trial(3, 99.0, violation=5.0),  # infeasible: a great value does not help
        _trial(4, 1e15, violation=HUGE),  # a failure as sampler.py tells it: even a huge value
        _trial(5, 50.0, violation=0.5),  # infeasible, small violation
    ]
    assert _below_order(study, trials) == [1, 0, 2, 5, 3, 4]


@pytest.mark.parametrize("direction", ["minimize", "maximize"])
def test_tpe_never_reads_an_infeasible_trials_value(direction: str) -> None:
    study = optuna.create_study(direction=direction)
    for failure_value in (-1e15, 0.0, 1e15):
        trials = [_trial(0, 1.0), _trial(1, failure_value, violation=HUGE), _trial(2, 2.0, violation=1.0)]
        order = _below_order(study, trials)
        assert order[-1] == 1, (direction, failure_value, order)


def test_nsga2_constrained_domination() -> None:
    directions = [StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE]

    def multi(number: int, values: list[float], violation: float) -> optuna.trial.FrozenTrial:
        t = create_trial(params={}, distributions={}, values=values, constraints={"c": violation})
        t.number = number
        return t

    feasible = multi(0, [1.0, 9.0], 0.0)  # poor values, but feasible
    infeasible = multi(1, [99.0, 0.0], 2.0)
    failed = multi(2, [1e15, -1e15], HUGE)  # values that would dominate everything if read
    assert _constrained_dominates(feasible, infeasible, directions)
    assert _constrained_dominates(feasible, failed, directions)
    assert _constrained_dominates(infeasible, failed, directions)  # smaller total violation wins
    assert not _constrained_dominates(failed, infeasible, directions)


def test_set_constraint_is_what_samplers_read() -> None:
    """Optuna 5's per-trial `set_constraint`: stored on the trial and read back as `constraints`."""
    study = optuna.create_study()
    trial = study.ask()
    trial.set_constraint("failed", HUGE)
    trial.set_constraint("errors == 0", -1.0)
    study.tell(trial, 1.0)
    assert study.trials[0].constraints == {"failed": HUGE, "errors == 0": -1.0}
