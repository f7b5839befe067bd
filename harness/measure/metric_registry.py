"""Every metric the tool produces, declared once: unit, which direction is better, and how values
over load points aggregate. Objectives, the gate, the curves, the summary and the report read
this table; no meaning is guessed from a name elsewhere.

Full names are `<workload>[@<point>].<leaf>` (a measured metric), `quality.<leaf>`,
`startup.<leaf>`, or a bare leaf (`errors`). Latency quantiles share one entry per family
(`ttft_p{50,90,95,99}_s`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Direction = Literal["higher", "lower"]
Aggregate = Literal["geomean", "sum"]


@dataclass(frozen=True)
class MetricDef:
    leaf: str
    unit: str
    direction: Direction | None  # None: descriptive only (a count, a fraction): not an objective or gate
    aggregate: Aggregate = "geomean"
    meaning: str = ""


_DEFS = [
    MetricDef("decode_tok_s", "tok/s", "higher",
              meaning="output tokens per second over the steady decode window, all streams (no first-token wait)"),
    MetricDef("output_tok_s", "tok/s", "higher",
              meaning="end-to-end throughput: output tokens over the run's wall time, prefill and queueing in"),
    MetricDef("req_s", "req/s", "higher", meaning="completed requests per second"),
    MetricDef("stream_tok_s", "tok/s", "higher", meaning="median per-stream output tokens over its E2E time"),
    MetricDef("stream_decode_tok_s", "tok/s", "higher",
              meaning="median per-request tokens after the first / decode time"),
    MetricDef("window_s", "s", None, meaning="length of the steady decode window"),
    MetricDef("window_tokens", "tok", None, "sum", meaning="output tokens inside the steady decode window"),
    MetricDef("window_concurrency", "streams", None, meaning="streams decoding at once inside the window"),
    MetricDef("window_coverage", "fraction", None, meaning="window length / a request's median decode time"),
    MetricDef("prefill_tok_s", "tok/s", "higher", meaning="median prompt tokens / TTFT"),
    MetricDef("engine_decode_tok_s", "tok/s", "higher", meaning="the engine's own decode speed (llama.cpp timings)"),
    MetricDef("engine_prefill_tok_s", "tok/s", "higher", meaning="the engine's own prompt speed"),
    MetricDef("decode_steps_s", "steps/s", "higher", meaning="engine decode steps per second (not tok/s)"),
    MetricDef("tokens_per_step", "tok/step", "higher", meaning="output tokens per decode step (speculation)"),
    MetricDef("tokens_per_chunk", "tok/chunk", None),
    MetricDef("spec_mean_acceptance_length", "tok", "higher"),
    MetricDef("spec_acceptance_rate", "fraction", "higher"),
    MetricDef("prefix_cache_hit_rate", "fraction", "higher"),
    MetricDef("cached_prompt_frac", "fraction", None),
    MetricDef("roofline_pct", "%", "higher", meaning="decode steps/s per stream as % of the bandwidth ceiling"),
    MetricDef("roofline_tok_pct", "%", "higher"),
    MetricDef("roofline_steps_s", "steps/s", None),
    MetricDef("requests", "count", None, "sum"),
    MetricDef("errors", "count", "lower", "sum", "non-2xx answers and streams that ended early"),
    MetricDef("cut_requests", "count", "lower", "sum", "requests that got fewer tokens than asked"),
    MetricDef("output_tokens", "tok", None, "sum"),
    MetricDef("prompt_tokens", "tok", None, "sum"),
    MetricDef("server_generation_tokens", "tok", None, "sum"),
    MetricDef("server_vs_usage_tokens", "ratio", None),
    MetricDef("preemptions", "count", "lower", "sum"),
    MetricDef("ready_s", "s", "lower", meaning="server start to ready"),
    # capacity.* (harness/measure/capacity.py) and kv.* (the engine's startup log)
    MetricDef("concurrency", "streams", "higher", meaning="highest concurrency whose latency stays within the SLO"),
    MetricDef("steps", "count", None, "sum", meaning="load steps the capacity search measured"),
    MetricDef("cache_tokens", "tok", "higher", meaning="KV-cache capacity in tokens (startup log)"),
    MetricDef("max_sequences", "seqs", "higher", meaning="sequences at the engine's per-request context"),
    MetricDef("sequences", "seqs", "higher", meaning="sequences of measure.kv_context_tokens the KV cache holds"),
    MetricDef("elapsed_s", "s", "lower"),
    # quality.*: scores up, distances down
    MetricDef("score", "fraction", "higher", meaning="share of quality checks passed"),
    MetricDef("degenerate", "flag", "lower"),
    MetricDef("agreement", "fraction", "higher"),
    MetricDef("prefix", "fraction", "higher"),
    MetricDef("answer_match", "fraction", "higher"),
    MetricDef("reference_score", "fraction", None),
    MetricDef("kl", "nats", "lower", meaning="mean KL divergence from the reference's top-k logprobs"),
    MetricDef("logprob_diff", "nats", "lower"),
    MetricDef("lost", "count", "lower", "sum"),
    MetricDef("gained", "count", None, "sum"),
]
REGISTRY: dict[str, MetricDef] = {d.leaf: d for d in _DEFS}
_QUANTILE = re.compile(r"^(ttft|tpot|e2e|itl)(?:_(cold|warm))?_p(\d+)_s$")


def leaf_of(name: str) -> str:
    """`chat@concurrency=4.ttft_p50_s` -> `ttft_p50_s`; `errors` -> `errors`."""
    return name.rsplit(".", 1)[-1]


def metric_def(name: str) -> MetricDef | None:
    """The declaration of a full metric name, or None if the tool does not produce it.
    `quality.<category>` (a per-category pass fraction) counts as a score."""
    leaf = leaf_of(name)
    if leaf in REGISTRY:
        return REGISTRY[leaf]
    q = _QUANTILE.match(leaf)
    if q:
        return MetricDef(leaf, "s", "lower", meaning=f"p{q.group(3)} of {q.group(2) or ''} {q.group(1).upper()}")
    if name.startswith("quality."):
        return MetricDef(leaf, "fraction", "higher", meaning=f"share of {leaf} checks passed")
    return None


def direction_of(name: str) -> Direction:
    """Which way is better; a clear error for a metric that has no direction or is unknown."""
    d = metric_def(name)
    if d is None:
        raise ValueError(f"unknown metric {name!r}: not one the tool measures (see harness/measure/metric_registry.py)")
    if d.direction is None:
        raise ValueError(f"metric {name!r} ({d.unit}) is descriptive: it has no better direction to optimize "
                         "or gate on")
    return d.direction


def aggregate_of(name: str) -> Aggregate:
    d = metric_def(name)
    return d.aggregate if d is not None else "geomean"
