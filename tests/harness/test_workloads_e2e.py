"""The issue-15 workloads and the big quality suite on a real llama-server (SmolLM2 Q4_1), scaled
down: warm-prefix RAG reports cold and warm TTFT apart, 2 x long context and prefill at depth are
sized exactly by the server's tokenizer, Hungarian prompts cost more tokens per word, and the big
suite's new kinds (needle, tool, multilingual) run and are judged relative to a reference.

Everything runs through the door: the session's llama-server door (`llama_session`) keeps this
module's server (2 slots of 2048 tokens) between tests; the reference is captured with the door's
other verb, and each judged model gets a fresh start, as every trial does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from harness import MeasureSettings, ModelChoice, QualityPlan, RunRequest, Session, flagsearch_home
from harness.engines import get_engine
from harness.measure.measure import WorkloadMeasurement
from harness.measure.workloads import WorkloadSpec, filler_text
from harness.quality.quality import QualityModel, QualityResult, suites
from tests.conftest import llama_request, llama_settings, quality_of

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
FLAGS: dict[str, Any] = {"ctx_size": 4096}  # over llama_request's 2 slots, 1 thread: 2 slots of 2048 tokens


def measure(session: Session, tmp: Path, spec: WorkloadSpec, repeats: int = 1,
            warmup: bool = False) -> WorkloadMeasurement:
    measured = session.run(llama_request(tmp, **FLAGS), [spec], MeasureSettings(repeats, warmup, 120.0))
    return measured.workloads[spec.name]


def test_warm_prefix_rag_reports_cold_and_warm_ttft_apart(llama_session: Session, tmp_path: Path) -> None:
    spec = WorkloadSpec("rag", ("rag8k_shared",), requests_per_stream=3, context_scale=0.05, max_tokens=2)
    wm = measure(llama_session, tmp_path, spec, repeats=2)
    assert wm.errors == 0, wm.error_examples
    for sample in wm.samples:
        kinds = [r.ttft_kind for r in sample.requests]
        assert kinds == ["cold", "warm", "warm"]  # the lead first, alone
        lead, *warm = sample.requests
        assert lead.prompt_tokens == round(8192 * 0.05)  # the first question is sized exactly
        # The server itself says the warm questions reused the shared prefix (llama.cpp's cache_n).
        assert all((r.cached_prompt_tokens or 0) > 0.8 * lead.prompt_tokens for r in warm)
        assert (lead.cached_prompt_tokens or 0) < 0.2 * lead.prompt_tokens  # each run its own document
    s = wm.summary
    assert s["ttft_warm_p50_s"].median < s["ttft_cold_p50_s"].median  # prefill of ~400 tokens skipped
    assert 0.5 < s["cached_prompt_frac"].median < 1.0


def test_long_context_pairs_and_prefill_at_depth_are_sized_exactly(llama_session: Session,
                                                                    tmp_path: Path) -> None:
    pair = measure(llama_session, tmp_path,
                   WorkloadSpec("long2", ("long100k", "long100k"), context_scale=0.003, max_tokens=2))
    assert pair.errors == 0 and pair.concurrency == 2
    assert [r.prompt_tokens for r in pair.samples[0].requests] == [300, 300]
    for depth, target in (("depth0", 2048), ("depth4k", 6144)):
        wm = measure(llama_session, tmp_path, WorkloadSpec(depth, (depth,), context_scale=0.05, max_tokens=2))
        r = wm.samples[0].requests[0]
        assert r.prompt_tokens == round(target * 0.05) and wm.errors == 0
        assert wm.summary["prefill_tok_s"].median > 0 and wm.summary["engine_prefill_tok_s"].median > 0


def test_hungarian_costs_more_tokens_per_word(llama_session: Session, tmp_path: Path) -> None:
    measured = llama_session.run(llama_request(tmp_path, **FLAGS),
                                 [WorkloadSpec("hu", ("hu_qa", "hu_summary"), context_scale=0.1, max_tokens=4)],
                                 MeasureSettings(1, False, 120.0))
    wm = measured.workloads["hu"]
    assert wm.errors == 0 and wm.samples[0].requests[1].prompt_tokens == round(2048 * 0.1)

    async def count(text: str) -> int:  # on the server the door measured, which it keeps
        async with httpx.AsyncClient() as client:
            tc = await get_engine("llamacpp").count_tokens(client, measured.base_url, "smollm2",
                                                            [{"role": "user", "content": text}])
            return tc.count

    en, hu = asyncio.run(count(filler_text(300, 5))), asyncio.run(count(filler_text(300, 5, "hu")))
    assert hu > 1.3 * en  # the real tokenizer: chars/4 or words x constant would be wrong here


SUBSET = ("needle_early", "tool_weather", "hu_capital", "hu_days", "json_people", "wp_apples")


@pytest.mark.slow  # long prompts (the needle) prefilled at -t 1; the suite's parsing has unit tests
def test_big_suite_kinds_run_and_are_judged_relative_to_the_reference(llama_session: Session,
                                                                      tmp_path: Path) -> None:
    big = {c.name: c for c in suites()["big"]}
    checks = [{k: v for k, v in dataclasses.asdict(big[n]).items() if v not in (None, (), "", False)}
              | {"max_tokens": min(big[n].max_tokens, 24), "allow_truncation": True} for n in SUBSET]
    for c in checks:
        c["expect"] = list(c.get("expect", []))
    path = tmp_path / "subset.yaml"
    path.write_text(yaml.safe_dump(checks, allow_unicode=True))
    quality = QualityModel.model_validate({"suite": str(path), "min_score": None, "max_lost": 0,
                                           "min_answer_match": 0.8, "context_scale": 0.02,
                                           "reference": {"tokens": 8}})
    assert quality.reference is not None
    reference = llama_request(tmp_path, **FLAGS)
    ref = llama_session.capture_reference(reference, quality.reference, "smollm2", reference.flags, 120.0)
    assert [c["name"] for c in ref.checks] == list(SUBSET)

    def assess_on(model: ModelChoice) -> QualityResult:
        # A fresh start, as every trial gets (no prompt cache from before), in a door of its own so
        # that the session's kept server is never a damaged model's.
        request = RunRequest(llama_settings(), model, reference.flags, {}, tmp_path / model.name, fresh=True)
        with Session(keep_server=False) as session:
            return quality_of(session, request, QualityPlan(quality, ref))

    # A/A: the reference config on a fresh server loses nothing; the needle prompts are sized exactly.
    same = assess_on(ModelChoice("smollm2", str(flagsearch_home.smollm2_gguf())))
    assert same.passed and same.relative is not None and same.relative.lost == [], same.to_dict()
    needle = next(c for c in same.checks if c.name == "needle_early")
    assert needle.prompt_tokens == 320 and needle.category == "long"
    assert {c.category for c in same.checks} >= {"long", "tool", "multilingual", "json", "exact"}
    # A damaged copy: its answers drift from the reference's, and it is flagged.
    damaged = tmp_path / "damaged.gguf"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "damage_model.py"), str(flagsearch_home.smollm2_gguf()),
                    str(damaged), "--tensor", "blk.15.ffn_down.weight", "--zero"], check=True, timeout=300)
    bad = assess_on(ModelChoice("smollm2-damaged", str(damaged)))
    assert not bad.passed and bad.relative is not None and bad.relative.answer_match < 0.8, bad.to_dict()
