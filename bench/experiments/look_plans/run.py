"""Which looks should the paired gate take? Issue 23's goal (a 5% change found with 95% power within 10 starts
per side on vLLM-CPU) meets a per-start noise of 2-4% there. `python -m bench.calibrate bound` shows that a t test
with one look at 10 starts needs less noise than the gate's plan (a look after every round from the third, one
Pocock threshold for all of them): the early looks cost power at the last. This compares plans and boundaries on
the gate's own decision rule, vectorised over many simulated runs:

- Pocock (the product's boundary): one p threshold for every look (search.verdicts.boundaries.paired_p_threshold);
- O'Brien-Fleming shaped (search.verdicts.boundaries.obrien_fleming_thresholds, `--boundary obrien-fleming`): the z
  boundary c * sqrt(N / k) at look k of a plan ending at N, c set by simulation so that the chance of any false
  crossing is alpha; early looks need a large effect, the last is near a single look.

Decision at a look (search.verdicts.gate.decide, paired t on the rounds' log differences at that look's level):
regressed if significant, the interval below 0 and the change at most -min_effect; unchanged if the interval is inside
+-min_effect; a run stops once settled. The noise is the paired residual per start (a round's difference has
twice its variance), normal on the log scale; no shared round term (pairing removes it).

    python -m bench.experiments.look_plans.run [--sims 40000]

Writes results.json and results.txt beside this file."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from scipy import special

from search.verdicts.boundaries import obrien_fleming_thresholds, paired_p_threshold
from search.verdicts.gate import DEFAULT_ALPHA, DEFAULT_MIN_EFFECT

# The throughput verdict's share of a run's false-alarm budget: a family of two, the metric and its workload's
# error rate (search.regress.ab.family), as in every live run and `bench.calibrate simulate`.
ALPHA = DEFAULT_ALPHA / 2
HERE = Path(__file__).resolve().parent
PLANS = {"every round 3..10": tuple(range(3, 11)), "3, 6, 10": (3, 6, 10), "5, 10": (5, 10), "3, 10": (3, 10),
         "10 only": (10,)}
NOISES = (0.0108, 0.015, 0.021, 0.0313, 0.0367)  # paired residual per start, as measured (docs/calibration.md)
EFFECTS = (0.0, 0.05, 0.10, 0.20)


def t_stats(d: np.ndarray, looks: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error of the first k differences of every run, at each look: sims x looks."""
    means = np.stack([d[:, :k].mean(axis=1) for k in looks], axis=1)
    ses = np.stack([d[:, :k].std(axis=1, ddof=1) / math.sqrt(k) for k in looks], axis=1)
    return means, ses


def p_thresholds(looks: tuple[int, ...], kind: str, alpha: float) -> np.ndarray:
    """Each look's nominal two-sided p threshold for a plan's false-alarm rate alpha: the product's."""
    if kind == "pocock":
        return np.full(len(looks), paired_p_threshold(looks, alpha))
    return np.array(obrien_fleming_thresholds(looks, alpha))


def run_plan(looks: tuple[int, ...], p_star: np.ndarray, noise: float, effect: float, sims: int,
             rng: np.random.Generator, min_effect: float = DEFAULT_MIN_EFFECT) -> dict[str, float]:
    d = rng.normal(math.log1p(-effect), math.sqrt(2) * noise, (sims, looks[-1]))
    means, ses = t_stats(d, looks)
    df = np.array(looks) - 1
    p = 2 * special.stdtr(df, -np.abs(means / ses))
    half = special.stdtrit(df, 1 - p_star / 2) * ses
    regressed = (p < p_star) & (means + half < 0) & (np.expm1(means) <= -min_effect)
    improved = (p < p_star) & (means - half > 0) & (np.expm1(means) >= min_effect)
    unchanged = (np.exp(means - half) > 1 - min_effect) & (np.exp(means + half) < 1 + min_effect)
    settled = regressed | improved | unchanged
    first = np.where(settled.any(axis=1), settled.argmax(axis=1), len(looks) - 1)  # the look the run ends at
    rows = np.arange(sims)
    return {"regressed": float(regressed[rows, first].mean()), "unchanged": float(unchanged[rows, first].mean()),
            "starts": float(np.array(looks)[first].mean())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=40_000)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(23)
    rows: list[dict[str, Any]] = []
    for name, looks in PLANS.items():
        for kind in ("pocock", "obf") if len(looks) > 1 else ("pocock",):
            p_star = p_thresholds(looks, kind, ALPHA)
            for noise in NOISES:
                for effect in EFFECTS:
                    rows.append({"plan": name, "boundary": kind, "p_star": [float(x) for x in p_star],
                                 "noise": noise, "effect": effect,
                                 **run_plan(looks, p_star, noise, effect, args.sims, rng)})
    (HERE / "results.json").write_text(json.dumps({"sims": args.sims, "alpha": ALPHA, "rows": rows}, indent=1))
    lines = [f"paired gate, {args.sims} simulated runs per cell, alpha {ALPHA:g} two-sided (the metric's share), "
             f"min effect {DEFAULT_MIN_EFFECT:g}; cells: -5% found / -10% found / -20% found, mean starts per side "
             "at -5% and -20%, A/A false regressed", ""]
    head = "| plan | boundary | " + " | ".join(f"per start {100 * n:.2f}%" for n in NOISES) + " |"
    lines += [head, "|---|---|" + "---|" * len(NOISES)]
    for name in PLANS:
        for kind in ("pocock", "obf"):
            cells = []
            for noise in NOISES:
                got = {r["effect"]: r for r in rows
                       if r["plan"] == name and r["boundary"] == kind and r["noise"] == noise}
                if not got:
                    break
                cells.append(f"{100 * got[0.05]['regressed']:.0f} / {100 * got[0.10]['regressed']:.0f} / "
                             f"{100 * got[0.20]['regressed']:.0f}%, {got[0.05]['starts']:.1f} & "
                             f"{got[0.20]['starts']:.1f}, A/A {100 * got[0.0]['regressed']:.1f}%")
            if cells:
                lines.append(f"| {name} | {kind} | " + " | ".join(cells) + " |")
    (HERE / "results.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
