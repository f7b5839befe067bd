"""Workloads: named prompt items and concurrency profiles (data in data/workloads.yaml), turned
into concrete chat requests whose prompt length is counted by the server's own tokenizer.

Traps this module exists to avoid (docs/domain.md, "Measurement traps"):
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
from pathlib import Path
from typing import Any

import httpx

from harness.engines.base import Engine, TokenCount
from harness.files import parse_yaml
from harness.measure.user_prompts import PromptSource, document_filler, load_prompts, replay_offsets, with_nonce

# Ordinary words (mostly one token each in BPE vocabularies); the filler is random text over them.
_WORDS = ("system", "memory", "kernel", "cache", "token", "layer", "expert", "router", "weight",
          "tensor", "batch", "stream", "latency", "bandwidth", "scheduler", "decode", "prefill",
          "quantization", "checkpoint", "graph", "compile", "benchmark", "throughput", "server",
          "request", "queue", "context", "attention", "vector", "matrix", "model", "river", "mountain",
          "garden", "window", "letter", "market", "winter", "summer", "forest", "island", "bridge",
          "station", "engine", "signal", "carbon", "silver", "copper", "yellow", "purple", "orange",
          "number", "answer")
# Hungarian filler (the documents measured Hungarian prose: ~1.14x the tokens of English per word
# class of text, which is why chars/4 sizing failed there).
_WORDS_HU = ("rendszer", "memória", "folyó", "hegy", "kert", "ablak", "levél", "piac", "tél", "nyár", "erdő",
             "sziget", "híd", "állomás", "jel", "ezüst", "réz", "sárga", "szám", "válasz", "számla", "szerződés",
             "adó", "önkormányzat", "bíróság", "határidő", "kötelezettség", "fizetés", "ügyfél", "jogszabály",
             "közlemény", "település", "vállalkozás", "könyvelés", "munkavállaló", "tájékoztatás", "és", "a",
             "hogy", "nem", "egy", "szerint", "között", "után", "előtt", "mellett", "teljesítés", "bizonylat")
LANGUAGES = {"en": _WORDS, "hu": _WORDS_HU}
# Appended one at a time to land on the exact target once whole words would overshoot.
_PADS = (" .", " ,", " a", " -")

TOO_LONG = 2**31  # the count of a prompt the server refused to count (over its limit)
Messages = list[dict[str, str]]
Counter = Callable[[Messages], Awaitable[TokenCount]]
Filler = Callable[[int, int], str]  # (n_words, seed) -> text; n+1 words extend n words


@dataclass(frozen=True)
class Item:
    name: str
    prompt: str
    max_tokens: int
    context_tokens: int = 0
    kind: str = "short"
    language: str = "en"  # the filler's words: en | hu
    # One context shared by every request of a run (a new one each run), with varying questions:
    # the first request is sent alone first and reported as cold TTFT, the others as warm.
    shared_context: bool = False
    questions: tuple[str, ...] = ()  # request i asks questions[i % n] (default: `prompt`)

    def question(self, i: int) -> str:
        return self.questions[i % len(self.questions)] if self.questions else self.prompt


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
    thinking: bool | None = None  # None: the template's default; else mapped per engine
    source: PromptSource | None = None  # the user's own prompts instead of items

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
    ttft_kind: str | None = None  # cold | warm where the workload decides it per request


@dataclass
class PreparedWorkload:
    spec: WorkloadSpec
    streams: list[list[PreparedRequest]]
    context_limit: int | None
    warnings: list[str] = field(default_factory=list)
    arrival_offsets_s: list[float] | None = None  # Poisson / replay: start offset of each request
    lead: list[PreparedRequest] = field(default_factory=list)  # sent alone, in order, before the rest

    @property
    def requests(self) -> list[PreparedRequest]:
        return [*self.lead, *(r for s in self.streams for r in s)]

    @property
    def not_fitting(self) -> list[PreparedRequest]:
        return [r for r in self.requests if not r.fits]


@cache
def catalogue() -> tuple[dict[str, Item], dict[str, tuple[str, ...]]]:
    """The shipped items and profiles (harness/data/workloads.yaml)."""
    text = resources.files("harness").joinpath("data/workloads.yaml").read_text()
    return parse_catalogue(parse_yaml(text, "harness/data/workloads.yaml"))


def parse_catalogue(data: Any) -> tuple[dict[str, Item], dict[str, tuple[str, ...]]]:
    if not isinstance(data, dict) or not isinstance(data.get("items"), dict):
        raise ValueError("workloads data: expected a mapping with `items:` and `profiles:`")
    items: dict[str, Item] = {}
    for name, body in data["items"].items():
        try:
            body = {**body, "questions": tuple(body.get("questions") or ())}
            items[name] = Item(name=name, **body)
        except TypeError as exc:
            raise ValueError(f"workloads data: item {name!r}: {exc}") from None
        if items[name].max_tokens < 1 or items[name].context_tokens < 0:
            raise ValueError(f"workloads data: item {name!r}: max_tokens >= 1 and context_tokens >= 0 expected")
        if items[name].language not in LANGUAGES:
            raise ValueError(f"workloads data: item {name!r}: language is one of {sorted(LANGUAGES)}")
    profiles: dict[str, tuple[str, ...]] = {}
    for name, body in (data.get("profiles") or {}).items():
        streams = tuple(body["streams"])
        unknown = [s for s in streams if s not in items]
        if unknown or not streams:
            raise ValueError(f"workloads data: profile {name!r}: unknown or no items {unknown}")
        profiles[name] = streams
    return items, profiles


def filler_text(n_words: int, seed: int, language: str = "en") -> str:
    """Deterministic filler: the first n words of the word stream of `seed` (so that n+1 words
    extend n words, and the token count grows monotonically with n)."""
    rng = random.Random(seed)
    words = LANGUAGES[language]
    return " ".join(rng.choice(words) for _ in range(n_words))


def language_filler(language: str) -> Filler:
    return lambda n, seed: filler_text(n, seed, language)


def messages(nonce: str, context: str, prompt: str) -> Messages:
    # The nonce comes first so that varied requests share no cacheable prefix beyond the template.
    body = f"{nonce}\n\n{context}\n\n{prompt}" if context else f"{nonce}\n{prompt}"
    return [{"role": "user", "content": body}]


async def sized_messages(count: Counter, nonce: str, prompt: str, target: int, seed: int,
                         filler: Filler = filler_text) -> tuple[Messages, int]:
    """Chat messages whose templated prompt is exactly `target` tokens by the server's count
    (or the closest reachable below it, which the caller reports)."""
    context, n = await sized_context(count, nonce, prompt, target, seed, filler)
    return messages(nonce, context, prompt), n


async def sized_context(count: Counter, nonce: str, prompt: str, target: int, seed: int,
                        filler: Filler = filler_text) -> tuple[str, int]:
    """The context text that makes messages(nonce, context, prompt) exactly `target` tokens."""
    async def n_of(context: str) -> int:
        return (await count(messages(nonce, context, prompt))).count

    base = await n_of("")
    if target <= base:
        return "", base
    # Bracket [lo, hi] in words: lo fits (<= target), hi reaches it (each word is >= 1 token).
    lo, n_lo = 0, base
    hi = target - base
    n_hi = await n_of(filler(hi, seed))
    if n_hi <= target:
        lo, n_lo = hi, n_hi
    while hi - lo > 1 and n_lo < target:
        # Interpolation (tokens per word is nearly constant), clamped strictly inside the bracket.
        guess = lo + round((target - n_lo) * (hi - lo) / max(1, n_hi - n_lo))
        mid = min(hi - 1, max(lo + 1, guess))
        n_mid = await n_of(filler(mid, seed))
        if n_mid <= target:
            lo, n_lo = mid, n_mid
        else:
            hi, n_hi = mid, n_mid
    context = filler(lo, seed)
    n = n_lo
    # Whole words overshoot by now: pad with single-token pieces, checking each one.
    while n < target:
        for pad in _PADS:
            m = await n_of(context + pad)
            if n < m <= target:
                context, n = context + pad, m
                break
        else:
            break  # no pad adds tokens without overshooting: leave it below, the caller warns
    return context, n


class Sizer:
    """Counts prompts with the server's tokenizer; remembers sized prompts (warm repeats)."""

    def __init__(self, engine: Engine, client: httpx.AsyncClient, base_url: str, model_id: str):
        self.engine, self.client, self.base_url, self.model_id = engine, client, base_url, model_id
        self.context_limit: int | None = None
        self.calls = 0
        self.refusals: list[str] = []  # the server's answers when it refused to count a prompt
        self._sized: dict[tuple[str, str, int, int, str], tuple[str, int]] = {}

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

    async def build(self, nonce: str, prompt: str, target: int, seed: int, sizing_nonce: str | None = None,
                    filler: Filler = filler_text, filler_id: str = "en") -> tuple[Messages, int]:
        """Messages of `target` tokens. With `sizing_nonce` (engines that count by sending a request,
        which would warm the prefix cache with the very prompt about to be measured), the prompt is
        sized under that nonce and sent under `nonce`, of the same width: usage verifies it after."""
        context, n = await self.context(nonce, prompt, target, seed, sizing_nonce, filler, filler_id)
        return messages(nonce, context, prompt), n

    async def context(self, nonce: str, prompt: str, target: int, seed: int, sizing_nonce: str | None = None,
                      filler: Filler = filler_text, filler_id: str = "en") -> tuple[str, int]:
        """The context of build(), and the whole prompt's size (cached: warm repeats reuse it)."""
        key = (nonce, prompt, target, seed, filler_id)
        if key not in self._sized:
            probe = sizing_nonce or nonce
            if target:
                self._sized[key] = await sized_context(self.count, probe, prompt, target, seed, filler)
            else:
                self._sized[key] = ("", (await self.count(messages(probe, "", prompt))).count)
        return self._sized[key]

    async def count_as(self, msgs: Messages, nonce: str, sizing_nonce: str | None) -> int:
        """Count messages that carry `nonce`, under the sizing nonce where the engine needs one."""
        if sizing_nonce:
            msgs = [{**m, "content": m["content"].replace(nonce, sizing_nonce, 1)} for m in msgs]
        return (await self.count(msgs)).count


