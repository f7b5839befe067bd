"""One fresh server start of a config, measured for the study's first objective: the unit of the
confirmation's rounds (search/confirm/confirm.py), the noise probes (search/study/noise.py) and the confirmation
experiments (bench/experiments/confirm_design)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.failure import Cause, Failure, TrialFailed
from harness.session import RunRequest, Session
from search.space.space import Space
from search.study.scoring import capacity_of, measure_settings

THROTTLE = Path(__file__).resolve().parents[2] / "harness" / "launch" / "throttle.py"


@dataclass(frozen=True)
class FreshStart:
    """One fresh start's measurement: the first objective's per-run values, the command, and the
    engine environment's fingerprint (harness/host/fingerprint.py)."""

    values: list[float]
    command: str
    fingerprint: dict[str, Any]


def measure_fresh(session: Session, space: Space, params: dict[str, Any], log_dir: Path,
                  slowdown: float | None = None, repeats: int | None = None) -> FreshStart:
    """The first objective's per-run values of a config on a fresh server start, with the command it
    ran and the engine environment's fingerprint (what a continued confirmation checks).
    `slowdown`: serve it behind harness/launch/throttle.py --stretch (a positive control); `repeats`: runs
    per workload (default: the space's measure.repeats).
    Raises TrialFailed when it cannot be measured."""
    workload, _, leaf = space.m.objectives[0].metric.partition(".")
    config = space.sample(fixed_trial(params))
    req = space.request(config, log_dir, fresh=True)
    if slowdown:  # the engine's own command, behind the throttle
        req = replace(req, settings=replace(req.settings, command=(sys.executable, str(THROTTLE), str(slowdown),
                                                                   "--stretch", "--", *req.settings.command)))
    metric = space.m.objectives[0].metric
    if metric.startswith("capacity."):
        return _capacity_fresh(session, space, req, metric)
    specs = [w for w in space.curve_specs() if w.name.partition("@")[0] == workload]
    measured = session.run(req, specs, measure_settings(space, metric, repeats))
    per_point: list[list[float]] = []
    for wm in measured.workloads.values():
        values = [float(s.metrics[leaf]) for s in wm.counted if s.metrics.get(leaf) and not s.errors_by_kind]
        if not values and leaf in wm.summary:
            values = [wm.summary[leaf].median]
        per_point.append([v for v in values if math.isfinite(v) and v > 0])
    if not per_point or not all(per_point):
        raise TrialFailed(Failure(Cause.OBJECTIVE_MISSING, f"{workload}.{leaf} was not measured"), measured.command)
    if len(per_point) == 1:
        return FreshStart(per_point[0], measured.command, measured.fingerprint)
    # A load ladder: each run's value is the geometric mean over the points (as the curve summary).
    n = min(len(v) for v in per_point)
    return FreshStart([math.exp(sum(math.log(v[i]) for v in per_point) / len(per_point)) for i in range(n)],
                      measured.command, measured.fingerprint)


def _capacity_fresh(session: Session, space: Space, req: RunRequest, metric: str) -> FreshStart:
    """The capacity search on one fresh start (its later steps reuse that server): one value a start."""
    keep, session.keep_server = session.keep_server, True
    try:
        found = capacity_of(session, req, space, session.progress)
        running = session.pool.running
        command, fingerprint = (running.command, running.fingerprint) if running else ("", {})
    finally:
        session.keep_server = keep
        if not keep:
            session.pool.release()
    value = found.metrics().get(metric)
    if not value:
        raise TrialFailed(Failure(Cause.OBJECTIVE_MISSING, f"{metric} was not measured (or 0: not even the first "
                                  f"load met the SLO; {found.limited_by})"), command)
    return FreshStart([value], command, fingerprint)


def fixed_trial(params: dict[str, Any]) -> Any:
    """Exactly these params, in the form `Space.sample` draws from (optuna imported here: it costs
    every CLI start that never samples)."""
    import optuna

    return optuna.trial.FixedTrial(params)
