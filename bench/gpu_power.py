"""The gate's false-alarm rate and power on the H100, computed by resampling measured starts.

Reads the calibration runs of bench/data/gpu_calib_h100.csv (llama-server CUDA, one config per
fresh start, interleaved in rotated order, several 1-stream runs per start; bench/gpu/table.py
--plan calib) and the ground-truth table bench/data/gpu_llamacpp_h100.csv (2 starts x 3 runs per
config). It prints:
1. variance components of 1-stream tok/s: within a start (run to run) and between starts, as CVs;
2. each config's true difference from the default, from all its interleaved starts;
3. the verdicts of `search.gate.compare` (whatever it is at run time) on resampled experiments
   of n fresh starts per side: each side's sample is one value per start, the median of its first
   R runs, as `search ab` forms a round's value. A/A draws A and B from disjoint starts of the
   default; "5% shift" multiplies B's runs by 0.95 (real noise, a known 5% change); real pairs
   draw B from another config's starts of the same run.
Resampled rates reuse the same starts many times, so they are not independent repetitions: each
row also states how many disjoint (independent) experiments the pool holds, the count of false
alarms / detections among one such partition, and the Clopper-Pearson 95% upper (or lower) bound
from it; and a rate from a normal model with the measured variance components (independent by
construction, but only as good as the model).

    .venv/bin/python bench/gpu_power.py [--draws 1000] [--json bench/data/gpu_power_h100.json]
    .venv/bin/python bench/gpu_power.py --setups bench/data/gpu_calib_h100_big.csv bench/data/gpu_calib_h100.csv

--setups compares measurement setups instead (the model, the CPUs the server is pinned to, the output
tokens of a run: the `model`/`pin`/`max_tokens` columns of bench/gpu/table.py, absent = the 1.1B
default) with the gate as `search ab` runs it: `search.sequential.compare_starts` (t test on start
values, the mean of log runs) with sequential looks at 3..cap starts per side, stopping at the first
settled verdict. Each calibration session (`run` column, one machine) is one interleaved pool; A/A
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
from scipy import stats as sps

from search.gate import compare
from search.sequential import MIN_STARTS, compare_starts, settled

DATA = Path(__file__).parent / "data"
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
    """(within-start CV, between-start CV, number of starts) by one-way random-effects ANOVA on log tok/s."""
    groups = [np.log(np.asarray(s)) for s in starts if len(s) >= 2]
    k = len(groups)
    n = np.mean([g.size for g in groups])
    msw = sum(((g - g.mean()) ** 2).sum() for g in groups) / sum(g.size - 1 for g in groups)
    means = np.array([g.mean() for g in groups])
    msb = n * means.var(ddof=1) if k > 1 else math.nan
    between = max((msb - msw) / n, 0.0)
    return math.sqrt(msw), math.sqrt(between), k


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


def cp_upper(k: int, n: int, conf: float = 0.95) -> float:
    return 1.0 if n == 0 else (1.0 if k == n else float(sps.beta.ppf(conf, k + 1, n - k)))


def cp_lower(k: int, n: int, conf: float = 0.95) -> float:
    return 0.0 if k == 0 else float(sps.beta.ppf(1 - conf, k, n - k + 1))


def verdict(a: list[float], b: list[float]) -> str:
    return compare(METRIC, a, b).verdict


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


# ---- measurement setups, with the live gate (search ab's sequential t test over starts) ----------

@dataclass
class SetupStart:
    setup: str
    session: str
    config: str
    runs: list[float]


def load_setup_starts(paths: list[Path]) -> list[SetupStart]:
    groups: dict[tuple[str, str, str, str], list[tuple[int, float]]] = defaultdict(list)
    configs: dict[tuple[str, str, str, str], str] = {}
    for path in paths:
        with path.open() as f:
            for r in csv.DictReader(f):
                if r["status"] != "ok" or r["load"] != "1":
                    continue
                model = r.get("model") or "random-1b-f16.gguf"
                setup = f"{model.removesuffix('.gguf')} pin={r.get('pin') or '-'} tokens={r.get('max_tokens') or 256}"
                key = (setup, f"{path.stem}:{r.get('run') or '0'}", r.get("label") or r["config"], r["start"])
                groups[key].append((int(r["repeat"]), float(r["tok_s"])))
                configs[key] = r["config"]
    return [SetupStart(k[0], k[1], configs[k], [v for _, v in sorted(vals)]) for k, vals in groups.items()]


def seq_verdict(a: list[list[float]], b: list[list[float]], cap: int) -> str:
    """search ab's verdict: looks at MIN_STARTS..cap starts per side, the first settled one wins."""
    looks = tuple(range(MIN_STARTS, cap + 1))
    for k in looks:
        v = compare_starts(METRIC, a[:k], b[:k], looks=looks)
        if settled(v) or k == cap:
            return v.verdict
    return "inconclusive"