def poisson_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Start offsets (s) of n requests arriving as a Poisson process of `rate` per second."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def _nonce(ids: tuple[int, ...]) -> str:
    # Fixed-width digits, so that a sizing nonce of the same width counts the same tokens.
    return "Request " + "-".join(f"{i % 10_000:04d}" for i in ids) + "."


_SIZING_NONCE = "Request 9999-9999-9999-9999."


class _Builder:
    """Turns (stream, request) slots into PreparedRequests for one run, with warnings."""

    def __init__(self, spec: WorkloadSpec, engine: Engine, sizer: Sizer, repeat: int, extra: dict[str, Any]):
        self.spec, self.engine, self.sizer, self.repeat = spec, engine, sizer, repeat
        self.extra = {**extra, **(engine.thinking_extras(spec.thinking) if spec.thinking is not None else {})}
        self.warnings: list[str] = []
        self.sizing = _SIZING_NONCE if engine.counts_by_request else None
        self.shared_seen: dict[str, int] = {}  # shared-context item -> requests built so far this run

    def _check(self, label: str, n: int, target: int, max_tokens: int) -> tuple[int, bool]:
        limit = self.sizer.context_limit
        refused = n >= TOO_LONG
        fits = not refused and not (limit and n + 1 > limit)
        if refused:
            n = -1  # unknown: the server would not count it
            self.warnings.append(f"{label}: the server refused to count the prompt (over its limit?): "
                                 f"{self.sizer.refusals[-1] if self.sizer.refusals else ''}")
        elif not fits:
            self.warnings.append(f"{label}: prompt of {n} tokens does not fit the context limit {limit}; "
                                 "sent anyway so that the server's answer is counted")
        elif limit and n + max_tokens > limit:
            self.warnings.append(f"{label}: {n} prompt + {max_tokens} output tokens exceed {limit}; "
                                 "the server may cut the output")
        if not refused and target and n != target:
            self.warnings.append(f"{label}: sized to {n} tokens, target {target}")
        return n, fits

    def _request(self, label: str, msgs: Messages, n: int, max_tokens: int, target: int,
                 ttft_kind: str | None = None) -> PreparedRequest:
        n, fits = self._check(label, n, target, max_tokens)
        payload = {"model": self.sizer.model_id, "messages": msgs, "max_tokens": max_tokens, "temperature": 0.0,
                   **self.extra}
        return PreparedRequest(label, payload, n, max_tokens, target, fits, ttft_kind)

    async def item_request(self, s: int, r: int, item: Item) -> PreparedRequest:
        spec = self.spec
        max_tokens, target = spec.output_tokens(item), spec.context_tokens(item)
        filler, fid = language_filler(item.language), item.language
        if item.shared_context:
            k = self.shared_seen.get(item.name, 0)
            self.shared_seen[item.name] = k + 1
            # One prefix per item and run (per workload when warm): the nonce is its first line.
            index = spec.streams.index(item.name)
            ids = (spec.seed, 1, index, 0) if spec.warm else (spec.seed, self.repeat + 2, index, 9999)
            nonce, seed = _nonce(ids), hash(ids) & 0xFFFFFFFF
            context, n = await self.sizer.context(nonce, item.question(0), target, seed, self.sizing, filler, fid)
            msgs = messages(nonce, context, item.question(k))
            if k % max(1, len(item.questions)) != 0:
                n = await self.sizer.count_as(msgs, nonce, self.sizing)
            kind = "warm" if (k > 0 or spec.warm) else "cold"
            # Only the first question is sized to the target; the others are counted as they are.
            return self._request(item.name, msgs, n, max_tokens, target if k == 0 else 0, kind)
        ids = (spec.seed, 0, 0, 0) if spec.warm else (spec.seed, self.repeat + 2, s, r)
        seed = hash(ids) & 0xFFFFFFFF  # tuples of ints hash the same in every process
        msgs, n = await self.sizer.build(_nonce(ids), item.prompt, target, seed, self.sizing, filler, fid)
        return self._request(item.name, msgs, n, max_tokens, target)

    async def source_requests(self, source: PromptSource, count: int) -> list[PreparedRequest]:
        """`count` requests from the user's prompts, each counted exactly by the server."""
        spec = self.spec
        out = []
        if source.format == "documents":
            filler, fid = document_filler(source.path), f"docs:{source.path}"
            scale = spec.context_scale if spec.context_scale is not None else spec.scale
            target = max(0, round(source.context_tokens * scale))
            max_tokens = spec.max_tokens or max(1, round(source.max_tokens * (spec.output_scale or spec.scale)))
            for j in range(count):
                ids = (spec.seed, 0, 0, j) if spec.warm else (spec.seed, self.repeat + 2, 0, j)
                question = source.questions[j % len(source.questions)]
                msgs, n = await self.sizer.build(_nonce(ids), question, target, hash(ids) & 0xFFFFFFFF,
                                                 self.sizing, filler, fid)
                out.append(self._request("documents", msgs, n, max_tokens, target))
            return out
        prompts = load_prompts(source)
        # Cold repeats walk on through the file; warm ones resend the same prompts.
        first = 0 if spec.warm else (self.repeat + 1) * count
        for j in range(count):
            prompt = prompts[(first + j) % len(prompts)] if not source.replay else prompts[j]
            ids = (spec.seed, 0, 0, j) if spec.warm else (spec.seed, self.repeat + 2, 0, j)
            nonce = _nonce(ids)
            msgs = with_nonce(prompt.as_messages(), nonce)
            n = await self.sizer.count_as(msgs, nonce, self.sizing)
            max_tokens = spec.max_tokens or prompt.max_tokens or source.max_tokens
            out.append(self._request(f"{Path(source.path).stem}[{j}]", msgs, n, max_tokens, 0))
        return out


