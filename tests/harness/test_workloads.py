"""Workload data and prompt sizing, without a server (the real tokenizer is in test_measure_e2e)."""

from __future__ import annotations

import asyncio
import itertools
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.engines.base import TokenCount
from harness.measure.workloads import (
    Item,
    WorkloadSpec,
    catalogue,
    filler_text,
    parse_catalogue,
    poisson_offsets,
    sized_messages,
)


def test_catalogue_has_the_seed_workloads_and_profiles() -> None:
    items, profiles = catalogue()
    expected = {"qa": (256, 0), "code": (512, 0), "json": (1024, 0), "math": (64, 0), "longcode": (2048, 0),
                "rag8k": (256, 8192), "rag32k": (256, 32768)}
    for name, (out, ctx) in expected.items():
        assert (items[name].max_tokens, items[name].context_tokens) == (out, ctx)
    assert items["stress100k"].context_tokens >= 100_000
    assert profiles["single"] == ("qa",)
    assert len(profiles["uniform_short"]) == 4
    assert profiles["mixed_typical"].count("rag8k") == 1 and profiles["mixed_typical"].count("qa") == 3
    assert all(items[i].kind == "long" for i in profiles["long_only"])


def test_scaling_and_overrides() -> None:
    items, _ = catalogue()
    spec = WorkloadSpec("w", ("rag8k",), scale=0.1)
    assert spec.context_tokens(items["rag8k"]) == 819
    assert spec.output_tokens(items["rag8k"]) == 26
    spec = WorkloadSpec("w", ("rag8k",), scale=0.1, context_scale=0.5, max_tokens=7)
    assert spec.context_tokens(items["rag8k"]) == 4096
    assert spec.output_tokens(items["rag8k"]) == 7
    inline = WorkloadSpec("w", ("mine",), items=(Item("mine", "Hi", 3, 10),))
    assert inline.item("mine").context_tokens == 10
    with pytest.raises(KeyError, match="unknown item 'nope'"):
        WorkloadSpec("w", ("nope",)).item("nope")
    assert WorkloadSpec("w", ("qa",), warm=True).ttft_kind == "warm"
    assert WorkloadSpec("w", ("qa",)).ttft_kind == "cold"


def test_bad_catalogue_data_is_named() -> None:
    with pytest.raises(ValueError, match="item 'x'"):
        parse_catalogue({"items": {"x": {"prompt": "p", "max_tokens": 1, "colour": "red"}}})
    with pytest.raises(ValueError, match="profile 'p'"):
        parse_catalogue({"items": {"x": {"prompt": "p", "max_tokens": 1}}, "profiles": {"p": {"streams": ["y"]}}})


def test_filler_is_deterministic_and_prefix_consistent() -> None:
    assert filler_text(50, 3) == filler_text(50, 3)
    assert filler_text(51, 3).startswith(filler_text(50, 3))
    assert filler_text(50, 3) != filler_text(50, 4)


def test_poisson_offsets_have_the_asked_rate() -> None:
    offsets = poisson_offsets(4000, rate=5.0, seed=1)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert offsets[0] == 0.0 and all(g >= 0 for g in gaps)
    assert statistics.mean(gaps) == pytest.approx(0.2, rel=0.08)
    assert statistics.stdev(gaps) == pytest.approx(0.2, rel=0.1)  # exponential: sd == mean
    assert poisson_offsets(10, 5.0, 1) == poisson_offsets(10, 5.0, 1)


def _tokenizer(multi: frozenset[str]) -> object:
    """A stand-in tokenizer for the search algorithm only: 1 token per word, 3 for words in `multi`,
    plus a fixed template overhead. The real server tokenizer is exercised in test_measure_e2e."""
    calls = {"n": 0}

    async def count(msgs: list[dict[str, str]]) -> TokenCount:
        calls["n"] += 1
        words = msgs[0]["content"].split()
        return TokenCount(20 + sum(3 if w in multi else 1 for w in words), 4096)

    count.calls = calls  # type: ignore[attr-defined]
    return count


