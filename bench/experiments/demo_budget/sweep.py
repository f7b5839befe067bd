"""The demo's budget, replayed on the window tables (bench/demo_replay.py: demo_report): how often
the ranking's best is within 5% of the table's best median at four streams, per (trials, design
size) and start noise, over 100 seeds; the default is the demo space's.

    python -m bench.experiments.demo_budget.sweep TABLE.csv...

Prints one line per table and budget and writes results.json beside this file (1.5 min a table on
the 2-core VM). The demo's budget (spaces/smollm2-cpu.yaml) was chosen from it: docs/search.md."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from bench.common import default_params
from bench.demo_replay import demo_report
from search.space.space import load_space

ROOT = Path(__file__).resolve().parents[3]
BUDGETS = ((8, 4), (9, 4), (10, 4), (10, 5), (12, 5))
LEVELS = ("table", "0.05", "0.1")
SEEDS = 100


def main(tables: list[Path]) -> dict[str, dict[str, list[int]]]:
    # The demo's default, in the table's params (the tables have no speculative decoding).
    default = default_params(load_space(ROOT / "spaces" / "smollm2-cpu.yaml"), ("speculative_method",))
    out: dict[str, dict[str, list[int]]] = {}
    for table in tables:
        out[table.name] = {}
        for trials, design in BUDGETS:
            text = demo_report(table, default, list(LEVELS), SEEDS, trials=trials, design=design)
            # The ranking's best column (the first count of each row).
            shares = [int(n) for n in re.findall(rf"^\| [^|]+ \| (\d+) of {SEEDS} ", text, flags=re.M)]
            out[table.name][f"{trials} trials, design {design}"] = shares
            print(table.name, trials, design, dict(zip(LEVELS, shares, strict=True)), flush=True)
    return out


if __name__ == "__main__":
    result = main([Path(p) for p in sys.argv[1:]])
    path = Path(__file__).parent / "results.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**old, **result}, indent=1) + "\n")
