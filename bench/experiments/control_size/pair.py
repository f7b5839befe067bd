"""How large the demo's 10% positive control is on this host: the default against the default behind
harness/throttle.py --stretch 0.1, each on a fresh start, three runs a start, in rounds whose order
alternates (the confirmation's own measurement: search/confirm.py measure_fresh).

    python -m bench.experiments.control_size.pair ROUNDS [FRACTION]

Prints each round's runs and the ratio of the control's geometric mean to the default's. A
FRACTION of 1e-9 measures the proxy without its delay."""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
from pathlib import Path

from bench.common import default_params
from harness import Session
from search.confirm import measure_fresh
from search.space import load_space

ROOT = Path(__file__).resolve().parents[3]


def geo(values: list[float]) -> float:
    return math.exp(statistics.mean(math.log(v) for v in values))


def main(rounds: int, fraction: float) -> None:
    space = load_space(ROOT / "spaces" / "smollm2-cpu.yaml")
    params = default_params(space)
    ratios = []
    for r in range(rounds):
        runs: dict[str, list[float]] = {}
        for arm in (("default", "control") if r % 2 == 0 else ("control", "default")):
            with Session(keep_server=False) as session:
                runs[arm], _ = measure_fresh(session, space, params, Path(tempfile.mkdtemp()),
                                             slowdown=fraction if arm == "control" else None, repeats=3)
        ratios.append(geo(runs["control"]) / geo(runs["default"]))
        print(r, [round(x, 1) for x in runs["default"]], [round(x, 1) for x in runs["control"]],
              round(ratios[-1], 3), flush=True)
    print(f"control / default, geometric mean over {rounds} rounds: {geo(ratios):.3f} (nominal {1 - fraction:.3f})")


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.1)
