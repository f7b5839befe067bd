"""SGLang dialect. SGLang needs a CUDA GPU and cannot run on the CPU machines where tests run, so
its command building is tested directly and its log parsing on recorded text (tests/data)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engines import EngineSettings, ModelChoice, get_engine
from harness.engines.sglang import SglangEngine, sglang_flags
from tests.documented_logs import documented_failures

DATA = Path(__file__).resolve().parents[1] / "data"


def test_launch_command_uses_sglang_spelling_and_enables_metrics() -> None:
    settings = EngineSettings(name="sglang", dialect="sglang", command=("python", "-m", "sglang.launch_server"))
    spec = get_engine("sglang").build_launch(settings, ModelChoice("q", "/models/q"),
                                             {"mem_fraction_static": 0.85, "chunked_prefill_size": 4096,
                                              "max_running_requests": 8, "kv_cache_dtype": "fp8_e4m3",
                                              "attention_backend": "flashinfer", "tp": 1}, {}, 30000)
    argv = list(spec.argv)
    assert argv[:9] == ["python", "-m", "sglang.launch_server", "--model-path", "/models/q", "--host", "127.0.0.1",
                        "--port", "30000"]
    text = " ".join(argv)
    for part in ("--mem-fraction-static 0.85", "--chunked-prefill-size 4096", "--max-running-requests 8",
                 "--kv-cache-dtype fp8_e4m3", "--attention-backend flashinfer", "--tp-size 1"):
        assert part in text
    assert argv.count("--enable-metrics") == 1


def test_shared_names_and_speculative_flags() -> None:
    argv = sglang_flags({"speculative_method": "mtp", "num_speculative_tokens": 3,
                         "gpu_memory_utilization": 0.9, "max_model_len": 131072, "max_num_seqs": 4,
                         "enable_prefix_caching": False, "cuda_graph": True, "json_arg": {"a": 1}})
    assert "--disable-radix-cache" in argv
    text = " ".join(argv)
    for part in ("--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1",
                 "--mem-fraction-static 0.9", "--context-length 131072", "--max-running-requests 4",
                 '--json-arg {"a":1}'):
        assert part in text
    assert "--disable-cuda-graph" not in argv
    off = sglang_flags({"speculative_method": "none", "num_speculative_tokens": 3, "speculative_num_steps": 2,
                        "enable_prefix_caching": True, "cuda_graph": False})
    assert off == ["--disable-cuda-graph"]


def test_speculative_flags_are_the_ones_sglang_honours() -> None:
    """At topk 1 SGLang sets the draft count to steps + 1 itself: a draft count is left out there,
    passed where topk > 1; SGLang's own steps name wins over vLLM's; 0 of either is no speculation."""
    top1 = sglang_flags({"speculative_method": "mtp", "speculative_num_steps": 2, "num_speculative_tokens": 5,
                         "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 7})
    assert top1 == ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2", "--speculative-eagle-topk",
                    "1"]
    tree = sglang_flags({"speculative_method": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 4,
                         "speculative_num_draft_tokens": 8})
    assert tree == ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk",
                    "4", "--speculative-num-draft-tokens", "8"]
    for zero in ({"num_speculative_tokens": 0}, {"speculative_num_steps": 0, "num_speculative_tokens": 2}):
        argv = sglang_flags({"speculative_method": "mtp", "speculative_eagle_topk": 1, **zero})
        assert not any(a.startswith("--speculative") for a in argv), argv


def test_a_rejected_speculative_flag_names_its_param() -> None:
    engine = SglangEngine()
    assert engine.param_for_flag("--speculative-num-steps", {"num_speculative_tokens": 2}) == "num_speculative_tokens"
    assert engine.param_for_flag("--context-length", {"max_model_len": 8}) == "max_model_len"
    assert engine.param_for_flag("--disable-radix-cache", {"enable_prefix_caching": False}) == "enable_prefix_caching"


def test_parse_startup_of_recorded_text() -> None:
    info = SglangEngine().parse_startup((DATA / "sglang_gpu_documented.log").read_text())
    assert info.phases_s == {"weight_loading": 508.31, "graph_capture": 14.27}
    assert info.kv_cache_tokens == 823296
    assert info.backends == {"attention": "flashinfer", "sampling": "flashinfer", "speculative": "NEXTN",
                             "kv_cache_dtype": "fp8_e4m3"}
    assert info.facts["context_len"] == "262144" and info.facts["max_running_requests"] == "8"
    assert info.max_concurrency == pytest.approx(823296 / 262144, abs=0.01)
    assert info.facts["model_class"] == "Qwen3_5MoeForConditionalGeneration"
    assert SglangEngine().classify_failure((DATA / "sglang_gpu_documented.log").read_text()) is None


@pytest.mark.parametrize(("cause", "text"), documented_failures("sglang_failures_documented.txt"))
def test_documented_failure_lines(cause: str, text: str) -> None:
    found = SglangEngine().classify_failure("[2026-04-02 10:00:01] starting\n" + text)
    assert found is not None and found.cause == cause and found.line == text


def test_metric_names_and_features() -> None:
    engine = SglangEngine()
    assert engine.metric_names.generation_tokens == "sglang:generation_tokens_total"
    assert engine.metric_names.spec_drafts is None  # SGLang has no draft counters to check against
    (feature,) = engine.expected_features({"enable_prefix_caching": True})
    assert feature.metric == "prompt_tokens_cached"
