"""A stability run: one config held at a load (its capacity under the SLO) for minutes, through
the door, run after run on the same server. It answers what a short measurement cannot: does the
server keep its throughput (drift: the slope of throughput over time, with its 95% interval), does
it fail requests, does it die (the cause from its log: an OOM, a crash, a freeze), does it keep
the latency SLO run after run.

The drift is the least-squares slope of each run's end-to-end throughput against the run's middle
time, in percent of the mean per minute; `drift_total_pct` is that slope over the whole duration.
It is called a drift when its interval excludes zero (a slope within the noise is no drift).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from harness.failure import TrialFailed
from harness.measure.capacity import Slo, at_concurrency, step_of, step_settings
from harness.measure.workloads import WorkloadSpec
from harness.session import MeasureSettings, RunRequest, Session

Progress = Callable[[str], None]
MIN_RUNS = 3  # the fewest runs a drift (a slope with an interval: n - 2 degrees of freedom) is fitted on


def _quiet(_: str) -> None:
    return None


@dataclass
class StabilitySample:
    t_s: float  # the run's middle, seconds after the first measured run began
    output_tok_s: float
    requests: int
    errors: int
    latencies: dict[str, float]
    meets: bool


@dataclass
class Drift:
    pct_per_min: float
    ci_low: float
    ci_high: float
    total_pct: float  # the slope over the whole run, in percent of the mean

    @property
    def significant(self) -> bool:
        return self.ci_low > 0 or self.ci_high < 0


@dataclass
class StabilityResult:
    concurrency: int
    planned_s: float
    duration_s: float
    samples: list[StabilitySample] = field(default_factory=list)
    drift: Drift | None = None
    failure: str | None = None  # the server died or stopped answering: cause and deciding line
    command: str = ""

    @property
    def requests(self) -> int:
        return sum(s.requests for s in self.samples)

    @property
    def errors(self) -> int:
        return sum(s.errors for s in self.samples)

    @property
    def slo_misses(self) -> int:
        return sum(1 for s in self.samples if not s.meets)

    def summary(self) -> str:
        runs = len(self.samples)
        head = (f"stability at concurrency {self.concurrency}: {self.duration_s / 60:.1f} of "
                f"{self.planned_s / 60:.1f} min, {runs} runs, {self.requests} requests, {self.errors} errors, "
                f"{self.slo_misses} runs missed the SLO")
        if self.samples:
            mean = sum(s.output_tok_s for s in self.samples) / runs
            head += f"; throughput {mean:.1f} tok/s mean"
        if self.drift is not None:
            d = self.drift
            head += (f"; drift {d.pct_per_min:+.2f}%/min (95% CI {d.ci_low:+.2f} to {d.ci_high:+.2f}), "
                     f"{d.total_pct:+.1f}% over the run: " + ("DRIFTS" if d.significant else "no drift beyond noise"))
        if self.failure:
            head += f"; FAILED: {self.failure}"
        return head

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(requests=self.requests, errors=self.errors, slo_misses=self.slo_misses, summary=self.summary())
        return out


def drift(samples: list[StabilitySample], duration_s: float) -> Drift | None:
    """Least-squares slope of throughput over time with its 95% t interval (None under MIN_RUNS runs)."""
    from scipy import stats as sps  # lazily: 0.6 s of every CLI start
    pts = [(s.t_s / 60.0, s.output_tok_s) for s in samples if s.output_tok_s > 0]
    if len(pts) < MIN_RUNS:
        return None
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    n = len(pts)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0 or my <= 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    resid = sum((y - my - slope * (x - mx)) ** 2 for x, y in pts)
    se = math.sqrt(resid / (n - 2) / sxx)
    half = float(sps.t.ppf(0.975, n - 2)) * se
    scale = 100.0 / my
    return Drift(round(slope * scale, 3), round((slope - half) * scale, 3), round((slope + half) * scale, 3),
                 round(slope * scale * duration_s / 60.0, 2))


def run_stability(session: Session, request: RunRequest, spec: WorkloadSpec, concurrency: int, duration_s: float,
                  slo: Slo, settings: MeasureSettings, progress: Progress = _quiet,
                  every_s: float = 60.0) -> StabilityResult:
    """Run `spec` at `concurrency` on one server until `duration_s` has passed (measured runs only;
    the warmup before them is not counted) and at least MIN_RUNS runs are measured, so that the drift
    has an estimate even when a run outlasts the duration. Raises TrialFailed when the server never
    starts."""
    result = StabilityResult(concurrency, duration_s, 0.0)
    loaded = at_concurrency(spec, concurrency)
    started: float | None = None
    last_note = 0.0
    while started is None or time.monotonic() - started < duration_s or len(result.samples) < MIN_RUNS:
        t0 = time.monotonic()
        try:
            # `fresh` asks for a new start for the whole run, not for each of its runs.
            measured = session.run(request if started is None else replace(request, fresh=False), [loaded],
                                   step_settings(settings, warmup=started is None))
        except TrialFailed as exc:
            if started is None and exc.partial is None:
                raise
            result.failure = f"{exc.failure.cause}: {exc.failure.detail}"
            break
        result.command = measured.command
        wm = next(iter(measured.workloads.values()), None)
        if wm is None or not wm.counted:
            result.failure = "nothing measured (the server answered no request)"
            break
        end = time.monotonic()
        wall = wm.counted[-1].wall_s
        if started is None:  # the clock starts with the first measured run (after the warmup)
            started = end - wall
        step = step_of(wm, slo, concurrency, end - t0)
        mid = end - started - wall / 2
        result.samples.append(StabilitySample(round(mid, 2), step.output_tok_s, step.requests, step.errors,
                                              step.latencies, step.meets))
        if end - last_note >= every_s:
            last_note = end
            progress(f"stability {(end - started) / 60:.1f}/{duration_s / 60:.1f} min: {step.line()}")
    result.duration_s = round(time.monotonic() - started, 1) if started is not None else 0.0
    result.drift = drift(result.samples, result.duration_s)
    return result
