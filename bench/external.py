"""The built-in measurement beside external benchmark tools (`vllm bench serve`, and AIPerf when
installed) on ONE server, interleaved: the server is started and measured through the product's
door (harness.Session.run, kept running between turns), the external tools point at the same
address, and their JSON exports are read by harness/measure/external_bench.py into flagsearch's metric
names, so the table compares like with like.

    flock /tmp/flagsearch-measure.lock .venv/bin/python -m bench.external \\
        [--aiperf /path/to/venv/bin/aiperf] [--keep-exports tests/data/external] [--repeats 3]
    flock /tmp/flagsearch-measure.lock .venv/bin/python -m bench.external --space spaces/smollm2-cpu.yaml \\
        --set enforce_eager=true --input-len 128 --output-len 32 --concurrency 2 --prompts 4 --out /tmp/vllm.json

Same load on every side: --concurrency requests in flight (closed loop), --prompts requests per
run, --input-len prompt tokens (the whole templated prompt, by the server's count: the external
tools' random prompts are shortened by the chat template's overhead, measured first), exactly
--output-len output tokens (ignore_eos). Raw numbers go to --out (default
bench/data/external_vs_builtin.json).
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

import httpx

from bench.common import DATA, REPO, request_for
from harness import Measurement, MeasureSettings, RunRequest, Session, flagsearch_home, get_engine
from harness.measure.client import served_model_id
from harness.measure.external_bench import parse_export, run_vllm_bench
from harness.measure.workloads import Item, WorkloadSpec
from search.regress.baseline import config_params, parse_assignments
from search.space.space import load_space

KEYS = [("decode tok/s (streams/TPOT p50)", "decode_from_tpot", 1.0),
        ("decode tok/s (window)", "decode_tok_s", 1.0), ("output tok/s", "output_tok_s", 1.0),
        ("requests/s", "req_s", 1.0), ("TTFT p50 (ms)", "ttft_p50_s", 1e3),
        ("TTFT p99 (ms)", "ttft_p99_s", 1e3), ("TPOT p50 (ms)", "tpot_p50_s", 1e3), ("ITL p50 (ms)", "itl_p50_s", 1e3),
        ("E2E p50 (ms)", "e2e_p50_s", 1e3), ("output tokens", "output_tokens", 1.0),
        ("prompt tokens (tool's count)", "prompt_tokens", 1.0), ("failed requests", "errors", 1.0),
        ("cached prompt fraction", "cached_prompt_frac", 1.0)]
ONE_RUN = MeasureSettings(repeats=1, warmup=False, request_timeout_s=600.0)


def builtin(session: Session, request: RunRequest, args: argparse.Namespace,
            seed: int) -> tuple[dict[str, float], Measurement]:
    """One built-in run through Session.run (the kept server): its metrics, and the Measurement
    (the server's address and command).
    A new seed per call: the same prompts again would be prefix-cache hits (cached_prompt_frac says so)."""
    per_stream = max(1, args.prompts // args.concurrency)
    spec = WorkloadSpec("cmp", ("rnd",) * args.concurrency, requests_per_stream=per_stream, seed=seed,
                        items=(Item("rnd", "Continue the text above.", args.output_len, args.input_len),))
    measured = session.run(request, [spec], ONE_RUN)
    wm = measured.workloads["cmp"]
    return {**{k: v.median for k, v in wm.summary.items()}, "errors": float(wm.errors)}, measured


def template_overhead(base_url: str, dialect: str) -> tuple[str, int]:
    """(served model id, tokens the chat template adds to a one-token message)."""
    async def count() -> tuple[str, int]:
        async with httpx.AsyncClient() as client:
            model_id = await served_model_id(client, base_url)
            tc = await get_engine(dialect).count_tokens(client, base_url, model_id,
                                                       [{"role": "user", "content": "hello"}])
            return model_id, tc.count - 1

    return asyncio.run(count())


def aiperf(exe: str, base_url: str, model_id: str, args: argparse.Namespace, input_len: int, out_dir: Path,
           i: int) -> dict[str, Any]:
    art = out_dir / f"aiperf-{i}"
    cmd = [exe, "profile", "--model", model_id, "--url", base_url, "--endpoint-type", "chat", "--streaming",
           "--concurrency", str(args.concurrency), "--request-count", str(args.prompts),
           "--prompt-input-tokens-mean", str(input_len), "--prompt-input-tokens-stddev", "0",
           "--prompt-output-tokens-mean", str(args.output_len), "--prompt-output-tokens-stddev", "0",
           "--extra-inputs", "ignore_eos:true", "--tokenizer", args.tokenizer,
           "--output-artifact-dir", str(art), "--random-seed", str(i), "--ui-type", "none"]
    # AIPerf loads a local tokenizer folder only with HF_HUB_OFFLINE unset.
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    found = sorted(art.rglob("profile_export_aiperf.json"))
    if proc.returncode != 0 or not found:
        raise SystemExit(f"aiperf failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-600:]}")
    return {"metrics": parse_export(found[0], "aiperf").metrics, "export": str(found[0]), "command": cmd}


def cell(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):9.2f} ({min(values):.1f}-{max(values):.1f})"


def keep_exports(dest: Path, runs: dict[str, list[dict[str, Any]]]) -> None:
    """The first run's exports and commands, as tests/data/external holds them."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(runs["vllm bench serve"][0]["export"], dest / "vllm_bench_serve.json")
    (dest / "vllm_bench_serve.cmd").write_text(" ".join(runs["vllm bench serve"][0]["command"]) + "\n")
    (dest / "builtin_same_server.json").write_text(json.dumps(runs["flagsearch"][0]["metrics"], indent=1))
    if runs["aiperf"]:
        shutil.copy(runs["aiperf"][0]["export"], dest / "aiperf_profile_export.json")
        (dest / "aiperf.cmd").write_text(" ".join(runs["aiperf"][0]["command"]) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.external", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", type=Path, default=REPO / "bench" / "tables" / "external-llamacpp.yaml",
                    help="the server to measure: a space's default config")
    ap.add_argument("--set", action="append", help="a param of that config: k=v (repeatable)")
    ap.add_argument("--tokenizer", default=str(flagsearch_home.smollm2_hf()), help="HF folder for the external tools")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--aiperf", help="the aiperf executable (its own venv); left out: not run")
    ap.add_argument("--keep-exports", type=Path, help="copy the first run's exports (and commands) here")
    ap.add_argument("--out", type=Path, default=DATA / "external_vs_builtin.json")
    args = ap.parse_args(argv)
    space = load_space(args.space)
    params = config_params(space, parse_assignments(args.set))
    values = {k: v for k, v in params.items() if k not in ("engine", "model")}
    load0 = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {"flagsearch": [], "vllm bench serve": [], "aiperf": []}
    with tempfile.TemporaryDirectory(prefix="external-bench-") as tmp_s, Session() as session:
        tmp = Path(tmp_s)
        # fresh=False: every turn of the built-in client reuses the one server the session keeps
        request = request_for(space, values, tmp, fresh=False)
        _, first = builtin(session, request, args, 100)  # starts the server; warmup for everyone (discarded)
        base, command = first.base_url, first.command
        model_id, overhead = template_overhead(base, request.settings.dialect)
        ext_len = max(1, args.input_len - overhead)
        print(f"chat template adds {overhead} tokens: external tools get --input-len {ext_len}", flush=True)
        for i in range(args.repeats):
            runs["flagsearch"].append({"metrics": builtin(session, request, args, i + 1)[0]})
            keep = tmp / f"vllm-bench-{i}.json"
            res = run_vllm_bench(str(flagsearch_home.vllm_python()), base, model_id, args.tokenizer,
                                 input_len=ext_len, output_len=args.output_len, prompts=args.prompts,
                                 concurrency=args.concurrency, vllm_version=f"{flagsearch_home.VLLM_VERSION}+cpu",
                                 keep=keep, seed=i)
            runs["vllm bench serve"].append({"metrics": res.metrics, "export": str(keep), "command": res.notes})
            if args.aiperf:
                runs["aiperf"].append(aiperf(args.aiperf, base, model_id, args, ext_len, tmp, i))
            print(f"run {i + 1}/{args.repeats}: " + ", ".join(
                f"{k} {v[-1]['metrics'].get('output_tok_s', 0):.1f} tok/s" for k, v in runs.items() if v), flush=True)
        if args.keep_exports:
            keep_exports(args.keep_exports, runs)
    load1 = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "loadavg_before": load0,
            "loadavg_after": load1, "space": str(args.space), "config": params, "command": command,
            "args": {k: str(v) for k, v in vars(args).items()}}
    args.out.write_text(json.dumps({"meta": meta, "runs": {k: [{"metrics": r["metrics"]} for r in v]
                                                           for k, v in runs.items()}}, indent=1))
    sides = [k for k, v in runs.items() if v]
    for side in sides:  # one decode figure every tool can give: streams / per-token time after the first
        for r in runs[side]:
            if r["metrics"].get("tpot_p50_s"):
                r["metrics"]["decode_from_tpot"] = args.concurrency / r["metrics"]["tpot_p50_s"]
    print(f"\n{args.concurrency} concurrent, {args.prompts} prompts/run, {args.input_len} in / {args.output_len} out, "
          f"median of {args.repeats} interleaved runs (min-max); load {load0[0]:.1f} -> {load1[0]:.1f}")
    others = [s for s in sides if s != "flagsearch"]
    print(f"{'metric':<32}" + "".join(f"{s:>28}" for s in sides) + "".join(f"{'ratio':>14}" for _ in others))
    for label, key, scale in KEYS:
        values = {s: [r["metrics"][key] * scale for r in runs[s] if key in r["metrics"]] for s in sides}
        row = [cell(values[s]) for s in sides]
        ratios = [f"{statistics.median(values[s]) / statistics.median(values['flagsearch']):.3f}"
                  if values[s] and values["flagsearch"] and statistics.median(values["flagsearch"]) else "-"
                  for s in others]
        print(f"{label:<32}" + "".join(f"{c:>28}" for c in row) + "".join(f"{r:>14}" for r in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
