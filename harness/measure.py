"""Warm up, run each workload N times, keep every request and counter delta, summarize.

Every number here has a precise name:
- output_tok_s: output tokens (from `usage`) of all successful requests / wall time of the run
  (effective aggregate throughput: what users get);
- stream_tok_s: median over requests of output_tokens / e2e (effective per-stream speed);
- decode_steps_s: engine forward steps per second per stream (differs from tok/s when
  speculative decoding accepts several tokens per step);
- ttft_*: time to the first content token; tpot_*: time per output token after the first.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from harness import metrics as prom
from harness.client import RequestResult, stream_chat
from harness.engines.base import Engine, FeatureExpectation
from harness.stats import Stat, percentile, summarize
from harness.workloads import PreparedWorkload, WorkloadSpec, prepare

Progress = Callable[[str], None]


@dataclass
class RunSample:
    repeat: int  # -1 for the warmup run
    wall_s: float
    requests: list[RequestResult]
    server: dict[str, float]  # canonical counter deltas over this run
    metrics: dict[str, float]
    errors_by_kind: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"repeat": self.repeat, "wall_s": self.wall_s, "server": self.server, "metrics": self.metrics,
                "errors_by_kind": self.errors_by_kind,
                "requests": [r.to_dict() for r in self.requests]}


@dataclass
class WorkloadMeasurement:
    name: str
    concurrency: int
    samples: list[RunSample]
    summary: dict[str, Stat]
    warnings: list[str] = field(default_factory=list)
    placebo: list[str] = field(default_factory=list)
    error_examples: list[str] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return sum(sum(s.errors_by_kind.values()) for s in self.samples)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "concurrency": self.concurrency,
                "summary": {k: v.to_dict() for k, v in self.summary.items()},
                "warnings": self.warnings, "placebo": self.placebo, "errors": self.errors,
                "error_examples": self.error_examples,
                "samples": [s.to_dict() for s in self.samples]}


def run_metrics(requests: list[RequestResult], wall_s: float, server: dict[str, float]) -> dict[str, float]:
    ok = [r for r in requests if r.ok]
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    m: dict[str, float] = {
        "requests": float(len(requests)),
        "errors": float(len(requests) - len(ok)),
        "output_tokens": float(out_tokens),
        "prompt_tokens": float(sum(r.prompt_tokens or 0 for r in ok)),
        "output_tok_s": out_tokens / wall_s if wall_s > 0 else 0.0,
        "req_s": len(ok) / wall_s if wall_s > 0 else 0.0,
    }
    per_stream = [r.output_tokens / r.e2e_s for r in ok if r.output_tokens and r.e2e_s > 0]
    if per_stream:
        m["stream_tok_s"] = percentile(per_stream, 50) or 0.0
    for name, values in (("ttft", [r.ttft_s for r in ok if r.ttft_s is not None]),
                         ("tpot", [r.tpot_s for r in ok if r.tpot_s is not None]),
                         ("e2e", [r.e2e_s for r in ok])):
        for q in (50, 90, 95, 99):
            value = percentile(values, q)
            if value is not None:
                m[f"{name}_p{q}_s"] = value
    gaps = [g for r in ok for g in r.chunk_gaps_s]
    if gaps:
        m["itl_p50_s"] = percentile(gaps, 50) or 0.0
    # Speculative decoding: tokens per engine step, so that steps/s and tok/s are never confused.
    drafts, accepted = server.get("spec_drafts"), server.get("spec_accepted_tokens")
    draft_tokens = server.get("spec_draft_tokens")
    tokens_per_step = 1.0
    if drafts:
        tokens_per_step = 1.0 + (accepted or 0.0) / drafts
        m["spec_mean_acceptance_length"] = tokens_per_step
        if draft_tokens:
            m["spec_acceptance_rate"] = (accepted or 0.0) / draft_tokens
    engine_decode = [r.server_timings["predicted_per_second"] for r in ok
                     if r.server_timings and r.server_timings.get("predicted_per_second")]
    if engine_decode:
        # llama.cpp reports its own decode tok/s per request; with drafts, steps are fewer.
        m["engine_decode_tok_s"] = percentile(engine_decode, 50) or 0.0
    if "stream_tok_s" in m:
        m["decode_steps_s"] = m["stream_tok_s"] / tokens_per_step
    if server.get("generation_tokens") is not None and out_tokens:
        m["server_vs_usage_tokens"] = server["generation_tokens"] / out_tokens
    if server.get("prefix_cache_queries"):
        m["prefix_cache_hit_rate"] = (server.get("prefix_cache_hits") or 0.0) / server["prefix_cache_queries"]
    if "preemptions" in server:
        m["preemptions"] = server["preemptions"]
    return m


async def _run_once(prepared: PreparedWorkload, client: httpx.AsyncClient, base_url: str,
                    timeout_s: float) -> tuple[list[RequestResult], float]:
    name = prepared.spec.name
    start = time.monotonic()
    if prepared.arrival_offsets_s is not None:
        flat = [req for stream in prepared.streams for req in stream]

        async def delayed(offset: float, payload: dict[str, Any]) -> RequestResult:
            await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
            return await stream_chat(client, base_url, payload, name, timeout_s)

        results = list(await asyncio.gather(*(delayed(o, r.payload)
                                              for o, r in zip(prepared.arrival_offsets_s, flat, strict=True))))
    else:
        async def run_stream(stream: list[Any]) -> list[RequestResult]:
            return [await stream_chat(client, base_url, req.payload, name, timeout_s) for req in stream]

        per_stream = await asyncio.gather(*(run_stream(s) for s in prepared.streams))
        results = [r for stream in per_stream for r in stream]
    return results, time.monotonic() - start


async def measure_workload(engine: Engine, base_url: str, model_id: str, spec: WorkloadSpec, repeats: int,
                           warmup: bool, timeout_s: float, expectations: list[FeatureExpectation],
                           progress: Progress) -> WorkloadMeasurement:
    samples: list[RunSample] = []
    warnings: list[str] = []
    limits = httpx.Limits(max_connections=max(64, spec.concurrency * 2))
    async with httpx.AsyncClient(limits=limits) as client:
        runs = ([-1] if warmup else []) + list(range(repeats))
        for repeat in runs:
            label = "warming up" if repeat < 0 else f"measuring {repeat + 1}/{repeats}"
            progress(f"{spec.name}: {label}")
            prepared = await prepare(spec, engine, client, base_url, model_id, repeat, engine.request_extras())
            if repeat >= 0:
                warnings.extend(w for w in prepared.warnings if w not in warnings)
            before = await prom.scrape(client, base_url)
            requests, wall = await _run_once(prepared, client, base_url, timeout_s)
            after = await prom.scrape(client, base_url)
            server = prom.canonical(prom.delta(before, after), engine.metric_names) if before.ok and after.ok else {}
            if repeat < 0:
                continue  # warmup results are discarded by design
            errors = Counter(r.error_kind for r in requests if not r.ok)
            samples.append(RunSample(repeat, wall, requests, server, run_metrics(requests, wall, server),
                                     dict(errors)))
    keys = sorted({k for s in samples for k in s.metrics})
    summary = {k: st for k in keys if (st := summarize([s.metrics[k] for s in samples if k in s.metrics]))}
    examples = []
    for s in samples:
        for r in s.requests:
            if not r.ok and len(examples) < 5:
                examples.append(f"{r.error_kind}: {(r.error_body or '')[:300]}")
    placebo = []
    for exp in expectations:
        moved = sum(s.server.get(exp.metric, 0.0) for s in samples)
        if moved <= 0:
            placebo.append(f"{exp.feature}: {exp.reason}, but the server's {exp.metric} counter did not move "
                           "(placebo flag?)")
    return WorkloadMeasurement(spec.name, spec.concurrency, samples, summary, warnings, placebo, examples)
