"""The built-in client beside `vllm bench serve` (and AIPerf, when installed) on one llama-server,
interleaved; the external tools' JSON exports are read by harness/external_bench.py into
flagsearch's metric names, so the table compares like with like.

    flock /tmp/flagsearch-measure.lock .venv/bin/python bench/external_vs_builtin.py \
        [--aiperf /path/to/venv/bin/aiperf] [--keep-exports tests/data/external] [--repeats 3]

Same load on every side: --concurrency requests in flight (closed loop), --prompts requests per
run, --input-len prompt tokens (the whole templated prompt, by the server's count: the external
tools' random prompts are shortened by the chat template's overhead, measured first), exactly
--output-len output tokens (ignore_eos). Raw numbers go to bench/data/external_vs_builtin.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from harness import setup_paths
from harness.engines import EngineSettings, ModelChoice, get_engine
from harness.external_bench import parse_export, run_vllm_bench
from harness.launch import start_ready
from harness.measure import measure_workload
from harness.session import free_port
from harness.workloads import Item, WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]
KEYS = [("output tok/s", "output_tok_s", 1.0), ("requests/s", "req_s", 1.0), ("TTFT p50 (ms)", "ttft_p50_s", 1e3),
        ("TTFT p99 (ms)", "ttft_p99_s", 1e3), ("TPOT p50 (ms)", "tpot_p50_s", 1e3), ("ITL p50 (ms)", "itl_p50_s", 1e3),
        ("E2E p50 (ms)", "e2e_p50_s", 1e3), ("output tokens", "output_tokens", 1.0),
        ("prompt tokens (tool's count)", "prompt_tokens", 1.0), ("failed requests", "errors", 1.0),
        ("cached prompt fraction", "cached_prompt_frac", 1.0)]


def builtin(base_url: str, args: argparse.Namespace, seed: int) -> dict[str, float]:
    # A new seed per call: each call is a separate measurement whose prompts must not repeat an
    # earlier call's (same seed = same prompts = prefix-cache hits: cached_prompt_frac says so).
    per_stream = max(1, args.prompts // args.concurrency)
    spec = WorkloadSpec("cmp", ("rnd",) * args.concurrency, requests_per_stream=per_stream, seed=seed,
                        items=(Item("rnd", "Continue the text above.", args.output_len, args.input_len),))
    wm = asyncio.run(measure_workload(get_engine("llamacpp"), base_url, "smollm2", spec, 1, False, 600.0, [],
                                      lambda _m: None))
    out = {k: v.median for k, v in wm.summary.items()}
    out["errors"] = float(wm.errors)
    return out


def template_overhead(base_url: str) -> int:
    async def count() -> int:
        async with httpx.AsyncClient() as client:
            tc = await get_engine("llamacpp").count_tokens(client, base_url, "smollm2",
                                                            [{"role": "user", "content": "hello"}])
            return tc.count - 1

    return asyncio.run(count())


def aiperf(exe: str, base_url: str, args: argparse.Namespace, input_len: int, out_dir: Path, i: int) -> dict[str, Any]:
    art = out_dir / f"aiperf-{i}"
    cmd = [exe, "profile", "--model", "smollm2", "--url", base_url, "--endpoint-type", "chat", "--streaming",
           "--concurrency", str(args.concurrency), "--request-count", str(args.prompts),
           "--prompt-input-tokens-mean", str(input_len), "--prompt-input-tokens-stddev", "0",
           "--prompt-output-tokens-mean", str(args.output_len), "--prompt-output-tokens-stddev", "0",
           "--extra-inputs", "ignore_eos:true", "--tokenizer", str(setup_paths.smollm2_hf()),
           "--output-artifact-dir", str(art), "--random-seed", str(i), "--ui-type", "none"]
    # AIPerf loads a local tokenizer folder only with HF_HUB_OFFLINE unset.
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    found = sorted(art.rglob("profile_export_aiperf.json"))
    if proc.returncode != 0 or not found:
        raise SystemExit(f"aiperf failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-600:]}")
    res = parse_export(found[0], "aiperf")
    return {"metrics": res.metrics, "export": str(found[0]), "command": cmd}


def cell(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):9.2f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--aiperf", help="the aiperf executable (its own venv); left out: not run")
    ap.add_argument("--keep-exports", help="copy the first run's exports (and commands) here")
    ap.add_argument("--out", default=str(ROOT / "bench" / "data" / "external_vs_builtin.json"))
    args = ap.parse_args()
    engine = get_engine("llamacpp")
    settings = EngineSettings(name="llamacpp", dialect="llamacpp", command=(str(setup_paths.llama_server()),),
                              ready_timeout_s=120)
    flags = {"ctx_size": 4096, "parallel": args.concurrency, "threads": args.threads, "alias": "smollm2"}
    spec = engine.build_launch(settings, ModelChoice(name="smollm2", path=str(setup_paths.smollm2_gguf())), flags,
                               {}, free_port())
    load0 = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {"flagsearch": [], "vllm bench serve": [], "aiperf": []}
    with tempfile.TemporaryDirectory(prefix="external-bench-") as tmp_s:
        tmp = Path(tmp_s)
        server = start_ready(spec, tmp / "llama.log", engine.ready_path)
        try:
            base = server.spec.base_url
            overhead = template_overhead(base)
            ext_len = max(1, args.input_len - overhead)
            print(f"chat template adds {overhead} tokens: external tools get --input-len {ext_len}", flush=True)
            builtin(base, args, 100)  # warmup for everyone (discarded)
            for i in range(args.repeats):
                runs["flagsearch"].append({"metrics": builtin(base, args, i + 1)})
                keep = tmp / f"vllm-bench-{i}.json"
                res = run_vllm_bench(str(setup_paths.vllm_python()), base, "smollm2", str(setup_paths.smollm2_hf()),
                                     input_len=ext_len, output_len=args.output_len, prompts=args.prompts,
                                     concurrency=args.concurrency, vllm_version=f"{setup_paths.VLLM_VERSION}+cpu",
                                     keep=keep, seed=i)
                runs["vllm bench serve"].append({"metrics": res.metrics, "export": str(keep), "command": res.notes})
                if args.aiperf:
                    runs["aiperf"].append(aiperf(args.aiperf, base, args, ext_len, tmp, i))
                print(f"run {i + 1}/{args.repeats}: " + ", ".join(
                    f"{k} {v[-1]['metrics'].get('output_tok_s', 0):.1f} tok/s" for k, v in runs.items() if v),
                      flush=True)
            if args.keep_exports:
                dest = Path(args.keep_exports)
                dest.mkdir(parents=True, exist_ok=True)
                shutil.copy(runs["vllm bench serve"][0]["export"], dest / "vllm_bench_serve.json")
                (dest / "vllm_bench_serve.cmd").write_text(" ".join(runs["vllm bench serve"][0]["command"]) + "\n")
                (dest / "builtin_same_server.json").write_text(json.dumps(runs["flagsearch"][0]["metrics"], indent=1))
                if runs["aiperf"]:
                    shutil.copy(runs["aiperf"][0]["export"], dest / "aiperf_profile_export.json")
                    (dest / "aiperf.cmd").write_text(" ".join(runs["aiperf"][0]["command"]) + "\n")
        finally:
            server.stop()
    load1 = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": {"time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                   "loadavg_before": load0, "loadavg_after": load1,
                                                   "server": "llama-server", "flags": flags, "args": vars(args)},
                                          "runs": {k: [{"metrics": r["metrics"]} for r in v] for k, v in runs.items()}},
                                         indent=1))
    sides = [k for k, v in runs.items() if v]
    print(f"\n{args.concurrency} concurrent, {args.prompts} prompts/run, {args.input_len} in / {args.output_len} out, "
          f"median of {args.repeats} interleaved runs (min-max); load {load0[0]:.1f} -> {load1[0]:.1f}")
    print(f"{'metric':<30}" + "".join(f"{s:>28}" for s in sides))
    for label, key, scale in KEYS:
        row = [cell([r["metrics"][key] * scale for r in runs[s] if key in r["metrics"]]) for s in sides]
        print(f"{label:<30}" + "".join(f"{c:>28}" for c in row))


if __name__ == "__main__":
    main()
