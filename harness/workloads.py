"""Workloads: named prompt items and concurrency profiles (data in data/workloads.yaml), turned
into concrete chat requests whose prompt length is counted by the server's own tokenizer.

Traps this module exists to avoid (shared DOMAIN.md, "Measurement traps"):
- chars/4 prompt sizing (off by 1.14x): every long prompt is sized EXACTLY with the server's
  tokenizer and chat template (`Engine.count_tokens`), by search over a deterministic filler;
- prefix-cache flattery: by default every request gets its own nonce *first* and its own filler,
  so no two requests share a cacheable prefix beyond the chat template; `warm: true` repeats
  one prompt on purpose and is reported as warm TTFT;
- a prompt over max-model-len: found here, before it is sent, and reported as a warning (it is
  still sent, so that the server's own error is counted and kept).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import httpx
import yaml

from harness.engines.base import Engine, TokenCount

# Ordinary words (mostly one token each in BPE vocabularies); the filler is random text over them.
_WORDS = ("system", "memory", "kernel", "cache", "token", "layer", "expert", "router", "weight",
          "tensor", "batch", "stream", "latency", "bandwidth", "scheduler", "decode", "prefill",
          "quantization", "checkpoint", "graph", "compile", "benchmark", "throughput", "server",
          "request", "queue", "context", "attention", "vector", "matrix", "model", "river", "mountain",
          "garden", "window", "letter", "market", "winter", "summer", "forest", "island", "bridge",
          "station", "engine", "signal", "carbon", "silver", "copper", "yellow", "purple", "orange",
          "number", "answer")
# Appended one at a time to land on the exact target once whole words would overshoot.
_PADS = (" .", " ,", " a", " -")

TOO_LONG = 2**31  # the count of a prompt the server refused to count (over its limit)
Messages = list[dict[str, str]]
Counter = Callable[[Messages], Awaitable[TokenCount]]


@dataclass(frozen=True)
class Item:
    name: str
    prompt: str
    max_tokens: int
    context_tokens: int = 0
    kind: str = "short"


@dataclass(frozen=True)
class WorkloadSpec:
    """One measured workload of a space: which items each stream sends, how often, how long."""

    name: str
    streams: tuple[str, ...]
    requests_per_stream: int = 1
    scale: float = 1.0  # scales both output and context lengths (small models, small machines)
    max_tokens: int | None = None  # overrides every item's max_tokens when set
    warm: bool = False  # repeat identical prompts on purpose (prefix cache hits): warm TTFT
    rate: float | None = None  # Poisson arrivals per second instead of closed-loop streams
    seed: int = 0
    context_scale: float | None = None  # overrides `scale` for context_tokens
    output_scale: float | None = None  # overrides `scale` for max_tokens
    items: tuple[Item, ...] = ()  # inline items; they shadow catalogue items of the same name

    @property
    def concurrency(self) -> int:
        return len(self.streams)

    @property
    def ttft_kind(self) -> str:
        return "warm" if self.warm else "cold"

    def item(self, name: str) -> Item:
        for it in self.items:
            if it.name == name:
                return it
        items, _ = catalogue()
        if name not in items:
            raise KeyError(f"workload {self.name!r}: unknown item {name!r} (known: {', '.join(items)})")
        return items[name]

    def output_tokens(self, item: Item) -> int:
        if self.max_tokens:
            return self.max_tokens
        scale = self.output_scale if self.output_scale is not None else self.scale
        return max(1, round(item.max_tokens * scale))

    def context_tokens(self, item: Item) -> int:
        scale = self.context_scale if self.context_scale is not None else self.scale
        return max(0, round(item.context_tokens * scale))


@dataclass
class PreparedRequest:
    item: str
    payload: dict[str, Any]
    prompt_tokens: int  # counted by the server's tokenizer, chat template included
    max_tokens: int
    target_tokens: int = 0  # the exact size asked for (0: the prompt alone)
    fits: bool = True  # False: prompt + 1 output token exceeds the context limit


@dataclass
class PreparedWorkload:
    spec: WorkloadSpec
    streams: list[list[PreparedRequest]]
    context_limit: int | None
    warnings: list[str] = field(default_factory=list)
    arrival_offsets_s: list[float] | None = None  # Poisson mode: start offset of each request

    @property
    def requests(self) -> list[PreparedRequest]:
        return [r for s in self.streams for r in s]

    @property
    def not_fitting(self) -> list[PreparedRequest]:
        return [r for r in self.requests if not r.fits]


@cache
def catalogue() -> tuple[dict[str, Item], dict[str, tuple[str, ...]]]:
    """The shipped items and profiles (harness/data/workloads.yaml)."""
    text = resources.files("harness").joinpath("data/workloads.yaml").read_text()
    return parse_catalogue(yaml.safe_load(text))


def parse_catalogue(data: Any) -> tuple[dict[str, Item], dict[str, tuple[str, ...]]]:
    if not isinstance(data, dict) or not isinstance(data.get("items"), dict):
        raise ValueError("workloads data: expected a mapping with `items:` and `profiles:`")
    items: dict[str, Item] = {}
    for name, body in data["items"].items():
        try:
            items[name] = Item(name=name, **body)
        except TypeError as exc:
            raise ValueError(f"workloads data: item {name!r}: {exc}") from None
        if items[name].max_tokens < 1 or items[name].context_tokens < 0:
            raise ValueError(f"workloads data: item {name!r}: max_tokens >= 1 and context_tokens >= 0 expected")
    profiles: dict[str, tuple[str, ...]] = {}
    for name, body in (data.get("profiles") or {}).items():
        streams = tuple(body["streams"])
        unknown = [s for s in streams if s not in items]
        if unknown or not streams:
            raise ValueError(f"workloads data: profile {name!r}: unknown or no items {unknown}")
        profiles[name] = streams
    return items, profiles


def filler_text(n_words: int, seed: int) -> str:
    """Deterministic filler: the first n words of the word stream of `seed` (so that n+1 words
    extend n words, and the token count grows monotonically with n)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(n_words))


