"""Workloads: named prompt items and concurrency profiles (data in data/workloads.yaml), turned
into concrete chat requests whose prompt length is counted by the server's own tokenizer."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import httpx
import yaml

from harness.engines.base import Engine

_WORDS = ("system memory kernel cache token layer expert router weight tensor batch stream "
          "latency bandwidth scheduler decode prefill quantization checkpoint graph compile "
          "benchmark throughput server request queue context attention vector matrix model").split()


@dataclass(frozen=True)
class Item:
    name: str
    prompt: str
    max_tokens: int
    context_tokens: int = 0


@dataclass(frozen=True)
class WorkloadSpec:
    """One measured workload of a space: which items each stream sends, how often, how long."""

    name: str
    streams: tuple[str, ...]
    requests_per_stream: int = 1
    scale: float = 1.0
    max_tokens: int | None = None  # overrides every item's max_tokens when set
    warm: bool = False  # repeat identical prompts on purpose (prefix cache hits): warm TTFT
    rate: float | None = None  # Poisson arrivals per second instead of closed-loop streams
    seed: int = 0

    @property
    def concurrency(self) -> int:
        return len(self.streams)


@dataclass
class PreparedRequest:
    item: str
    payload: dict[str, Any]
    prompt_tokens: int
    max_tokens: int


@dataclass
class PreparedWorkload:
    spec: WorkloadSpec
    streams: list[list[PreparedRequest]]
    context_limit: int | None
    warnings: list[str] = field(default_factory=list)
    arrival_offsets_s: list[float] | None = None  # Poisson mode: start offset of each request


@cache
def catalogue() -> tuple[dict[str, Item], dict[str, tuple[str, ...]]]:
    text = resources.files("harness").joinpath("data/workloads.yaml").read_text()
    data = yaml.safe_load(text)
    items = {name: Item(name=name, **body) for name, body in data["items"].items()}
    profiles = {name: tuple(body["streams"]) for name, body in data["profiles"].items()}
    return items, profiles


def filler_text(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(n_words))


def _messages(nonce: str, context: str, prompt: str) -> list[dict[str, str]]:
    # The nonce comes first so that varied requests share no cacheable prefix beyond the template.
    body = f"{nonce}\n\n{context}\n\n{prompt}" if context else f"{nonce}\n{prompt}"
    return [{"role": "user", "content": body}]


async def _sized_messages(engine: Engine, client: httpx.AsyncClient, base_url: str, model_id: str,
                          nonce: str, prompt: str, target: int, seed: int) -> tuple[list[dict[str, str]], int]:
    """Chat messages whose templated prompt is exactly `target` tokens (or the closest reachable)."""
    async def count(words: int) -> int:
        msgs = _messages(nonce, filler_text(words, seed), prompt)
        return (await engine.count_tokens(client, base_url, model_id, msgs)).count

    base = await count(0)
    if target <= base:
        msgs = _messages(nonce, "", prompt)
        return msgs, base
    lo, hi = 0, max(1, target - base)  # a word is at least one token, so hi words overshoot or fit
    while lo < hi:  # largest word count whose prompt does not exceed the target
        mid = (lo + hi + 1) // 2
        if await count(mid) <= target:
            lo = mid
        else:
            hi = mid - 1
    context = filler_text(lo, seed)
    msgs = _messages(nonce, context, prompt)
    n = (await engine.count_tokens(client, base_url, model_id, msgs)).count
    # Pad with single-token fillers to land exactly; stop if a pad does not add exactly one.
    for _ in range(8):
        if n >= target:
            break
        trial = _messages(nonce, context + " .", prompt)
        m = (await engine.count_tokens(client, base_url, model_id, trial)).count
        if m > target:
            break
        context, msgs, n = context + " .", trial, m
    return msgs, n


async def prepare(spec: WorkloadSpec, engine: Engine, client: httpx.AsyncClient, base_url: str,
                  model_id: str, repeat: int, extra: dict[str, Any]) -> PreparedWorkload:
    """Build every request of one measured run. `repeat` varies the prompts between runs."""
    items, _ = catalogue()
    streams: list[list[PreparedRequest]] = []
    warnings: list[str] = []
    limit: int | None = None
    for s, item_name in enumerate(spec.streams):
        item = items[item_name]
        max_tokens = spec.max_tokens or max(1, int(item.max_tokens * spec.scale))
        target = int(item.context_tokens * spec.scale)
        stream: list[PreparedRequest] = []
        for r in range(spec.requests_per_stream):
            nonce = "Request 0." if spec.warm else f"Request {spec.seed}.{repeat}.{s}.{r}."
            if target:
                msgs, n = await _sized_messages(engine, client, base_url, model_id, nonce, item.prompt,
                                                target, seed=spec.seed * 1000 + s)
                if n != target:
                    warnings.append(f"{item_name}: sized to {n} tokens, target {target}")
            else:
                msgs = _messages(nonce, "", item.prompt)
                n = (await engine.count_tokens(client, base_url, model_id, msgs)).count
            limit = limit or (await engine.count_tokens(client, base_url, model_id, msgs)).context_limit
            if limit and n + 1 > limit:
                warnings.append(f"{item_name}: prompt of {n} tokens does not fit the context limit {limit}")
            elif limit and n + max_tokens > limit:
                warnings.append(f"{item_name}: {n} prompt + {max_tokens} output tokens exceed {limit}; "
                                "the server may cut the output")
            payload = {"model": model_id, "messages": msgs, "max_tokens": max_tokens, "temperature": 0.0,
                       **extra}
            stream.append(PreparedRequest(item_name, payload, n, max_tokens))
        streams.append(stream)
    offsets = None
    if spec.rate:
        rng = random.Random(spec.seed * 7919 + repeat)
        total = sum(len(s) for s in streams)
        t, offsets = 0.0, []
        for _ in range(total):
            offsets.append(t)
            t += rng.expovariate(spec.rate)
    return PreparedWorkload(spec, streams, limit, warnings, offsets)
