"""Prometheus /metrics scraping and before/after deltas, parsed with prometheus-client's parser.

Counters and histogram parts (`_sum`, `_count`, `_bucket`) are compared as deltas over a run;
gauges (KV-cache usage, running/waiting requests) are instantaneous, so they are kept as the
value after the run and, through `GaugeWatcher`, as the peak seen while the run was going.
Engine-specific names live in each engine module's `MetricNames`; this module is generic.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from harness.engines.base import MetricNames
from harness.measure.client import server_client

# Canonical MetricNames fields that are gauges (everything else there is a counter).
GAUGES = ("kv_cache_usage", "requests_running", "requests_waiting")


@dataclass
class Scrape:
    """Sample name -> value summed over label sets, plus the label-resolved raw samples."""

    totals: dict[str, float] = field(default_factory=dict)
    labelled: dict[str, float] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)  # sample name -> counter | gauge | histogram | ...
    ok: bool = True
    error: str | None = None
    at_s: float = 0.0  # monotonic time of the scrape


def parse_metrics(text: str) -> Scrape:
    totals: dict[str, float] = defaultdict(float)
    labelled: dict[str, float] = {}
    kinds: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue  # creation timestamps, not measurements
            totals[sample.name] += sample.value
            kinds[sample.name] = family.type
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())
                              if k not in ("engine", "model_name"))
            labelled[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return Scrape(totals=dict(totals), labelled=labelled, kinds=kinds, at_s=time.monotonic())


async def scrape(client: httpx.AsyncClient, base_url: str, timeout_s: float = 10.0) -> Scrape:
    """One /metrics scrape; a failure is returned (ok=False, with why), never raised."""
    try:
        resp = await client.get(base_url + "/metrics", timeout=timeout_s)
        if resp.status_code != 200:
            return Scrape(ok=False, error=f"/metrics answered HTTP {resp.status_code}", at_s=time.monotonic())
        return parse_metrics(resp.text)
    except (httpx.HTTPError, ValueError) as exc:
        return Scrape(ok=False, error=f"/metrics: {type(exc).__name__}: {exc}", at_s=time.monotonic())


def delta(before: Scrape, after: Scrape) -> dict[str, float]:
    """after - before for counters and histogram parts; the after value for gauges.

    A counter that went down means the server restarted in between; its delta is then the
    after value (what was counted since the restart), and `counter_resets` names it."""
    out: dict[str, float] = {}
    for name, value in after.totals.items():
        if after.kinds.get(name) == "gauge":
            out[name] = value
            continue
        prev = before.totals.get(name, 0.0)
        out[name] = value - prev if value >= prev else value
    return out


def counter_resets(before: Scrape, after: Scrape) -> list[str]:
    return sorted(n for n, v in after.totals.items()
                  if after.kinds.get(n) != "gauge" and v < before.totals.get(n, 0.0))


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


def histogram_means(deltas: dict[str, float], kinds: dict[str, str]) -> dict[str, float]:
    """Mean of every histogram that observed something during the run (e.g. the server's own
    TTFT, queue time, prefill time): family -> sum / count."""
    out = {}
    for name, kind in kinds.items():
        if kind in ("histogram", "summary") and name.endswith("_count"):
            family = name[: -len("_count")]
            mean = histogram_mean(deltas, family)
            if mean is not None:
                out[family] = mean
    return out


class GaugeWatcher:
    """Polls /metrics while a run goes and keeps the peak of the watched gauges, e.g. the KV
    cache usage or the number of waiting requests (a snapshot after the run would read idle).

    One scrape per `interval_s` (default 1 s) on a separate connection: negligible next to the
    requests being measured, even on two cores."""

    def __init__(self, base_url: str, names: MetricNames, interval_s: float = 1.0):
        self.base_url = base_url
        self.watched = {key: getattr(names, key) for key in GAUGES if getattr(names, key, None)}
        self.interval_s = interval_s
        self.peaks: dict[str, float] = {}
        self.scrapes = 0
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        async with server_client() as client:
            while True:
                s = await scrape(client, self.base_url, timeout_s=max(1.0, self.interval_s * 2))
                if s.ok:
                    self.scrapes += 1
                    for key, sample in self.watched.items():
                        if sample in s.totals:
                            self.peaks[key] = max(self.peaks.get(key, float("-inf")), s.totals[sample])
                await asyncio.sleep(self.interval_s)

    async def __aenter__(self) -> GaugeWatcher:
        if self.watched:
            self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def as_peaks(self) -> dict[str, float]:
        return {f"{key}_peak": value for key, value in self.peaks.items()}