def messages(nonce: str, context: str, prompt: str) -> Messages:
    # The nonce comes first so that varied requests share no cacheable prefix beyond the template.
    body = f"{nonce}\n\n{context}\n\n{prompt}" if context else f"{nonce}\n{prompt}"
    return [{"role": "user", "content": body}]


async def sized_messages(count: Counter, nonce: str, prompt: str, target: int,
                         seed: int) -> tuple[Messages, int]:
    """Chat messages whose templated prompt is exactly `target` tokens by the server's count
    (or the closest reachable below it, which the caller reports)."""
    async def n_of(msgs: Messages) -> int:
        return (await count(msgs)).count

    base = await n_of(messages(nonce, "", prompt))
    if target <= base:
        return messages(nonce, "", prompt), base
    # Bracket [lo, hi] in words: lo fits (<= target), hi reaches it (each word is >= 1 token).
    lo, n_lo = 0, base
    hi = target - base
    n_hi = await n_of(messages(nonce, filler_text(hi, seed), prompt))
    if n_hi <= target:
        lo, n_lo = hi, n_hi
    while hi - lo > 1 and n_lo < target:
        # Interpolation (tokens per word is nearly constant), clamped strictly inside the bracket.
        guess = lo + round((target - n_lo) * (hi - lo) / max(1, n_hi - n_lo))
        mid = min(hi - 1, max(lo + 1, guess))
        n_mid = await n_of(messages(nonce, filler_text(mid, seed), prompt))
        if n_mid <= target:
            lo, n_lo = mid, n_mid
        else:
            hi, n_hi = mid, n_mid
    context = filler_text(lo, seed)
    n = n_lo
    # Whole words overshoot by now: pad with single-token pieces, checking each one.
    while n < target:
        for pad in _PADS:
            m = await n_of(messages(nonce, context + pad, prompt))
            if n < m <= target:
                context, n = context + pad, m
                break
        else:
            break  # no pad adds tokens without overshooting: leave it below, the caller warns
    return messages(nonce, context, prompt), n


