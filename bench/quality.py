"""What the quality checks catch and what they cost, on llama-server with SmolLM2-135M, every
server started through the product's door (harness.Session: `run` with a QualityPlan, and
`capture_reference` for the reference answers).

    flock /tmp/flagsearch-measure.lock .venv/bin/python -m bench.quality big \
        [--aa 3] [--context-scale 0.04] [--out bench/data/quality_big.json]
    .venv/bin/python -m bench.quality big --report bench/data/quality_big.json    # the table again, no engine
    .venv/bin/python -m bench.quality overhead [--space spaces/llamacpp-cpu.yaml] [--rounds 2] [--set threads=1]

big: does the `big` suite, judged relative to the reference config, catch damaged checkpoints and
stay quiet on an A/A? The reference is the default config (`-c 4096 -np 1 -t 1`, undamaged GGUF):
it answers the suite once (its answers and pass/fail per check are kept) and gives the agreement
continuations. Every config then runs on a FRESH server: the A/A rows are the reference config
itself, restarted; damaged rows use copies made by scripts/damage_model.py; the other rows are real
but harmless or mildly lossy changes, to show where the relative criteria draw the line.

overhead: what quality checks add to a trial. The space's default config on one kept server: the
trial's measurement exactly as a trial does it (the space's workloads, warmup and repeats), then the
quality work a trial adds (the spot-check suite; the reference-agreement comparison), `--rounds`
times, medians; plus the once-per-study reference capture. Overhead % = quality seconds /
measurement seconds. On a GPU both sides speed up, but the quality side is a fixed number of tokens
of sequential greedy decoding (printed), so its share there is estimated from the tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import DATA, REPO, measure_settings, request_for
from harness import (
    Cause,
    EngineSettings,
    Measurement,
    MeasureSettings,
    ModelChoice,
    QualityPlan,
    RunRequest,
    Session,
    TrialFailed,
    flagsearch_home,
)
from harness.quality.quality import QualityModel, QualityResult, checks_for, quality_metrics, suites
from harness.quality.reference import ReferenceSpec, prompt_sets
from search.regress.baseline import config_params, parse_assignments
from search.space.space import load_space

NO_WORKLOADS = MeasureSettings(repeats=1, warmup=False)

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


def request(log_dir: Path, model: Path, flags: dict[str, Any]) -> RunRequest:
    settings = EngineSettings(name="llamacpp", dialect="llamacpp", command=(str(flagsearch_home.llama_server()),),
                              ready_timeout_s=120)
    return RunRequest(settings, ModelChoice(name=model.stem, path=str(model)), {**BASE, **flags}, {}, log_dir,
                      fresh=True)


def judged(session: Session, req: RunRequest, plan: QualityPlan) -> QualityResult:
    """The quality result of one run (garbage answers are a result here, not a failure)."""
    try:
        measured = session.run(req, [], NO_WORKLOADS, plan)
    except TrialFailed as exc:
        if exc.failure.cause != Cause.DEGENERATE_OUTPUT or exc.partial is None:
            raise
        assert isinstance(exc.partial, Measurement)
        measured = exc.partial
    assert measured.quality is not None
    result: QualityResult = measured.quality
    return result


def damaged_copy(tmp: Path, good: Path, tensor: str, how: list[str]) -> Path:
    out = tmp / f"damaged-{tensor}-{'-'.join(how)}.gguf".replace("--", "")
    subprocess.run([sys.executable, str(REPO / "scripts" / "damage_model.py"), str(good), str(out), "--tensor", tensor,
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


def big(args: argparse.Namespace) -> None:
    good = flagsearch_home.smollm2_gguf()
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
    with tempfile.TemporaryDirectory(prefix="quality-big-") as tmp_s, Session(keep_server=False) as session:
        tmp = Path(tmp_s)
        t0 = time.monotonic()
        ref = session.capture_reference(request(tmp / "reference", good, {}), quality.reference, good.name, BASE,
                                        600.0)
        print(f"reference captured in {time.monotonic() - t0:.0f} s: passes "
              f"{sum(c['passed'] for c in ref.checks)}/{len(ref.checks)} checks", flush=True)
        plan: list[tuple[str, str, dict[str, Any], tuple[str, list[str]] | None]] = [
            (f"A/A {i + 1} (reference config, fresh server)", "aa", {}, None) for i in range(args.aa)]
        plan += [(label, "damaged" if damage else "change", flags, damage) for label, flags, damage in CONFIGS]
        for i, (label, kind, flags, damage) in enumerate(plan):
            if args.only and args.only not in label:
                continue
            model = damaged_copy(tmp, good, damage[0], damage[1]) if damage else good
            t1 = time.monotonic()
            res = judged(session, request(tmp / f"config-{i}", model, flags), QualityPlan(quality, ref, 600.0))
            rows.append(row(label, kind, res, time.monotonic() - t1))
            r = rows[-1]
            print(f"{label:<40} {r['verdict']:<8} lost {len(r['lost'] or [])} match {r['answer_match']:.2f} "
                  f"KL {r['kl']:.4f} ({r['elapsed_s']:.0f} s)", flush=True)
    load_after = os.getloadavg()
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)), "loadavg_before": load_before,
            "loadavg_after": load_after, "model": good.name, "base_flags": BASE, "suite": args.suite,
            "quality": quality.model_dump(), "max_tokens_cap": args.max_tokens, "reference_checks": ref.checks,
            "llama_server": str(flagsearch_home.llama_server())}
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


def overhead(args: argparse.Namespace) -> None:
    space = load_space(args.space)
    params = config_params(space, parse_assignments(args.set))  # e.g. threads=1: -t 2 collapses when shared
    values = {k: v for k, v in params.items() if k not in ("engine", "model")}
    settings = measure_settings(space)
    ref_spec = ReferenceSpec()
    suite_only = QualityModel(suite=args.suite, concurrency=args.concurrency)
    agreement_only = QualityModel.model_validate({"suite": None, "reference": {}})
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="quality-overhead-") as tmp, Session() as session:
        req = request_for(space, values, Path(tmp), fresh=False)  # one kept server for every part
        first = session.run(req, [], NO_WORKLOADS)
        t = time.monotonic()
        reference = session.capture_reference(req, ref_spec, params["model"], params, settings.request_timeout_s)
        capture_s = time.monotonic() - t
        for _ in range(args.rounds):
            t0 = time.monotonic()
            measured = session.run(req, space.workload_specs(), settings)
            measure_s = time.monotonic() - t0
            tokens = sum(r.output_tokens or 0 for wm in measured.workloads.values() for s in wm.counted
                         for r in s.requests)
            suite = judged(session, req, QualityPlan(suite_only, None, settings.request_timeout_s))
            agree = judged(session, req, QualityPlan(agreement_only, reference, settings.request_timeout_s))
            assert agree.agreement is not None
            rows.append({"measure_s": measure_s, "suite_s": suite.elapsed_s, "agree_s": agree.elapsed_s,
                         "measure_tokens": tokens, "suite_score": suite.score, "suite_fatal": suite.fatal,
                         "suite_failed": [c.name for c in suite.checks if not c.passed],
                         "agreement_exact": agree.agreement.exact, "agreement_requests": agree.agreement.requests})
    med = {k: statistics.median(r[k] for r in rows) for k in ("measure_s", "suite_s", "agree_s", "measure_tokens")}
    n_checks = len(suites()[args.suite])
    suite_tokens = sum(c.max_tokens for c in suites()[args.suite])
    agree_tokens = len(prompt_sets()[ref_spec.prompts]) * ref_spec.tokens
    quality_s = med["suite_s"] + med["agree_s"]
    print(f"\nquality overhead on {first.dialect} ({space.name}; {values}), {args.rounds} rounds, medians; "
          f"suite concurrency {args.concurrency}:")
    print(f"{'part':<34}{'seconds':>10}{'% of measurement':>20}")
    print(f"{'trial measurement (workloads)':<34}{med['measure_s']:>10.1f}{100.0:>19.0f}%")
    for label, secs in ((f"spot-check suite ({n_checks} checks)", med["suite_s"]),
                        ("reference agreement (compare)", med["agree_s"]), ("quality total per trial", quality_s),
                        ("reference capture (once a study)", capture_s)):
        print(f"{label:<34}{secs:>10.1f}{100 * secs / med['measure_s']:>19.1f}%")
    print(f"\ntokens: measurement generated {med['measure_tokens']:.0f} (measured repeats only); quality asks for "
          f"at most {suite_tokens} (suite) + {agree_tokens} (agreement) tokens, sequential greedy")
    for i, r in enumerate(rows):
        print(f"round {i}: suite score {r['suite_score']:.2f} failed={r['suite_failed']} fatal={r['suite_fatal']} "
              f"agreement exact {r['agreement_exact']:.2f} ({r['agreement_requests']} requests)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("big", help="damage caught, A/A quiet (the big suite, judged relatively)")
    b.add_argument("--suite", default="big")
    b.add_argument("--aa", type=int, default=3, help="A/A runs (the reference config on fresh servers)")
    b.add_argument("--context-scale", type=float, default=0.04, help="needle contexts (16000 x 0.04 = 640 tokens)")
    b.add_argument("--max-tokens", type=int, default=48,
                   help="cap every check's max_tokens (SmolLM2 rambles to the limit; 0: the suite's own)")
    b.add_argument("--max-lost", type=int, default=1)
    b.add_argument("--min-answer-match", type=float, default=0.3)
    b.add_argument("--max-kl", type=float, default=0.05)
    b.add_argument("--only", help="run only configs whose label contains this text")
    b.add_argument("--out", default=str(DATA / "quality_big.json"))
    b.add_argument("--report", help="print the table of an earlier run's raw JSON under these criteria")
    b.add_argument("--no-match", action="store_true", help="--report: leave min_answer_match out")
    o = sub.add_parser("overhead", help="what the quality checks add to a trial")
    o.add_argument("--space", default="spaces/llamacpp-cpu.yaml")
    o.add_argument("--rounds", type=int, default=2)
    o.add_argument("--suite", default="smoke")
    o.add_argument("--set", action="append", metavar="PARAM=VALUE", help="override a default param")
    o.add_argument("--concurrency", type=int, default=1, help="quality checks in flight at once")
    args = ap.parse_args(argv)
    if args.cmd == "overhead":
        overhead(args)
    elif args.report:
        rows = json.loads(Path(args.report).read_text())["rows"]
        print(table(rows, args.max_lost, args.max_kl, None if args.no_match else args.min_answer_match))
    else:
        big(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
