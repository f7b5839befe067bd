"""Steady state and stalls: when a server is warm, which runs a stall set, when a measurement is long
enough. Used by harness/measure/measure.py for every workload it measures."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from harness.measure.sample import RunSample
from harness.measure.stats import log_mean_rel_halfwidth, robust_z
from harness.measure.window import token_times


@dataclass(frozen=True)
class MeasurePolicy:
    """How long to warm up and measure, and what makes a run suspect (the space's `measure:` section).

    Steady state: warm up until two consecutive runs agree on `metric` within `warmup_tolerance`
    (at most `max_warmups` runs; the agreeing run is the first measured one, so a quick convergence
    costs what one warmup always cost). Stalls: a run whose worst first token is `stall_factor` times
    (and `min_stall_s` more than) the best run's worst, or with an inter-token gap `gap_factor` times
    the run's median gap (and `min_stall_s` more), or whose metric is a robust-z outlier over >= 5
    runs, is excluded and re-measured, up to `max_remeasure` times per workload; past that the
    stalls are part of the config's behaviour and count. Length: with `target_ci`, runs continue
    until the metric's 95% interval is within +-target_ci or `max_repeats` / `time_cap_s` is hit."""

    metric: str = "decode_tok_s"  # the steady window's throughput: no first-token wait in it
    max_warmups: int = 3  # each one past the second costs a run when the machine is noisy
    warmup_tolerance: float = 0.10
    stall_factor: float = 3.0
    gap_factor: float = 10.0
    min_stall_s: float = 1.0
    outlier_z: float = 5.0
    max_remeasure: int = 2
    target_ci: float | None = None
    max_repeats: int = 20
    time_cap_s: float = 300.0


DEFAULT_POLICY = MeasurePolicy()
# Prompt variant of warmup runs: never the same prompts as a measured run. The prompt's nonce keeps
# 4 digits of the variant (harness/measure/workloads.py `_nonce`: fixed width so that sizing counts the same
# tokens), so variants equal modulo 10,000 share a prompt. This was 10,000: warmup k then sent the
# prompt of measured repeat k - 1 (+2 offsets cancel), whose prefix the server had cached, so the
# first measured runs read a ~10x faster first token and the third a cold one: the "third run is a
# third slower" position effect of the CPU calibration (docs/measurement.md). 5,000 keeps warmup and
# measured prompts apart for up to 5,000 runs per workload.
WARMUP_REPEAT = 5_000


@dataclass
class SteadyState:
    """What the warmup and the measurement length decided, for the record."""

    metric: str
    warmups: int = 0
    warmup_values: list[float] = field(default_factory=list)
    converged: bool = False
    note: str = ""
    excluded: list[dict[str, Any]] = field(default_factory=list)  # {repeat, value, flags}
    remeasured: int = 0
    target_ci: float | None = None
    achieved_ci: float | None = None  # relative half-width of the metric's 95% t interval
    stopped_by: str = "repeats"  # repeats | target | max_repeats | time_cap | server_dead
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ttft_max(s: RunSample) -> float | None:
    values = [r.ttft_s for r in s.requests if r.ok and r.ttft_s is not None]
    return max(values) if values else None


def stall_flags(s: RunSample, reference_ttft_s: float | None, policy: MeasurePolicy) -> list[str]:
    """Why this run looks stalled: a first token far behind the reference, or one huge gap."""
    out = []
    worst = _ttft_max(s)
    if worst is not None and reference_ttft_s is not None and reference_ttft_s > 0 \
            and worst > policy.stall_factor * reference_ttft_s and worst > reference_ttft_s + policy.min_stall_s:
        out.append(f"first token after {worst:.2f} s, {worst / reference_ttft_s:.1f}x the best run's worst "
                   f"({reference_ttft_s:.2f} s)")
    gaps = _unscheduled_gaps(s)
    if len(gaps) >= 5:
        med, top = float(np.median(gaps)), max(gaps)
        if top > policy.gap_factor * med and top > med + policy.min_stall_s:
            out.append(f"an inter-token gap of {top:.2f} s, {top / med if med else math.inf:.0f}x the run's "
                       f"median gap")
    return out


# The prefilled request's first token and the waiting stream's next token leave in one engine step,
# but reach the client on two connections: the first token was seen up to a millisecond after the
# gap's end (eager vLLM-CPU, two streams, 2.1 s gaps).
FIRST_TOKEN_SLACK_S = 0.1


def _unscheduled_gaps(s: RunSample) -> list[float]:
    """Inter-token gaps of the run, less those during which (or as they ended) another request got
    its first token: an engine that prefills a newly arrived prompt pauses the others' decoding
    (vLLM-CPU at four streams: 9 s), which is how it schedules, not a stall, and is the same in
    every run."""
    firsts = [r.start_s + r.ttft_s for r in s.requests if r.ok and r.ttft_s is not None]
    out = []
    for r in s.requests:
        if not r.ok:
            continue
        times = token_times(r)
        for a, b in itertools.pairwise(times):
            if not any(a < f <= b + FIRST_TOKEN_SLACK_S for f in firsts):
                out.append(b - a)
    return out


def run_value(s: RunSample, metric: str) -> float | None:
    v = s.metrics.get(metric)
    return v if v is not None and v > 0 and not s.metrics.get("errors") else None


def review_runs(samples: list[RunSample], warmup_ref: RunSample | None, policy: MeasurePolicy) -> dict[int, list[str]]:
    """Flags of every counted run, each judged against the others (and the last warmup run)."""
    counted = [i for i, s in enumerate(samples) if not s.excluded]
    flags: dict[int, list[str]] = {}
    for i in counted:
        others = [samples[j] for j in counted if j != i] + ([warmup_ref] if warmup_ref else [])
        refs = [t for o in others if (t := _ttft_max(o)) is not None]
        found = stall_flags(samples[i], min(refs) if refs else None, policy)
        if found:
            flags[i] = found
    values = [(i, v) for i in counted if (v := run_value(samples[i], policy.metric)) is not None]
    if len(values) >= 5:
        for (i, v), z in zip(values, robust_z([v for _, v in values]), strict=True):
            if abs(z) > policy.outlier_z:
                flags.setdefault(i, []).append(f"{policy.metric} {v:.4g} is an outlier (robust z {z:+.1f})")
    return flags


def need_more(samples: list[RunSample], repeats: int, policy: MeasurePolicy, t0: float,
               steady: SteadyState) -> bool:
    counted = [s for s in samples if not s.excluded]
    if len(counted) < repeats:
        if time.monotonic() - t0 > policy.time_cap_s and len(samples) >= repeats:
            steady.stopped_by = "time_cap"
            return False
        return True
    if policy.target_ci is None:
        return False
    values = [v for s in counted if (v := run_value(s, policy.metric)) is not None]
    steady.achieved_ci = log_mean_rel_halfwidth(values)
    if steady.achieved_ci <= policy.target_ci:
        steady.stopped_by = "target"
        return False
    if len(counted) >= policy.max_repeats:
        steady.stopped_by = "max_repeats"
        return False
    if time.monotonic() - t0 > policy.time_cap_s:
        steady.stopped_by = "time_cap"
        return False
    return True
