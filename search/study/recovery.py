"""Resume after a crash, through Optuna's public API only: trials left RUNNING by a dead worker of
this host are failed as interrupted (their record kept in a study attribute, since a finished
trial's attributes cannot be written through the public API), and every interrupted config is
queued again once."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState as OptunaState

from harness.failure import Cause, Failure
from harness.launch.reaper import worker_dead
from search.store.results import TrialRecord, TrialState
from search.store.trial_index import params_key

INTERRUPTED_ATTR = "interrupted"  # trial attr (own process) or study attr prefix "interrupted.<number>"


def jsonable(data: Any) -> Any:
    import json

    return json.loads(json.dumps(data, default=str))


def fail_trials_of_dead_workers(study: optuna.Study, default_params: dict[str, Any]) -> None:
    """A trial left RUNNING by a process of this host that is gone (SIGKILL, OOM killer) is failed
    as interrupted now, not after the heartbeat's grace period."""
    for t in study.get_trials(deepcopy=False, states=(OptunaState.RUNNING,)):
        worker = t.user_attrs.get("worker")
        if not worker or not worker_dead(worker):
            continue
        params = {**default_params, **t.params}
        record = TrialRecord(number=t.number, state=TrialState.FAILED, params=params, engine=str(params["engine"]),
                             model=str(params["model"]),
                             failure=Failure(Cause.INTERRUPTED, f"the search process running it ({worker}) died"))
        study.set_user_attr(f"{INTERRUPTED_ATTR}.{t.number}", jsonable(record.summary()))
        study.tell(t.number, state=OptunaState.FAIL)


def interrupted_numbers(study: optuna.Study) -> set[int]:
    marked = {int(k.split(".", 1)[1]) for k in study.user_attrs if k.startswith(INTERRUPTED_ATTR + ".")}
    return marked | {t.number for t in study.get_trials(deepcopy=False) if t.user_attrs.get(INTERRUPTED_ATTR)}


def requeue_interrupted(study: optuna.Study) -> None:
    """Queue each interrupted config again, unless it finished since or is already queued."""
    trials = study.get_trials(deepcopy=False)
    done = {params_key(t.params) for t in trials if t.state in (OptunaState.COMPLETE, OptunaState.WAITING)}
    interrupted = interrupted_numbers(study)
    for t in trials:
        key = params_key(t.params)
        if t.number in interrupted and key not in done:
            study.enqueue_trial(t.params, user_attrs={"resumed_from": t.number})
            done.add(key)


def interrupted_records(study: optuna.Study) -> dict[int, TrialRecord]:
    """Records of trials failed by fail_trials_of_dead_workers (kept as study attributes)."""
    out = {}
    for key, data in study.user_attrs.items():
        if key.startswith(INTERRUPTED_ATTR + ".") and isinstance(data, dict):
            record = TrialRecord.from_dict(data)
            out[record.number] = record
    return out
