"""Where a study lives: Optuna's storage (SQLite by default, any SQLAlchemy URL for many workers),
opened with heartbeats so that a dead worker's trial is retried, and the study's budget count."""

from __future__ import annotations

import random
import re
import time
import warnings
from pathlib import Path

import optuna
import sqlalchemy.exc
from optuna.samplers import BaseSampler
from optuna.trial import TrialState as OptunaState

from search.space.space import Space
from search.store.results import STUDY_FORMAT, ResultsError, TrialRecord, check_study_format
from search.store.trial_index import RECORD_ATTR, final_numbers

HEARTBEAT_S = 60  # RDB storages: a trial without a heartbeat for GRACE_S is failed and retried once
GRACE_S = 180
BUDGET_ATTR = "counts_in_budget"  # False for duplicates and skips: they cost no start


def default_storage(results_dir: Path) -> str:
    try:
        results_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a read-only or full results folder: one line, never a traceback
        raise ResultsError(f"cannot create the results folder {results_dir}: {exc.strerror or exc}") from None
    return f"sqlite:///{(results_dir / 'study.db').resolve()}"


def make_storage(url: str) -> optuna.storages.BaseStorage:
    """SQLite or any SQLAlchemy URL, with heartbeats so a dead worker's trial is retried."""
    return optuna.storages.RDBStorage(
        url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
        heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1),
        engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else {"connect_args": {"timeout": 60}})


def open_study(space: Space, storage: str, study_name: str, sampler: BaseSampler) -> optuna.Study:
    """The space's study in `storage`, created on first use, asking `sampler` for its configs (a worker's:
    search.sampling.sampler.study_sampler)."""
    directions = [o.direction for o in space.m.objectives]
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    for attempt in range(6):
        try:
            study = optuna.create_study(storage=make_storage(storage), study_name=study_name,
                                        directions=directions, sampler=sampler, load_if_exists=True)
            break
        except sqlalchemy.exc.DBAPIError:
            # Workers that start together on a fresh database race to create its tables.
            if attempt == 5:
                raise
            time.sleep(0.5 + random.random() * (attempt + 1))
    objectives = [[o.metric, o.direction] for o in space.m.objectives]
    if study.user_attrs.get("objectives") not in (None, objectives):
        raise ValueError(f"study {study_name!r} was created with objectives {study.user_attrs['objectives']}, "
                         f"the space now says {objectives}; use another --study name")
    if "objectives" not in study.user_attrs:
        study.set_metric_names([o.metric for o in space.m.objectives])  # optuna-dashboard's axis labels
        study.set_user_attr("objectives", objectives)
        study.set_user_attr("space_source", space.source)
        study.set_user_attr("format", STUDY_FORMAT)
    check_study_format(study.user_attrs, f"study {study_name!r} in {storage}")
    return study


def stored_records(study: optuna.Study) -> list[TrialRecord]:
    return [TrialRecord.from_dict(t.user_attrs[RECORD_ATTR]) for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(RECORD_ATTR)]


def counted_trials(study: optuna.Study, with_running: bool = False) -> int:
    """Finished trials that count in the budget. Duplicates and skips do not (they cost no start),
    nor interrupted trials (FAIL: the search died or was stopped during them): each is re-run once
    on resume and that re-run counts, so a search killed during its last trial still re-runs it
    (counting both left the re-run queued forever and the study one result short)."""
    states = [OptunaState.COMPLETE, OptunaState.PRUNED]
    if with_running:
        states.append(OptunaState.RUNNING)
    counted = sum(1 for t in study.get_trials(deepcopy=False, states=tuple(states))
                  if t.user_attrs.get(BUDGET_ATTR, True))
    # A trial a resume settled (recovered from its result.json, or given up after two interruptions)
    # is FAIL in Optuna but counts like the trial it was.
    final = final_numbers(study)
    if final:
        counted += sum(1 for t in study.get_trials(deepcopy=False, states=(OptunaState.FAIL,))
                       if t.number in final and t.user_attrs.get(BUDGET_ATTR, True))
    return counted


_STUDY_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


def study_name(name: str) -> str:
    """A study name, checked before it becomes a folder under results/: letters, digits, '_', '.',
    '-', not starting with '.' or '-', so that no name (`..`, `/tmp/x`, `../x`) writes outside it."""
    if not _STUDY_NAME.match(name) or len(name) > 120:
        raise ResultsError(f"study name {name!r}: use letters, digits, '_', '.' and '-', not starting with '.' or "
                           "'-' (it names the folder results/NAME)")
    return name


def storage_for(target: str, storage: str | None) -> tuple[str, str]:
    """(storage URL, study name) from a study name or a results folder."""
    path = Path(target)
    if storage:
        return storage, study_name(target)
    if path.is_dir() and (path / "study.db").exists():
        return default_storage(path), path.name
    candidate = Path("results") / target
    if (candidate / "study.db").exists():
        return default_storage(candidate), target
    raise ResultsError(f"no study found at {target!r} (give a results folder, or --storage URL with the name)")


def open_existing(name: str, storage: str) -> optuna.Study:
    """An existing study, or a one-line ResultsError (no such study, no driver for the URL)."""
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise ResultsError(f"no study named {name!r} in {storage}") from None
    except ImportError as exc:  # e.g. postgresql:// without psycopg2 installed
        raise ResultsError(f"storage {storage}: {exc}") from None
