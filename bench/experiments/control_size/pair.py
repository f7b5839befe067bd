"""How large the demo's 10% positive control is on this host: the default against the default behind
harness/launch/throttle.py --stretch FRACTION, each on a fresh start, three runs a start, in rounds whose
order alternates: bench/experiments/confirm_design/measure.py's measurement with another fraction.

    python -m bench.experiments.control_size.pair ROUNDS [FRACTION]

Prints each round's runs and the ratio of the control's geometric mean to the default's (rows in
rows_FRACTION.json here). A FRACTION of 1e-9 measures the proxy without its delay."""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

from bench.experiments.confirm_design.measure import main as measure_rounds

HERE = Path(__file__).parent


def geo(values: list[float]) -> float:
    return math.exp(statistics.mean(math.log(v) for v in values))


def main(rounds: int, fraction: float) -> None:
    rows = measure_rounds(rounds, 3, slowdown=fraction, out=HERE / f"rows_{fraction:g}.json")
    ratios = []
    for r in range(rounds):
        runs = {row["arm"]: row["runs"] for row in rows if row["round"] == r}
        ratios.append(geo(runs["control"]) / geo(runs["default"]))
        print(r, runs["default"], runs["control"], round(ratios[-1], 3), flush=True)
    print(f"control / default, geometric mean over {rounds} rounds: {geo(ratios):.3f} (nominal {1 - fraction:.3f})")


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.1)
