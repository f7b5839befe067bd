"""How a confirmation's noise splits between runs, starts and rounds on this host: the demo's
confirmation exactly (the default and its 10% positive control, fresh starts, interleaved in
rounds whose order alternates, the demo's four-stream 128-token workload), with RUNS measured runs
per start instead of one, so that the spread of runs within a start, of starts within an arm and
of what a round shares between both arms can be told apart.

    python -m bench.experiments.confirm_design.measure ROUNDS RUNS [aa]

Writes rows.json beside it (one row per start); design.py fits the components and simulates the
designs a demo could afford (docs/search.md, "The confirmation's design"). With `aa` the second
arm is the default again, served directly (rows_aa.json): the spread of a round's difference
without the control's proxy, which runs beside the server on the same two cores."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import default_params
from harness import Session
from harness.host.hostload import LoadMeter
from search.space.space import load_space
from search.study.fresh_start import measure_fresh

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).parent


def main(rounds: int, runs: int, aa: bool = False, slowdown: float | None = None,
         out: Path | None = None) -> list[dict[str, Any]]:
    """`slowdown`: the control's fraction instead of the demo's; `out`: the rows' file instead of rows.json."""
    space = load_space(ROOT / "spaces" / "smollm2-cpu.yaml")
    default = default_params(space)
    slowdown = slowdown if slowdown is not None else float(space.m.confirm.controls[0]["slowdown"])
    arms = [("default", None), ("default2", None) if aa else ("control", slowdown)]
    out = out or HERE / ("rows_aa.json" if aa else "rows.json")
    tmp = Path(tempfile.mkdtemp())
    rows: list[dict[str, Any]] = []
    with Session(keep_server=False) as session:
        for rnd in range(rounds):
            for label, slow in (arms if rnd % 2 == 0 else arms[::-1]):
                meter = LoadMeter().start()
                began = time.monotonic()
                values = measure_fresh(session, space, default, tmp / f"r{rnd}-{label}", slow, runs).values
                load = meter.stop()
                rows.append({"round": rnd, "arm": label, "runs": [round(v, 2) for v in values],
                             "wall_s": round(time.monotonic() - began, 1), "probe_ms": load.probe_ms,
                             "foreign_cores": round(load.foreign_cores, 3), "t": round(time.time(), 1)})
                print(rows[-1], flush=True)
                out.write_text(json.dumps(rows, indent=0))
    return rows


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] == ["aa"])
