"""The gate replayed on stored calibration data: the CPU rounds files of the earlier measure tool
(every arm started once per round, rotated; bench/data/calibration_cpu_llama_*.json), this tool's
live-ab files (bench.calibrate.live) and the H100 calibration CSV (bench/data/gpu_calib_h100.csv).
Rates come with one-sided 95% Clopper-Pearson bounds on the number of independent repetitions."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.calibrate.confirmations import centered, pooled_sd
from bench.calibrate.gate import final_verdict, fmt_rate, sequential
from harness.measure.stats import variance_components
from search.regress.ab import SequentialPlan
from search.verdicts.gate import MetricVerdict
from search.verdicts.sequential import compare_errors, compare_quality, sequential_p_threshold, starts_needed

METRIC = "decode_tok_s"


def truth(metric: str, runs_a: Sequence[Sequence[float]], runs_b: Sequence[Sequence[float]]) -> MetricVerdict:
    """The gate's estimate from every round: the change and its 95% interval."""
    n = min(len(runs_a), len(runs_b))
    return final_verdict(metric, runs_a[:n], runs_b[:n], SequentialPlan((metric,), max_rounds=n, min_rounds=n,
                                                                         alpha=0.05))


def by_arm(data: dict[str, Any]) -> dict[str, dict[int, dict[str, Any]]]:
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for row in data["starts"]:
        if row.get("runs") and all(v and v > 0 for v in row["runs"]):
            out.setdefault(row["arm"], {})[row["round"]] = row
    return out


def replay(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]], cap: int, runs: int) -> list[dict[str, Any]]:
    """`search ab --rounds cap` over consecutive, non-overlapping blocks of rounds (time order): each
    block is one independent repetition, ending where the stop rule ended it. A last block that ran
    out of rounds before the rule or the cap ended it is not a repetition."""
    rounds = sorted(set(a) & set(b))
    reps, i = [], 0
    while i < len(rounds):
        block = rounds[i:i + cap]
        o = sequential(f"single.{METRIC}", [a[r]["runs"][:runs] for r in block], [b[r]["runs"][:runs] for r in block],
                       cap)
        if not o.stopped and len(block) < cap:
            break
        used = block[:o.rounds]
        seconds = sum(a[r].get("seconds", 0) + b[r].get("seconds", 0) for r in used)
        reps.append({"verdict": o.verdict, "starts": o.rounds, "change_pct": o.change_pct, "seconds": seconds,
                     "first_round": block[0]})
        i += o.rounds
    return reps


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
            v = truth(f"single.{METRIC}", [base[r]["runs"] for r in common], [rows[r]["runs"] for r in common])
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
    errs: dict[str, list[int]] = {}
    for row in data["starts"]:
        e = errs.setdefault(row["arm"], [0, 0])
        e[0] += row.get("errors", 0)
        e[1] += row.get("requests", 0)
    lines = ["| arm | failed requests | requests | verdict vs A (Fisher, rates) |", "|---|---|---|---|"]
    for arm, (failed, n) in errs.items():
        v = compare_errors("single.errors", errs["A"][0], errs["A"][1], failed, n).verdict if arm != "A" else "-"
        lines.append(f"| {arm} | {failed} | {n} | {v} |")
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


def gpu_replay(path: Path, caps: list[int], runs_list: list[int]) -> str:
    """The sequential gate replayed on the H100 calibration runs (bench/data/gpu_calib_h100.csv,
    measured by the earlier GPU tool: each
    round starts every config once, 4 one-stream runs per start). Independent blocks of rounds within
    each run; A/A = the default's two labels (base.1 vs base.2) of the same rounds; "5% shift" = the
    same with B's runs x 0.95 (real noise, a known change); real pairs = another config vs the default."""
    starts: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
    for row in csv.DictReader(path.open()):
        if row["status"] != "ok":
            continue
        by_round = starts.setdefault(row["run"], {}).setdefault(row["label"], {})
        cell = by_round.setdefault(int(row["start"]), {"runs": [], "t": []})
        cell["runs"].append(float(row.get("decode_tok_s") or row["tok_s"]))  # the decode window where recorded
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
        true = truth(f"single.{METRIC}", a_all, b_all)
        true_txt = f"{true.change_pct:+.1f}% ({100 * (true.ci_low - 1):+.1f}..{100 * (true.ci_high - 1):+.1f})"
        for cap in caps:
            for runs in runs_list:
                reps = [r for a, b in pairs for r in replay(a, b, cap, runs)]
                n = len(reps)
                count = {k: sum(r["verdict"] == k for r in reps) for k in ("regressed", "improved", "unchanged",
                                                                           "inconclusive")}
                aa = name.startswith("A/A") or true.ci_low <= 1 <= true.ci_high
                mean_starts = np.mean([r["starts"] for r in reps]) if reps else math.nan
                mean_min = np.mean([r["seconds"] for r in reps]) / 60 if reps else math.nan
                lines.append(f"| {name} | {true_txt} | {cap} | {runs} | {n} | "
                             f"{fmt_rate(count['regressed'], n, aa)} | {fmt_rate(count['improved'], n, True)} | "
                             f"{count['unchanged']}/{n} | {count['inconclusive']}/{n} | {mean_starts:.1f} | "
                             f"{mean_min:.1f} |")
    return "\n".join(lines)


