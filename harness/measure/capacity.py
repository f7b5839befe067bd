"""Capacity under a latency SLO: the highest concurrency whose TTFT / inter-token latency
percentiles stay within the user's limits, found per config by a short search over load on the
already-started server (every step goes through the door, `Session.run`, which reuses it).

The search doubles the concurrency from `start` while the step meets the SLO, then bisects between
the last step that met it and the first that did not, until the gap is at most `resolution` of the
load (or `max_steps` steps). It assumes latency grows with load (true of one server's queue); a
noisy step can make it stop one bisection step early, never report a load it did not measure.

Each step is a short closed-loop run (`concurrency` streams, each sending `requests_per_stream`
requests): its percentiles are taken over every request of the step, its throughput is the run's
end-to-end output tokens per second (queueing included: what a user at that load gets). A step
with failed requests beyond `max_error_rate` misses the SLO; a server that dies in a step ends the
search (the cause, e.g. an OOM, is in the result).

`harness/measure/stability.py` holds a config at its capacity for minutes and reports the drift.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from harness.failure import TrialFailed
from harness.measure.measure import WorkloadMeasurement
from harness.measure.stats import percentile
from harness.measure.steady import MeasurePolicy
from harness.measure.workloads import WorkloadSpec
from harness.session import MeasureSettings, RunRequest, Session

Progress = Callable[[str], None]
LIMIT = re.compile(r"^(ttft|itl|tpot|e2e)_p(\d+)_s$")


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class Slo:
    """The user's latency target: limits like {"ttft_p90_s": 2.0, "itl_p90_s": 0.2}."""

    limits: dict[str, float]
    max_error_rate: float = 0.0
    start: int = 1
    max_load: int = 64
    resolution: float = 0.1  # stop bisecting once (bad - good) <= resolution * good (and >= 1 apart)
    max_steps: int = 10

    def finest_gap(self, load: float) -> float:
        """The gap at which the bisection stops at this load: `resolution` of it, and never below one stream."""
        return max(1.0, self.resolution * load)

    def __post_init__(self) -> None:
        bad = [k for k in self.limits if not LIMIT.match(k)]
        if bad:
            raise ValueError(f"SLO limits are ttft|itl|tpot|e2e_pNN_s, got {bad}")
        if not 1 <= self.start <= self.max_load:
            raise ValueError(f"SLO load range: 1 <= start ({self.start}) <= max_load ({self.max_load})")

    def text(self) -> str:
        return ", ".join(f"{k} <= {v:g}" for k, v in self.limits.items())


@dataclass
class LoadStep:
    """One measured load level."""

    concurrency: int
    requests: int
    errors: int
    latencies: dict[str, float]  # the SLO's percentiles over every request of the step (s)
    output_tok_s: float
    decode_tok_s: float | None
    meets: bool
    why: str = ""  # which limit it missed, or the failure
    wall_s: float = 0.0

    def line(self) -> str:
        lat = ", ".join(f"{k} {v:.3g}" for k, v in self.latencies.items())
        verdict = "within SLO" if self.meets else f"MISSES ({self.why})"
        return f"c={self.concurrency}: {lat}, {self.output_tok_s:.1f} tok/s, {self.errors} errors: {verdict}"


@dataclass
class CapacityResult:
    capacity: int  # the highest concurrency that met the SLO (0: not even `start`)
    limited_by: str  # the limit the next load missed, "max_load", or the failure
    slo: dict[str, Any]
    curve: list[LoadStep] = field(default_factory=list)  # every measured step, by concurrency
    wall_s: float = 0.0
    failure: str | None = None  # the server died or failed during the search

    @property
    def at_capacity(self) -> LoadStep | None:
        return next((s for s in self.curve if s.concurrency == self.capacity), None)

    def metrics(self) -> dict[str, float]:
        """Flat values for a trial record: capacity.concurrency and the step at capacity."""
        out = {"capacity.concurrency": float(self.capacity), "capacity.steps": float(len(self.curve))}
        step = self.at_capacity
        if step is not None:
            out["capacity.output_tok_s"] = step.output_tok_s
            out.update({f"capacity.{k}": v for k, v in step.latencies.items()})
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> list[str]:
        return [s.line() for s in self.curve] + [f"capacity: {self.capacity} concurrent streams "
                                                 f"(next load limited by {self.limited_by})"]


