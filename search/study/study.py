"""The trial loop, one verb a step: sample -> resolve -> run -> record -> tell.

- sample: the space draws a config from the sampler (search/sampling/sampler.py).
- resolve: the TrialIndex says whether it was already measured (a duplicate: never launched
  twice), holds a value an engine rejected, or is being run by another worker (both skipped);
  memory fit rejects what cannot fit before paying for a start.
- run: harness.session.Session.run, the one door that starts or reuses the server, measures and
  checks quality, and raises TrialFailed with the cause.
- record: one TrialRecord, stored in the study and as results/<study>/trials/NNNN/result.json.
- tell: values and constraints, or a failure the sampler ranks below every result.

Ctrl-C / SIGTERM stop every server and leave the study consistent and resumable. Beside the loop:
scoring.py (the record and the values told), pruning.py (stop after a clearly worse load point),
study_inputs.py (reference answers, rooflines), noise.py (the default re-measured), study_lock.py
(the budget shared by workers).
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import optuna
from optuna.trial import TrialState as OptunaState

from harness.failure import Cause, Failure, TrialFailed
from harness.launch.reaper import Terminated, worker_tag
from harness.quality.quality import QualityResult
from harness.session import Measurement, QualityPlan, RunningConfig, Session, free_port
from search.sampling.pruning import clearly_worse
from search.sampling.sampler import (
    FAILED_KEY,
    FAILED_VIOLATION,
    QUEUED_ATTR,
    failure_values,
    record_guide,
    space_exhausted,
    study_sampler,
    trial_origin,
)
from search.sampling.stopping import study_should_stop
from search.space.space import Config, Resolved, Space
from search.store.results import ResultsError, TrialRecord, TrialState, write_json_atomic
from search.store.storage import BUDGET_ATTR, counted_trials, default_storage, make_storage, open_study, stored_records
from search.store.trial_index import RECORD_ATTR, TrialIndex
from search.study.curves import add_curve_summaries
from search.study.estimate import Estimator
from search.study.inputs import ReferenceCapture, Rooflines
from search.study.lock import StudyLock
from search.study.memory_fit import LocalMemory, estimate, free_at_start, workloads_beyond_context
from search.study.noise import probe, probe_due, stop_rule_floor
from search.study.recovery import (
    BY_CTRL_C,
    INTERRUPTED_BY,
    fail_trials_of_dead_workers,
    jsonable,
    recover_from_files,
    requeue_interrupted,
)
from search.study.scoring import (
    capacity_of,
    constraint_labels,
    copy_duplicate,
    fail,
    fill,
    fill_capacity,
    judges_quality,
    measure_settings,
    score,
)
from search.study.unified_memory import MEMORY_HELD, MemoryGuard, retry_if_memory_held
from search.verdicts import noise_store

# Storage helpers are re-exported: callers open and count studies through this module or search.store.storage.
__all__ = ["BUDGET_ATTR", "RECORD_ATTR", "Reporter", "StudyRunner", "counted_trials", "default_storage", "free_port",
           "make_storage", "open_study", "stored_records"]

EXHAUSTED_AFTER = 25  # consecutive suggestions that started nothing (known or rejected): stop, saying so


class Reporter(Protocol):
    def trial_started(self, number: int, index: int, total: int, config: Config) -> None: ...
    def phase(self, text: str) -> None: ...
    def trial_finished(self, record: TrialRecord) -> None: ...
    def note(self, text: str) -> None: ...


class SkipTrial(Exception):
    """A suggestion that costs nothing and teaches nothing (another worker runs it): told as FAIL."""


class StudyRunner:
    def __init__(self, space: Space, storage: str, study_name: str, results_dir: Path, reporter: Reporter,
                 seed: int | None = None, budget_s: float | None = None,
                 drop_page_cache: Sequence[str] | None = None):
        self.space = space
        self.storage = storage
        self.study_name = study_name
        self.results_dir = results_dir
        self.reporter = reporter
        self.study = open_study(space, storage, study_name, study_sampler(space, seed))
        # Held while a worker checks the budget and creates a trial, or queues configs (study_lock.py).
        self.lock = StudyLock(storage, study_name)
        with self.lock:
            self.guided_by = record_guide(self.study)  # the guided phase, in words (`search run` says it once)
            if not self.study.get_trials(deepcopy=False):
                # The default config is measured first, so every result has a "x default" ratio.
                self.study.enqueue_trial(space.default_config(), user_attrs={"baseline": True})
                for label, params in space.queued_configs():  # the space's known configs, in its order
                    self.study.enqueue_trial(params, user_attrs={QUEUED_ATTR: label})
        self.session = Session(reporter.phase)
        self.index = TrialIndex()
        self.total = space.m.budget.trials
        self.stop_reason: str | None = None  # why the study stopped before its budget
        self.budget_s = budget_s  # wall time: no trial is started that the estimate says cannot finish
        self.deadline: float | None = None
        self.estimator = Estimator(space, stored_records(self.study))
        self._free_memory: LocalMemory | None = None
        self.memory = MemoryGuard(space, reporter.note, drop_page_cache)
        self._known_in_a_row = 0
        self._stopping = False
        self.reference = ReferenceCapture(space, results_dir, self.session, reporter.phase)
        self.rooflines = Rooflines(space)

    @property
    def starts(self) -> int:
        return self.session.starts

    @property
    def starts_saved(self) -> int:
        return self.session.reuses

    @property
    def active(self) -> RunningConfig | None:
        """The server kept running between trials, if any."""
        return self.session.pool.running

    # ---- the loop ---------------------------------------------------------------------------
    def run(self, n_trials: int | None = None, timeout_s: float | None = None) -> None:
        """Run until the study holds `n_trials` counted trials (the budget is per study, so a
        second run of the same study resumes, and several workers share one budget)."""
        self.total = n_trials or self.space.m.budget.trials
        self.deadline = time.monotonic() + self.budget_s if self.budget_s else None
        self._free_memory = free_at_start(self.space)  # unified memory: what the OS leaves us, read once
        with self.lock:
            trials_dir = self.results_dir / "trials"
            fail_trials_of_dead_workers(self.study, self.space.default_config(), trials_dir)
            for number in recover_from_files(self.study, trials_dir):
                self.reporter.note(f"trial #{number}: its record was recovered from its result.json (the study "
                                   "storage failed as it was stored)")
            for number in requeue_interrupted(self.study):
                self.reporter.note(f"trial #{number}: not queued again, its config was interrupted twice")
        if counted_trials(self.study) >= self.total:
            self.reporter.note(f"the study already has {self.total} finished trials")
            return
        try:
            try:
                self.reference.answers()  # before any trial: it may need a server of its own
            except TrialFailed as exc:
                raise ValueError(f"the reference config (quality.reference) did not start: {exc}") from None
            self._loop(timeout_s)
        finally:
            self.session.close()
            self.lock.close()

    def _loop(self, timeout_s: float | None) -> None:
        """One trial at a time, each created under the study's lock while the budget has room, so
        that workers together never run more than the budget. optimize() (not bare ask/tell), one
        trial a call, so that RDB storages get heartbeats and stale trials of dead workers are
        failed and retried (see make_storage)."""
        ends = time.monotonic() + timeout_s if timeout_s else None
        self._stopping = False
        while not self._stopping and (ends is None or time.monotonic() < ends):
            with self.lock:  # _objective releases it as soon as its trial holds its params
                # Trials other workers are running count too: they hold their share of the budget.
                if counted_trials(self.study, with_running=True) >= self.total:
                    return
                self.study.optimize(self._objective, n_trials=1, callbacks=[self._after_trial],
                                    gc_after_trial=False, catch=(SkipTrial,))

    def _stop(self, reason: str | None = None) -> None:
        if reason:
            self.stop_reason = reason
        self._stopping = True

    def noise_floor_value(self) -> float:
        """The spread the stop rule allows for (search/study/noise.py)."""
        # The default is trial 0 of every study (queued first); read from the index, not the storage.
        base = next((r for r in self.index.finished.values() if r.number == 0), None)
        return stop_rule_floor(self.study, self.space, base.objective_values[0] if base and base.objective_values
                               else None)

    def paired_noise(self) -> tuple[float, str] | None:
        """The start noise this setup's paired runs measured (search/verdicts/noise_store.py: the host, engine and model
        of the default's start, the objective's workload and metric), per start (a round's difference holds two
        starts), with where it comes from; None until the store holds enough of them. It prices the confirmation the
        stop rule weighs what is left against (search/sampling/stopping.py)."""
        base = next((r for r in self.index.finished.values() if r.number == 0), None)
        if base is None or not base.fingerprint or len(self.space.m.objectives) != 1:
            return None
        prior = noise_store.prior(noise_store.key_for(base.fingerprint, self.space.m.objectives[0].metric))
        if prior is None:
            return None
        return prior.sd / math.sqrt(2), f"from this setup's {prior.runs} earlier paired runs ({prior.df} df)"

    def confirmation_fits(self) -> bool:
        """Whether the minimum confirmation (3 rounds of the default and the top configs) fits the
        time budget that is left."""
        if self.deadline is None:
            return True
        return self.estimator.confirmation_s()[0] <= self.deadline - time.monotonic()

    def _after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        counted = counted_trials(study, with_running=True)
        if counted >= self.total:
            self._stop()
            return
        number = probe_due(self.space, counted, trial.user_attrs.get(BUDGET_ATTR, True))
        if number is not None:
            self.reporter.phase("re-measuring the default on a fresh start (the study's noise floor)")
            self.reporter.note(probe(self.session, self.space, study, self.space.default_config(),
                                     self.results_dir / "noise", number))
        reason = None
        if study.get_trials(deepcopy=False, states=(OptunaState.WAITING,)):
            return  # queued configs (the default, a resume, a warm start) run first, whatever the rule
        if space_exhausted(study, self.space):
            reason = "the space is exhausted: every config was tried"
        elif self._known_in_a_row >= EXHAUSTED_AFTER:
            # The sampler replaces a repeat by an untried config (search/sampling/sampler.py); repeats in a row
            # are left in a space it cannot enumerate, or where what is untried holds rejected values.
            reason = (f"the last {self._known_in_a_row} proposals were configs already tried or holding a value the "
                      "engine rejected, so nothing new was started; untried configs may remain")
        else:
            decision = study_should_stop(study, self.space, self.noise_floor_value(), paired_noise=self.paired_noise())
            if decision.stop:
                reason = decision.reason
        if reason:
            self.reporter.note(f"stopping before the budget: {reason}")
            self._stop(reason)

    def _objective(self, trial: optuna.Trial) -> list[float]:
        started = time.monotonic()
        config = self.space.sample(trial)  # sample
        self.lock.release()  # the trial is running with its params: the next worker may create its own
        self.reporter.trial_started(trial.number, counted_trials(self.study) + 1, self.total, config)
        self.reporter.phase(f"chosen by: {trial_origin(self.study, trial)}")
        record = TrialRecord(number=trial.number, state=TrialState.RUNNING, params=config.as_params(),
                             engine=config.engine, model=config.model)
        trial.set_user_attr("worker", worker_tag())
        trial_dir = self.results_dir / "trials" / f"{trial.number:04d}"
        try:
            resolved = self.space.resolve(config)  # its engine settings, flags and env: once a trial
            if self._resolve(trial, resolved, record):  # resolve
                self._run(trial, resolved, record, trial_dir)  # run
                self._known_in_a_row = 0
        except TrialFailed as exc:
            if exc.failure.cause == MEMORY_HELD:  # the machine's memory, not the config: no result, no budget
                record.state, record.failure, record.command = TrialState.SKIPPED, exc.failure, exc.command
                trial.set_user_attr(BUDGET_ATTR, False)
                self._record(trial, record, trial_dir, started)
                if self.memory.refused_in_a_row >= 2:  # the machine, not the configs: stop, say why
                    self._stop(f"two starts in a row were refused for memory held elsewhere: {exc.detail}")
                    self.reporter.note(f"stopping: {self.stop_reason}")
                raise SkipTrial(exc.failure.detail) from None
            fail(record, exc.failure)
            record.command = record.command or exc.command
            record.log_path = record.log_path or exc.log_path
            if isinstance(exc.partial, Measurement):
                fill(record, exc.partial)
            self._known_in_a_row = 0
        except SkipTrial:
            raise
        except Exception as exc:  # a bug or an unforeseen fault costs one trial, not the search
            self.session.close()
            fail(record, Failure(Cause.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}",
                                 traceback.format_exc().splitlines()[-12:]))
        except KeyboardInterrupt as exc:
            by = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted (Ctrl-C)"
            fail(record, Failure(Cause.INTERRUPTED, f"the search was {by} during this trial"))
            trial.set_user_attr("interrupted", True)
            if not isinstance(exc, Terminated):  # the user's, not the config's doing: no count towards a cap
                trial.set_user_attr(INTERRUPTED_BY, BY_CTRL_C)
            self._record(trial, record, trial_dir, started)
            raise
        self._record(trial, record, trial_dir, started)  # record
        return self._tell(trial, record)  # tell

    # ---- resolve ----------------------------------------------------------------------------
    def _resolve(self, trial: optuna.Trial, resolved: Resolved, record: TrialRecord) -> bool:
        """False when the config needs no run (known result, rejected value, run elsewhere)."""
        config = resolved.config
        params = config.as_params()
        self.index.refresh(self.study, own=trial.number)
        previous = self.index.identical(params)
        if previous is not None:
            self._known_in_a_row += 1
            trial.set_user_attr(BUDGET_ATTR, False)
            copy_duplicate(record, previous)
            self.reporter.phase(f"identical to trial #{previous.number}: not launched again")
            return False
        rejected = self.index.rejected_value(params)
        if rejected is not None:
            self._known_in_a_row += 1
            trial.set_user_attr(BUDGET_ATTR, False)
            name, value, number = rejected
            record.state = TrialState.SKIPPED
            record.failure = Failure(Cause.REJECTED_VALUE, f"{name}={value} was rejected by the engine in trial "
                                     f"#{number}: not launched again", param=name, duplicate_of=number)
            self.reporter.phase(f"not launched: {name}={value} was rejected by the engine in trial #{number}")
            return False
        running_elsewhere = self.index.in_flight(params)
        if running_elsewhere is not None:
            trial.set_user_attr(BUDGET_ATTR, False)
            record.state = TrialState.SKIPPED
            self._record(trial, record, self.results_dir / "trials" / f"{trial.number:04d}", time.monotonic())
            raise SkipTrial(f"another worker runs the same config (trial #{running_elsewhere})")
        if self.deadline is not None:
            need = self.estimator.needed_s(config.engine)  # the trial and the shortest confirmation after it
            left = self.deadline - time.monotonic()
            if need > left:
                trial.set_user_attr(BUDGET_ATTR, False)
                record.state = TrialState.SKIPPED
                self._stop(f"the time budget is spent: a trial of {config.engine} and the shortest confirmation "
                           f"take about {need / 60:.1f} min, {max(0.0, left) / 60:.1f} min are left")
                self.reporter.note(f"stopping: {self.stop_reason}")
                self._record(trial, record, self.results_dir / "trials" / f"{trial.number:04d}", time.monotonic())
                raise SkipTrial(self.stop_reason)
        self._free_memory = self.memory.before_start(resolved)  # unified memory: measured before every start
        fit = estimate(self.space, resolved, self._free_memory)
        if fit is not None and not fit.fits:
            self.reporter.phase(f"not launched: cannot fit ({fit.detail})")
            raise TrialFailed(Failure(Cause.WONT_FIT, f"rejected before launch: {fit.detail}"))
        if fit is not None and fit.warning:
            record.warnings.append(fit.warning)
        return True

    # ---- run --------------------------------------------------------------------------------
    def _run(self, trial: optuna.Trial, resolved: Resolved, record: TrialRecord, trial_dir: Path) -> None:
        """One server start, measured at every load point; stopped early once clearly worse."""
        config = resolved.config
        req = resolved.run_request(trial_dir)
        m = self.space.m
        quality = QualityPlan(m.quality, self.reference.answers(), m.measure.request_timeout_s) \
            if judges_quality(self.space) else None
        judged: QualityResult | None = None
        # Workloads longer than this config's context are not measured for it (a choice, not a failure).
        beyond = {name for name, _ in workloads_beyond_context(self.space, resolved)}
        specs = [s for s in self.space.curve_specs() if s.name.partition("@")[0] not in beyond]
        points = list(dict.fromkeys(s.name.partition("@")[2] for s in specs))  # in ladder order
        for i, point in enumerate(points):
            def start(point: str = point, i: int = i) -> Measurement:
                return self.session.run(req, [s for s in specs if s.name.partition("@")[2] == point],
                                        measure_settings(self.space), quality if i == 0 else None,
                                        self.rooflines.of(config))
            measured = retry_if_memory_held(self.memory, resolved, start, self.reporter.phase) if i == 0 else start()
            if i == 0 and measured.reused_server:
                self.reporter.phase("reused the running server")
            fill(record, measured, first=i == 0, kv_context=m.measure.kv_context_tokens)
            judged = measured.quality or judged
            if i + 1 < len(points) and clearly_worse(self.space, self.index.finished.values(), trial, record, point, i):
                record.state = TrialState.PRUNED
                record.warnings.append(f"stopped after load point {point}: clearly worse than the incumbent there")
                self.reporter.phase(f"stopped measuring: clearly worse than the incumbent at {point}")
                return
        add_curve_summaries(record.metrics)
        if m.slo is not None:  # the highest load within the SLO, on the same server (harness/measure/capacity.py)
            self.reporter.phase("capacity under the SLO: doubling, then bisecting the concurrency")
            fill_capacity(record, capacity_of(self.session, req, self.space, self.reporter.phase))
        score(record, self.space, judged)

    # ---- record and tell --------------------------------------------------------------------
    def _record(self, trial: optuna.Trial, record: TrialRecord, trial_dir: Path, started: float) -> None:
        record.wall_s = time.monotonic() - started
        # The file first: when the study storage then fails (a lasting database outage, a full disk
        # under SQLite), the trial just measured is kept there and a resume recovers it
        # (search/study/recovery.py); the storage is what resume, reports and workers read.
        try:
            write_json_atomic(trial_dir / "result.json", {**record.summary(), "workloads": record.workloads})
        except ResultsError:  # a read-only or full results folder: the storage may still keep the record
            trial.set_user_attr(RECORD_ATTR, jsonable(record.summary()))
            raise
        trial.set_user_attr(RECORD_ATTR, jsonable(record.summary()))
        self.index.add(record)
        if record.state in (TrialState.COMPLETE, TrialState.FAILED, TrialState.PRUNED):
            self.estimator.observe(record)
        self.reporter.trial_finished(record)

    def _tell(self, trial: optuna.Trial, record: TrialRecord) -> list[float]:
        if record.state == TrialState.PRUNED:
            raise optuna.TrialPruned(f"trial {trial.number} stopped early: clearly worse than the incumbent")
        measured = record.state in (TrialState.COMPLETE, TrialState.DUPLICATE) and record.objective_values is not None
        labels = constraint_labels(self.space)
        for label, value in zip(labels, record.constraint_values if measured else [0.0] * len(labels), strict=True):
            trial.set_constraint(label, value)  # feasible when <= 0; samplers and reports read these
        if measured:
            trial.set_constraint(FAILED_KEY, 0.0)
            return record.objective_values or []
        # A failed config is told COMPLETE with a violation larger than any real one and the worst
        # finite values: every sampler in use (TPE, NSGA-II) then ranks it below every measured
        # config, feasible or not, and steers away from its region (search/sampling/sampler.py says why
        # PRUNED or FAIL would not). The record keeps its state and cause.
        trial.set_constraint(FAILED_KEY, FAILED_VIOLATION)
        return failure_values(self.study.directions)

