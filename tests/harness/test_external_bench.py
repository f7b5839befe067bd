"""External benchmark exports read into flagsearch's metric names: a REAL `vllm bench serve` export,
a REAL AIPerf 0.13.0 export (tests/data/external, made by `python -m bench.external` against one
llama-server) and a REAL GuideLLM 0.8.1 export; the commands that made them are beside them; the
vllm-bench one next to the built-in client's numbers from the same server and load."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from harness.measure.external_bench import detect, parse_export

DATA = Path(__file__).resolve().parents[1] / "data" / "external"
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


def test_a_real_guidellm_export_reads_into_our_names() -> None:
    """A REAL GuideLLM 0.8.1 export (tests/data/external/guidellm_benchmarks.json) of 8 requests, 2
    streams, 64 synthetic prompt tokens and 32 output tokens each (ignore_eos), against llama-server
    with SmolLM2-135M Q4_1 on loopback. Made with (guidellm.cmd beside it):
    guidellm run --backend kind=openai_http,target=http://127.0.0.1:18097 --profile kind=concurrent,streams=2
    --constraint kind=max_requests,count=8 --data kind=synthetic_text,prompt_tokens=64,output_tokens=32
    --tokenizer kind=huggingface_auto,model=<SmolLM2-135M-Instruct HF folder> --seed kind=static,value=0
    --output kind=json,path=benchmarks.json"""
    path = DATA / "guidellm_benchmarks.json"
    res = parse_export(path)
    m = res.metrics
    raw = json.loads(path.read_text())
    bench = raw["benchmarks"][0]
    assert raw["metadata"]["guidellm_version"] == "0.8.1" and "guidellm run" in (DATA / "guidellm.cmd").read_text()
    assert res.tool == "guidellm" and set(SHARED) <= set(m)
    assert (m["requests"], m["errors"]) == (8, 0) and m["output_tokens"] == 32 * 8
    # The export's own arithmetic holds in our units: rates = counts / duration; p50 <= p99.
    assert m["output_tok_s"] == pytest.approx(m["output_tokens"] / m["duration_s"], rel=1e-3)
    assert m["req_s"] == pytest.approx(m["requests"] / m["duration_s"], rel=1e-3)
    assert m["ttft_p50_s"] <= m["ttft_p99_s"] and m["ttft_p50_s"] < m["e2e_p50_s"]
    # GuideLLM's inter_token_latency is our TPOT: per request (E2E - TTFT) / (out - 1), in seconds.
    # (Its time_per_output_token counts the first token's wait: about twice as long in this run.)
    tpots = [(r["request_latency"] - r["time_to_first_token_ms"] / 1000) / (r["output_tokens"] - 1)
             for r in bench["requests"]["successful"]]
    assert m["tpot_p50_s"] == pytest.approx(statistics.median(tpots), rel=0.02)
    # It has no gaps between chunks (our ITL): left out, never guessed. Per request, as our client:
    assert not any(k.startswith("itl_") for k in m)
    assert 0 < m["stream_tok_s"] < m["stream_decode_tok_s"]


def test_unknown_files_are_refused() -> None:
    with pytest.raises(ValueError, match="not a vllm bench serve"):
        detect({"hello": 1})
