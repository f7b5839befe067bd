"""Warm up, run each workload N times, keep every request and counter delta, summarize.

Every number here has a precise name (docs/measurement.md; trap 1: steps/s is not tok/s):
- decode_tok_s: output tokens per second over the steady decode window, all streams together
  (harness/measure/window.py: the stretch of time in which every stream decodes at once; no first-token
  wait in it). The throughput unit every verdict rests on;
- output_tok_s: output tokens (from `usage`) of all successful requests / wall time of the run
  (end-to-end throughput: prefill, queueing and the tail included);
- stream_tok_s: median over requests of output_tokens / e2e (per-stream speed, TTFT in);
- stream_decode_tok_s: median over requests of (output_tokens - 1) / (e2e - TTFT) (one stream's
  decode speed);
- tokens_per_step: output tokens per engine forward step (1.0 without speculative decoding; from
  the server's generated/accepted token counters with it);
- decode_steps_s: stream_decode_tok_s / tokens_per_step: engine steps per second per stream, the
  number llama-benchy-style tools call "tok/s";
- engine_decode_tok_s / engine_prefill_tok_s: the engine's own per-request speeds where its
  responses carry them (the engine module reads them: Engine.timing_metrics);
- ttft_*: time to the first content token; ttft_cold_* / ttft_warm_*: the same, named by whether
  the prompts were varied (cold, the default) or repeated on purpose (warm: prefix-cache hits);
- prefill_tok_s: prompt tokens computed (cached ones left out) / TTFT;
- itl_*: gaps between content chunks; tpot_*: (e2e - TTFT) / (output_tokens - 1);
- spec_acceptance_rate, spec_mean_acceptance_length: from the spec-decode counters;
- errors: failed requests, by kind in `errors_by_kind`; never folded into a median.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from harness.engines.base import Engine, FeatureExpectation
from harness.measure import metrics as prom
from harness.measure.client import RequestResult, server_client, stream_chat
from harness.measure.natural_end import NATURAL_REPEAT, NaturalEnd, natural_end, speculating
from harness.measure.roofline import Roofline
from harness.measure.sample import RunSample
from harness.measure.stats import Stat, log_mean_rel_halfwidth, percentile, summarize
from harness.measure.steady import (
    DEFAULT_POLICY,
    WARMUP_REPEAT,
    MeasurePolicy,
    SteadyState,
    need_more,
    review_runs,
    run_value,
)
from harness.measure.window import check as window_check
from harness.measure.window import steady_window
from harness.measure.workloads import PreparedRequest, PreparedWorkload, Sizer, WorkloadSpec, prepare

Progress = Callable[[str], None]
QUANTILES = (50, 90, 95, 99)


@dataclass
class WorkloadMeasurement:
    name: str
    concurrency: int
    samples: list[RunSample]
    summary: dict[str, Stat]
    warnings: list[str] = field(default_factory=list)
    placebo: list[str] = field(default_factory=list)
    error_examples: list[str] = field(default_factory=list)
    ttft_kind: str = "cold"
    context_limit: int | None = None
    steady: SteadyState | None = None
    window_problems: list[str] = field(default_factory=list)  # the decode window asked for was not delivered
    # with speculative decoding: the answers' own ends (harness/measure/natural_end.py)
    natural: NaturalEnd | None = None

    @property
    def counted(self) -> list[RunSample]:
        """The runs the summary is made of (stalled runs that were re-measured left out)."""
        return [s for s in self.samples if not s.excluded]

    @property
    def errors(self) -> int:
        return sum(sum(s.errors_by_kind.values()) for s in self.samples)

    @property
    def errors_by_kind(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for s in self.samples:
            total.update(s.errors_by_kind)
        return dict(total)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "concurrency": self.concurrency, "ttft_kind": self.ttft_kind,
                "context_limit": self.context_limit,
                "summary": {k: v.to_dict() for k, v in self.summary.items()},
                "warnings": self.warnings, "placebo": self.placebo, "errors": self.errors,
                "errors_by_kind": self.errors_by_kind, "error_examples": self.error_examples,
                "steady": self.steady.to_dict() if self.steady else None,
                "window_problems": self.window_problems,
                "natural_end": self.natural.to_dict() if self.natural else None,
                "samples": [s.to_dict() for s in self.samples]}


def _quantiles(m: dict[str, float], name: str, values: list[float]) -> None:
    for q in QUANTILES:
        value = percentile(values, q)
        if value is not None:
            m[f"{name}_p{q}_s"] = value


def tokens_per_step(server: dict[str, float], usage_tokens: int) -> float | None:
    """Output tokens per engine decode step, from the server's counters.

    Every step of a sequence emits one token plus the draft tokens accepted in it, so
    steps = generated - accepted. None when the server does not expose spec-decode counters."""
    accepted = server.get("spec_accepted_tokens")
    if accepted is None:
        return None
    generated = server.get("generation_tokens") or float(usage_tokens)
    steps = generated - accepted
    return generated / steps if steps > 0 else None


def run_metrics(requests: list[RequestResult], wall_s: float, server: dict[str, float],
                ttft_kind: str = "cold", roofline: Roofline | None = None, concurrency: int = 1) -> dict[str, float]:
    ok = [r for r in requests if r.ok]
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    m: dict[str, float] = {
        "requests": float(len(requests)),
        "errors": float(len(requests) - len(ok)),
        "output_tokens": float(out_tokens),
        "prompt_tokens": float(sum(r.prompt_tokens or 0 for r in ok)),
        "output_tok_s": out_tokens / wall_s if wall_s > 0 else 0.0,
        "req_s": len(ok) / wall_s if wall_s > 0 else 0.0,
        "cut_requests": float(sum(1 for r in ok if r.cut)),
    }
    per_stream = [r.output_tokens / r.e2e_s for r in ok if r.output_tokens and r.e2e_s > 0]
    if per_stream:
        m["stream_tok_s"] = percentile(per_stream, 50) or 0.0
    win = steady_window(ok, concurrency)
    if win is not None and win.seconds > 0:
        m["decode_tok_s"] = win.tok_s
        m["window_s"] = win.seconds
        m["window_tokens"] = win.tokens
        m["window_concurrency"] = float(win.concurrency)
        m["window_coverage"] = win.coverage
    decode = [d for r in ok if (d := r.decode_tok_s)]
    if decode:
        m["stream_decode_tok_s"] = percentile(decode, 50) or 0.0
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    _quantiles(m, "ttft", ttfts)
    # Per-request kinds (a shared context: its first request cold, the rest warm) beat the workload's.
    for kind in ("cold", "warm"):
        _quantiles(m, f"ttft_{kind}", [r.ttft_s for r in ok if r.ttft_s is not None
                                       and (r.ttft_kind or ttft_kind) == kind])
    # Prefill speed: prompt tokens the server computed (cached ones excluded where it says) / TTFT.
    prefill = [(r.prompt_tokens - (r.cached_prompt_tokens or 0)) / r.ttft_s for r in ok
               if r.prompt_tokens and r.ttft_s]
    if prefill:
        m["prefill_tok_s"] = percentile(prefill, 50) or 0.0
    cached = [r.cached_prompt_tokens for r in ok if r.cached_prompt_tokens is not None]
    if cached and m["prompt_tokens"]:
        m["cached_prompt_frac"] = sum(cached) / m["prompt_tokens"]
    _quantiles(m, "tpot", [t for r in ok if (t := r.tpot_s) is not None])
    _quantiles(m, "e2e", [r.e2e_s for r in ok])
    _quantiles(m, "itl", [g for r in ok for g in r.chunk_gaps_s])
    chunks = sum(r.content_chunks for r in ok)
    if chunks:
        m["tokens_per_chunk"] = out_tokens / chunks

    # Speculative decoding: tokens per engine step, so that steps/s and tok/s are never confused.
    drafts, accepted = server.get("spec_drafts"), server.get("spec_accepted_tokens")
    draft_tokens = server.get("spec_draft_tokens")
    if drafts:
        m["spec_mean_acceptance_length"] = 1.0 + (accepted or 0.0) / drafts
    if draft_tokens:
        m["spec_acceptance_rate"] = (accepted or 0.0) / draft_tokens
    tps = tokens_per_step(server, out_tokens) or 1.0
    m["tokens_per_step"] = tps
    if "stream_decode_tok_s" in m:
        m["decode_steps_s"] = m["stream_decode_tok_s"] / tps
    for name in sorted({k for r in ok for k in r.engine_metrics}):
        m[name] = percentile([r.engine_metrics[name] for r in ok if name in r.engine_metrics], 50) or 0.0

    if server.get("generation_tokens") is not None and out_tokens:
        m["server_generation_tokens"] = server["generation_tokens"]
        m["server_vs_usage_tokens"] = server["generation_tokens"] / out_tokens
    if server.get("prefix_cache_queries"):
        m["prefix_cache_hit_rate"] = (server.get("prefix_cache_hits") or 0.0) / server["prefix_cache_queries"]
    for key in ("preemptions", "kv_cache_usage_peak", "requests_waiting_peak", "requests_running_peak"):
        if key in server:
            m[key] = server[key]
    if roofline is not None:
        m.update(roofline.metrics(m))
    return m


async def _run_once(engine: Engine, prepared: PreparedWorkload, client: httpx.AsyncClient, base_url: str,
                    timeout_s: float) -> tuple[list[RequestResult], float]:
    name = prepared.spec.name

    async def send(req: PreparedRequest) -> RequestResult:
        result = await stream_chat(client, base_url, req.payload, name, timeout_s, item=req.item)
        result.sized_prompt_tokens = req.prompt_tokens if req.prompt_tokens >= 0 else None
        result.ttft_kind = req.ttft_kind
        if result.server_timings:
            result.engine_metrics = engine.timing_metrics(result.server_timings)
            if result.cached_prompt_tokens is None:
                result.cached_prompt_tokens = engine.cached_prompt_tokens(result.server_timings)
        return result

    start = time.monotonic()
    # Lead requests (a shared context's first, cold request) run alone, before everything else.
    results = [await send(req) for req in prepared.lead]
    rest = [r for s in prepared.streams for r in s]
    if prepared.arrival_offsets_s is not None:
        t0 = time.monotonic()

        async def delayed(offset: float, req: PreparedRequest) -> RequestResult:
            await asyncio.sleep(max(0.0, t0 + offset - time.monotonic()))
            return await send(req)

        results += await asyncio.gather(*(delayed(o, r) for o, r in zip(prepared.arrival_offsets_s, rest,
                                                                        strict=True)))
    else:
        async def run_stream(stream: list[PreparedRequest]) -> list[RequestResult]:
            return [await send(req) for req in stream]

        per_stream = await asyncio.gather(*(run_stream(s) for s in prepared.streams))
        results += [r for stream in per_stream for r in stream]
    return results, time.monotonic() - start


def check_placebo(expectations: list[FeatureExpectation], samples: list[RunSample]) -> list[str]:
    """Features the launch asked for whose proving counter did not move in any measured run."""
    out = []
    scraped = [s for s in samples if s.metrics_error is None]
    for exp in expectations:
        if not scraped:
            out.append(f"{exp.feature}: {exp.reason}, but the server's metrics could not be read to verify it "
                       f"({samples[0].metrics_error if samples else 'no runs'})")
            continue
        moved = sum(s.server.get(exp.metric, 0.0) for s in scraped)
        if moved <= 0:
            seen = any(exp.metric in s.server for s in scraped)
            how = "did not move" if seen else "is absent from /metrics"
            out.append(f"{exp.feature}: {exp.reason}, but the server's {exp.metric} counter {how} "
                       "(placebo flag?)")
    return out


def consistency_warnings(samples: list[RunSample]) -> list[str]:
    """Client-side (usage), tokenizer and server-side counts of the same tokens must agree."""
    out = []
    for s in samples:
        off = [r for r in s.requests if r.ok and r.sized_prompt_tokens is not None
               and r.prompt_tokens is not None and r.prompt_tokens != r.sized_prompt_tokens]
        if off:
            out.append(f"repeat {s.repeat}: {len(off)} prompts were sized to {off[0].sized_prompt_tokens} tokens "
                       f"by /tokenize but usage says {off[0].prompt_tokens}")
        if s.metrics.get("cut_requests"):
            out.append(f"repeat {s.repeat}: {s.metrics['cut_requests']:.0f} requests got fewer output tokens "
                       "than asked for (finish_reason length: cut to fit the context?)")
        if s.metrics_error or s.metrics.get("errors"):
            continue  # failed requests may have generated tokens that usage never reported
        usage = s.metrics.get("output_tokens", 0.0)
        server = s.server.get("generation_tokens")
        if server is not None and usage and server != usage:
            out.append(f"repeat {s.repeat}: usage says {usage:.0f} output tokens, the server counted {server:.0f}")
    return out


async def measure_workload(engine: Engine, base_url: str, model_id: str, spec: WorkloadSpec, repeats: int,
                           warmup: bool, timeout_s: float, expectations: list[FeatureExpectation],
                           progress: Progress, roofline: Roofline | None = None,
                           watch_interval_s: float = 1.0, policy: MeasurePolicy | None = None,
                           alive: Callable[[], bool] | None = None, epoch: int = 0) -> WorkloadMeasurement:
    """Warm up to a steady state, then measure until `repeats` clean runs (or the policy's CI target).

    `epoch` numbers the measurements made on one running server (each workload of a run, then each
    run of a reused server): its prompts are drawn under seed + epoch, so that no measurement resends
    a prompt an earlier one left in the server's prefix cache (the nonce is built from the seed)."""
    policy = policy or DEFAULT_POLICY
    if epoch:
        spec = replace(spec, seed=spec.seed + epoch)
    samples: list[RunSample] = []
    warnings: list[str] = []
    steady = SteadyState(policy.metric, target_ci=policy.target_ci)
    n_requests = spec.concurrency * spec.requests_per_stream
    limits = httpx.Limits(max_connections=max(64, n_requests * 2), max_keepalive_connections=max(20, n_requests))
    if spec.warm and not warmup:
        warnings.append("warm TTFT without a warmup run: the first repeat primes the cache and reads cold")
    t0 = time.monotonic()
    assert policy.max_repeats + 2 * policy.max_remeasure < WARMUP_REPEAT, "measured prompts would repeat warmups'"
    async with server_client(limits=limits) as client:
        sizer = Sizer(engine, client, base_url, model_id)
        context_limit = None

        async def one_run(repeat: int, variant: int, label: str) -> RunSample:
            nonlocal context_limit
            progress(f"{spec.name}: {label}")
            prepared = await prepare(spec, engine, client, base_url, model_id, variant, engine.request_extras(),
                                     sizer)
            context_limit = prepared.context_limit
            warnings.extend(w for w in prepared.warnings if w not in warnings)
            return await _measured_run(engine, client, base_url, prepared, repeat, timeout_s, spec, roofline,
                                       watch_interval_s, warnings)

        warmup_ref: RunSample | None = None
        if warmup:
            previous: float | None = None
            while steady.warmups < policy.max_warmups:
                label = "warming up" if steady.warmups == 0 else f"warming up ({steady.warmups + 1})"
                run = await one_run(-1, WARMUP_REPEAT + steady.warmups, label)
                value = run_value(run, policy.metric)
                if value is None:
                    steady.warmups += 1
                    steady.note = "a warmup run failed or had errors: steady state not checked"
                    warmup_ref = None
                    break
                if previous is not None and abs(value / previous - 1) <= policy.warmup_tolerance:
                    steady.converged = True  # this run agrees with the one before: it is the first measured
                    run.repeat = 0
                    samples.append(run)
                    break
                steady.warmups += 1
                steady.warmup_values.append(value)
                previous, warmup_ref = value, run
                if alive is not None and not alive():
                    break
            if not steady.converged and not steady.note and policy.max_warmups > 1:
                steady.note = (f"no two consecutive warmup runs agreed within {100 * policy.warmup_tolerance:.0f}% "
                               f"in {steady.warmups} runs: measured anyway")
                warnings.append(f"not steady after {steady.warmups} warmup runs ({policy.metric} "
                                + ", ".join(f"{v:.4g}" for v in steady.warmup_values) + ")")
        while need_more(samples, repeats, policy, t0, steady):
            if alive is not None and not alive():
                steady.stopped_by = "server_dead"
                break
            done = sum(1 for s in samples if not s.excluded)
            label = (f"measuring {done + 1}/{repeats}" if done < repeats
                     else f"measuring {done + 1} (CI {100 * (steady.achieved_ci or math.inf):.1f}% > "
                          f"{100 * (policy.target_ci or 0):.1f}%)")
            samples.append(await one_run(len(samples), len(samples), label))
            for i, found in review_runs(samples, warmup_ref, policy).items():
                s = samples[i]
                if s.flags == found:
                    continue
                s.flags = found
                if steady.remeasured < policy.max_remeasure:
                    s.excluded = True
                    steady.remeasured += 1
                    steady.excluded.append({"repeat": s.repeat, "value": s.metrics.get(policy.metric),
                                            "flags": found})
                    progress(f"{spec.name}: run {s.repeat + 1} excluded ({found[0]}): measuring again")
                else:
                    warnings.append(f"repeat {s.repeat}: {'; '.join(found)}; kept (stalls recurred after "
                                    f"{policy.max_remeasure} re-measurements: part of this config's behaviour)")
        counted = [s for s in samples if not s.excluded]
        natural = None
        if engine.exact_output_tokens and speculating(counted) and (alive is None or alive()):
            progress(f"{spec.name}: answers to their own end (speculative decoding is on)")
            prepared = await prepare(spec, engine, client, base_url, model_id, NATURAL_REPEAT,
                                     engine.natural_extras(), sizer)
            own = await _measured_run(engine, client, base_url, prepared, -2, timeout_s, spec, roofline,
                                      watch_interval_s, warnings)
            natural = natural_end(own, counted)
            if (note := natural.note()) is not None:
                warnings.append(note)
    steady.elapsed_s = time.monotonic() - t0
    if steady.achieved_ci is None:
        steady.achieved_ci = log_mean_rel_halfwidth([v for s in counted if (v := run_value(s, policy.metric))])
    if not math.isfinite(steady.achieved_ci):
        steady.achieved_ci = None
    summary = summarize_samples(samples)
    examples: list[str] = []
    for s in samples:
        for r in s.requests:
            if not r.ok and len(examples) < 5:
                examples.append(f"{r.item or spec.name} -> {r.error_kind}: {(r.error_body or '')[:300]}")
    warnings.extend(w for w in consistency_warnings(samples) if w not in warnings)
    window_problems = window_notes(counted, spec.concurrency, engine.exact_output_tokens)
    warnings.extend(w for w in window_problems if w not in warnings)
    return WorkloadMeasurement(spec.name, spec.concurrency, samples, summary, warnings,
                               check_placebo(expectations, samples), examples, spec.ttft_kind, context_limit,
                               steady, window_problems, natural)


def window_notes(counted: list[RunSample], concurrency: int, exact_tokens: bool) -> list[str]:
    """What kept any measured run from the decode window it asked for, once per kind of problem."""
    out: dict[str, str] = {}  # first words of a note (its kind) -> the note of the first run that had it
    for s in counted:
        for note in window_check(s.requests, steady_window(s.requests, concurrency), exact_tokens):
            out.setdefault(" ".join(note.split()[:2]), f"repeat {s.repeat}: {note}")
    return list(out.values())


async def _measured_run(engine: Engine, client: httpx.AsyncClient, base_url: str, prepared: PreparedWorkload,
                        repeat: int, timeout_s: float, spec: WorkloadSpec, roofline: Roofline | None,
                        watch_interval_s: float, warnings: list[str]) -> RunSample:
    """One run with the server's counters read before and after it. No read of the counters waits
    longer than a request may (a frozen server is told in the request timeout, not 10 s later)."""
    scrape_s = min(10.0, timeout_s)
    before = await prom.scrape(client, base_url, scrape_s)
    async with prom.GaugeWatcher(base_url, engine.metric_names, watch_interval_s) as watcher:
        requests, wall = await _run_once(engine, prepared, client, base_url, timeout_s)
    after = await prom.scrape(client, base_url, scrape_s)
    server: dict[str, float] = {}
    histograms: dict[str, float] = {}
    metrics_error = None
    if before.ok and after.ok:
        deltas = prom.delta(before, after)
        server = prom.canonical(deltas, engine.metric_names)
        server.update(watcher.as_peaks())
        histograms = prom.histogram_means(deltas, after.kinds)
        resets = prom.counter_resets(before, after)
        if resets and repeat >= 0:
            warnings.append(f"repeat {repeat}: server counters went down ({resets[0]}, ...): restarted?")
    else:
        metrics_error = before.error or after.error
    errors = Counter(r.error_kind or "unknown" for r in requests if not r.ok)
    return RunSample(repeat, wall, requests, server,
                     run_metrics(requests, wall, server, spec.ttft_kind, roofline, spec.concurrency),
                     dict(errors), histograms, metrics_error)


def summarize_samples(samples: list[RunSample]) -> dict[str, Stat]:
    """Median / spread / CI of every per-run metric over the counted repeats (excluded stalls left
    out). Error counts are totals over every run (`errors_total`): a median would hide a run that
    failed, and an excluded run's errors still happened."""
    counted = [s for s in samples if not s.excluded]
    keys = sorted({k for s in counted for k in s.metrics} - {"errors"})
    summary = {k: st for k in keys if (st := summarize([s.metrics[k] for s in counted if k in s.metrics]))}
    total = summarize([float(sum(s.metrics.get("errors", 0.0) for s in samples))])
    if total is not None:
        summary["errors_total"] = total
    return summary
