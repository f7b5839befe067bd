"""Calibrate the regression gate on a real engine: false-alarm rate (A/A) and detection rate.

    .venv/bin/python bench/calibrate_gate.py --rounds 16 --out results/calibration
    .venv/bin/python bench/calibrate_gate.py --analyze results/calibration/samples.json

Measuring: llama-server with SmolLM2-135M Q4_1, `-t 1`, one stream, 32 output tokens. Each round
starts every arm's server fresh (the gate's sample unit), in a rotated order, measures one run after a
warmup, and stops it. Arms:
  A, A2      the same config twice (A/A),
  T5, T10    the same config under bench/throttle.py at 5% and 10% (a known, settable slowdown),
  t2         `-t 2` (the brief's "threads 1 vs 2"; its size and sign depend on the machine's load;
             not measured by default: under contention one run takes minutes).
Analysing: for each n (rounds per side) the gate is applied to many subsets of n rounds, A against
each arm, taking both sides from the same rounds as an interleaved run would; the table gives the
share of each verdict. Non-overlapping blocks (independent, but few) are counted as well.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import setup_paths  # noqa: E402
from harness.session import LaunchFailed, MeasureSettings, measure_running, start_config  # noqa: E402
from search.ab import Subject, subject_from  # noqa: E402
from search.baseline import pinned_space  # noqa: E402
from search.gate import DEFAULT_ALPHA, DEFAULT_MIN_EFFECT, compare  # noqa: E402
from search.results import write_json_atomic  # noqa: E402
from search.study import free_port  # noqa: E402

METRIC = "single.output_tok_s"


def space_doc(max_tokens: int) -> dict[str, Any]:
    return {
        "name": "calibrate-gate",
        "engines": {"llamacpp": {"dialect": "llamacpp", "command": [str(setup_paths.llama_server())],
                                 "args": {"ctx_size": 2048, "parallel": 1}, "ready_timeout_s": 60}},
        "models": [{"name": "smollm2-135m-q4_1", "path": str(setup_paths.smollm2_gguf())}],
        "params": {"threads": {"type": "categorical", "choices": [1, 2], "default": 1}},
        "workloads": [{"name": "single", "streams": ["qa"], "max_tokens": max_tokens}],
        "measure": {"repeats": 1, "warmup": True, "request_timeout_s": 120},
        "quality": {"suite": None},
        "objectives": [{"metric": METRIC}],
    }


def arms(max_tokens: int) -> dict[str, Subject]:
    doc = space_doc(max_tokens)
    one = {"engine": "llamacpp", "model": "smollm2-135m-q4_1", "threads": 1}
    space, config = pinned_space(doc, one, "calibration")
    space2, config2 = pinned_space(doc, {**one, "threads": 2}, "calibration")
    server = setup_paths.llama_server()

    def throttled(fraction: float) -> str:
        return f"{sys.executable} {REPO / 'bench' / 'throttle.py'} {fraction} -- {server}"

    return {"A": subject_from(space, config, "A"), "A2": subject_from(space, config, "A2"),
            "T5": subject_from(space, config, "T5", command=throttled(0.05)),
            "T10": subject_from(space, config, "T10", command=throttled(0.10)),
            "t2": subject_from(space2, config2, "t2")}


def measure(rounds: int, out: Path, max_tokens: int, chosen: list[str]) -> Path:
    subjects = {k: v for k, v in arms(max_tokens).items() if k in chosen}
    space, _ = pinned_space(space_doc(max_tokens), {"engine": "llamacpp", "model": "smollm2-135m-q4_1",
                                                     "threads": 1}, "calibration")
    workloads = space.workload_specs()
    settings = MeasureSettings(repeats=1, warmup=True, request_timeout_s=120)
    path = out / "samples.json"
    data: dict[str, Any] = {"metric": METRIC, "max_tokens": max_tokens, "arms": list(subjects), "rounds": [],
                            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    names = list(subjects)
    t0 = time.monotonic()
    for rnd in range(rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        row: dict[str, Any] = {"order": order}
        for name in order:
            subject = subjects[name]
            try:
                running = start_config(subject.settings, subject.model, subject.flags, subject.env,
                                       free_port(), out / "logs" / f"{name}-{rnd:02d}.log")
            except LaunchFailed as exc:
                row[name] = None
                print(f"round {rnd}: {name} failed to start: {exc}", flush=True)
                continue
            try:
                measured = measure_running(running, workloads, settings)
                stat = measured["single"].summary.get("output_tok_s")
                row[name] = stat.median if stat and measured["single"].errors == 0 else None
            finally:
                running.stop()
        data["rounds"].append(row)
        write_json_atomic(path, data)  # partial data survives an interruption
        shown = "  ".join(f"{n}={row[n]:.1f}" if row.get(n) else f"{n}=-" for n in names)
        print(f"round {rnd + 1}/{rounds} ({time.monotonic() - t0:.0f} s): {shown}", flush=True)
    return path


def analyze(path: Path, ns: list[int], subsets: int, min_effect: float, alpha: float) -> str:
    data = json.loads(path.read_text())
    rows = [r for r in data["rounds"] if all(r.get(a) for a in data["arms"])]
    values = {a: np.array([r[a] for r in rows]) for a in data["arms"]}
    lines = [f"{len(rows)} complete rounds of {data['metric']} (max_tokens {data['max_tokens']}), "
             f"min effect {100 * min_effect:.0f}%, alpha {alpha}", ""]
    # "paired CV": spread of log(arm / A) within a round; far below the CV across rounds when the
    # machine's load drifts slowly (then a paired test would gain power).
    lines.append("| arm | median tok/s | CV across rounds | paired CV vs A | change vs A (all rounds) |")
    lines.append("|---|---|---|---|---|")
    base = float(np.median(values["A"]))
    for a, v in values.items():
        cv = float(np.std(np.log(v), ddof=1)) if len(v) > 1 else math.nan
        paired = float(np.std(np.log(v / values["A"]), ddof=1)) if a != "A" and len(v) > 1 else math.nan
        lines.append(f"| {a} | {np.median(v):.2f} | {100 * cv:.1f}% | {100 * paired:.1f}% | "
                     f"{100 * (np.median(v) / base - 1):+.1f}% |")
    lines += ["", "| n rounds/side | comparison | subsets | regressed | improved | unchanged | inconclusive | "
              "blocks (independent): regressed/total |", "|---|---|---|---|---|---|---|---|---|"]
    rng = np.random.default_rng(0)
    for n in ns:
        if n > len(rows):
            continue
        all_sets = list(itertools.combinations(range(len(rows)), n)) if math.comb(len(rows), n) <= subsets else None
        picks = all_sets or [tuple(sorted(rng.choice(len(rows), n, replace=False))) for _ in range(subsets)]
        for arm in [a for a in data["arms"] if a != "A"]:
            counts = dict.fromkeys(("regressed", "improved", "unchanged", "inconclusive"), 0)
            for i, idx in enumerate(picks):
                ix = list(idx)
                counts[compare(METRIC, values["A"][ix], values[arm][ix], min_effect=min_effect, alpha=alpha,
                               seed=i).verdict] += 1
            blocks = [list(range(s, s + n)) for s in range(0, len(rows) - n + 1, n)]
            hits = sum(compare(METRIC, values["A"][b], values[arm][b], min_effect=min_effect,
                               alpha=alpha).verdict == "regressed" for b in blocks)
            total = len(picks)
            shares = " | ".join(f"{100 * counts[k] / total:.1f}%" for k in counts)
            lines.append(f"| {n} | A vs {arm} | {total} | {shares} | {hits}/{len(blocks)} |")
    return "\n".join(lines)


def simulate(ns: list[int], cvs: list[float], effects: list[float], trials: int, min_effect: float,
             alpha: float) -> str:
    """The same gate on log-normal samples of a known noise: what n buys at which noise."""
    lines = [f"simulated: log-normal noise, {trials} comparisons per cell, share called `regressed`", "",
             "| noise CV | n/side | " + " | ".join(f"{100 * e:.0f}% slower" if e else "A/A" for e in effects)
             + " |", "|---|---|" + "---|" * len(effects)]
    rng = np.random.default_rng(1)
    for cv in cvs:
        for n in ns:
            cells = []
            for effect in effects:
                hits = 0
                for i in range(trials):
                    a = 100 * np.exp(rng.normal(0, cv, n))
                    b = 100 * (1 - effect) * np.exp(rng.normal(0, cv, n))
                    hits += compare(METRIC, a, b, min_effect=min_effect, alpha=alpha, seed=i).verdict == "regressed"
                cells.append(f"{100 * hits / trials:.1f}%")
            lines.append(f"| {100 * cv:.0f}% | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--out", default="results/calibration")
    p.add_argument("--analyze", help="only analyse this samples.json")
    p.add_argument("--arms", default="A,A2,T5,T10", help="arms to measure (A,A2,T5,T10,t2); t2 collapses under "
                                                         "load and can take minutes a round")
    p.add_argument("--n", default="3,4,5,6,8", help="rounds per side to evaluate")
    p.add_argument("--subsets", type=int, default=300)
    p.add_argument("--min-effect", type=float, default=DEFAULT_MIN_EFFECT)
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    p.add_argument("--simulate", action="store_true", help="only the simulated table (no engine)")
    args = p.parse_args()
    if args.simulate:
        print(simulate([int(x) for x in args.n.split(",")], [0.01, 0.02, 0.04, 0.08, 0.15], [0.0, 0.05, 0.10],
                       args.subsets, args.min_effect, args.alpha))
        return 0
    if args.analyze:
        path = Path(args.analyze)
    else:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = measure(args.rounds, out, args.max_tokens, args.arms.split(","))
    print(analyze(path, [int(x) for x in args.n.split(",")], args.subsets, args.min_effect, args.alpha))
    return 0


if __name__ == "__main__":
    sys.exit(main())
