"""Prometheus /metrics scraping and before/after deltas, parsed with prometheus-client's parser."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from harness.engines.base import MetricNames


@dataclass
class Scrape:
    """Sample name -> value summed over label sets, plus the label-resolved raw samples."""

    totals: dict[str, float] = field(default_factory=dict)
    labelled: dict[str, float] = field(default_factory=dict)
    ok: bool = True
    error: str | None = None


def parse_metrics(text: str) -> Scrape:
    totals: dict[str, float] = defaultdict(float)
    labelled: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] += sample.value
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())
                              if k not in ("engine", "model_name"))
            labelled[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return Scrape(totals=dict(totals), labelled=labelled)


async def scrape(client: httpx.AsyncClient, base_url: str) -> Scrape:
    try:
        resp = await client.get(base_url + "/metrics", timeout=10.0)
        if resp.status_code != 200:
            return Scrape(ok=False, error=f"/metrics answered HTTP {resp.status_code}")
        return parse_metrics(resp.text)
    except (httpx.HTTPError, ValueError) as exc:
        return Scrape(ok=False, error=f"{type(exc).__name__}: {exc}")


def delta(before: Scrape, after: Scrape) -> dict[str, float]:
    """after - before for every sample name present after (counters and histogram parts)."""
    return {name: after.totals[name] - before.totals.get(name, 0.0) for name in after.totals}


def canonical(deltas: dict[str, float], names: MetricNames) -> dict[str, float]:
    """Engine-specific deltas -> canonical names (generation_tokens, spec_drafts, ...)."""
    out: dict[str, float] = {}
    for key, sample_name in names.items():
        if sample_name in deltas:
            out[key] = deltas[sample_name]
    return out


def histogram_mean(deltas: dict[str, float], family: str) -> float | None:
    count = deltas.get(family + "_count")
    total = deltas.get(family + "_sum")
    if not count or total is None:
        return None
    return total / count
