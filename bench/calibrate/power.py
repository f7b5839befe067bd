"""The gate's false-alarm rate and power on the H100, computed by resampling measured starts.

Reads the calibration runs of bench/data/gpu_calib_h100.csv (llama-server CUDA, one config per
fresh start, interleaved in rotated order, several 1-stream runs per start; the earlier GPU
tool's calib plan) and the ground-truth table bench/data/gpu_llamacpp_h100.csv (2 starts x 3 runs per
config). It prints:
1. variance components of 1-stream tok/s: within a start (run to run) and between starts, as CVs;
2. each config's true difference from the default, from all its interleaved starts;
3. the verdicts of the product's gate at a fixed number of starts (bench.calibrate.gate, whatever
   it is at run time) on resampled experiments of n fresh starts per side: each side's sample is
   one value per start, the median of its first R runs, as `search ab` forms a round's value.
   A/A draws A and B from disjoint starts of the default; "5% shift" multiplies B's runs by 0.95
   (real noise, a known 5% change); real pairs draw B from another config's starts of the same run.
Resampled rates reuse the same starts many times, so they are not independent repetitions: each
row also states how many disjoint (independent) experiments the pool holds, the count of false
alarms / detections among one such partition, and the Clopper-Pearson 95% upper (or lower) bound
from it; and a rate from a normal model with the measured variance components (independent by
construction, but only as good as the model).

    .venv/bin/python -m bench.calibrate power [--draws 1000] [--json bench/data/gpu_power_h100.json]
    .venv/bin/python -m bench.calibrate power --setups bench/data/gpu_calib_h100_big.csv bench/data/gpu_calib_h100.csv

--setups compares measurement setups instead (the model, the CPUs the server is pinned to, the output
tokens of a run: the `model`/`pin`/`max_tokens` columns of the calibration CSVs, absent = the 1.1B
default) with the gate as `search ab` runs it (bench.calibrate.gate: its sequential stop rule and
report). Each calibration session (`run` column, one machine) is one interleaved pool; A/A
draws A and B from disjoint default starts of one session, "5% shift" scales B's runs by 0.95, and
a real pair draws B from another config's starts of the same session.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.calibrate.gate import final_verdict, lower_bound
from bench.common import DATA
from harness.measure.stats import clopper_pearson_upper, variance_components
from search.regress.ab import SequentialPlan

METRIC = "single.output_tok_s"
DEFAULT = "fa=on b=2048 ub=512 kv=f16/f16 np=4 ngl=99"


@dataclass
class Start:
    run: str
    config: str
    runs: list[float]  # tok/s of each measured 1-stream run, in order


def load_starts(path: Path) -> list[Start]:
    groups: dict[tuple[str, str, str], list[tuple[int, float]]] = defaultdict(list)
    configs: dict[tuple[str, str, str], str] = {}
    with path.open() as f:
        for r in csv.DictReader(f):
            if r["status"] != "ok" or r["load"] != "1":
                continue
            key = (r.get("run") or "0", r.get("label") or r["config"], r["start"])
            groups[key].append((int(r["repeat"]), float(r["tok_s"])))
            configs[key] = r["config"]
    return [Start(k[0], configs[k], [v for _, v in sorted(vals)]) for k, vals in groups.items()]


def components(starts: list[list[float]]) -> tuple[float, float, int]:
    """(within-start CV, between-start CV, number of starts): harness.measure.stats' one-way random effects on
    log tok/s."""
    vc = variance_components([s for s in starts if len(s) >= 2])
    return vc.sd_within, vc.sd_between, vc.starts


def pooled_table_components(path: Path, ngl: str) -> tuple[float, float, int]:
    """Within/between-start CVs pooled over the ground-truth table's configs with this -ngl (2 starts
    each, often on two machines), each config centred on its own mean, 1 stream."""
    by_cfg: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    with path.open() as f:
        for r in csv.DictReader(f):
            if r["status"] == "ok" and r["load"] == "1" and r["ngl"] == ngl:
                by_cfg[r["config"]][r["start"]].append(math.log(float(r["tok_s"])))
    ssw = dfw = ssb = dfb = 0.0
    n_runs: list[int] = []
    for cfg in by_cfg.values():
        groups = [np.asarray(v) for v in cfg.values() if len(v) >= 2]
        if len(groups) < 2:
            continue
        ssw += sum(((g - g.mean()) ** 2).sum() for g in groups)
        dfw += sum(g.size - 1 for g in groups)
        means = np.array([g.mean() for g in groups])
        n = float(np.mean([g.size for g in groups]))
        ssb += n * ((means - means.mean()) ** 2).sum()
        dfb += len(groups) - 1
        n_runs.append(int(n))
    msw, msb = ssw / dfw, ssb / dfb
    n = float(np.mean(n_runs))
    return math.sqrt(msw), math.sqrt(max((msb - msw) / n, 0.0)), int(dfb)


def start_value(s: Start, r: int, scale: float = 1.0) -> float:
    return float(np.median(s.runs[:r])) * scale


cp_upper = clopper_pearson_upper
cp_lower = lower_bound


def verdict(a: list[float], b: list[float]) -> str:
    """The gate's verdict on n start values per side, as one look at n rounds."""
    n = min(len(a), len(b))
    plan = SequentialPlan((METRIC,), max_rounds=n, min_rounds=n)
    return final_verdict(METRIC, [[x] for x in a[:n]], [[x] for x in b[:n]], plan).verdict


