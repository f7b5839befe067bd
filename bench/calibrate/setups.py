"""Measurement setups compared on the H100 calibration CSVs (model, pinned CPUs, output tokens: the
`model`/`pin`/`max_tokens` columns): noise components per setup and session, the true differences of
real pairs, and the live gate (`search ab` with a cap of rounds, bench.calibrate.gate) resampled and
on a normal model. Part of `python -m bench.calibrate power --setups CSV...`."""

from __future__ import annotations

import csv
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.calibrate.gate import sequential
from bench.calibrate.power import DEFAULT, METRIC, components, cp_lower, cp_upper
from bench.calibrate.replay import truth
from search.verdicts.sequential import MIN_STARTS


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
    """search ab's verdict with `--rounds cap` (bench.calibrate.gate)."""
    return sequential(METRIC, a, b, cap).verdict


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
        v = truth(METRIC, [s.runs for s in base], [s.runs for s in pool])
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