class Sizer:
    """Counts prompts with the server's tokenizer; remembers sized prompts (warm repeats)."""

    def __init__(self, engine: Engine, client: httpx.AsyncClient, base_url: str, model_id: str):
        self.engine, self.client, self.base_url, self.model_id = engine, client, base_url, model_id
        self.context_limit: int | None = None
        self.calls = 0
        self.refusals: list[str] = []  # the server's answers when it refused to count a prompt
        self._sized: dict[tuple[str, str, int, int], tuple[Messages, int]] = {}

    async def count(self, msgs: Messages) -> TokenCount:
        self.calls += 1
        try:
            tc = await self.engine.count_tokens(self.client, self.base_url, self.model_id, msgs)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code not in (400, 413):
                raise
            # Engines that count by sending the prompt get a 400 for one over the limit: "too long".
            self.refusals.append(exc.response.text[:300])
            return TokenCount(TOO_LONG, self.context_limit)
        if tc.context_limit:
            self.context_limit = tc.context_limit
        return tc

    async def build(self, nonce: str, prompt: str, target: int, seed: int,
                    sizing_nonce: str | None = None) -> tuple[Messages, int]:
        """Messages of `target` tokens. With `sizing_nonce` (engines that count by sending a request,
        which would warm the prefix cache with the very prompt about to be measured), the prompt is
        sized under that nonce and sent under `nonce`, of the same width: usage verifies it after."""
        key = (nonce, prompt, target, seed)
        if key not in self._sized:
            probe = sizing_nonce or nonce
            if target:
                msgs, n = await sized_messages(self.count, probe, prompt, target, seed)
            else:
                msgs = messages(probe, "", prompt)
                n = (await self.count(msgs)).count
            if probe != nonce:
                msgs = [{**m, "content": m["content"].replace(probe, nonce, 1)} for m in msgs]
            self._sized[key] = (msgs, n)
        return self._sized[key]


def poisson_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Start offsets (s) of n requests arriving as a Poisson process of `rate` per second."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def prepare(spec: WorkloadSpec, engine: Engine, client: httpx.AsyncClient, base_url: str,
                  model_id: str, repeat: int, extra: dict[str, Any], sizer: Sizer | None = None) -> PreparedWorkload:
    """Build every request of one measured run. `repeat` varies the prompts between runs (cold);
    a warm workload sends the identical prompt every time."""
    sizer = sizer or Sizer(engine, client, base_url, model_id)
    streams: list[list[PreparedRequest]] = []
    warnings: list[str] = []
    for s, item_name in enumerate(spec.streams):
        item = spec.item(item_name)
        max_tokens = spec.output_tokens(item)
        target = spec.context_tokens(item)
        stream: list[PreparedRequest] = []
        for r in range(spec.requests_per_stream):
            # Fixed-width digits, so that a sizing nonce of the same width counts the same tokens.
            ids = (spec.seed, 0, 0, 0) if spec.warm else (spec.seed, repeat + 2, s, r)
            nonce = "Request " + "-".join(f"{i % 10_000:04d}" for i in ids) + "."
            seed = hash(ids) & 0xFFFFFFFF  # tuples of ints hash the same in every process
            sizing = "Request 9999-9999-9999-9999." if getattr(engine, "counts_by_request", False) else None
            msgs, n = await sizer.build(nonce, item.prompt, target, seed, sizing)
            limit = sizer.context_limit
            refused = n >= TOO_LONG
            fits = not refused and not (limit and n + 1 > limit)
            if refused:
                n = -1  # unknown: the server would not count it
                warnings.append(f"{item_name}: the server refused to count the prompt (over its limit?): "
                                f"{sizer.refusals[-1] if sizer.refusals else ''}")
            elif not fits:
                warnings.append(f"{item_name}: prompt of {n} tokens does not fit the context limit {limit}; "
                                "sent anyway so that the server's answer is counted")
            elif limit and n + max_tokens > limit:
                warnings.append(f"{item_name}: {n} prompt + {max_tokens} output tokens exceed {limit}; "
                                "the server may cut the output")
            if not refused and target and n != target:
                warnings.append(f"{item_name}: sized to {n} tokens, target {target}")
            payload = {"model": model_id, "messages": msgs, "max_tokens": max_tokens, "temperature": 0.0,
                       **extra}
            stream.append(PreparedRequest(item_name, payload, n, max_tokens, target, fits))
        streams.append(stream)
    offsets = None
    if spec.rate:
        offsets = poisson_offsets(sum(len(s) for s in streams), spec.rate, spec.seed * 7919 + repeat)
    unique = list(dict.fromkeys(warnings))
    return PreparedWorkload(spec, streams, sizer.context_limit, unique, offsets)
