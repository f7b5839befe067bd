"""Calibrate the gate on a real engine: false alarms (A/A) and power against known slowdowns, from
INDEPENDENT repetitions of the sequential gate, plus what the measured noise components predict.

    .venv/bin/python bench/calibrate_gate.py measure --minutes 15 --out bench/data/calibration_cpu_llama.json
    .venv/bin/python bench/calibrate_gate.py analyze bench/data/calibration_cpu_llama.json
    .venv/bin/python bench/calibrate_gate.py simulate --sd-between 0.012 --sd-within 0.004   # e.g. GPU numbers

measure: llama-server, SmolLM2-135M Q4_1, `-t 1 -np 1`, one stream of 32 output tokens. Each round
starts every arm's server fresh (rotated order), warms it up to a steady state, measures
`--runs` runs (stalls re-measured: harness/steady.py), and stops it. Arms: A and A2 are the same
config (A/A); T5, T10, T20 run it under bench/throttle.py, which freezes the server for 5/10/20% of
every 100 ms (a CPU quota without cgroups: a known, real slowdown). Every start's runs, time, load
average and errors are written after each round (an interruption keeps what was measured).

analyze: the true effect of each arm (all rounds), the noise split into run-to-run and
start-to-start, then the sequential gate (search/sequential.py, looks at 3..cap starts per side)
replayed over consecutive, NON-overlapping blocks of rounds in time order: each block is one
independent repetition, exactly what a live run would have seen, ending where the gate stopped.
Rates come with Clopper-Pearson 95% bounds on the number of repetitions.

simulate: the same gate on runs drawn from given noise components (log-normal start effect +
run noise): what the cap and runs per start buy at that noise. Labelled as a simulation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import setup_paths  # noqa: E402
from harness.client import served_model_id  # noqa: E402
from harness.measure import MeasurePolicy, measure_workload  # noqa: E402
from harness.quality import run_suite  # noqa: E402
from harness.session import LaunchFailed, RunningConfig, start_config  # noqa: E402
from harness.stats import clopper_pearson, clopper_pearson_upper, variance_components  # noqa: E402
from search.ab import Subject, subject_from  # noqa: E402
from search.baseline import pinned_space  # noqa: E402
from search.results import write_json_atomic  # noqa: E402
from search.sequential import (  # noqa: E402
    compare_errors,
    compare_quality,
    compare_starts,
    sequential_p_threshold,
    settled,
    starts_needed,
)
from search.study import free_port  # noqa: E402

METRIC = "output_tok_s"
THROTTLES = {"T5": 0.05, "T10": 0.10, "T20": 0.20}
# The load-independent slowdowns (bench/throttle.py --stretch: every response byte delivered later).
STRETCHES = {"S5": 0.05, "S10": 0.10, "S20": 0.20}


def space_doc(max_tokens: int) -> dict[str, Any]:
    return {
        "name": "calibrate-gate",
        "engines": {"llamacpp": {"dialect": "llamacpp", "command": [str(setup_paths.llama_server())],
                                 "args": {"ctx_size": 2048, "parallel": 1}, "ready_timeout_s": 60}},
        "models": [{"name": "smollm2-135m-q4_1", "path": str(setup_paths.smollm2_gguf())}],
        "params": {"threads": {"type": "categorical", "choices": [1, 2], "default": 1}},
        "workloads": [{"name": "single", "streams": ["qa"], "max_tokens": max_tokens}],
        "quality": {"suite": None},
        "objectives": [{"metric": f"single.{METRIC}"}],
    }


def arms(max_tokens: int) -> dict[str, Subject]:
    space, config = pinned_space(space_doc(max_tokens), {"engine": "llamacpp", "model": "smollm2-135m-q4_1",
                                                         "threads": 1}, "calibration")
    out = {"A": subject_from(space, config, "A"), "A2": subject_from(space, config, "A2")}
    for name, fraction in THROTTLES.items():
        command = f"{sys.executable} {REPO / 'bench' / 'throttle.py'} {fraction} -- {setup_paths.llama_server()}"
        out[name] = subject_from(space, config, name, command=command)
    for name, fraction in STRETCHES.items():
        command = (f"{sys.executable} {REPO / 'bench' / 'throttle.py'} {fraction} --stretch -- "
                   f"{setup_paths.llama_server()}")
        out[name] = subject_from(space, config, name, command=command)
    return out


def measure_start(running: RunningConfig, max_tokens: int, runs: int, quality: bool,
                  max_warmups: int) -> dict[str, Any]:
    space, _ = pinned_space(space_doc(max_tokens), {"engine": "llamacpp", "model": "smollm2-135m-q4_1",
                                                    "threads": 1}, "calibration")
    spec = space.workload_specs()[0]

    async def go() -> dict[str, Any]:
        import httpx

        async with httpx.AsyncClient() as client:
            model_id = await served_model_id(client, running.base_url)
        wm = await measure_workload(running.engine, running.base_url, model_id, spec, runs, True, 120.0, [],
                                    lambda _: None, policy=MeasurePolicy(metric=METRIC, max_warmups=max_warmups),
                                    alive=running.alive)
        out: dict[str, Any] = {
            "runs": [s.metrics.get(METRIC) for s in wm.counted],
            "excluded": [{"value": s.metrics.get(METRIC), "flags": s.flags} for s in wm.samples if s.excluded],
            "warmups": wm.steady.warmups if wm.steady else None,
            "converged": wm.steady.converged if wm.steady else None,
            "errors": wm.errors, "requests": int(sum(s.metrics.get("requests", 0) for s in wm.samples))}
        if quality:
            q = await run_suite(running.base_url, model_id, "smoke", 120.0)
            out["quality"] = {c.name: bool(c.passed) for c in q.checks}
        return out
    return asyncio.run(go())


def measure(out: Path, minutes: float, max_rounds: int, max_tokens: int, runs: int, chosen: list[str],
            quality_arms: list[str], quality_rounds: int, max_warmups: int) -> None:
    subjects = {k: v for k, v in arms(max_tokens).items() if k in chosen}
    data: dict[str, Any] = {"metric": METRIC, "max_tokens": max_tokens, "runs_per_start": runs,
                            "max_warmups": max_warmups,
                            "arms": list(subjects), "throttles": THROTTLES, "stretches": STRETCHES, "starts": [],
                            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            "command": " ".join(sys.argv)}
    names, t0 = list(subjects), time.monotonic()
    fp_cache: dict[str, dict[str, Any]] = {}  # the engine environment is fingerprinted once, not per start
    logs = REPO / "results" / "calibration-logs" / out.stem  # server logs: not data to commit
    logs.mkdir(parents=True, exist_ok=True)
    for rnd in range(max_rounds):
        if time.monotonic() - t0 > minutes * 60:
            break
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for pos, name in enumerate(order):
            s = subjects[name]
            row: dict[str, Any] = {"round": rnd, "pos": pos, "arm": name, "load1": os.getloadavg()[0],
                                   "t": round(time.monotonic() - t0, 1)}
            t_start = time.monotonic()
            try:
                running = start_config(s.settings, s.model, s.flags, s.env, free_port(),
                                       logs / f"{name}-{rnd:02d}.log", fingerprint_cache=fp_cache)
            except LaunchFailed as exc:
                row["failed"] = f"{exc.cause}: {exc.detail}"
                data["starts"].append(row)
                continue
            try:
                row["ready_s"] = running.ready_s
                row.update(measure_start(running, max_tokens, runs, name in quality_arms and rnd < quality_rounds,
                                         max_warmups))
            finally:
                running.stop()
            row["seconds"] = round(time.monotonic() - t_start, 2)
            data["starts"].append(row)
        write_json_atomic(out, data)
        last = [r for r in data["starts"] if r["round"] == rnd and r.get("runs")]
        shown = "  ".join(f"{r['arm']}={np.exp(np.mean(np.log(r['runs']))):.1f}" for r in last)
        print(f"round {rnd + 1} ({time.monotonic() - t0:.0f} s, load {os.getloadavg()[0]:.1f}): {shown}", flush=True)


# ---- analysis -------------------------------------------------------------------------------------

def by_arm(data: dict[str, Any]) -> dict[str, dict[int, dict[str, Any]]]:
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for row in data["starts"]:
        if row.get("runs") and all(v and v > 0 for v in row["runs"]):
            out.setdefault(row["arm"], {})[row["round"]] = row
    return out


def replay(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]], cap: int, runs: int,
           min_starts: int = 3) -> list[dict[str, Any]]:
    """The sequential gate over consecutive, non-overlapping blocks of rounds (time order)."""
    rounds = sorted(set(a) & set(b))
    looks = tuple(range(min_starts, cap + 1))
    reps, i = [], 0
    while i + min_starts <= len(rounds):
        for k in looks:
            if i + k > len(rounds):
                return reps  # the last block ran out of rounds: not a repetition
            block = rounds[i:i + k]
            v = compare_starts(f"single.{METRIC}", [a[r]["runs"][:runs] for r in block],
                               [b[r]["runs"][:runs] for r in block], looks=looks)
            if settled(v) or k == cap:
                seconds = sum(a[r].get("seconds", 0) + b[r].get("seconds", 0) for r in block)
                reps.append({"verdict": v.verdict, "starts": k, "change_pct": v.change_pct, "seconds": seconds,
                             "first_round": block[0]})
                i += k
                break
    return reps


def fmt_rate(k: int, n: int, upper: bool) -> str:
    if n == 0:
        return "-"
    if upper:
        return f"{k}/{n} ({100 * k / n:.0f}%, 95% upper bound {100 * clopper_pearson_upper(k, n):.0f}%)"
    low, _ = clopper_pearson(k, n, 0.90)  # one-sided 95% lower bound
    return f"{k}/{n} ({100 * k / n:.0f}%, 95% lower bound {100 * low:.0f}%)"


def load(paths: list[Path]) -> dict[str, Any]:
    """One or more measure files as one: rounds of later files numbered after earlier ones."""
    data: dict[str, Any] = {}
    for i, path in enumerate(paths):
        part = json.loads(path.read_text())
        for row in part["starts"]:
            row["round"] += 1000 * i
        if not data:
            data = {**part, "starts": list(part["starts"]), "started": part["started"]}
        else:
            data["starts"] += part["starts"]
            data["started"] += ", " + part["started"]
    return data


def analyze(paths: list[Path], caps: list[int], runs_list: list[int]) -> str:
    data = load(paths)
    arms_ = by_arm(data)
    base = arms_["A"]
    loads = [r["load1"] for r in data["starts"]]
    n_rounds = len({r['round'] for r in data['starts']})
    lines = [f"{', '.join(p.name for p in paths)}: {n_rounds} rounds, {len(data['starts'])} starts, "
             f"{data['runs_per_start']} runs per start, started {data['started']}; load average (1 min) "
             f"{min(loads):.1f}..{max(loads):.1f}, median {np.median(loads):.1f}", "",
             "| arm | starts | tok/s (geo. mean) | change vs A, all rounds (95% CI) | sd between starts | "
             "sd run to run | excluded stalls | warmup converged | s per start |", "|---" * 9 + "|"]
    for name, rows in arms_.items():
        vc = variance_components([r["runs"] for r in rows.values()])
        geo = math.exp(float(np.mean([np.mean(np.log(r["runs"])) for r in rows.values()])))
        common = sorted(set(rows) & set(base))
        if name != "A":
            v = compare_starts(f"single.{METRIC}", [base[r]["runs"] for r in common], [rows[r]["runs"] for r in common])
            change = f"{v.change_pct:+.1f}% ({100 * (v.ci_low - 1):+.1f}..{100 * (v.ci_high - 1):+.1f})"
        else:
            change = "-"
        excluded = sum(len(r.get("excluded", [])) for r in rows.values())
        secs = np.mean([r.get("seconds", 0) for r in rows.values()])
        conv = sum(bool(r.get("converged")) for r in rows.values())
        lines.append(f"| {name} | {len(rows)} | {geo:.2f} | {change} | {100 * vc.sd_between:.1f}% | "
                     f"{100 * vc.sd_within:.1f}% | {excluded} | {conv}/{len(rows)} | {secs:.1f} |")
    vc = variance_components([r["runs"] for r in base.values()])
    timed = [r.get("seconds", 0) for r in base.values() if not r.get("quality")] or [0.0]  # quality: not a cost
    secs = float(np.mean(timed))
    run_s = data["max_tokens"] / math.exp(float(np.mean([np.mean(np.log(r["runs"])) for r in base.values()])))
    overhead = max(0.0, secs - data["runs_per_start"] * run_s)  # start, warmups, stop: paid once per start
    p_star = sequential_p_threshold(tuple(range(3, 21)))
    lines += ["", f"What A's noise implies (start-to-start sd with R runs per start = sqrt(between^2 + "
              f"within^2 / R); starts per side for 95% power, looks at 3..20, p < {p_star:.4f}; one "
              f"start = {overhead:.0f} s + R x {run_s:.1f} s):", "",
              "| runs/start R | sd of a start | 5% change | 10% change | 20% change |", "|---|---|---|---|---|"]
    for r in (1, 3, 10):
        sd = vc.sd_start_mean(r)
        cost = overhead + r * run_s
        cells = [f"{n} starts (~{2 * n * cost / 60:.0f} min)" if (n := starts_needed(sd, e, p_star)) else "-"
                 for e in (0.05, 0.10, 0.20)]
        lines.append(f"| {r} | {100 * sd:.1f}% | " + " | ".join(cells) + " |")
    lines += ["", "Sequential gate replayed on independent blocks (alpha 0.02 two-sided, min effect 3%):", "",
              "| comparison | cap (starts/side) | runs/start | reps | regressed | improved | unchanged | "
              "inconclusive | mean starts/side | mean min per rep |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in [n for n in arms_ if n != "A"]:
        for cap in caps:
            for runs in runs_list:
                reps = replay(base, arms_[name], cap, runs)
                n = len(reps)
                count = {k: sum(r["verdict"] == k for r in reps) for k in ("regressed", "improved", "unchanged",
                                                                           "inconclusive")}
                aa = name == "A2"
                cells = [fmt_rate(count["regressed"], n, aa), fmt_rate(count["improved"], n, True),
                         f"{count['unchanged']}/{n}", f"{count['inconclusive']}/{n}"]
                mean_starts = np.mean([r["starts"] for r in reps]) if reps else math.nan
                mean_min = np.mean([r["seconds"] for r in reps]) / 60 if reps else math.nan
                lines.append(f"| A vs {name} | {cap} | {runs} | {n} | " + " | ".join(cells)
                             + f" | {mean_starts:.1f} | {mean_min:.1f} |")
    lines += ["", errors_table(data), quality_table(data)]
    return "\n".join(lines)


def errors_table(data: dict[str, Any]) -> str:
    errs = {}
    for row in data["starts"]:
        e = errs.setdefault(row["arm"], [0, 0])
        e[0] += row.get("errors", 0)
        e[1] += row.get("requests", 0)
    lines = ["| arm | failed requests | requests | verdict vs A (Fisher, rates) |", "|---|---|---|---|"]
    for arm, (e, n) in errs.items():
        v = compare_errors("single.errors", errs["A"][0], errs["A"][1], e, n).verdict if arm != "A" else "-"
        lines.append(f"| {arm} | {e} | {n} | {v} |")
    return "\n".join(lines) + "\n"


def quality_table(data: dict[str, Any]) -> str:
    """A/A on the quality suite: consecutive starts with a quality result, paired without overlap."""
    starts = [r for r in data["starts"] if r.get("quality")]
    if len(starts) < 2:
        return "(no quality A/A in this file)"
    pairs = [(starts[i], starts[i + 1]) for i in range(0, len(starts) - 1, 2)]
    verdicts = [compare_quality({k: [v] for k, v in a["quality"].items()},
                                {k: [v] for k, v in b["quality"].items()})["verdict"] for a, b in pairs]
    flips = sum(a["quality"] != b["quality"] for a, b in pairs)
    n = len(pairs)
    return (f"Quality A/A ({len(starts)} starts of the same config, {n} independent pairs, "
            f"{len(starts[0]['quality'])} checks): regressed {fmt_rate(verdicts.count('regressed'), n, True)}, "
            f"inconclusive {verdicts.count('inconclusive')}/{n}; pairs whose check results differed at all: "
            f"{flips}/{n}")


# ---- simulation from noise components -------------------------------------------------------------

def draw_side(rng: np.random.Generator, level: float, starts: int, runs: int, sd_between: float,
              sd_within: float) -> list[list[float]]:
    return [list(level * np.exp(rng.normal(0, sd_between) + rng.normal(0, sd_within, runs))) for _ in range(starts)]


def simulate(sd_between: float, sd_within: float, runs: list[int], caps: list[int], effects: list[float],
             trials: int, seed: int = 1) -> str:
    lines = [f"simulated: start effect sd {100 * sd_between:.1f}%, run-to-run sd {100 * sd_within:.1f}% (log-normal), "
             f"{trials} sequential runs per cell; looks at 3..cap starts per side, alpha 0.02, min effect 3%", "",
             "| runs/start | cap | change | regressed | unchanged | inconclusive | mean starts/side |",
             "|---|---|---|---|---|---|---|"]
    rng = np.random.default_rng(seed)
    for r in runs:
        for cap in caps:
            looks = tuple(range(3, cap + 1))
            for effect in effects:
                verdicts, used = [], []
                for _ in range(trials):
                    a = draw_side(rng, 100.0, cap, r, sd_between, sd_within)
                    b = draw_side(rng, 100.0 * (1 - effect), cap, r, sd_between, sd_within)
                    for k in looks:
                        v = compare_starts(f"single.{METRIC}", a[:k], b[:k], looks=looks)
                        if settled(v) or k == cap:
                            verdicts.append(v.verdict)
                            used.append(k)
                            break
                share = {k: 100 * verdicts.count(k) / trials for k in ("regressed", "unchanged", "inconclusive")}
                change = f"{-100 * effect:+.0f}%" if effect else "0 (A/A)"
                lines.append(f"| {r} | {cap} | {change} | {share['regressed']:.1f}% | "
                             f"{share['unchanged']:.1f}% | {share['inconclusive']:.1f}% | {np.mean(used):.1f} |")
    return "\n".join(lines)


def simulate_errors(rates: list[float], requests: list[int], trials: int, seed: int = 2) -> str:
    """The error verdict under A/A (both sides fail at the same rate) and at 2x / 5x the rate on B."""
    rng = np.random.default_rng(seed)
    lines = [f"simulated error counts (binomial), {trials} comparisons per cell: share called regressed "
             "(and inconclusive)", "", "| error rate A | requests/side | B = A | B = 2x A | B = 5x A |",
             "|---|---|---|---|---|"]
    for rate in rates:
        for n in requests:
            cells = []
            for factor in (1, 2, 5):
                verdicts = [compare_errors("w.errors", int(rng.binomial(n, rate)), n,
                                           int(rng.binomial(n, min(1.0, rate * factor))), n).verdict
                            for _ in range(trials)]
                cells.append(f"{100 * verdicts.count('regressed') / trials:.1f}% "
                             f"({100 * verdicts.count('inconclusive') / trials:.0f}%)")
            lines.append(f"| {100 * rate:g}% | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gpu_replay(path: Path, caps: list[int], runs_list: list[int]) -> str:
    """The sequential gate replayed on the H100 calibration runs (bench/data/gpu_calib_h100.csv: each
    round starts every config once, 4 one-stream runs per start). Independent blocks of rounds within
    each run; A/A = the default's two labels (base.1 vs base.2) of the same rounds; "5% shift" = the
    same with B's runs x 0.95 (real noise, a known change); real pairs = another config vs the default."""
    import csv

    starts: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
    for row in csv.DictReader(path.open()):
        if row["status"] != "ok":
            continue
        by_round = starts.setdefault(row["run"], {}).setdefault(row["label"], {})
        cell = by_round.setdefault(int(row["start"]), {"runs": [], "t": []})
        cell["runs"].append(float(row["tok_s"]))
        cell["t"].append(float(row["unix_time"]))
    for labels in starts.values():
        for rounds in labels.values():
            for cell in rounds.values():
                cell["seconds"] = max(cell["t"]) - min(cell["t"]) + 1.0  # + about a second to start
    comparisons: dict[str, list[tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]]] = {}
    for run, labels in sorted(starts.items()):
        base = labels.get("base.1") or labels.get("base")
        if base is None:
            continue
        if "base.2" in labels:
            comparisons.setdefault("A/A (default vs default)", []).append((base, labels["base.2"]))
            shifted = {k: {**v, "runs": [x * 0.95 for x in v["runs"]]} for k, v in labels["base.2"].items()}
            comparisons.setdefault("default vs default x 0.95", []).append((base, shifted))
        for label, rounds in labels.items():
            if not label.startswith("base"):
                comparisons.setdefault(f"{label} (run {run})", []).append((base, rounds))
    lines = [f"{path.name}: sequential gate (looks at 3..cap starts per side, alpha 0.02, min effect 3%) on "
             "independent blocks of rounds", "",
             "| comparison | true change (all rounds) | cap | runs/start | reps | regressed | improved | unchanged | "
             "inconclusive | mean starts/side | mean min per rep |", "|---" * 11 + "|"]
    for name, pairs in comparisons.items():
        a_all = [r["runs"] for a, b in pairs for k, r in a.items() if k in b]
        b_all = [r["runs"] for a, b in pairs for k, r in b.items() if k in a]
        truth = compare_starts(f"single.{METRIC}", a_all, b_all)
        true_txt = f"{truth.change_pct:+.1f}% ({100 * (truth.ci_low - 1):+.1f}..{100 * (truth.ci_high - 1):+.1f})"
        for cap in caps:
            for runs in runs_list:
                reps = [r for a, b in pairs for r in replay(a, b, cap, runs)]
                n = len(reps)
                count = {k: sum(r["verdict"] == k for r in reps) for k in ("regressed", "improved", "unchanged",
                                                                           "inconclusive")}
                aa = name.startswith("A/A") or truth.ci_low <= 1 <= truth.ci_high
                mean_starts = np.mean([r["starts"] for r in reps]) if reps else math.nan
                mean_min = np.mean([r["seconds"] for r in reps]) / 60 if reps else math.nan
                lines.append(f"| {name} | {true_txt} | {cap} | {runs} | {n} | "
                             f"{fmt_rate(count['regressed'], n, aa)} | {fmt_rate(count['improved'], n, True)} | "
                             f"{count['unchanged']}/{n} | {count['inconclusive']}/{n} | {mean_starts:.1f} | "
                             f"{mean_min:.1f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", default="bench/data/calibration_cpu_llama.json")
    m.add_argument("--minutes", type=float, default=15.0, help="stop starting rounds after this long")
    m.add_argument("--max-rounds", type=int, default=200)
    m.add_argument("--max-tokens", type=int, default=32)
    m.add_argument("--runs", type=int, default=3, help="measured runs per start")
    m.add_argument("--arms", default="A,A2,T5,T10,T20")
    m.add_argument("--quality-arms", default="", help="arms whose starts also run the smoke suite")
    m.add_argument("--quality-rounds", type=int, default=1000, help="... in the first N rounds only")
    m.add_argument("--max-warmups", type=int, default=4, help="steady-state warmup cap per start")
    a = sub.add_parser("analyze")
    a.add_argument("paths", nargs="+")
    a.add_argument("--caps", default="6,10")
    a.add_argument("--runs", default="1,3", help="runs per start to replay with (the first r of each start)")
    s = sub.add_parser("simulate")
    s.add_argument("--sd-between", type=float, required=True)
    s.add_argument("--sd-within", type=float, required=True)
    s.add_argument("--runs", default="1,3")
    s.add_argument("--caps", default="6,10")
    s.add_argument("--effects", default="0,0.05,0.10")
    s.add_argument("--trials", type=int, default=1000)
    e = sub.add_parser("errors", help="the error-rate verdict on simulated counts")
    e.add_argument("--rates", default="0.005,0.02,0.1")
    e.add_argument("--requests", default="100,1000")
    e.add_argument("--trials", type=int, default=2000)
    g = sub.add_parser("gpu", help="replay the gate on the H100 calibration CSV")
    g.add_argument("path", nargs="?", default=str(REPO / "bench" / "data" / "gpu_calib_h100.csv"))
    g.add_argument("--caps", default="6,10")
    g.add_argument("--runs", default="1,4")
    args = p.parse_args()
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    if args.cmd == "measure":
        measure(Path(args.out), args.minutes, args.max_rounds, args.max_tokens, args.runs, args.arms.split(","),
                [x for x in args.quality_arms.split(",") if x], args.quality_rounds, args.max_warmups)
        print(analyze([Path(args.out)], [6, 10], sorted({1, args.runs})))
    elif args.cmd == "analyze":
        print(analyze([Path(x) for x in args.paths], ints(args.caps), ints(args.runs)))
    elif args.cmd == "gpu":
        print(gpu_replay(Path(args.path), ints(args.caps), ints(args.runs)))
    elif args.cmd == "errors":
        print(simulate_errors([float(x) for x in args.rates.split(",")], ints(args.requests), args.trials))
    else:
        print(simulate(args.sd_between, args.sd_within, ints(args.runs), ints(args.caps),
                       [float(x) for x in args.effects.split(",")], args.trials))
    return 0


if __name__ == "__main__":
    sys.exit(main())
