"""Where a study lives: Optuna's storage (SQLite by default, any SQLAlchemy URL for many workers),
opened with heartbeats so that a dead worker's trial is retried, and the study's budget count."""

from __future__ import annotations

import functools
import random
import re
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.samplers import BaseSampler
from optuna.trial import TrialState as OptunaState

from search.space.space import Space
from search.store.results import STUDY_FORMAT, ResultsError, TrialRecord, check_study_format
from search.store.trial_index import RECORD_ATTR, final_numbers
from search.terminal import warning

HEARTBEAT_S = 60  # RDB storages: a trial without a heartbeat for GRACE_S is failed and retried once
GRACE_S = 180
OUTAGE_S = 300.0  # a database server that is away longer than this (not a restart or failover) fails the call
BUDGET_ATTR = "counts_in_budget"  # False for duplicates and skips: they cost no start


def default_storage(results_dir: Path) -> str:
    try:
        results_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a read-only or full results folder: one line, never a traceback
        raise ResultsError(f"cannot create the results folder {results_dir}: {exc.strerror or exc}") from None
    return f"sqlite:///{(results_dir / 'study.db').resolve()}"


def _connection_lost(exc: BaseException) -> bool:
    """Whether `exc` (or what it wraps: Optuna re-raises SQLAlchemy's errors as StorageInternalError)
    is the database server being unreachable, as opposed to a bad query or a constraint."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, sqlalchemy.exc.OperationalError):
            return True
        if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.connection_invalidated:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _riding_out_outages(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method`, called again while the database server is away (a restart, a failover, a network
    blip), for up to OUTAGE_S, with a line on stderr so that a wait is never silent. A trial being
    measured is not disturbed: its next storage call simply waits for the server to come back."""

    @functools.wraps(method)
    def call(self: RetryingRDBStorage, *args: Any, **kwargs: Any) -> Any:
        waited = 0.0
        pause = 1.0
        while True:
            try:
                return method(self, *args, **kwargs)
            except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError) as exc:
                if not _connection_lost(exc) or waited >= OUTAGE_S:
                    raise
                if waited == 0.0:
                    warning(f"the study storage is unreachable ({type(exc.__cause__ or exc).__name__}); "
                            f"retrying for up to {OUTAGE_S / 60:.0f} min")
                time.sleep(pause)
                waited += pause
                pause = min(pause * 2, 15.0)

    return call


class RetryingRDBStorage(optuna.storages.RDBStorage):
    """Optuna's RDBStorage for database servers (PostgreSQL, MySQL): every storage call rides out a
    server restart instead of ending the search with a traceback. A write whose connection drops
    after the server committed it is sent again: Optuna's writes of attributes, values and states
    are idempotent; a trial created in the instant the server went down can be created twice, and
    the spare one stays RUNNING (it has no heartbeat, so Optuna never fails it) and costs a worker
    sharing the budget one trial."""


for _name in ("create_new_trial", "set_trial_param", "set_trial_state_values", "set_trial_intermediate_value",
              "set_trial_user_attr", "set_trial_system_attr", "set_study_user_attr", "set_study_system_attr",
              "get_trial", "get_all_trials", "get_trial_id_from_study_id_trial_number", "get_study_user_attrs",
              "get_study_system_attrs", "get_trial_user_attrs", "get_trial_system_attrs", "get_study_directions",
              "get_study_id_from_name", "get_best_trial", "record_heartbeat", "_get_stale_trial_ids"):
    if hasattr(optuna.storages.RDBStorage, _name):
        setattr(RetryingRDBStorage, _name, _riding_out_outages(getattr(optuna.storages.RDBStorage, _name)))


def make_storage(url: str) -> optuna.storages.BaseStorage:
    """SQLite or any SQLAlchemy URL, with heartbeats so a dead worker's trial is retried. A database
    server's restart is ridden out (RetryingRDBStorage); SQLite has no server to come back."""
    storage_class = optuna.storages.RDBStorage if url.startswith("sqlite") else RetryingRDBStorage
    return storage_class(
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