@settings(max_examples=40, deadline=None)
@given(target=st.integers(min_value=30, max_value=3000), seed=st.integers(0, 10_000))
def test_sizing_lands_exactly_on_the_target(target: int, seed: int) -> None:
    count = _tokenizer(frozenset({"quantization", "checkpoint", "bandwidth"}))
    msgs, n = asyncio.run(sized_messages(count, "Request 1.", "Summarize.", target, seed))  # type: ignore[arg-type]
    assert n == target
    assert asyncio.run(count(msgs)).count == target  # type: ignore[operator]
    assert count.calls["n"] < 40  # type: ignore[attr-defined]  # interpolation, not a linear walk


def test_sizing_below_the_bare_prompt_returns_the_bare_prompt() -> None:
    count = _tokenizer(frozenset())
    msgs, n = asyncio.run(sized_messages(count, "Request 1.", "Summarize the text.", 5, 0))  # type: ignore[arg-type]
    assert n > 5 and "\n\n" not in msgs[0]["content"]


class _CountingEngine:
    """Counts like an engine without a tokenizer endpoint (by sending the prompt): records every
    prompt it was shown, and refuses (HTTP 400) prompts over `limit`."""

    counts_by_request = True

    def __init__(self, limit: int = 10_000):
        self.limit = limit
        self.seen: list[str] = []

    async def count_tokens(self, client: object, base_url: str, model_id: str,
                           msgs: list[dict[str, str]]) -> TokenCount:
        import httpx

        self.seen.append(msgs[0]["content"])
        n = 20 + len(msgs[0]["content"].split())
        if n > self.limit:
            request = httpx.Request("POST", "http://x/v1/chat/completions")
            raise httpx.HTTPStatusError("400", request=request,
                                        response=httpx.Response(400, text="maximum context length", request=request))
        return TokenCount(n, self.limit)


def test_engines_counting_by_request_never_see_the_measured_prompt_before_it_is_sent() -> None:
    from harness.measure.workloads import prepare

    engine = _CountingEngine()
    spec = WorkloadSpec("w", ("doc", "doc"), items=(Item("doc", "Summarize.", 4, context_tokens=300),))
    prepared = asyncio.run(prepare(spec, engine, None, "http://x", "m", 0, {}))  # type: ignore[arg-type]
    sent = [r.payload["messages"][0]["content"] for r in prepared.requests]
    assert all(r.prompt_tokens == 300 for r in prepared.requests)
    assert len(set(sent)) == 2  # cold: every request its own prompt
    assert not set(sent) & set(engine.seen)  # sizing warmed no cache entry of a measured prompt
    assert all(s.startswith("Request ") for s in sent) and all(s.startswith("Request 9999") for s in engine.seen)


def test_a_prompt_the_server_refuses_to_count_is_reported_not_fatal() -> None:
    from harness.measure.workloads import prepare

    engine = _CountingEngine(limit=200)
    spec = WorkloadSpec("w", ("doc",), items=(Item("doc", "Summarize.", 4, context_tokens=500),))
    prepared = asyncio.run(prepare(spec, engine, None, "http://x", "m", 0, {}))  # type: ignore[arg-type]
    req = prepared.requests[0]
    # Refusals read as "too long": the largest prompt the server would count is built, and flagged.
    assert not req.fits and req.prompt_tokens == 200 and prepared.not_fitting == [req]
    assert "doc: sized to 200 tokens, target 500" in prepared.warnings
    assert any("does not fit the context limit 200" in w for w in prepared.warnings)
    # Even the bare prompt refused: reported with the server's answer, size unknown (-1), still sent.
    engine = _CountingEngine(limit=5)
    prepared = asyncio.run(prepare(spec, engine, None, "http://x", "m", 0, {}))  # type: ignore[arg-type]
    assert prepared.requests[0].prompt_tokens == -1 and not prepared.requests[0].fits
    assert any("refused to count" in w and "maximum context length" in w for w in prepared.warnings)