SessionPools = list[tuple[list[SetupStart], list[SetupStart] | None]]


def setup_experiment(pools: SessionPools, cap: int, r: int, scale: float, draws: int,
                     rng: np.random.Generator) -> tuple[dict[str, float], int, dict[str, int]]:
    """(resampled verdict rates, independent experiments, their verdict counts) for sequential runs
    capped at `cap` starts per side, R = r runs per start; one disjoint partition of each session
    gives the independent experiments (each uses cap starts per side, even where it stopped early)."""
    pools = [(pa, pb) for pa, pb in pools
             if (pb is None and len(pa) >= 2 * cap) or (pb and min(len(pa), len(pb)) >= cap)]
    if not pools:
        return {}, 0, {}

    def runs(side: list[SetupStart], f: float = 1.0) -> list[list[float]]:
        return [[x * f for x in s.runs[:r]] for s in side]

    def split(pa: list[SetupStart], pb: list[SetupStart] | None, m: int) -> list[tuple[list[SetupStart], ...]]:
        if pb is None:
            perm = rng.permutation(len(pa))
            return [([pa[i] for i in perm[2 * cap * j: 2 * cap * j + cap]],
                     [pa[i] for i in perm[2 * cap * j + cap: 2 * cap * (j + 1)]]) for j in range(m)]
        qa, qb = rng.permutation(len(pa)), rng.permutation(len(pb))
        return [([pa[i] for i in qa[cap * j: cap * (j + 1)]], [pb[i] for i in qb[cap * j: cap * (j + 1)]])
                for j in range(m)]

    weights = np.array([len(pa) + len(pb or []) for pa, pb in pools], dtype=float)
    counts: dict[str, int] = defaultdict(int)
    for _ in range(draws):
        pa, pb = pools[int(rng.choice(len(pools), p=weights / weights.sum()))]
        a, b = split(pa, pb, 1)[0]
        counts[seq_verdict(runs(a), runs(b, scale), cap)] += 1
    indep: list[str] = []
    for pa, pb in pools:
        m = len(pa) // (2 * cap) if pb is None else min(len(pa), len(pb)) // cap
        indep += [seq_verdict(runs(a), runs(b, scale), cap) for a, b in split(pa, pb, m)]
    return {v: c / draws for v, c in counts.items()}, len(indep), {v: indep.count(v) for v in set(indep)}


def setup_model(cv_w: float, cv_b: float, cap: int, r: int, change: float, draws: int,
                rng: np.random.Generator) -> dict[str, float]:
    """Sequential verdict rates from a normal model: start effect ~ N(0, cv_b), run ~ N(0, cv_w)."""
    counts: dict[str, int] = defaultdict(int)
    for _ in range(draws):
        a, b = ((100 * (1 + shift) * np.exp(rng.normal(0, cv_b, (cap, 1)) + rng.normal(0, cv_w, (cap, r)))).tolist()
                for shift in (0.0, change))
        counts[seq_verdict(a, b, cap)] += 1
    return {v: c / draws for v, c in counts.items()}