async def prepare(spec: WorkloadSpec, engine: Engine, client: httpx.AsyncClient, base_url: str,
                  model_id: str, repeat: int, extra: dict[str, Any], sizer: Sizer | None = None) -> PreparedWorkload:
    """Build every request of one measured run. `repeat` varies the prompts between runs (cold);
    a warm workload sends the identical prompt every time."""
    sizer = sizer or Sizer(engine, client, base_url, model_id)
    b = _Builder(spec, engine, sizer, repeat, extra)
    streams: list[list[PreparedRequest]] = []
    lead: list[PreparedRequest] = []
    offsets = None
    if spec.source is not None and spec.source.replay:
        prompts = load_prompts(spec.source)
        reqs = await b.source_requests(spec.source, len(prompts))
        streams = [[r] for r in reqs]
        offsets = replay_offsets(prompts, spec.source.time_scale)
    elif spec.source is not None:
        reqs = await b.source_requests(spec.source, spec.concurrency * spec.requests_per_stream)
        per = spec.requests_per_stream
        streams = [reqs[i * per:(i + 1) * per] for i in range(spec.concurrency)]
    else:
        for s, item_name in enumerate(spec.streams):
            item = spec.item(item_name)
            stream: list[PreparedRequest] = []
            for r in range(spec.requests_per_stream):
                req = await b.item_request(s, r, item)
                # The first request of a shared context primes it, alone, before the others start.
                (lead if item.shared_context and b.shared_seen[item.name] == 1 else stream).append(req)
            streams.append(stream)
    if spec.rate and offsets is None:
        offsets = poisson_offsets(sum(len(s) for s in streams), spec.rate, spec.seed * 7919 + repeat)
    unique = list(dict.fromkeys(b.warnings))
    return PreparedWorkload(spec, streams, sizer.context_limit, unique, offsets, lead)
