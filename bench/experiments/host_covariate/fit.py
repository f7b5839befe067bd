"""How much of the runs' spread the probe explains (rows.json from measure.py): log decode_tok_s
against the log of each core's mean probe time in the run, least squares.

    python -m bench.experiments.host_covariate.fit"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np


def main() -> None:
    rows = [r for r in json.loads((Path(__file__).parent / "rows.json").read_text())
            if r["dec"] > 0 and r["probe0_ms"] and r["probe1_ms"]]
    y = np.log([r["dec"] for r in rows])
    print(f"{len(rows)} runs; decode_tok_s sd {100 * y.std(ddof=1):.1f}% (log), "
          f"median {math.exp(float(np.median(y))):.1f}")
    for name, x in (("core 0", [r["probe0_ms"] for r in rows]), ("core 1", [r["probe1_ms"] for r in rows]),
                    ("both", [(r["probe0_ms"] * r["probe1_ms"]) ** 0.5 for r in rows])):
        lx = np.log(x)
        slope, icpt = np.polyfit(lx, y, 1)
        resid = y - (slope * lx + icpt)
        r = float(np.corrcoef(lx, y)[0, 1])
        print(f"{name}: probe sd {100 * lx.std(ddof=1):.1f}%, r {r:+.2f}, slope {slope:+.2f}, "
              f"residual sd {100 * resid.std(ddof=2):.1f}%; y + log(probe) sd {100 * (y + lx).std(ddof=1):.1f}%")


if __name__ == "__main__":
    main()
