"""Warm start after an upgrade (another wheel, image or checkpoint revision): the earlier study's
top configs are queued first, and its measured trials are added to the new study so that the
sampler learns from them. Added trials are marked, count in no budget and are no results of the
new study (reports, duplicates and the confirmation ignore them): the new build is measured anew."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState as OptunaState

from search.store.results import TrialState
from search.store.storage import BUDGET_ATTR
from search.store.summary import load_view

WARM_ATTR = "warm_start_from"


def warm_start(study: optuna.Study, source: optuna.Study, top_k: int = 3) -> tuple[int, int]:
    """(configs queued, trials added). Done once per study: a resumed run adds nothing again."""
    if study.user_attrs.get(WARM_ATTR):
        return 0, 0
    if list(study.directions) != list(source.directions):
        raise ValueError(f"--warm-start: study {source.study_name!r} has other objectives "
                         f"({len(source.directions)}) than this space ({len(study.directions)})")
    view = load_view(source)
    maximize = view.objectives[0][1] == "maximize"
    # The default runs first in every study anyway: queue the best of the others.
    others = [r for r in view.feasible if r.state == TrialState.COMPLETE and r.number != view.baseline_number]
    tops = sorted(others, key=lambda r: (r.objective_values or [0.0])[0], reverse=maximize)[:top_k]
    for record in tops:
        params = {k: v for k, v in record.params.items() if k in _searched(source, record.number)}
        study.enqueue_trial(params, user_attrs={WARM_ATTR: f"{source.study_name}#{record.number}"},
                            skip_if_exists=True)
    added = 0
    for t in source.get_trials(deepcopy=False, states=(OptunaState.COMPLETE,)):
        study.add_trial(optuna.trial.create_trial(
            params=t.params, distributions=t.distributions, values=t.values, constraints=dict(t.constraints),
            user_attrs={WARM_ATTR: f"{source.study_name}#{t.number}", BUDGET_ATTR: False}))
        added += 1
    study.set_user_attr(WARM_ATTR, source.study_name)
    return len(tops), added


def _searched(source: optuna.Study, number: int) -> set[str]:
    """The params the sampler drew in that trial (engine/model only where the space chose them)."""
    return set(source.trials[number].params)
