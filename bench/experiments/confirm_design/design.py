"""The confirmation's design from measured noise: fits the components of rows.json (measure.py)
and simulates the demo's confirmation (its default, a top config and the 10% positive control,
the product's own sequential test and stop rule: search/confirm/confirm.py `judge`, since 2026-11-29 the
blocked test of search/verdicts/blocked.py; design.txt and design_aa.txt were printed with the paired test
before it, design_blocked.txt and design_aa_blocked.txt with it) for each affordable design.

    python -m bench.experiments.confirm_design.design [SIMS] [ROWS]

ROWS: rows.json (the default and its control, default) or rows_aa.json (the default twice: the
noise of a comparison without the control's proxy).

Model of one start's value (log scale): arm + round (shared by every arm of a round: cancels in the
paired difference) + start (its own level) + the mean of its runs' noise. Prints the components,
the run-position means (is a start's k-th run different?), and per design (runs per start,
rounds at most) how often the control is found worse, how often a verdict is withheld, the rounds
used and the confirmation's minutes at this host's measured cost of a start and of a run."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from search.confirm.confirm import Arm, judge
from search.verdicts.sequential import MIN_STARTS, settled

HERE = Path(__file__).parent
ARMS = 3  # the demo's: the default, its top config, the positive control
CONTROL = math.log(0.9)  # the demo's positive control: every response byte 1/0.9 later
ONE_RUN_START_S = 37.0  # a demo confirmation start with one run (12 starts in 7.4 min, 2026-11-28)
DESIGNS = [(runs, rounds) for runs in (1, 2, 3, 5) for rounds in (4, 5, 6)]


def components(rows: list[dict]) -> dict[str, float]:
    """sd of a run within a start, of a start's own level, of the round (log scale)."""
    logs = [np.log(r["runs"]) for r in rows if r["runs"]]
    within = sum(float(((x - x.mean()) ** 2).sum()) for x in logs) / sum(len(x) - 1 for x in logs)
    runs = float(np.mean([len(x) for x in logs]))
    means = {(r["round"], r["arm"]): float(np.log(r["runs"]).mean()) for r in rows if r["runs"]}
    rounds = sorted({k[0] for k in means})
    other = next(r["arm"] for r in rows if r["arm"] != "default")  # the control, or the default again
    diffs = np.array([means[(n, other)] - means[(n, "default")] for n in rounds
                      if (n, other) in means and (n, "default") in means])
    start = max(0.0, float(diffs.var(ddof=1)) / 2 - within / runs)
    per_arm = [float(np.var([means[(n, a)] for n in rounds if (n, a) in means], ddof=1))
               for a in ("default", other)]
    shared = max(0.0, float(np.mean(per_arm)) - start - within / runs)
    return {"run_sd": math.sqrt(within), "start_sd": math.sqrt(start), "round_sd": math.sqrt(shared),
            "runs": runs, "control_ratio": math.exp(float(diffs.mean())), "diff_sd": float(diffs.std(ddof=1))}


def position_means(rows: list[dict]) -> tuple[list[float], float, float]:
    """Each run position's mean ratio to its start's mean (1.0: no position effect), and the slope
    per position of log(run / start mean) with its 95% half-width (0: no trend within a start)."""
    from scipy import stats
    width = min(len(r["runs"]) for r in rows if r["runs"])
    logs = np.array([np.log(r["runs"][:width]) - np.log(r["runs"][:width]).mean() for r in rows if r["runs"]])
    fit = stats.linregress(np.tile(np.arange(width), len(logs)), logs.ravel())
    half = float(stats.t.ppf(0.975, logs.size - 2) * fit.stderr)
    return [float(v) for v in np.exp(logs).mean(axis=0)], float(fit.slope), half


def simulate(c: dict[str, float], runs: int, rounds: int, top: float, sims: int, seed: int = 3,
             control: float = CONTROL) -> dict[str, float]:
    """The demo's confirmation `sims` times, its top config `top` (log) from the default: the shares
in which the control was found worse, the verdict withheld and the top found better; mean rounds."""
    rng = np.random.default_rng(seed)
    looks = tuple(range(MIN_STARTS, rounds + 1))
    found = withheld = improved = used = 0
    for _ in range(sims):
        truth = {"default": 0.0, "top": top, "control": control}
        starts = {a: np.exp(mu + rng.normal(0, c["start_sd"], rounds)[:, None]
                            + rng.normal(0, c["run_sd"], (rounds, runs))) for a, mu in truth.items()}
        for n in range(MIN_STARTS, rounds + 1):
            arms = [Arm(0, "default", {}, key="default", runs=starts["default"][:n].tolist()),
                    Arm(1, "#1", {}, key="top", runs=starts["top"][:n].tolist()),
                    Arm(-1, "control1", {}, key="control", control={"slowdown": 0.1},
                        runs=starts["control"][:n].tolist())]
            v = judge(arms, "x.decode_tok_s", "maximize", 0.03, looks)
            if all(settled(x) for x in v.values()) or n == rounds:
                break
        detected = v["control"].verdict == "regressed"
        found += detected
        withheld += not detected and v["top"].verdict != "improved"
        improved += v["top"].verdict == "improved"
        used += n
    return {"control_found": found / sims, "withheld": withheld / sims, "top_improved": improved / sims,
            "rounds": used / sims}


def main(sims: int, name: str) -> None:
    rows = json.loads((HERE / name).read_text())
    c = components(rows)
    per_run_s = (float(np.mean([r["wall_s"] for r in rows])) - ONE_RUN_START_S) / (c["runs"] - 1)
    print(f"{len(rows)} starts x {c['runs']:.0f} runs: run sd {100 * c['run_sd']:.1f}%, start sd "
          f"{100 * c['start_sd']:.1f}%, round sd {100 * c['round_sd']:.1f}% (log scale); paired difference of "
          f"start means sd {100 * c['diff_sd']:.1f}%; second arm / default {c['control_ratio']:.3f}")
    means, slope, half = position_means(rows)
    print("run position / start mean: " + " ".join(f"{v:.3f}" for v in means)
          + f"; trend {100 * slope:+.2f}% per run (95% CI {100 * (slope - half):+.2f}..{100 * (slope + half):+.2f})")
    print(f"a run costs {per_run_s:.1f} s beside a start's {ONE_RUN_START_S:.0f} s (one run and its warm-up)")
    print(f"\n{'runs':>4} {'rounds':>6} | {'control found':>13} {'withheld':>8} {'rounds':>6} {'minutes':>7}"
          f" | {'top +10% found':>14} {'top = default found':>19} | {'2nd arm at its ratio found':>26}")
    for runs, rounds in DESIGNS:
        null = simulate(c, runs, rounds, 0.0, sims)
        better = simulate(c, runs, rounds, math.log(1.1), sims, seed=5)
        seen = simulate(c, runs, rounds, 0.0, sims, seed=7, control=math.log(c["control_ratio"]))
        minutes = null["rounds"] * ARMS * (ONE_RUN_START_S + (runs - 1) * per_run_s) / 60
        print(f"{runs:>4} {rounds:>6} | {null['control_found']:>13.2f} {null['withheld']:>8.2f} "
              f"{null['rounds']:>6.1f} {minutes:>7.1f} | {better['top_improved']:>14.2f} "
              f"{null['top_improved']:>19.2f} | {seen['control_found']:>26.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 400, sys.argv[2] if len(sys.argv) > 2 else "rows.json")
