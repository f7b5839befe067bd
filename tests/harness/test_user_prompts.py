"""The user's own prompts and checks, and the new workload shapes, without a server: loading,
validation errors, replay offsets, shared-context and source preparation (a stand-in counter that
counts words; the real tokenizer drives tests/harness/test_workloads_e2e.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from harness.engines.base import TokenCount
from harness.measure.user_prompts import PromptSource, document_filler, load_prompts, replay_offsets
from harness.measure.workloads import Item, WorkloadSpec, catalogue, filler_text, prepare
from harness.quality.quality import QualityModel, checks_for
from search.space.space import SpaceError, parse_space

DATA = Path(__file__).resolve().parents[1] / "data" / "user"


class WordCounter:
    """Counts 20 template tokens + one per word; records what it was shown."""

    counts_by_request = False

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def count_tokens(self, client: object, base_url: str, model_id: str,
                           msgs: list[dict[str, str]]) -> TokenCount:
        self.seen.append(msgs[-1]["content"])
        return TokenCount(20 + sum(len(m["content"].split()) for m in msgs), 100_000)

    def thinking_extras(self, on: bool) -> dict[str, object]:
        return {"chat_template_kwargs": {"enable_thinking": on}}


def _prepare(spec: WorkloadSpec, repeat: int = 0):  # type: ignore[no-untyped-def]
    return asyncio.run(prepare(spec, WordCounter(), None, "http://x", "m", repeat, {}))  # type: ignore[arg-type]


def test_jsonl_and_sharegpt_files_load_in_order() -> None:
    prompts = load_prompts(PromptSource(str(DATA / "prompts.jsonl")))
    assert len(prompts) == 4 and prompts[0].max_tokens == 8 and prompts[1].messages[0][0] == "system"
    conv = load_prompts(PromptSource(str(DATA / "sharegpt.json"), format="sharegpt"))
    # Up to the last human turn; a conversation without one is skipped.
    assert len(conv) == 2
    assert [r for r, _ in conv[0].messages] == ["user", "assistant", "user"]
    assert conv[1].messages[0] == ("system", "Be concise.")
    assert replay_offsets(load_prompts(PromptSource(str(DATA / "prompts.jsonl"), replay=True, time_scale=2.0)),
                          2.0) == [0.0, 0.25, 0.75, 1.0]


def test_bad_prompt_files_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"nope": 1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 2: needs `prompt`"):
        load_prompts(PromptSource(str(bad)))
    with pytest.raises(ValueError, match="replay needs a `timestamp`"):
        load_prompts(PromptSource(str(DATA / "sharegpt.json"), format="sharegpt", replay=True))
    with pytest.raises(ValueError, match="no such prompt file"):
        load_prompts(PromptSource(str(tmp_path / "missing.jsonl")))


def test_document_filler_extends_and_varies_by_seed() -> None:
    filler = document_filler(str(DATA / "docs"))
    assert filler(60, 1).startswith(filler(30, 1))
    assert len({filler(30, seed) for seed in range(10)}) > 1  # the documents' order follows the seed
    assert len(filler(500, 3).split()) == 500  # a short folder repeats


def test_source_workloads_prepare_exactly_counted_cold_requests() -> None:
    spec = WorkloadSpec("mine", ("source",) * 2, requests_per_stream=2, max_tokens=5,
                        source=PromptSource(str(DATA / "prompts.jsonl")))
    run0, run1 = _prepare(spec, 0), _prepare(spec, 1)
    assert [len(s) for s in run0.streams] == [2, 2]
    first = run0.requests[0].payload["messages"]
    assert first[0]["content"].startswith("Request ") and first[0]["content"].endswith("rainbow.")
    assert all(r.prompt_tokens > 20 and r.max_tokens == 5 for r in run0.requests)
    # Repeats differ (nonce and position in the file): cold unless the workload says warm.
    assert {str(r.payload["messages"]) for r in run0.requests}.isdisjoint(
        str(r.payload["messages"]) for r in run1.requests)
    replay = WorkloadSpec("replay", ("source",), source=PromptSource(str(DATA / "prompts.jsonl"), replay=True))
    prepared = _prepare(replay)
    assert prepared.arrival_offsets_s == [0.0, 0.5, 1.5, 2.0] and len(prepared.requests) == 4


def test_documents_source_is_sized_exactly_and_varies_per_request() -> None:
    spec = WorkloadSpec("rag", ("source",) * 2, source=PromptSource(str(DATA / "docs"), format="documents",
                                                                       context_tokens=300, max_tokens=7))
    prepared = _prepare(spec)
    assert [r.prompt_tokens for r in prepared.requests] == [300, 300]
    a, b = (r.payload["messages"][0]["content"] for r in prepared.requests)
    assert a.split("\n\n")[1] != b.split("\n\n")[1]  # a different retrieved part per request
    assert "Danube" in a + b and all(r.max_tokens == 7 for r in prepared.requests)


def test_shared_context_sends_one_cold_lead_then_warm_questions() -> None:
    items, profiles = catalogue()
    spec = WorkloadSpec("rag", ("rag8k_shared",), requests_per_stream=4, context_scale=0.05, max_tokens=4)
    run0, run1 = _prepare(spec, 0), _prepare(spec, 1)
    assert [r.ttft_kind for r in run0.lead] == ["cold"] and len(run0.streams[0]) == 3
    assert {r.ttft_kind for r in run0.streams[0]} == {"warm"}
    assert run0.lead[0].prompt_tokens == round(8192 * 0.05)
    bodies = [r.payload["messages"][0]["content"] for r in run0.requests]
    prefixes = {b.rsplit("\n\n", 1)[0] for b in bodies}
    questions = [b.rsplit("\n\n", 1)[1] for b in bodies]
    assert len(prefixes) == 1 and questions == list(items["rag8k_shared"].questions)
    other = run1.requests[0].payload["messages"][0]["content"].rsplit("\n\n", 1)[0]
    assert other not in prefixes  # each run its own document: its lead is cold again
    assert profiles["long_4x100k"] == ("long100k",) * 4 and items["long100k"].context_tokens == 100_000
    assert [items[f"depth{d}"].context_tokens for d in ("0", "4k", "16k", "64k")] == [2048, 6144, 18432, 67584]


def test_hungarian_filler_and_thinking_extras() -> None:
    assert "számla" in filler_text(400, 1, "hu") and "számla" not in filler_text(400, 1)
    spec = WorkloadSpec("hu", ("hu_summary",), context_scale=0.1, max_tokens=4, thinking=False)
    req = _prepare(spec).requests[0]
    assert req.payload["chat_template_kwargs"] == {"enable_thinking": False}
    assert req.prompt_tokens == round(2048 * 0.1)
    with pytest.raises(ValueError, match="language"):
        from harness.measure.workloads import parse_catalogue
        parse_catalogue({"items": {"x": {"prompt": "p", "max_tokens": 1, "language": "xx"}}})
    assert Item("q", "p", 1, questions=("a", "b")).question(3) == "b"


def _space(workload: dict[str, object], quality: dict[str, object] | None = None) -> dict[str, object]:
    return {"name": "s", "engines": {"llamacpp": {"command": ["llama-server"]}},
            "models": [{"name": "m", "path": "/m.gguf"}], "workloads": [workload],
            "quality": quality or {"suite": None}, "objectives": [{"metric": "w.output_tok_s"}]}


def test_space_schema_for_sources_and_user_checks(tmp_path: Path) -> None:
    space = parse_space(_space({"name": "w", "source": {"path": str(DATA / "prompts.jsonl")}, "concurrency": 3,
                                "thinking": False},
                               {"suite": str(DATA / "checks.yaml"), "max_lost": 0}))
    spec = space.workload_specs()[0]
    assert spec.concurrency == 3 and spec.source is not None and spec.thinking is False
    q = space.m.quality
    assert q.reference is not None and q.reference.suite == str(DATA / "checks.yaml")  # relative: implied
    assert [c.name for c in checks_for(q.suite or "")] == ["my_capital_france", "my_days_in_week"]
    with pytest.raises(SpaceError, match="no such prompt file"):
        parse_space(_space({"name": "w", "source": {"path": str(tmp_path / "none.jsonl")}}))
    with pytest.raises(SpaceError, match="exactly one of"):
        parse_space(_space({"name": "w", "streams": ["qa"], "source": {"path": str(DATA / "prompts.jsonl")}}))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump([{"name": "x", "kind": "telepathy", "prompt": "?"}]))
    with pytest.raises(SpaceError, match="unknown kind 'telepathy'"):
        parse_space(_space({"name": "w", "streams": ["qa"]}, {"suite": str(bad)}))
    with pytest.raises(ValueError, match="need a suite"):
        QualityModel(suite=None, max_lost=0)
