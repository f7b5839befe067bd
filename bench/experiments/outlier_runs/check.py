"""Would a rule that flags one run among 3-4 of a start help the gate? A run is flagged when it lies more than
SHARE from the median of the start's other runs and more than Z times their range. For every committed live
calibration file: starts flagged, and the gate's paired noise per start with and without the flagged runs.

    .venv/bin/python -m bench.experiments.outlier_runs.check
"""

from __future__ import annotations

import glob
import json
import math
from pathlib import Path

import numpy as np

from bench.calibrate.confirmations import centered, pooled_sd
from search.verdicts.sequential import start_values

SHARE, Z = 0.10, 5.0


def flagged(runs: list[float]) -> list[int]:
    out = []
    for i, v in enumerate(runs):
        others = [w for j, w in enumerate(runs) if j != i]
        med, spread = float(np.median(others)), max(others) - min(others)
        if abs(v - med) > SHARE * med and abs(v - med) > Z * spread:
            out.append(i)
    return out


def kept(runs: list[float], drop: bool) -> list[float]:
    return [v for i, v in enumerate(runs) if not (drop and 3 <= len(runs) <= 4 and i in flagged(runs))]


def paired_per_start(reps: list[dict], metric: str, drop: bool) -> tuple[float, int]:
    """The gate's paired noise per start and side (bench.calibrate's pooled paired residual), each
    start's value the mean log of its kept runs (search.verdicts.sequential.start_values)."""
    groups = []
    for rep in reps:
        a = start_values([kept(r, drop) for r in rep["run"]["a"]["runs"][metric]])
        b = start_values([kept(r, drop) for r in rep["run"]["b"]["runs"][metric]])
        groups.append(centered([y - x for x, y in zip(a, b, strict=False)]))
    sd, df = pooled_sd(groups)
    return sd / math.sqrt(2), df


def main() -> None:
    print("| file | starts (3-4 runs) | flagged | paired noise per start: all runs | without flagged | df |")
    print("|---|---|---|---|---|---|")
    for path in sorted(glob.glob("bench/data/*.json")):
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or "reps" not in data:
            continue
        metric = data["metric"]
        starts = [runs for rep in data["reps"] for side in "ab" for runs in rep["run"][side]["runs"].get(metric, [])
                  if 3 <= len(runs) <= 4]
        if not starts:
            continue
        n_flag = sum(bool(flagged(r)) for r in starts)
        all_runs, df = paired_per_start(data["reps"], metric, False)
        dropped, _ = paired_per_start(data["reps"], metric, True)
        print(f"| {Path(path).name} | {len(starts)} | {n_flag} | {100 * all_runs:.2f}% | {100 * dropped:.2f}% "
              f"| {df} |")


if __name__ == "__main__":
    main()
