"""A trial's record from its measurements, and the values the loop tells the sampler: objectives,
constraints (<= 0 feasible), or the failure (search/study/study.py tells them)."""

from __future__ import annotations

from harness.engines import get_engine
from harness.failure import Cause, Failure
from harness.measure.capacity import CapacityResult, Slo, find_capacity
from harness.quality.quality import QualityResult, quality_metrics
from harness.quality.quality import constraint_names as quality_constraint_names
from harness.quality.quality import constraint_values as quality_constraint_values
from harness.session import Measurement, MeasureSettings, RunRequest, Session
from search.space.space import Space, constraint_value
from search.store.results import TrialRecord, TrialState


def measure_settings(space: Space, metric: str | None = None, repeats: int | None = None) -> MeasureSettings:
    """The space's `measure:` section as the harness takes it, its steady-state policy watching
    `metric` (default: the first objective) per run. Every command that measures a space uses it,
    so a space's warm-up, stall and length settings hold in `ab`, `regress` and `bisect` as in `run`."""
    m = space.m.measure
    metric = metric or space.m.objectives[0].metric
    workload, _, leaf = metric.rpartition(".")
    # A metric that is no workload's per-run value (capacity, quality, kv, errors) watches the default.
    if workload.partition("@")[0] not in {w.name for w in space.m.workloads} or leaf == "errors":
        leaf = "decode_tok_s"
    return MeasureSettings(repeats or m.repeats, m.warmup, m.request_timeout_s, m.policy(leaf))


def slo_of(space: Space) -> Slo | None:
    s = space.m.slo
    if s is None:
        return None
    return Slo(s.limits(), s.max_error_rate, s.start_concurrency, s.max_concurrency, s.resolution, s.max_steps)


def capacity_of(session: Session, request: RunRequest, space: Space, progress: object) -> CapacityResult:
    """The config's capacity under the space's SLO, on its running server (harness/measure/capacity.py)."""
    slo = slo_of(space)
    assert slo is not None and space.m.slo is not None
    name = space.m.slo.workload or space.m.workloads[0].name
    spec = next(w for w in space.workload_specs() if w.name == name)
    return find_capacity(session, request, spec, slo, measure_settings(space), progress)  # type: ignore[arg-type]


def fill_capacity(record: TrialRecord, result: CapacityResult) -> None:
    """capacity.* metrics, the curve in result.json (record.workloads["capacity"])."""
    record.metrics.update(result.metrics())
    record.workloads["capacity"] = result.to_dict()
    if result.failure:
        record.warnings.append(f"capacity search stopped: {result.failure}")


def fill(record: TrialRecord, measured: Measurement, first: bool = True, kv_context: int | None = None) -> None:
    """Add one run's results to the record (a trial runs once per load point)."""
    if first:
        record.command, record.env, record.log_path = measured.command, measured.env, measured.log_path
        record.reused_server, record.ready_s = measured.reused_server, measured.ready_s
        record.startup = {"ready_s": measured.ready_s, **vars(measured.startup)}
        record.fingerprint = measured.fingerprint
    for name, wm in measured.workloads.items():
        record.workloads[name] = wm.to_dict()
        for k, stat in wm.summary.items():
            record.metrics[f"{name}.{k}"] = stat.median
        record.metrics[f"{name}.errors"] = float(wm.errors)
        record.placebo.extend(p for p in wm.placebo if p not in record.placebo)
        record.warnings.extend(f"{name}: {w}" for w in wm.warnings)
    if measured.quality is not None:
        record.quality = measured.quality.to_dict()
        record.metrics.update(quality_metrics(measured.quality))
    # Per workload (and load point) only: the curve summaries are added after the last point.
    record.metrics["errors"] = sum(v for k, v in record.metrics.items() if k.endswith(".errors"))
    record.metrics["startup.ready_s"] = record.ready_s or 0.0
    if first:
        record.metrics.update(kv_metrics(measured, kv_context))


def kv_metrics(measured: Measurement, context_tokens: int | None) -> dict[str, float]:
    """KV-cache capacity from the engine's startup log: kv.cache_tokens, kv.max_sequences (the
    engine's own figure at its per-request context) and kv.sequences at `context_tokens`."""
    info, out = measured.startup, {}
    if info.kv_cache_tokens:
        out["kv.cache_tokens"] = float(info.kv_cache_tokens)
    if info.max_concurrency:
        out["kv.max_sequences"] = float(info.max_concurrency)
    if context_tokens and measured.dialect:
        seqs = get_engine(measured.dialect).kv_sequences(info, context_tokens)
        if seqs is not None:
            out["kv.sequences"] = seqs
    return out


def judges_quality(space: Space) -> bool:
    return bool(space.m.quality.suite or space.m.quality.reference)


def constraint_labels(space: Space) -> list[str]:
    labels = [f"{metric} {op} {threshold:g}" for metric, op, threshold in space.constraint_exprs()]
    # Same condition as score(): without a suite or reference no quality values are appended.
    return labels + (quality_constraint_names(space.m.quality) if judges_quality(space) else [])


def score(record: TrialRecord, space: Space, quality: QualityResult | None) -> None:
    """Objective and constraint values of a measured trial (COMPLETE), or its failure when an
    objective was not measured."""
    m = space.m
    missing = [o.metric for o in m.objectives if o.metric not in record.metrics]
    if missing:
        fail(record, Failure(Cause.OBJECTIVE_MISSING,
                             f"metric {missing[0]!r} was not measured (every request failed?)"))
        return
    record.objective_values = [record.metrics[o.metric] for o in m.objectives]
    constraints = []
    for metric, op, threshold in space.constraint_exprs():
        value = record.metrics.get(metric)
        constraints.append(constraint_value(value, op, threshold) if value is not None else 1.0)
    if judges_quality(space):
        constraints += quality_constraint_values(quality, m.quality)
    record.constraint_values = constraints
    record.state = TrialState.COMPLETE


def fail(record: TrialRecord, failure: Failure) -> None:
    record.state = TrialState.FAILED
    record.failure = failure


def copy_duplicate(record: TrialRecord, previous: TrialRecord) -> None:
    """Never re-run an identical config: a failure stays a failure, a result is reused."""
    record.duplicate_of = previous.number
    record.command, record.env, record.metrics = previous.command, previous.env, previous.metrics
    record.quality, record.objective_values = previous.quality, previous.objective_values
    record.constraint_values = previous.constraint_values
    if previous.state == TrialState.FAILED or previous.objective_values is None:
        cause = previous.failure.cause if previous.failure else "failed"
        fail(record, Failure(cause, f"same config as failed trial #{previous.number}", duplicate_of=previous.number))
    else:
        record.state = TrialState.DUPLICATE
