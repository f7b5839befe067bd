"""What a study will cost in wall time, before it runs and while it runs.

One trial = server start + (warmup + repeats) x one pass over the workloads + the quality suite.

Each part comes from the best source there is, and says which:
- measured: the mean of this engine's finished trials (`Estimator.observe`, or the study's stored
  records at start): the server's ready time, and the rest of the trial's wall time;
- declared: the space's `engines.<name>.expect` (start_s, decode_tok_s, prefill_tok_s);
- assumed: decode at half the device's bandwidth roofline (bandwidth / bytes of active weights per
  token), prefill at 40x decode, 120 s to start. A printed "assumed" means: declare it.

A workload pass is timed from its token counts: each stream sends its requests back to back; with
c concurrent streams a stream decodes at decode / sqrt(c) (the documents' DGX Spark: 4 short streams
gave 63.86 tok/s aggregate vs ~31 for one, about 2x = sqrt(4)) and prefills at prefill / c.

A study is more than its trials (`Estimator.study`, printed as a range):
- warm-up: a workload is warmed up until two runs agree, at most `measure.max_warmups` runs: one
  warm-up run at best, max_warmups at worst;
- failed starts: a config that does not start costs its start, not a trial (the study's own rate
  once 3 trials ran; assumed ASSUMED_FAIL_RATE before);
- hung starts: a server that never gets ready costs the engine's `ready_timeout_s` (the study's
  own rate of timeouts; assumed ASSUMED_HANG_RATE before);
- confirmation: the top configs, the default and the controls re-measured on fresh starts (start +
  the objective's workload), 3 rounds at least, `confirm.max_rounds` at most.
`search run --budget-hours` starts a trial only when it and the shortest confirmation still fit.

The study loop updates the estimate from each finished trial:

    est = Estimator(space, records)          # records: the study's finished TrialRecords, if any
    est.observe(record)                      # after each trial
    est.trial_s(engine) / est.remaining_s(trials_left)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from harness.measure.workloads import WorkloadSpec
from search.space.space import Space
from search.store.results import TrialRecord
from search.study.memory_fit import longest_request, quality_checks, stream_requests

ASSUMED_START_S = 120.0
ASSUMED_ROOFLINE_SHARE = 0.5
ASSUMED_PREFILL_PER_DECODE = 40.0
ASSUMED_DECODE_TOK_S = 20.0  # no device bandwidth or model size stated
ASSUMED_FAIL_RATE = 0.2  # new configs that fail to start, before the study has measured its own
ASSUMED_HANG_RATE = 0.05  # starts that hang until ready_timeout_s, likewise
MIN_CONFIRM_ROUNDS = 3  # the sequential test's minimum (search/verdicts/sequential.py MIN_STARTS)
# Failures that cost no start of that config (rejected before launch, the machine's memory, Ctrl-C).
_NOT_A_START = ("wont_fit", "rejected_value", "memory_held", "interrupted", "internal_error")
_SHORT_PROMPT_TOKENS = 100  # a short item's prompt, chat template included (upper bound)


@dataclass(frozen=True)
class Part:
    seconds: float
    source: str  # measured (n trials) | declared | assumed


@dataclass(frozen=True)
class EngineCost:
    engine: str
    start: Part
    measure: Part  # workloads x runs + quality
    decode_tok_s: float
    prefill_tok_s: float
    rates_source: str

    @property
    def trial_s(self) -> float:
        return self.start.seconds + self.measure.seconds

    def line(self) -> str:
        return (f"{self.engine}: start {self.start.seconds:.0f} s ({self.start.source}), "
                f"measuring {self.measure.seconds:.0f} s ({self.measure.source}; decode {self.decode_tok_s:.3g} "
                f"tok/s, prefill {self.prefill_tok_s:.4g} tok/s: {self.rates_source}), "
                f"trial ~{self.trial_s / 60:.1f} min")


def request_s(prompt: int, output: int, concurrency: int, decode: float, prefill: float) -> float:
    return prompt / (prefill / concurrency) + output / (decode / math.sqrt(concurrency))


def workload_pass_s(spec: WorkloadSpec, decode: float, prefill: float, timeout_s: float) -> float:
    """One pass over a workload: the slowest stream (closed loop), or the arrivals' span plus one
    request (open loop, `rate`). A shared-context item (warm-prefix RAG) is costed as cold: an upper
    bound."""
    c = spec.concurrency
    per_stream = [min(timeout_s, request_s(prompt, output, c, decode, prefill)) * spec.requests_per_stream
                  for prompt, output, _ in stream_requests(spec)]
    if spec.rate:
        n = c * spec.requests_per_stream
        return n / spec.rate + max(per_stream) / spec.requests_per_stream
    return max(per_stream)


@dataclass(frozen=True)
class StudyCost:
    """A study's wall time as a range (seconds) and the parts that make it."""

    trials: int
    trials_s: float  # every trial measured, one warm-up run per workload
    warmup_extra_s: float  # every workload needing max_warmups runs to agree (high end only)
    fail_rate: float
    fail_source: str
    failed_saving_s: float  # failed starts cost a start, not a trial (low end)
    hang_rate: float
    hung_extra_s: float  # hung starts wait ready_timeout_s (high end)
    confirm_s: tuple[float, float]  # (MIN_CONFIRM_ROUNDS, max_rounds) rounds; (0, 0) without
    arms: int

    @property
    def low_s(self) -> float:
        return self.trials_s - self.failed_saving_s + self.confirm_s[0]

    @property
    def high_s(self) -> float:
        return self.trials_s + self.warmup_extra_s + self.hung_extra_s + self.confirm_s[1]


