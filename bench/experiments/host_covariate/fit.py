"""How much of the runs' spread each probe explains (a rows file from measure.py): log decode_tok_s
against the log of a probe's mean time in the run, least squares. probe0/probe1: the integer loop on
core 0 / core 1; probe2 (rows files from 2026-11-29 on): the 64 MiB read on core 1.

    python -m bench.experiments.host_covariate.fit [ROWS_FILE]"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

NAMES = {"probe0_ms": "loop, core 0", "probe1_ms": "loop, core 1", "probe2_ms": "64 MiB read, core 1"}


def main(name: str) -> None:
    rows = json.loads((Path(__file__).parent / name).read_text())
    probes = [k for k in NAMES if all(r.get(k) for r in rows if r["dec"] > 0)]
    rows = [r for r in rows if r["dec"] > 0]
    y = np.log([r["dec"] for r in rows])
    print(f"{name}: {len(rows)} runs; decode_tok_s sd {100 * y.std(ddof=1):.1f}% (log), "
          f"median {math.exp(float(np.median(y))):.1f}")
    for key in probes:
        lx = np.log([r[key] for r in rows])
        slope, icpt = np.polyfit(lx, y, 1)
        resid = y - (slope * lx + icpt)
        r = float(np.corrcoef(lx, y)[0, 1])
        print(f"{NAMES[key]}: probe sd {100 * lx.std(ddof=1):.1f}%, r {r:+.2f}, slope {slope:+.2f}, "
              f"residual sd {100 * resid.std(ddof=2):.1f}%")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "rows.json")