Pools = list[tuple[list[Start], list[Start] | None]]  # per calibration session: (default, other or None)


def experiment(pools: Pools, n: int, r: int, scale: float, draws: int, rng: np.random.Generator) -> dict[str, object]:
    """Resampled verdict rates for n starts per side, plus one disjoint partition (independent
    experiments). A and B always come from the same session (interleaved); a draw picks a session
    in proportion to its starts."""
    pools = [(pa, pb) for pa, pb in pools
             if (pb is None and len(pa) >= 2 * n) or (pb is not None and min(len(pa), len(pb)) >= n)]
    if not pools:
        return {"n": n, "draws": 0, "rates": {}, "independent": 0, "independent_verdicts": {}}
    weights = np.array([len(pa) + len(pb or []) for pa, pb in pools], dtype=float)
    counts: dict[str, int] = defaultdict(int)
    for _ in range(draws):
        pool_a, pool_b = pools[int(rng.choice(len(pools), p=weights / weights.sum()))]
        if pool_b is None:
            idx = rng.choice(len(pool_a), size=2 * n, replace=False)
            a = [pool_a[i] for i in idx[:n]]
            b = [pool_a[i] for i in idx[n:]]
        else:
            assert pool_b is not None
            a = [pool_a[i] for i in rng.choice(len(pool_a), size=n, replace=False)]
            b = [pool_b[i] for i in rng.choice(len(pool_b), size=n, replace=False)]
        counts[verdict([start_value(s, r) for s in a], [start_value(s, r, scale) for s in b])] += 1
    # one partition of every session into disjoint experiments: these are independent repetitions
    parts: list[tuple[list[Start], list[Start]]] = []
    for pool_a, pool_b in pools:
        if pool_b is None:
            perm = rng.permutation(len(pool_a))
            parts += [([pool_a[i] for i in perm[2 * n * j: 2 * n * j + n]],
                       [pool_a[i] for i in perm[2 * n * j + n: 2 * n * (j + 1)]])
                      for j in range(len(pool_a) // (2 * n))]
        else:
            pa, pb = rng.permutation(len(pool_a)), rng.permutation(len(pool_b))
            parts += [([pool_a[i] for i in pa[n * j: n * (j + 1)]], [pool_b[i] for i in pb[n * j: n * (j + 1)]])
                      for j in range(min(len(pool_a), len(pool_b)) // n)]
    indep = [verdict([start_value(s, r) for s in a], [start_value(s, r, scale) for s in b]) for a, b in parts]
    return {"n": n, "draws": draws, "rates": {v: c / draws for v, c in counts.items()},
            "independent": len(indep), "independent_verdicts": {v: indep.count(v) for v in set(indep)}}


def model_rate(cv_w: float, cv_b: float, n: int, r: int, change: float, draws: int,
               rng: np.random.Generator) -> dict[str, float]:
    """Verdict rates from a normal model of log tok/s: start effect ~ N(0, cv_b), run ~ N(0, cv_w)."""
    counts: dict[str, int] = defaultdict(int)
    for _ in range(draws):
        side = []
        for shift in (0.0, math.log(1 + change)):
            starts = rng.normal(0, cv_b, size=n)[:, None] + rng.normal(0, cv_w, size=(n, r)) + shift
            side.append((580.0 * np.exp(np.median(starts, axis=1))).tolist())
        counts[verdict(side[0], side[1])] += 1
    return {v: c / draws for v, c in counts.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.calibrate power", description=__doc__.splitlines()[0])
    p.add_argument("--calib", type=Path, default=DATA / "gpu_calib_h100.csv")
    p.add_argument("--table", type=Path, default=DATA / "gpu_llamacpp_h100.csv")
    p.add_argument("--draws", type=int, default=400)
    p.add_argument("--runs-per-start", type=int, default=3, help="R: runs per start that make a start's value")
    p.add_argument("--sizes", default="5,6,8,12")
    p.add_argument("--json", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--setups", type=Path, nargs="+", help="compare measurement setups in these CSVs (live gate)")
    p.add_argument("--caps", default="4,6,8", help="--setups: sequential caps, starts per side")
    p.add_argument("--model-draws", type=int, default=2000, help="--setups: simulated experiments per model cell")
    p.add_argument("--pairs", default="-ot ,kv=q8_0/f16", help="--setups: real pairs (config name substrings)")
    a = p.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    if a.setups:
        from bench.calibrate.setups import setups_report  # it imports this module

        res = setups_report(a.setups, [int(x) for x in a.caps.split(",")], a.draws, a.model_draws,
                            a.pairs.split(","), rng)
        if a.json:
            a.json.write_text(json.dumps(res, indent=1, default=float) + "\n")
        return 0
    r = a.runs_per_start
    starts = load_starts(a.calib)
    by: dict[tuple[str, str], list[Start]] = defaultdict(list)
    for s in starts:
        by[(s.run, s.config)].append(s)
    out: dict[str, object] = {"metric": METRIC, "runs_per_start": r, "draws": a.draws}

    print("## Variance components of 1-stream tok/s (log scale, as CVs)\n")
    print("| data | config | starts | runs/start | within-start CV % | between-start CV % |\n|---|---|---|---|---|---|")
    comp: dict[str, dict[str, float]] = {}
    for (run, cfg), pool in sorted(by.items()):
        w, b, k = components([s.runs for s in pool])
        comp[f"run{run} {cfg}"] = {"within_cv": w, "between_cv": b, "starts": k}
        print(f"| calib run {run} | {cfg} | {k} | {len(pool[0].runs)} | {100 * w:.2f} | {100 * b:.2f} |")
    base_all = [s for (run, cfg), pool in by.items() if cfg == DEFAULT for s in pool]
    w_all, b_all, k_all = components([s.runs for s in base_all])
    print(f"| calib, all runs | {DEFAULT} | {k_all} | 4 | {100 * w_all:.2f} | {100 * b_all:.2f} |")
    out["components"] = {**comp, "calib all default": {"within_cv": w_all, "between_cv": b_all, "starts": k_all}}
    for ngl in ("99", "22"):
        tw, tb, tdf = pooled_table_components(a.table, ngl)
        print(f"| table (starts on 1-2 machines) | every -ngl {ngl} config | 2 per config ({tdf} df) | 3 | "
              f"{100 * tw:.2f} | {100 * tb:.2f} |")
        out["components"][f"table ngl={ngl}"] = {"within_cv": tw, "between_cv": tb, "between_df": tdf}  # type: ignore[index]

    print("\n## True differences from the default (all interleaved starts of one run)\n")
    print("| run | config | starts (config/default) | change % of median start value | "
          "95% CI (bootstrap over starts) |")
    print("|---|---|---|---|---|")
    truths: dict[str, dict[str, object]] = {}
    for (run, cfg), pool in sorted(by.items()):
        if cfg == DEFAULT:
            continue
        base = by[(run, DEFAULT)]
        va = np.array([start_value(s, 4) for s in base])
        vb = np.array([start_value(s, 4) for s in pool])
        boots = [np.median(rng.choice(vb, vb.size)) / np.median(rng.choice(va, va.size)) for _ in range(4000)]
        ratio = float(np.median(vb) / np.median(va))
        lo, hi = np.quantile(boots, [0.025, 0.975])
        truths[f"run{run} {cfg}"] = {"ratio": ratio, "ci": [float(lo), float(hi)], "starts": [len(pool), len(base)]}
        print(f"| {run} | {cfg} | {len(pool)}/{len(base)} | {100 * (ratio - 1):+.1f} | "
              f"{100 * (lo - 1):+.1f} .. {100 * (hi - 1):+.1f} |")
    out["truths"] = truths

    sizes = [int(x) for x in a.sizes.split(",")]
    print(f"\n## Gate verdicts by resampling (n fresh starts per side, a start's value = median of {r} runs)\n")
    print("| experiment | n/side | resampled: false alarm or detection % (draws) | regressed / improved / unchanged / "
          "inconclusive % | independent experiments | hits among them | 95% bound |")
    print("|---|---|---|---|---|---|---|")
    rows: list[dict[str, object]] = []
    runs = sorted({s.run for s in base_all})
    default_pools: Pools = [(by[(run, DEFAULT)], None) for run in runs]
    scenarios: list[tuple[str, Pools, float]] = [("A/A (default vs default)", default_pools, 1.0),
                                                 ("default vs default x 0.95 (5% shift)", default_pools, 0.95)]
    for cfg in sorted({c for _, c in by} - {DEFAULT}):
        cfg_runs = [run for run in runs if (run, cfg) in by]
        changes = "/".join(f"{100 * (float(truths[f'run{run} {cfg}']['ratio']) - 1):+.1f}"  # type: ignore[arg-type]
                           for run in cfg_runs)
        scenarios.append((f"{cfg} ({changes}%)", [(by[(run, DEFAULT)], by[(run, cfg)]) for run in cfg_runs], 1.0))
    for name, pools, scale in scenarios:
        aa = pools[0][1] is None and scale == 1.0
        for n in sizes:
            res = experiment(pools, n, r, scale, a.draws, rng)
            if not res["draws"]:
                continue
            rates: dict[str, float] = res["rates"]  # type: ignore[assignment]
            iv: dict[str, int] = res["independent_verdicts"]  # type: ignore[assignment]
            k = int(res["independent"])  # type: ignore[call-overload]
            hit = rates.get("regressed", 0.0) + rates.get("improved", 0.0) if aa else rates.get("regressed", 0.0)
            hits = iv.get("regressed", 0) + iv.get("improved", 0) if aa else iv.get("regressed", 0)
            bound = (f"false alarm <= {100 * cp_upper(hits, k):.0f}%" if aa
                     else f"power >= {100 * cp_lower(hits, k):.0f}%")
            dist = " / ".join(f"{100 * rates.get(v, 0.0):.1f}" for v in ("regressed", "improved", "unchanged",
                                                                        "inconclusive"))
            print(f"| {name} | {n} | {100 * hit:.1f} ({a.draws}) | {dist} | {k} | {hits} | {bound} |")
            rows.append({"experiment": name, **res, "hit_rate": hit, "independent_hits": hits,
                         "bound95": cp_upper(hits, k) if aa else cp_lower(hits, k)})
    out["resampled"] = rows

    print(f"\n## Normal model with the measured components (within {100 * w_all:.2f}%, between "
          f"{100 * b_all:.2f}%), {a.draws} independent simulated experiments each\n")
    print("| true change | n/side | regressed % | improved % | 95% bound on the regressed rate |")
    print("|---|---|---|---|---|")
    model_rows = []
    for change in (0.0, -0.05):
        for n in sizes:
            rates = model_rate(w_all, b_all, n, r, change, a.draws, rng)
            k = round(rates.get("regressed", 0.0) * a.draws)
            model_bound = cp_upper(k, a.draws) if change == 0 else cp_lower(k, a.draws)
            print(f"| {100 * change:+.0f}% | {n} | {100 * rates.get('regressed', 0.0):.1f} | "
                  f"{100 * rates.get('improved', 0.0):.1f} | {'<=' if change == 0 else '>='} "
                  f"{100 * model_bound:.1f}% |")
            model_rows.append({"change": change, "n": n, "rates": rates, "bound95": model_bound})
    out["model"] = model_rows
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, default=float) + "\n")
    print(f"\n(starts in the calibration data: {len(starts)}; default starts: {len(base_all)}; "
          f"median default value {statistics.median(start_value(s, r) for s in base_all):.0f} tok/s)")
    return 0
