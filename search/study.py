"""The trial loop: sample a config, start (or reuse) its server, measure, check, store.

A failed start is a failed trial with its cause (never a crash of the search), an identical
config is never launched twice, a running server is reused when only request-side parameters
change, and Ctrl-C / SIGTERM stop every server and leave the study consistent and resumable.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
import traceback
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import httpx
import optuna
import sqlalchemy.exc
from optuna.trial import TrialState

from harness.launch import log_tail
from harness.launch.registry import worker_dead, worker_tag
from harness.quality import QualityResult, assess, quality_metrics
from harness.quality import constraint_names as quality_constraint_names
from harness.quality import constraint_values as quality_constraint_values
from harness.reference import ReferenceAnswers, ReferenceStore, capture_reference, reference_config, reference_key
from harness.roofline import Roofline, build_roofline
from harness.session import (
    LaunchFailed,
    MeasureSettings,
    RunningConfig,
    measure_running,
    model_id_of,
    start_config,
)
from search.memory_fit import estimate
from search.results import Failure, TrialRecord, write_json_atomic
from search.space import Config, Space, constraint_value

RECORD_ATTR = "flagsearch_record"
HEARTBEAT_S = 60  # RDB storages: a trial without a heartbeat for GRACE_S is failed and retried once
GRACE_S = 180




class Reporter(Protocol):
    def trial_started(self, number: int, index: int, total: int, config: Config) -> None: ...
    def phase(self, text: str) -> None: ...
    def trial_finished(self, record: TrialRecord) -> None: ...
    def note(self, text: str) -> None: ...


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host not in ("0.0.0.0", "") else "127.0.0.1", 0))
        return int(s.getsockname()[1])


def default_storage(results_dir: Path) -> str:
    results_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(results_dir / 'study.db').resolve()}"


def make_sampler(space: Space) -> optuna.samplers.BaseSampler:
    """TPE for one objective, NSGA-II for several; both honour the constraints each trial sets."""
    if len(space.m.objectives) == 1:
        return optuna.samplers.TPESampler(seed=space.m.seed, n_startup_trials=4)
    return optuna.samplers.NSGAIISampler(seed=space.m.seed, population_size=8)


def make_storage(url: str) -> optuna.storages.BaseStorage:
    """SQLite or any SQLAlchemy URL, with heartbeats so a dead worker's trial is retried."""
    return optuna.storages.RDBStorage(
        url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
        heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1),
        engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else {"connect_args": {"timeout": 60}})


def open_study(space: Space, storage: str, study_name: str) -> optuna.Study:
    directions = [o.direction for o in space.m.objectives]
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    for attempt in range(6):
        try:
            study = optuna.create_study(storage=make_storage(storage), study_name=study_name,
                                        directions=directions, sampler=make_sampler(space), load_if_exists=True)
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
    return study


def stored_records(study: optuna.Study) -> list[TrialRecord]:
    out = []
    for t in study.get_trials(deepcopy=False):
        data = t.user_attrs.get(RECORD_ATTR)
        if data:
            out.append(TrialRecord.from_dict(data))
    return out


class ActiveServer:
    """The server kept between trials, with the launch key it was started for."""

    def __init__(self, key: str, running: RunningConfig):
        self.key = key
        self.running = running