def search(measure: Callable[[int], LoadStep], slo: Slo, progress: Progress = _quiet) -> CapacityResult:
    """Doubling, then bisection, over concurrency; `measure(c)` runs one step."""
    started = time.monotonic()
    steps: dict[int, LoadStep] = {}
    failure: str | None = None

    def at(c: int) -> LoadStep:
        nonlocal failure
        step = measure(c)
        steps[c] = step
        progress(f"capacity {step.line()}")
        if step.why.startswith("failed:"):
            failure = step.why
        return step

    good, bad = 0, None
    c = slo.start
    while len(steps) < slo.max_steps and failure is None:
        if at(c).meets:
            good = c
            if c >= slo.max_load:
                break
            c = min(2 * c, slo.max_load)
        else:
            bad = c
            break
    while (bad is not None and good and failure is None and len(steps) < slo.max_steps
           and bad - good > slo.finest_gap(good)):
        mid = (good + bad) // 2
        if at(mid).meets:
            good = mid
        else:
            bad = mid
    if bad is not None:
        limited = steps[bad].why
    elif failure is not None:
        limited = failure
    else:
        limited = "max_load" if good >= slo.max_load else "max_steps"
    curve = [steps[k] for k in sorted(steps)]
    return CapacityResult(good, limited, {**asdict(slo)}, curve, round(time.monotonic() - started, 2), failure)


def step_of(wm: WorkloadMeasurement, slo: Slo, concurrency: int, wall_s: float) -> LoadStep:
    """A load step from its measurement: percentiles over every counted request."""
    requests = [r for s in wm.counted for r in s.requests]
    ok = [r for r in requests if r.ok]
    errors = len(requests) - len(ok)
    values = {"ttft": [r.ttft_s for r in ok if r.ttft_s is not None],
              "itl": [g for r in ok for g in r.chunk_gaps_s],
              "tpot": [t for r in ok if (t := r.tpot_s) is not None],
              "e2e": [r.e2e_s for r in ok]}
    latencies: dict[str, float] = {}
    missed: list[str] = []
    for name, limit in slo.limits.items():
        match = LIMIT.match(name)
        assert match
        value = percentile(values[match.group(1)], float(match.group(2)))
        if value is None:
            missed.append(f"no {match.group(1)} measured")
            continue
        latencies[name] = value
        if value > limit:
            missed.append(f"{name} {value:.3g} > {limit:g}")
    if requests and errors / len(requests) > slo.max_error_rate:
        missed.append(f"{errors} of {len(requests)} requests failed")
    if not requests:
        missed.append("no requests measured")
    throughput = wm.summary.get("output_tok_s")
    decode = wm.summary.get("decode_tok_s")
    return LoadStep(concurrency, len(requests), errors, latencies, throughput.median if throughput else 0.0,
                    decode.median if decode else None, not missed, "; ".join(missed), round(wall_s, 2))


def at_concurrency(spec: WorkloadSpec, concurrency: int) -> WorkloadSpec:
    """The workload with `concurrency` streams (its items cycled, as a request-side ladder does)."""
    streams = tuple(spec.streams[i % len(spec.streams)] for i in range(concurrency))
    return replace(spec, name=f"{spec.name}@concurrency={concurrency}", streams=streams)


def step_settings(base: MeasureSettings, warmup: bool) -> MeasureSettings:
    """One short measured run per step, one warmup run before the first step only."""
    policy = MeasurePolicy(metric="output_tok_s", max_warmups=1, max_remeasure=0, max_repeats=1)
    return MeasureSettings(repeats=1, warmup=warmup, request_timeout_s=base.request_timeout_s, policy=policy)


def find_capacity(session: Session, request: RunRequest, spec: WorkloadSpec, slo: Slo,
                  settings: MeasureSettings, progress: Progress = _quiet) -> CapacityResult:
    """The capacity of one config: every step is `session.run` on the same (reused) server.
    Raises TrialFailed when the server cannot be started at all."""
    if not slo.limits:
        raise ValueError("a capacity search needs at least one latency limit")
    first = True

    def measure(c: int) -> LoadStep:
        nonlocal first
        t0 = time.monotonic()
        # `fresh` asks for a new start for the search, not for each step: later steps reuse it.
        step_request = request if first else replace(request, fresh=False)
        try:
            measured = session.run(step_request, [at_concurrency(spec, c)], step_settings(settings, first))
        except TrialFailed as exc:
            if first and exc.partial is None:
                raise  # it never started: the config failed, not the load
            return LoadStep(c, 0, 0, {}, 0.0, None, False, f"failed: {exc.failure.cause}: {exc.failure.detail}",
                            round(time.monotonic() - t0, 2))
        first = False
        wm = next(iter(measured.workloads.values()), None)
        if wm is None:
            return LoadStep(c, 0, 0, {}, 0.0, None, False, "failed: nothing measured", 0.0)
        return step_of(wm, slo, c, time.monotonic() - t0)

    return search(measure, slo, progress)