class Estimator:
    def __init__(self, space: Space, records: Iterable[TrialRecord] = (), confirm: bool = True):
        self.space = space
        self.confirm = confirm  # False under `search run --no-confirm`: no confirmation to reserve time for
        self._starts: dict[str, list[float]] = {}
        self._measures: dict[str, list[float]] = {}
        self._outcomes: list[str] = []  # "ok", "failed", "hung": for the study's own failure rates
        for record in records:
            self.observe(record)

    def observe(self, record: TrialRecord) -> None:
        """Learn from a finished trial: its start (unless a running server was reused) and the rest
        of its wall time. Failed starts teach nothing about a measured trial and are left out (they
        count in the study's failure and hang rates)."""
        if record.failure is not None and record.failure.duplicate_of is None \
                and record.failure.cause not in _NOT_A_START:
            self._outcomes.append("hung" if record.failure.cause == "timeout" else "failed")
        elif record.failure is None and record.wall_s is not None:
            self._outcomes.append("ok")
        if record.failure is not None or record.ready_s is None or record.wall_s is None:
            return
        if not record.reused_server:
            self._starts.setdefault(record.engine, []).append(record.ready_s)
        rest = record.wall_s - (0.0 if record.reused_server else record.ready_s)
        if rest > 0:
            self._measures.setdefault(record.engine, []).append(rest)

    def _rates(self, engine: str) -> tuple[float, float, str]:
        """(decode tok/s, prefill tok/s, where each comes from)."""
        expect = self.space.m.engines[engine].expect
        decode, prefill = expect.decode_tok_s, expect.prefill_tok_s
        decode_from = prefill_from = "declared"
        if decode is None:
            device, model = self.space.m.device, self.space.m.models[0]
            if device and device.bandwidth_gbs and model.active_params_b and model.bytes_per_param:
                roofline = device.bandwidth_gbs / (model.active_params_b * model.bytes_per_param)
                decode = roofline * ASSUMED_ROOFLINE_SHARE
            else:
                decode = ASSUMED_DECODE_TOK_S
            decode_from = "assumed"
        if prefill is None:
            prefill, prefill_from = decode * ASSUMED_PREFILL_PER_DECODE, "assumed"
        return decode, prefill, f"{decode_from}/{prefill_from}" if decode_from != prefill_from else decode_from

    def _measure_from_rates(self, decode: float, prefill: float) -> float:
        m = self.space.m
        timeout = m.measure.request_timeout_s
        passes = m.measure.repeats + (1 if m.measure.warmup else 0)
        total = passes * sum(workload_pass_s(w, decode, prefill, timeout) for w in self.space.workload_specs())
        checks = quality_checks(self.space)
        c = m.quality.concurrency
        serial = sum(request_s(round(ch.context_tokens * m.quality.context_scale) or _SHORT_PROMPT_TOKENS,
                               ch.max_tokens, c, decode, prefill) for ch in checks)
        return total + serial / c

    def engine_cost(self, engine: str) -> EngineCost:
        decode, prefill, rates_source = self._rates(engine)
        starts, measures = self._starts.get(engine), self._measures.get(engine)
        declared_start = self.space.m.engines[engine].expect.start_s
        if starts:
            start = Part(sum(starts) / len(starts), f"measured, {len(starts)} trials")
        elif declared_start is not None:
            start = Part(declared_start, "declared")
        else:
            start = Part(ASSUMED_START_S, "assumed")
        if measures:
            measure = Part(sum(measures) / len(measures), f"measured, {len(measures)} trials")
        else:
            passes = self.space.m.measure.repeats + (1 if self.space.m.measure.warmup else 0)
            measure = Part(self._measure_from_rates(decode, prefill),
                           f"{passes} passes x {len(self.space.m.workloads)} workloads + quality, from rates")
        return EngineCost(engine, start, measure, decode, prefill, rates_source)

    def trial_s(self, engine: str | None = None) -> float:
        """One trial of `engine`; without one, the mean over the space's engines (drawn evenly)."""
        if engine is not None:
            return self.engine_cost(engine).trial_s
        engines = list(self.space.m.engines)
        return sum(self.engine_cost(e).trial_s for e in engines) / len(engines)

    def remaining_s(self, trials_left: int) -> float:
        return max(0, trials_left) * self.trial_s()

    def _failure_rates(self) -> tuple[float, float, str]:
        """(failed-start rate, hung-start rate, where they come from)."""
        n = len(self._outcomes)
        if n >= 3:
            return (self._outcomes.count("failed") / n, self._outcomes.count("hung") / n,
                    f"measured over {n} trials")
        return ASSUMED_FAIL_RATE, ASSUMED_HANG_RATE, "assumed"

    def _mean(self, per_engine: dict[str, float]) -> float:
        return sum(per_engine.values()) / len(per_engine)

    def confirmation_start_s(self) -> float:
        """One fresh start of a confirmation arm: the start and the objective's workload, measured."""
        workload = self.space.m.objectives[0].metric.split(".", 1)[0].split("@", 1)[0]
        m = self.space.m.measure
        passes = (self.space.m.confirm.repeats or m.repeats) + (1 if m.warmup else 0)
        out = {}
        for engine in self.space.m.engines:
            cost = self.engine_cost(engine)
            specs = [s for s in self.space.workload_specs() if s.name == workload]
            measure = passes * sum(workload_pass_s(s, cost.decode_tok_s, cost.prefill_tok_s, m.request_timeout_s)
                                   for s in specs)
            out[engine] = cost.start.seconds + measure
        return self._mean(out)

    def confirmation_s(self) -> tuple[float, float]:
        """(shortest, longest) confirmation: every arm a fresh start each round."""
        confirm = self.space.m.confirm
        if not confirm.top_k or not self.confirm:
            return 0.0, 0.0
        arms = 1 + confirm.top_k + len(confirm.controls)
        one = arms * self.confirmation_start_s()
        return MIN_CONFIRM_ROUNDS * one, max(MIN_CONFIRM_ROUNDS, confirm.max_rounds) * one

    def needed_s(self, engine: str) -> float:
        """What starting one more trial commits the time budget to: the trial and the shortest
        confirmation after it."""
        return self.trial_s(engine) + self.confirmation_s()[0]

    def study(self, trials: int) -> StudyCost:
        engines = list(self.space.m.engines)
        m = self.space.m.measure
        costs = {e: self.engine_cost(e) for e in engines}
        trial = self._mean({e: c.trial_s for e, c in costs.items()})
        start = self._mean({e: c.start.seconds for e, c in costs.items()})
        timeout = self._mean({e: self.space.m.engines[e].ready_timeout_s for e in engines})
        passes = m.repeats + (1 if m.warmup else 0)
        measure = self._mean({e: c.measure.seconds for e, c in costs.items()})
        extra_warmups = max(0, m.max_warmups - 1) if m.warmup else 0
        fail, hang, source = self._failure_rates()
        confirm = self.space.m.confirm
        # One trial is the default alone: nothing to confirm, and without a control nothing is started.
        nothing = trials <= 1 and not confirm.controls
        return StudyCost(
            trials=trials, trials_s=trials * trial,
            warmup_extra_s=trials * measure * extra_warmups / passes,
            fail_rate=fail, fail_source=source, failed_saving_s=trials * fail * (trial - start),
            hang_rate=hang, hung_extra_s=trials * hang * max(0.0, timeout - start),
            confirm_s=(0.0, 0.0) if nothing else self.confirmation_s(),
            arms=0 if nothing else 1 + confirm.top_k + len(confirm.controls))

    def lines(self, trials: int) -> list[str]:
        """The estimate as text: per engine, then the study as a range."""
        out = ["# time estimate, per trial = start + (warmup + repeats) x workloads + quality:"]
        out += ["#   " + self.engine_cost(e).line() for e in self.space.m.engines]
        longest, where = longest_request(self.space)
        out.append(f"#   longest request: {longest} tokens ({where})")
        c = self.study(trials)
        h = 3600.0
        then = ", then confirmation" if c.confirm_s[1] else ""
        out.append(f"# study of {trials} trials (engines drawn evenly){then}:")
        out.append(f"#   trials: {c.trials_s / h:.1f} h with every config measured (one warm-up run per workload)")
        out.append(f"#   warm-up: up to +{c.warmup_extra_s / h:.1f} h when runs need all "
                   f"{self.space.m.measure.max_warmups} warm-up runs to agree")
        out.append(f"#   failed starts: {c.fail_rate:.0%} ({c.fail_source}) end at the start: "
                   f"-{c.failed_saving_s / h:.1f} h")
        out.append(f"#   hung starts: {c.hang_rate:.0%} ({c.fail_source}) wait for the ready timeout: "
                   f"+{c.hung_extra_s / h:.1f} h")
        if c.confirm_s[1]:
            out.append(f"#   confirmation: {c.arms} arms (top {self.space.m.confirm.top_k}, the default, "
                       f"{len(self.space.m.confirm.controls)} controls) x {MIN_CONFIRM_ROUNDS}-"
                       f"{max(MIN_CONFIRM_ROUNDS, self.space.m.confirm.max_rounds)} rounds of fresh starts: "
                       f"{c.confirm_s[0] / h:.1f}-{c.confirm_s[1] / h:.1f} h")
        else:
            why = ("--no-confirm" if not self.confirm else "confirm.top_k is 0" if not self.space.m.confirm.top_k
                   else "one trial is the default alone: nothing to confirm")
            out.append(f"#   confirmation: none ({why})")
        out.append(f"# total: {c.low_s / h:.1f}-{c.high_s / h:.1f} h")
        return out