class StudyRunner:
    def __init__(self, space: Space, storage: str, study_name: str, results_dir: Path, reporter: Reporter):
        self.space = space
        self.storage = storage
        self.study_name = study_name
        self.results_dir = results_dir
        self.reporter = reporter
        self.study = open_study(space, storage, study_name)
        self._ensure_baseline()
        self.active: ActiveServer | None = None
        self._fingerprints: dict[str, dict[str, Any]] = {}
        self.starts = 0
        self.starts_saved = 0
        self.total = space.m.budget.trials
        self._reference_answers: ReferenceAnswers | None = None
        self._quality_result: QualityResult | None = None
        self._rooflines: dict[str, Roofline | None] = {}

    # ---- the loop ---------------------------------------------------------------------------
    def run(self, n_trials: int | None = None, timeout_s: float | None = None) -> None:
        """Run until the study holds `n_trials` finished trials (the budget is per study, so a
        second run of the same study resumes, and several workers share one budget)."""
        self.total = n_trials or self.space.m.budget.trials
        self._requeue_interrupted()
        if self._finished_count() >= self.total:
            self.reporter.note(f"the study already has {self.total} finished trials")
            return
        try:
            try:
                self._reference()  # before any trial: it may need a server of its own
            except LaunchFailed as exc:
                raise ValueError(f"the reference config (quality.reference) did not start: {exc}") from None
            # optimize() (not bare ask/tell) so that RDB storages get heartbeats and stale trials of
            # dead workers are failed and retried (see open_study).
            self.study.optimize(self._objective, timeout=timeout_s, callbacks=[self._stop_at_budget],
                                gc_after_trial=False)
        finally:
            self._stop_active()

    def _finished_count(self, with_running: bool = False) -> int:
        states = [TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED]
        if with_running:
            states.append(TrialState.RUNNING)
        return len(self.study.get_trials(deepcopy=False, states=tuple(states)))

    def _stop_at_budget(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        # Trials other workers are running count too, so that workers together run the budget.
        if self._finished_count(with_running=True) >= self.total:
            study.stop()

    def _ensure_baseline(self) -> None:
        # The engine's default config is measured first, so every result has a "x default" ratio.
        # skip_if_exists: a second worker starting on the same fresh study does not queue it twice
        # (a race remains if both start within the same moment).
        if not self.study.get_trials(deepcopy=False):
            self.study.enqueue_trial(self.space.default_config(), user_attrs={"baseline": True},
                                     skip_if_exists=True)

    def _fail_trials_of_dead_workers(self) -> None:
        """A trial left RUNNING by a process of this host that is gone (SIGKILL, OOM killer) is failed
        as interrupted now, so that it is re-run now, not after the heartbeat's grace period."""
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            worker = t.user_attrs.get("worker")
            if not worker or not worker_dead(worker):
                continue
            params = {"engine": next(iter(self.space.m.engines)), "model": self.space.m.models[0].name, **t.params}
            record = TrialRecord(number=t.number, state="failed", params=params, engine=str(params["engine"]),
                                 model=str(params["model"]),
                                 failure=Failure("interrupted", f"the search process running it ({worker}) died"))
            storage = self.study._storage  # the public Trial API only reaches trials of this process
            storage.set_trial_user_attr(t._trial_id, RECORD_ATTR, _jsonable(record.summary()))
            storage.set_trial_user_attr(t._trial_id, "interrupted", True)
            self.study.tell(t.number, state=TrialState.FAIL)

    def _requeue_interrupted(self) -> None:
        self._fail_trials_of_dead_workers()
        trials = self.study.get_trials(deepcopy=False)
        finished = {repr(sorted(t.params.items())) for t in trials if t.state == TrialState.COMPLETE}
        waiting = {repr(sorted(t.params.items())) for t in trials if t.state == TrialState.WAITING}
        for t in trials:
            key = repr(sorted(t.params.items()))
            if t.user_attrs.get("interrupted") and key not in finished and key not in waiting:
                self.study.enqueue_trial(t.params, user_attrs={"resumed_from": t.number})
                waiting.add(key)

    def _objective(self, trial: optuna.Trial) -> list[float]:
        started = time.monotonic()
        index = self._finished_count() + 1
        config = self.space.sample(trial)
        self.reporter.trial_started(trial.number, index, self.total, config)
        record = TrialRecord(number=trial.number, state="running", params=config.as_params(),
                             engine=config.engine, model=config.model)
        trial.set_user_attr("worker", worker_tag())
        trial_dir = self.results_dir / "trials" / f"{trial.number:04d}"
        try:
            previous = self._identical_finished(config)
            if previous is not None:
                self._record_duplicate(record, previous)
            else:
                self._measure_config(config, record, trial_dir)
        except Exception as exc:  # a bug or an unforeseen fault costs one trial, not the search
            self._stop_active()
            record.state = "failed"
            record.failure = Failure("internal_error", f"{type(exc).__name__}: {exc}",
                                     traceback.format_exc().splitlines()[-12:])
        except KeyboardInterrupt:
            record.state = "failed"
            record.failure = Failure("interrupted", "the search was interrupted during this trial")
            trial.set_user_attr("interrupted", True)
            self._finish(trial, record, trial_dir, started)
            raise
        self._finish(trial, record, trial_dir, started)
        if record.state in ("complete", "duplicate") and record.objective_values is not None:
            for label, value in zip(self.constraint_labels(), record.constraint_values, strict=True):
                trial.set_constraint(label, value)  # feasible when <= 0; samplers and reports read these
            return record.objective_values
        # A failed config is told as PRUNED, not FAIL: TPE then ranks it below every result and
        # steers away from its region (crash learning), while FAIL trials would be ignored and the
        # same failing region proposed again. The record keeps state "failed" and the cause.
        cause = record.failure.cause if record.failure else "failed"
        raise optuna.TrialPruned(f"trial {trial.number} failed: {cause}")

    def _identical_finished(self, config: Config) -> TrialRecord | None:
        params = config.as_params()
        for rec in stored_records(self.study):
            if rec.params == params and rec.state in ("complete", "failed", "duplicate") and not (
                    rec.failure and rec.failure.cause == "interrupted"):
                return rec
        return None

    def _record_duplicate(self, record: TrialRecord, previous: TrialRecord) -> None:
        """Never re-run an identical config: a failure stays a failure, a result is reused."""
        record.duplicate_of = previous.duplicate_of if previous.duplicate_of is not None else previous.number
        self.reporter.phase(f"identical to trial #{record.duplicate_of}: not launched again")
        record.command, record.env, record.metrics = previous.command, previous.env, previous.metrics
        record.quality, record.objective_values = previous.quality, previous.objective_values
        record.constraint_values = previous.constraint_values
        if previous.state == "failed" or previous.objective_values is None:
            record.state = "failed"
            cause = previous.failure.cause if previous.failure else "failed"
            record.failure = Failure(f"duplicate_of_failed:{cause}",
                                     f"same config as failed trial #{record.duplicate_of}")
        else:
            record.state = "duplicate"

    # ---- one config ---------------------------------------------------------------------------
    def _measure_config(self, config: Config, record: TrialRecord, trial_dir: Path) -> None:
        _, _, request = self.space.split(config)
        key = self.space.launch_key(config)

        if self.active and self.active.key == key and self.active.running.alive():
            running = self.active.running
            record.reused_server = True
            record.ready_s = 0.0
            self.starts_saved += 1
            self.reporter.phase("reusing the running server (only request-side parameters changed)")
        else:
            fit = estimate(self.space, config)
            if fit is not None and not fit.fits:
                record.state = "failed"
                record.failure = Failure("wont_fit", f"rejected before launch: {fit.detail}")
                self.reporter.phase(f"not launched: cannot fit ({fit.detail})")
                return
            if fit is not None and fit.warning:
                record.warnings.append(fit.warning)
            try:
                running = self._server_for(config, trial_dir)
            except LaunchFailed as exc:
                record.command = exc.command
                record.log_path = str(trial_dir / "server.log")
                record.state = "failed"
                record.failure = Failure(exc.cause, exc.detail, exc.log_tail)
                return
            record.ready_s = running.ready_s
        record.command = running.command
        record.log_path = str(running.server.log_path)
        record.startup = {"ready_s": running.ready_s, **asdict(running.startup)}
        record.fingerprint = running.fingerprint
        record.env = dict(running.spec.env)
        self._measure(record, running, request)

    def _measure(self, record: TrialRecord, running: RunningConfig, request: dict[str, Any]) -> None:
        m = self.space.m
        self._quality_result = None
        workloads = self.space.workload_specs(request)
        try:
            results = measure_running(running, workloads, MeasureSettings(m.measure.repeats, m.measure.warmup,
                                                                          m.measure.request_timeout_s),
                                      self.reporter.phase, self._roofline(record.model, running))
        except httpx.HTTPError as exc:
            for _ in range(20):  # a killed server may take a moment to be seen as exited
                if not running.alive():
                    break
                time.sleep(0.1)
            if running.alive():  # alive but not answering (frozen, deadlocked): a failed trial
                record.state = "failed"
                record.failure = Failure("unresponsive", f"the server stopped answering ({type(exc).__name__})",
                                         log_tail(running.server.log_path))
                running.stop()
                self.active = None
                return
            results = {}  # it died: recorded as a crash below
        for name, wm in results.items():
            record.workloads[name] = wm.to_dict()
            for k, stat in wm.summary.items():
                record.metrics[f"{name}.{k}"] = stat.median
            record.metrics[f"{name}.errors"] = float(wm.errors)
            record.placebo.extend(p for p in wm.placebo if p not in record.placebo)
            record.warnings.extend(f"{name}: {w}" for w in wm.warnings)
        if running.alive() and (m.quality.suite or m.quality.reference):
            self.reporter.phase(f"checking quality ({m.quality.suite or 'reference agreement'})")
            q = asyncio.run(self._quality(running, self._reference()))
            record.quality = q.to_dict()
            record.metrics.update(quality_metrics(q))
            self._quality_result = q
            if q.fatal:  # garbage never wins: the trial fails outright, whatever its speed
                record.state = "failed"
                record.failure = Failure("degenerate_output", q.fatal)
                return
        if not running.alive():
            cause, detail = running.crash_cause()
            record.state = "failed"
            record.failure = Failure(cause, detail, log_tail(running.server.log_path))
            running.stop()
            self.active = None
            return
        record.metrics["errors"] = sum(v for k, v in record.metrics.items() if k.endswith(".errors"))
        record.metrics["startup.ready_s"] = record.ready_s or 0.0
        self._score(record)

    async def _quality(self, running: RunningConfig, reference: ReferenceAnswers | None) -> QualityResult:
        m = self.space.m
        return await assess(running.base_url, await model_id_of(running.base_url), running.engine.dialect,
                            m.quality, reference, m.measure.request_timeout_s)

    def _reference(self) -> ReferenceAnswers | None:
        """Reference answers for agreement checks: captured once per study on the reference config
        (the default config unless `quality.reference.params` says otherwise), then cached."""
        spec = self.space.m.quality.reference
        if spec is None:
            return None
        if self._reference_answers is not None:
            return self._reference_answers
        params = reference_config(self.space.default_config(), spec)
        config = self.space.sample(optuna.trial.FixedTrial(params))
        key = reference_key(config.model, params, spec)
        store = ReferenceStore(self.results_dir)
        answers = store.load(key)
        if answers is None:
            self.reporter.phase("capturing reference answers on the reference config (once per study)")
            running = self._server_for(config, self.results_dir / "reference")
            base_url = running.base_url
            answers = asyncio.run(capture_reference(
                base_url, asyncio.run(model_id_of(base_url)), running.engine.dialect, spec, config.model, params,
                self.space.m.measure.request_timeout_s))
            store.save(answers)
        self._reference_answers = answers
        return answers

    def _roofline(self, model_name: str, running: RunningConfig) -> Roofline | None:
        """% of the memory-bandwidth ceiling, when the model's bytes per token are known: bandwidth
        as the space's `device` states it, else measured once (GPU copy in the engine's torch, or
        host memory for CPU engines)."""
        key = f"{model_name}|{running.spec.engine}"
        if key not in self._rooflines:
            device = self.space.m.device
            self._rooflines[key] = build_roofline(self.space.model_choice(model_name),
                                                  device.bandwidth_gbs if device else None,
                                                  engine_python=self.space.engine_settings(running.spec.engine).python)
        return self._rooflines[key]

    def _server_for(self, config: Config, log_dir: Path) -> RunningConfig:
        """A running server for `config`: the active one if it fits, else a new one (kept active)."""
        key = self.space.launch_key(config)
        if self.active and self.active.key == key and self.active.running.alive():
            return self.active.running
        self._stop_active()
        flags, env, _ = self.space.split(config)
        settings = self.space.engine_settings(config.engine)
        self.starts += 1  # every attempted start costs its startup time, failed or not
        running = start_config(settings, self.space.model_choice(config.model), flags, env,
                               free_port(settings.host), log_dir / "server.log", self.reporter.phase,
                               self._fingerprints)
        self.active = ActiveServer(key, running)
        return running

    def constraint_labels(self) -> list[str]:
        labels = [f"{metric} {op} {threshold:g}" for metric, op, threshold in self.space.constraint_exprs()]
        quality = self.space.m.quality
        # Same condition as _score: without a suite or reference no quality values are appended.
        return labels + (quality_constraint_names(quality) if quality.suite or quality.reference else [])

    def _score(self, record: TrialRecord) -> None:
        m = self.space.m
        values = []
        for obj in m.objectives:
            if obj.metric not in record.metrics:
                record.state = "failed"
                record.failure = Failure("objective_missing",
                                         f"metric {obj.metric!r} was not measured (every request failed?)")
                return
            values.append(record.metrics[obj.metric])
        record.objective_values = values
        constraints = []
        for metric, op, threshold in self.space.constraint_exprs():
            value = record.metrics.get(metric)
            constraints.append(constraint_value(value, op, threshold) if value is not None else 1.0)
        if m.quality.suite or m.quality.reference:
            constraints += quality_constraint_values(self._quality_result, m.quality)
        record.constraint_values = constraints
        record.state = "complete"

    def _finish(self, trial: optuna.Trial, record: TrialRecord, trial_dir: Path, started: float) -> None:
        record.wall_s = time.monotonic() - started
        # The study storage gets the record first: it is what resume, reports and workers read.
        trial.set_user_attr(RECORD_ATTR, _jsonable(record.summary()))
        write_json_atomic(trial_dir / "result.json", {**record.summary(), "workloads": record.workloads})
        self.reporter.trial_finished(record)

    def _stop_active(self) -> None:
        if self.active:
            self.reporter.phase("stopping the server")
            self.active.running.stop()
            self.active = None


def _jsonable(data: Any) -> Any:
    import json

    return json.loads(json.dumps(data, default=str))