def setups_report(paths: list[Path], caps: list[int], draws: int, model_draws: int, pairs: list[str],
                  rng: np.random.Generator) -> dict[str, object]:
    starts = load_setup_starts(paths)
    by: dict[tuple[str, str, str], list[SetupStart]] = defaultdict(list)
    for s in starts:
        by[(s.setup, s.session, s.config)].append(s)
    setups = sorted({s.setup for s in starts})

    def sessions_of(setup: str) -> list[str]:  # sessions with enough default starts for the smallest cap
        return sorted(ss for su, ss, c in by if su == setup and c == DEFAULT and len(by[(su, ss, c)]) >= 2 * min(caps))

    out: dict[str, object] = {}
    print("## Setups: variance components of 1-stream tok/s (log scale, as CVs), default config\n")
    print("| setup | session | starts | runs/start | median tok/s | within-start CV % | between-start CV % "
          "(90% bootstrap over starts) |\n|---|---|---|---|---|---|---|")
    comps: dict[str, dict[str, float]] = {}
    for setup in setups:
        sessions = sessions_of(setup)
        for session in sessions:
            pool = by[(setup, session, DEFAULT)]
            r = min(len(s.runs) for s in pool)
            w, b, k = components([s.runs[:r] for s in pool])
            boot = [components([pool[i].runs[:r] for i in rng.integers(0, k, k)])[1] for _ in range(300)]
            lo, hi = np.quantile(boot, [0.05, 0.95])
            med = statistics.median(math.exp(np.mean(np.log(s.runs[:r]))) for s in pool)
            print(f"| {setup} | {session} | {k} | {r} | {med:.1f} | {100 * w:.2f} | {100 * b:.2f} "
                  f"({100 * lo:.2f}-{100 * hi:.2f}) |")
        # pooled over sessions: each session centred on its own mean (A and B always share a session)
        centred = []
        for session in sessions:
            pool = by[(setup, session, DEFAULT)]
            r = min(len(s.runs) for s in pool)
            mu = float(np.mean([np.mean(np.log(s.runs[:r])) for s in pool]))
            centred += [[x / math.exp(mu) for x in s.runs[:r]] for s in pool]
        r_min = min(len(x) for x in centred)
        w, b, k = components([x[:r_min] for x in centred])
        comps[setup] = {"within_cv": w, "between_cv": b, "starts": k, "runs": r_min}
        print(f"| {setup} | all, each session centred | {k} | {r_min} | - | {100 * w:.2f} | {100 * b:.2f} |")
    out["components"] = comps

    print("\n## Setups: true differences of the real pairs (all interleaved starts of a session, R = all runs)\n")
    print("| setup | session | config | starts (config/default) | change % (geometric mean of starts) | 95% CI |")
    print("|---|---|---|---|---|---|")
    for (setup, session, cfg), pool in sorted(by.items()):
        if cfg == DEFAULT or not any(x in cfg for x in pairs) or session not in sessions_of(setup):
            continue
        base = by[(setup, session, DEFAULT)]
        v = compare_starts(METRIC, [s.runs for s in base], [s.runs for s in pool], alpha=0.05)
        print(f"| {setup} | {session} | {cfg} | {len(pool)}/{len(base)} | {v.change_pct:+.1f} | "
              f"{100 * (v.ci_low - 1):+.1f} .. {100 * (v.ci_high - 1):+.1f} |")

    print(f"\n## Setups: the live gate (sequential t test over starts, looks at {MIN_STARTS}..cap, alpha 0.02, "
          "min effect 3%), resampled\n")
    print("| setup | experiment | cap (starts/side) | R runs/start | resampled hit % (draws) | regressed / improved / "
          "unchanged / inconclusive % | independent experiments | hits among them | 95% bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows: list[dict[str, object]] = []
    for setup in setups:
        sessions = sessions_of(setup)
        base_pools: SessionPools = [(by[(setup, ss, DEFAULT)], None) for ss in sessions]
        scen: list[tuple[str, SessionPools, float]] = [("A/A", base_pools, 1.0),
                                                       ("5% shift (B x 0.95)", base_pools, 0.95)]
        for cfg in sorted({c for su, _, c in by if su == setup and c != DEFAULT and any(x in c for x in pairs)}):
            scen.append((f"pair: {cfg}", [(by[(setup, ss, DEFAULT)], by[(setup, ss, cfg)]) for ss in sessions
                                          if (setup, ss, cfg) in by], 1.0))
        r_max = min(len(s.runs) for ss in sessions for s in by[(setup, ss, DEFAULT)])
        for name, pools, scale in scen:
            aa = name == "A/A"
            for cap in caps:
                for r in sorted({min(4, r_max), r_max}):
                    rates, k, iv = setup_experiment(pools, cap, r, scale, draws, rng)
                    if not k:
                        continue
                    hit = rates.get("regressed", 0.0) + (rates.get("improved", 0.0) if aa else 0.0)
                    hits = iv.get("regressed", 0) + (iv.get("improved", 0) if aa else 0)
                    bound = (f"false alarm <= {100 * cp_upper(hits, k):.0f}%" if aa
                             else f"power >= {100 * cp_lower(hits, k):.0f}%")
                    dist = " / ".join(f"{100 * rates.get(v, 0.0):.1f}" for v in ("regressed", "improved", "unchanged",
                                                                                "inconclusive"))
                    print(f"| {setup} | {name} | {cap} | {r} | {100 * hit:.1f} ({draws}) | {dist} | {k} | {hits} | "
                          f"{bound} |")
                    rows.append({"setup": setup, "experiment": name, "cap": cap, "runs_per_start": r, "rates": rates,
                                 "independent": k, "independent_hits": hits,
                                 "bound95": cp_upper(hits, k) if aa else cp_lower(hits, k)})
    out["resampled"] = rows

    print(f"\n## Setups: normal model with each setup's pooled components, {model_draws} independent simulated "
          "experiments per cell\n")
    print("| setup | true change | cap | R | regressed % | improved % | 95% bound (regressed + improved at 0%; "
          "regressed at -5%) |\n|---|---|---|---|---|---|---|")
    model_rows = []
    for setup, c in comps.items():
        for change in (0.0, -0.05):
            for cap in caps:
                for r in sorted({min(4, int(c["runs"])), int(c["runs"])}):
                    rates = setup_model(c["within_cv"], c["between_cv"], cap, r, change, model_draws, rng)
                    if change == 0:
                        k = round((rates.get("regressed", 0.0) + rates.get("improved", 0.0)) * model_draws)
                        bound = f"<= {100 * cp_upper(k, model_draws):.2f}%"
                    else:
                        k = round(rates.get("regressed", 0.0) * model_draws)
                        bound = f">= {100 * cp_lower(k, model_draws):.1f}%"
                    print(f"| {setup} | {100 * change:+.0f}% | {cap} | {r} | {100 * rates.get('regressed', 0.0):.2f} | "
                          f"{100 * rates.get('improved', 0.0):.2f} | {bound} |")
                    model_rows.append({"setup": setup, "change": change, "cap": cap, "runs_per_start": r,
                                       "rates": rates, "draws": model_draws})
    out["model"] = model_rows
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    if a.setups:
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
            k = int(res["independent"])  # type: ignore[arg-type]
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
            bound = cp_upper(k, a.draws) if change == 0 else cp_lower(k, a.draws)
            print(f"| {100 * change:+.0f}% | {n} | {100 * rates.get('regressed', 0.0):.1f} | "
                  f"{100 * rates.get('improved', 0.0):.1f} | {'<=' if change == 0 else '>='} {100 * bound:.1f}% |")
            model_rows.append({"change": change, "n": n, "rates": rates, "bound95": bound})
    out["model"] = model_rows
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, default=float) + "\n")
    print(f"\n(starts in the calibration data: {len(starts)}; default starts: {len(base_all)}; "
          f"median default value {statistics.median(start_value(s, r) for s in base_all):.0f} tok/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
