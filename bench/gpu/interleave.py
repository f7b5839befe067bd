"""Interleaved re-measurement of a few llama-server configs: each round starts every config once, in
rotated order, and measures one stream and four streams; medians and min-max spread per config.
This is what separates a real difference from run-to-run noise (docs/domain.md, traps 7 and 8).

    python3 bench/gpu/interleave.py --rounds 3 --out table.md
Uses the same engine dialect, process launcher and measurement code as `search run`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from pathlib import Path

import httpx

from harness.client import served_model_id
from harness.engines import EngineSettings, ModelChoice, get_engine
from harness.launch import get_launcher, wait_ready
from harness.measure import measure_workload
from harness.workloads import WorkloadSpec
from search.study import free_port

FSGPU = Path(os.environ.get("FSGPU", "/tmp/fsgpu"))
BASE = {"n_gpu_layers": 99, "ctx_size": 16384, "parallel": 4, "batch_size": 2048, "ubatch_size": 512}
CONFIGS: dict[str, dict[str, object]] = {
    "fa on": {"flash_attn": "on"},
    "fa off": {"flash_attn": "off"},
    "fa on, K/V q8_0": {"flash_attn": "on", "cache_type_k": "q8_0", "cache_type_v": "q8_0"},
    "fa on, ngram-simple spec": {"flash_attn": "on", "spec_type": "ngram-simple"},
}
WORKLOADS = (WorkloadSpec(name="single", streams=("qa",), max_tokens=256),
             WorkloadSpec(name="four", streams=("qa", "code", "json", "math"), max_tokens=256))


async def measure(engine, base_url: str, flags: dict[str, object]) -> dict[str, float]:  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient() as client:
        model_id = await served_model_id(client, base_url)
    out: dict[str, float] = {}
    for spec in WORKLOADS:
        wm = await measure_workload(engine, base_url, model_id, spec, 2, True, 120,
                                    engine.expected_features(flags), lambda _text: None)
        for key in ("output_tok_s", "decode_tok_s", "tokens_per_step"):
            if key in wm.summary:
                out[f"{spec.name}.{key}"] = wm.summary[key].median
        out[f"{spec.name}.errors"] = float(wm.errors)
        if wm.placebo:
            out[f"{spec.name}.placebo"] = 1.0
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path)
    p.add_argument("--max-tokens", type=int, default=256)
    a = p.parse_args()
    global WORKLOADS
    WORKLOADS = tuple(WorkloadSpec(name=w.name, streams=w.streams, max_tokens=a.max_tokens) for w in WORKLOADS)
    engine = get_engine("llamacpp")
    settings = EngineSettings(name="llamacpp", dialect="llamacpp", command=(str(FSGPU / "bin" / "llama-server"),),
                              ready_timeout_s=180)
    model = ModelChoice("random-1b", str(FSGPU / "random-1b-f16.gguf"))
    results: dict[str, list[dict[str, float]]] = {name: [] for name in CONFIGS}
    names = list(CONFIGS)
    for r in range(a.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            flags = {**BASE, **CONFIGS[name]}
            spec = engine.build_launch(settings, model, flags, {}, free_port())
            server = get_launcher("process").start(spec, FSGPU / "interleave" / f"{r}-{name.replace(' ', '_')}.log")
            try:
                wait_ready(server, engine.ready_path, spec.ready_timeout_s, poll_s=0.1)
                results[name].append(asyncio.run(measure(engine, spec.base_url, flags)))
            finally:
                server.stop()
            print(f"round {r + 1} {name}: {json.dumps(results[name][-1])}", flush=True)

    def cell(name: str, key: str, digits: int = 0) -> str:
        values = [m[key] for m in results[name] if key in m]
        if not values:
            return "-"
        return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"

    lines = [f"Interleaved: {a.rounds} rounds x {len(CONFIGS)} configs, each a fresh server start; per start "
             "1 warmup + 2 measured runs (median); cells: median over rounds (min-max).", "",
             "| config | single tok/s | single decode tok/s | tokens/step | 4 streams tok/s | errors |",
             "|---|---|---|---|---|---|"]
    for name in names:
        errors = sum(m.get("single.errors", 0) + m.get("four.errors", 0) for m in results[name])
        lines.append(f"| {name} | {cell(name, 'single.output_tok_s')} | {cell(name, 'single.decode_tok_s')} | "
                     f"{cell(name, 'single.tokens_per_step', 2)} | "
                     f"{cell(name, 'four.output_tok_s')} | {errors:.0f} |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.write_text(text + "\n\n```json\n" + json.dumps(results, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
