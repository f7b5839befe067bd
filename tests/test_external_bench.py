"""External benchmark exports read into flagsearch's metric names: a REAL `vllm bench serve` export
and a REAL AIPerf 0.13.0 export (tests/data/external, made by bench/external_vs_builtin.py against
one llama-server; the commands that made them are beside them), next to the built-in client's
numbers from the same server and load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.external_bench import detect, parse_export, parse_guidellm

DATA = Path(__file__).resolve().parent / "data" / "external"
SHARED = ("output_tok_s", "req_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "e2e_p50_s", "requests", "errors",
          "output_tokens")


def test_a_real_vllm_bench_export_reads_into_our_names_beside_the_builtin_client() -> None:
    res = parse_export(DATA / "vllm_bench_serve.json")
    ours = json.loads((DATA / "builtin_same_server.json").read_text())
    cmd = (DATA / "vllm_bench_serve.cmd").read_text()
    assert res.tool == "vllm-bench" and "bench serve" in cmd
    m = res.metrics
    assert set(SHARED) <= set(m) and set(SHARED) <= set(ours)
    raw = json.loads((DATA / "vllm_bench_serve.json").read_text())
    # The same load on both sides (8 requests, 64 output tokens each with ignore_eos). This real run
    # lost requests to "Server disconnected" (aiohttp reusing keep-alive connections llama-server
    # had closed); they are counted as errors, never dropped, and only completed ones carry tokens.
    assert m["requests"] == ours["requests"] == raw["completed"] + raw["failed"] and ours["errors"] == 0
    assert m["errors"] == raw["failed"] == sum(1 for e in raw["errors"] if e)
    assert m["output_tokens"] == 64 * raw["completed"] and ours["output_tokens"] == 64 * ours["requests"]
    # The export's own arithmetic holds in our units: throughput = tokens / duration; p50 <= p99.
    assert m["output_tok_s"] == pytest.approx(m["output_tokens"] / m["duration_s"], rel=1e-6)
    assert m["ttft_p50_s"] <= m["ttft_p99_s"] and m["ttft_p50_s"] < m["e2e_p50_s"]
    # Per-request data (--save-detailed) gives the per-stream views the built-in client reports too.
    assert 0 < m["stream_tok_s"] < m["stream_decode_tok_s"]


def test_a_real_aiperf_export_reads_into_our_names() -> None:
    path = DATA / "aiperf_profile_export.json"
    res = parse_export(path)
    m = res.metrics
    assert res.tool == "aiperf" and set(SHARED) <= set(m)
    assert m["errors"] == 0 and m["requests"] == json.loads(path.read_text())["request_count"]["avg"]
    assert m["ttft_p50_s"] < m["e2e_p50_s"] and m["ttft_p50_s"] < 60  # milliseconds became seconds
    # AIPerf counts output tokens with its own tokenizer; the server's usage count is kept apart.
    assert m["server_output_tokens"] > 0


def test_guidellm_report_shape_and_unknown_files() -> None:
    # GuideLLM's report structure (benchmarks[].metrics.<name>.successful); no real export here.
    dist = {"successful": {"mean": 2.0, "median": 1.5, "total_sum": 80, "percentiles": {"p50": 1.5, "p99": 3.0}}}
    doc = {"benchmarks": [{"duration": 10.0, "metrics": {
        "output_tokens_per_second": {"successful": {"mean": 40.0}},
        "requests_per_second": {"successful": {"mean": 1.0}},
        "time_to_first_token_ms": {"successful": {"percentiles": {"p50": 250.0, "p99": 900.0}}},
        "request_latency": dist, "output_token_count": dist,
        "request_totals": {"successful": 9, "errored": 1, "incomplete": 0}}}]}
    assert detect(doc) == "guidellm"
    m = parse_guidellm(doc)
    assert (m["output_tok_s"], m["ttft_p50_s"], m["ttft_p99_s"], m["e2e_p50_s"]) == (40.0, 0.25, 0.9, 1.5)
    assert (m["requests"], m["errors"], m["output_tokens"]) == (10.0, 1.0, 80.0)
    with pytest.raises(ValueError, match="not a vllm bench serve"):
        detect({"hello": 1})
