"""Resume after a crash, through Optuna's public API only.

- A trial left RUNNING by a dead worker of this host is failed as interrupted (its record kept in a
  study attribute, since a finished trial's attributes cannot be written through the public API).
- A trial whose record never reached the study storage (a lasting database outage, a full disk
  under SQLite, just as it was recorded) but whose `trials/NNNN/result.json` was written first is
  recovered from that file: the measurement is kept and the config is not run again.
- Every interrupted config is queued again, once per resume; a config whose run was cut short twice
  by anything but a Ctrl-C (the tool killed, the OOM killer choosing the tool, the machine frozen by
  the config) is not queued a third time: it is failed with that cause, so it cannot take the
  machine down first in line forever.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState as OptunaState

from harness.failure import Cause, Failure
from harness.launch.reaper import worker_dead
from search.store.results import ResultsError, TrialRecord, TrialState, read_record
from search.store.trial_index import (
    FINAL_ATTR,
    INTERRUPTED_ATTR,
    RECORD_ATTR,
    final_numbers,
    params_key,
    study_records,
)

# An interruption's kind (trial attr INTERRUPTED_BY): a user's Ctrl-C is not the config's doing
# and never counts towards INTERRUPTED_TWICE.
INTERRUPTED_BY = "interrupted_by"
BY_CTRL_C = "ctrl-c"
INTERRUPTED_TWICE = "interrupted_twice"  # the cause of a config given up after two interruptions
MAX_INTERRUPTIONS = 2

__all__ = ["BY_CTRL_C", "INTERRUPTED_ATTR", "INTERRUPTED_BY", "INTERRUPTED_TWICE", "fail_trials_of_dead_workers",
           "interrupted_numbers", "interrupted_records", "jsonable", "recover_from_files", "requeue_interrupted"]


def jsonable(data: Any) -> Any:
    import json

    return json.loads(json.dumps(data, default=str))


def _file_record(trials_dir: Path | None, number: int) -> TrialRecord | None:
    """The finished record a trial wrote to its result.json, if any (a damaged file is no record)."""
    if trials_dir is None:
        return None
    path = trials_dir / f"{number:04d}" / "result.json"
    if not path.is_file():
        return None
    try:
        record = read_record(path)
    except ResultsError:
        return None
    finished = record.state in (TrialState.COMPLETE, TrialState.FAILED, TrialState.PRUNED, TrialState.DUPLICATE,
                                TrialState.SKIPPED)
    if record.number != number or not finished or (record.failure and record.failure.cause == Cause.INTERRUPTED):
        return None
    return record


def fail_trials_of_dead_workers(study: optuna.Study, default_params: dict[str, Any],
                                trials_dir: Path | None = None) -> None:
    """A trial left RUNNING by a process of this host that is gone (SIGKILL, OOM killer) is failed
    now, not after the heartbeat's grace period: as interrupted, or, when its result.json holds a
    finished record (the tool died between the file and the storage write), with that record."""
    for t in study.get_trials(deepcopy=False, states=(OptunaState.RUNNING,)):
        worker = t.user_attrs.get("worker")
        if not worker or not worker_dead(worker):
            continue
        recovered = _file_record(trials_dir, t.number)
        if recovered is not None:
            study.set_user_attr(f"{FINAL_ATTR}.{t.number}", jsonable(recovered.summary()))
        else:
            params = {**default_params, **t.params}
            record = TrialRecord(number=t.number, state=TrialState.FAILED, params=params,
                                 engine=str(params["engine"]), model=str(params["model"]),
                                 failure=Failure(Cause.INTERRUPTED, f"the search process running it ({worker}) died"))
            study.set_user_attr(f"{INTERRUPTED_ATTR}.{t.number}", jsonable(record.summary()))
        study.tell(t.number, state=OptunaState.FAIL)


def recover_from_files(study: optuna.Study, trials_dir: Path) -> list[int]:
    """Failed trials with no record in the storage whose result.json holds one (its storage write
    failed after the file was written): the record is kept on the study. Returns their numbers."""
    kept = study_records(study)
    found = []
    for t in study.get_trials(deepcopy=False, states=(OptunaState.FAIL,)):
        if t.user_attrs.get(RECORD_ATTR) or t.number in kept:
            continue
        record = _file_record(trials_dir, t.number)
        if record is not None:
            study.set_user_attr(f"{FINAL_ATTR}.{t.number}", jsonable(record.summary()))
            found.append(t.number)
    return found


def interrupted_numbers(study: optuna.Study) -> set[int]:
    marked = {int(k.split(".", 1)[1]) for k in study.user_attrs if k.startswith(INTERRUPTED_ATTR + ".")}
    return (marked | {t.number for t in study.get_trials(deepcopy=False) if t.user_attrs.get(INTERRUPTED_ATTR)}) \
        - final_numbers(study)


def requeue_interrupted(study: optuna.Study) -> list[int]:
    """Queue each interrupted config again, unless it finished since or is already queued; a config
    interrupted MAX_INTERRUPTIONS times (a Ctrl-C aside) is failed instead. Returns the numbers of
    the trials given up."""
    trials = study.get_trials(deepcopy=False)
    final = final_numbers(study)  # recovered from their files, or given up: settled either way
    done = {params_key(t.params) for t in trials if t.state in (OptunaState.COMPLETE, OptunaState.WAITING)
            or t.number in final}
    interrupted = interrupted_numbers(study)
    kept = study_records(study)
    cut_short: dict[str, list[int]] = {}  # params -> its interrupted trials, a Ctrl-C aside
    for t in trials:
        if t.number in interrupted and t.user_attrs.get(INTERRUPTED_BY) != BY_CTRL_C:
            cut_short.setdefault(params_key(t.params), []).append(t.number)
    given_up = []
    for t in trials:
        key = params_key(t.params)
        if t.number not in interrupted or key in done:
            continue
        numbers = cut_short.get(key, [])
        if len(numbers) >= MAX_INTERRUPTIONS:
            last = max(numbers)
            record = _given_up(study, trials, last, numbers, kept)
            study.set_user_attr(f"{FINAL_ATTR}.{last}", jsonable(record.summary()))
            given_up.append(last)
        else:
            study.enqueue_trial(t.params, user_attrs={"resumed_from": t.number})
        done.add(key)
    return given_up


def _given_up(study: optuna.Study, trials: list[optuna.trial.FrozenTrial], last: int, numbers: list[int],
              kept: dict[int, TrialRecord]) -> TrialRecord:
    """The failed record of a config interrupted in each of `numbers`: its last interruption's
    record with the cause INTERRUPTED_TWICE and what cut each run short."""
    records = []
    for number in numbers:
        trial = next(t for t in trials if t.number == number)
        data = trial.user_attrs.get(RECORD_ATTR)
        records.append(kept[number] if number in kept else TrialRecord.from_dict(data) if data else None)
    last_record = records[numbers.index(last)]
    if last_record is None:
        trial = next(t for t in trials if t.number == last)
        last_record = TrialRecord(number=last, state=TrialState.FAILED, params=dict(trial.params),
                                  engine=str(trial.params.get("engine", "")), model=str(trial.params.get("model", "")))
    causes = "; ".join(f"#{n}: {r.failure.detail if r and r.failure else 'interrupted'}"
                       for n, r in zip(numbers, records, strict=True))
    last_record.state = TrialState.FAILED
    last_record.failure = Failure(INTERRUPTED_TWICE, f"its run was cut short {len(numbers)} times ({causes}): not "
                                  "queued again, since the config may be what takes the tool or the machine down "
                                  "(the OOM killer, a memory freeze)")
    return last_record


def interrupted_records(study: optuna.Study) -> dict[int, TrialRecord]:
    """Records kept as study attributes (trials of dead workers, recovered or given-up trials)."""
    return study_records(study)
