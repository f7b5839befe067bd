"""Does the `big` quality suite, judged relative to the reference config, catch damaged checkpoints
and stay quiet on an A/A? Measured on llama-server with SmolLM2-135M (Q4_1), printed as a table,
raw results written as JSON.

The reference is the default config (`-c 4096 -np 1 -t 1`, undamaged GGUF): it answers the suite
once (its answers and pass/fail per check are kept) and gives the agreement continuations. Every
config then runs on a FRESH server: the A/A rows are the reference config itself, restarted;
damaged rows use copies made by scripts/damage_model.py; the other rows are real but harmless or
mildly lossy changes, to show where the relative criteria draw the line.

    flock /tmp/flagsearch-measure.lock .venv/bin/python bench/quality_big.py \
        [--aa 3] [--context-scale 0.1] [--out bench/data/quality_big.json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from harness import setup_paths
from harness.engines import EngineSettings, ModelChoice, get_engine
from harness.launch import start_ready
from harness.launch.base import Server
from harness.quality import QualityModel, assess, checks_for, quality_metrics
from harness.reference import capture_reference
from harness.session import free_port

ROOT = Path(__file__).resolve().parents[1]

BASE: dict[str, Any] = {"ctx_size": 4096, "parallel": 1, "threads": 1}
# (label, extra flags, damage: (tensor, --zero | --scale F) or None)
CONFIGS: list[tuple[str, dict[str, Any], tuple[str, list[str]] | None]] = [
    ("-b 256 -ub 64 (harmless)", {"batch_size": 256, "ubatch_size": 64}, None),
    ("-fa off", {"flash_attn": "off"}, None),
    ("--cache-type-k q4_0", {"flash_attn": "on", "cache_type_k": "q4_0"}, None),
    ("damaged: blk.15.ffn_down zeroed", {}, ("blk.15.ffn_down.weight", ["--zero"])),
    ("damaged: blk.15.attn_norm x8", {}, ("blk.15.attn_norm.weight", ["--scale", "8"])),
    ("damaged: blk.10.ffn_down x0.5", {}, ("blk.10.ffn_down.weight", ["--scale", "0.5"])),
]


def start(tmp: Path, model: Path, flags: dict[str, Any], label: str) -> Server:
    engine = get_engine("llamacpp")
    settings = EngineSettings(name="llamacpp", dialect="llamacpp", command=(str(setup_paths.llama_server()),),
                              ready_timeout_s=120)
    spec = engine.build_launch(settings, ModelChoice(name=model.stem, path=str(model)), {**BASE, **flags}, {},
                               free_port())
    return start_ready(spec, tmp / f"{abs(hash(label))}.log", engine.ready_path)


def damaged_copy(tmp: Path, good: Path, tensor: str, how: list[str]) -> Path:
    out = tmp / f"damaged-{tensor}-{'-'.join(how)}.gguf".replace("--", "")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "damage_model.py"), str(good), str(out), "--tensor", tensor,
                    *how], check=True, capture_output=True, timeout=300)
    return out


def row(label: str, kind: str, res: Any, elapsed: float) -> dict[str, Any]:
    m = quality_metrics(res)
    rel = res.relative
    return {"config": label, "kind": kind, "verdict": "pass" if res.passed else "FLAGGED",
            "violations": res.violations, "fatal": res.fatal, "score": res.score,
            "reference_score": m.get("quality.reference_score"), "lost": rel.lost if rel else None,
            "gained": rel.gained if rel else None, "answer_match": m.get("quality.answer_match"),
            "agreement_exact": m.get("quality.agreement"), "kl": m.get("quality.kl"),
            "categories": res.categories, "elapsed_s": elapsed, "result": res.to_dict()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="big")
    ap.add_argument("--aa", type=int, default=3, help="A/A runs (the reference config on fresh servers)")
    ap.add_argument("--context-scale", type=float, default=0.04, help="needle contexts (16000 x 0.04 = 640 tokens)")
    ap.add_argument("--max-tokens", type=int, default=48,
                    help="cap every check's max_tokens (SmolLM2 rambles to the limit; 0: the suite's own)")
    ap.add_argument("--max-lost", type=int, default=1)
    ap.add_argument("--min-answer-match", type=float, default=0.3)
    ap.add_argument("--max-kl", type=float, default=0.05)
    ap.add_argument("--only", help="run only configs whose label contains this text")
    ap.add_argument("--out", default=str(ROOT / "bench" / "data" / "quality_big.json"))
    ap.add_argument("--report", help="print the table of an earlier run's raw JSON under these criteria")
    ap.add_argument("--no-match", action="store_true", help="--report: leave min_answer_match out")
    args = ap.parse_args()
    if args.report:
        rows = json.loads(Path(args.report).read_text())["rows"]
        print(table(rows, args.max_lost, args.max_kl, None if args.no_match else args.min_answer_match))
        return
    good = setup_paths.smollm2_gguf()
    suite = args.suite
    if args.max_tokens:  # the same checks, answers capped (and allowed to be cut): a scaled-down run
        capped = [{k: v for k, v in dataclasses.asdict(c).items() if v not in (None, (), "", False)}
                  | {"max_tokens": min(c.max_tokens, args.max_tokens), "allow_truncation": True,
                     "expect": list(c.expect)} for c in checks_for(args.suite)]
        suite = str(Path(tempfile.gettempdir()) / f"quality-big-capped-{args.max_tokens}.yaml")
        Path(suite).write_text(yaml.safe_dump(capped, allow_unicode=True))
    quality = QualityModel.model_validate({
        "suite": suite, "min_score": None, "max_lost": args.max_lost, "min_answer_match": args.min_answer_match,
        "max_kl": args.max_kl, "context_scale": args.context_scale, "reference": {"tokens": 32}})
    assert quality.reference is not None
    rows: list[dict[str, Any]] = []
    started = time.time()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="quality-big-") as tmp_s:
        tmp = Path(tmp_s)
        t0 = time.monotonic()
        server = start(tmp, good, {}, "reference")
        try:
            ref = asyncio.run(capture_reference(server.spec.base_url, "smollm2", "llamacpp", quality.reference,
                                                good.name, BASE, 600.0))
        finally:
            server.stop()
        print(f"reference captured in {time.monotonic() - t0:.0f} s: passes "
              f"{sum(c['passed'] for c in ref.checks)}/{len(ref.checks)} checks", flush=True)
        plan = [(f"A/A {i + 1} (reference config, fresh server)", "aa", {}, None) for i in range(args.aa)]
        plan += [(label, "damaged" if damage else "change", flags, damage) for label, flags, damage in CONFIGS]
        for label, kind, flags, damage in plan:
            if args.only and args.only not in label:
                continue
            model = damaged_copy(tmp, good, damage[0], damage[1]) if damage else good
            t1 = time.monotonic()
            server = start(tmp, model, flags, label)
            try:
                res = asyncio.run(assess(server.spec.base_url, "smollm2", "llamacpp", quality, ref, 600.0))
            finally:
                server.stop()
            rows.append(row(label, kind, res, time.monotonic() - t1))
            r = rows[-1]
            print(f"{label:<40} {r['verdict']:<8} lost {len(r['lost'] or [])} match {r['answer_match']:.2f} "
                  f"KL {r['kl']:.4f} ({r['elapsed_s']:.0f} s)", flush=True)
    load_after = os.getloadavg()
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)), "loadavg_before": load_before,
            "loadavg_after": load_after, "model": good.name, "base_flags": BASE, "suite": args.suite,
            "quality": quality.model_dump(), "max_tokens_cap": args.max_tokens, "reference_checks": ref.checks,
            "llama_server": str(setup_paths.llama_server())}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    print(f"\nsuite {args.suite}: reference passes {sum(c['passed'] for c in ref.checks)}/{len(ref.checks)}; "
          f"criteria max_lost {args.max_lost}, min_answer_match {args.min_answer_match}, max_kl {args.max_kl}; "
          f"load average {load_before[0]:.1f} -> {load_after[0]:.1f}")
    print(table(rows, args.max_lost, args.max_kl, args.min_answer_match))


def table(rows: list[dict[str, Any]], max_lost: int, max_kl: float, min_match: float | None) -> str:
    """Markdown rows, each config judged by the given criteria from its raw measurements (so one run
    can be read under several criteria: --report FILE)."""
    crit = f"lost <= {max_lost}, KL <= {max_kl}" + (f", match >= {min_match}" if min_match is not None else "")
    out = [f"| config | verdict ({crit}) | score (reference) | lost | answer match | greedy exact | mean KL |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        why = []
        if r["fatal"]:
            why.append(r["fatal"].split(":")[0])
        if len(r["lost"] or []) > max_lost:
            why.append(f"lost {len(r['lost'])}")
        if (r["kl"] or 0) > max_kl:
            why.append(f"KL {r['kl']:.3f}")
        if min_match is not None and (r["answer_match"] or 0) < min_match:
            why.append(f"match {r['answer_match']:.2f}")
        verdict = "FLAGGED: " + ", ".join(why) if why else "pass"
        out.append(f"| {r['config']} | {verdict} | {r['score']:.2f} ({r['reference_score'] or 0:.2f}) | "
                   f"{len(r['lost'] or [])} | {r['answer_match'] or 0:.2f} | {r['agreement_exact'] or 0:.2f} | "
                   f"{r['kl'] or 0:.4f} |")
    return "\n".join(out)

if __name__ == "__main__":
    main()