def analyze_live(paths: list[Path]) -> str:
    """A live-ab measure file: each repetition is one `search ab` verdict, so the rates are direct."""
    reps = [r for path in paths for r in json.loads(path.read_text())["reps"]]
    first = json.loads(paths[0].read_text())
    metric = first["metric"]
    lines = [f"{', '.join(p.name for p in paths)}: {len(reps)} repetitions of `search ab` (cap {first['cap']} "
             f"rounds, min effect {100 * first['min_effect']:.0f}%, alpha {first['alpha']}), started "
             f"{first['started']}", "",
             "| comparison | reps | regressed | improved | unchanged | inconclusive | mean rounds | mean min per rep |",
             "|---|---|---|---|---|---|---|---|"]
    for a, b in dict.fromkeys((r["a"], r["b"]) for r in reps):
        mine = [r for r in reps if (r["a"], r["b"]) == (a, b)]
        n, aa = len(mine), {a, b} <= {"A", "A2"}
        count = {k: sum(r["verdict"] == k for r in mine) for k in ("regressed", "improved", "unchanged",
                                                                   "inconclusive")}
        lines.append(f"| {a} vs {b} | {n} | {fmt_rate(count['regressed'], n, aa)} | "
                     f"{fmt_rate(count['improved'], n, True)} | {count['unchanged']}/{n} | {count['inconclusive']}/{n} "
                     f"| {np.mean([r['rounds'] for r in mine]):.1f} "
                     f"| {np.mean([r['seconds'] for r in mine]) / 60:.1f} |")
    lines += ["", "Paired noise (what the gate sees): within each repetition, the log difference B - A of the "
              "start means of a round, around that repetition's mean difference; pooled over repetitions.", "",
              "| comparison | rounds | df | mean change | per start, each side | run to run | between starts |",
              "|---|---|---|---|---|---|---|"]
    for a, b in dict.fromkeys((r["a"], r["b"]) for r in reps):
        pn = paired_noise([r for r in reps if (r["a"], r["b"]) == (a, b)], metric)
        if pn is not None:
            lines.append(f"| {a} vs {b} | {pn.rounds} | {pn.df} | {100 * pn.mean_change:+.1f}% | "
                         f"{100 * pn.per_start:.2f}% | {100 * pn.run_to_run:.2f}% | {100 * pn.between:.2f}% |")
    lines += ["", "| arm | starts | sd between starts | sd run to run |", "|---|---|---|---|"]
    starts: dict[str, list[list[float]]] = {}
    for r in reps:
        for key, side in (("a", r["a"]), ("b", r["b"])):
            starts.setdefault(side, []).extend(r["run"][key]["runs"].get(metric, []))
    for arm, runs in starts.items():
        vc = variance_components(runs)
        lines.append(f"| {arm} | {vc.starts} | {100 * vc.sd_between:.1f}% | {100 * vc.sd_within:.1f}% |")
    return "\n".join(lines)


@dataclass(frozen=True)
class PairedNoise:
    rounds: int
    df: int  # rounds minus one per repetition (each repetition's mean difference is estimated)
    mean_change: float  # mean over repetitions of the mean log difference B - A
    per_start: float  # sd of a round's paired log difference / sqrt(2): one start's share, each side
    run_to_run: float  # pooled sd of log runs within a start
    between: float  # per_start with the run-to-run share of a start's mean removed (0 when it explains all)


def paired_noise(reps: list[dict[str, Any]], metric: str) -> PairedNoise | None:
    """The noise the paired gate works on, from live repetitions: the inputs of `bench.calibrate
    simulate --sd-between --sd-within` (docs/calibration.md uses these numbers)."""
    groups: list[list[float]] = []
    changes: list[float] = []
    starts: list[list[float]] = []
    for rep in reps:
        a, b = rep["run"]["a"]["runs"].get(metric, []), rep["run"]["b"]["runs"].get(metric, [])
        diffs = [math.log(float(np.mean(y))) - math.log(float(np.mean(x))) for x, y in zip(a, b, strict=False)]
        if len(diffs) < 2:
            continue
        changes.append(float(np.mean(diffs)))
        groups.append(centered(diffs))
        starts += [*a, *b]
    sd, df = pooled_sd(groups)
    if df == 0:
        return None
    per_start = sd / math.sqrt(2)
    runs = variance_components(starts)
    run_to_run = runs.sd_within
    between = math.sqrt(max(0.0, per_start ** 2 - run_to_run ** 2 / (runs.runs / runs.starts)))
    return PairedNoise(sum(len(g) for g in groups), df, float(np.mean(changes)), per_start, run_to_run, between)
