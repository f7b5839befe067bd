"""Run-to-run and between-start spread of window_length rows files: python spread.py rows_*.json"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path


def spread(path: Path) -> str:
    rows = [r for r in json.loads(path.read_text()) if not r["excluded"]]
    within, out_within, means = [], [], []
    for start in sorted({r["start"] for r in rows}):
        dec = [math.log(r["dec"]) for r in rows if r["start"] == start]
        out = [math.log(r["out"]) for r in rows if r["start"] == start]
        within.append(statistics.stdev(dec))
        out_within.append(statistics.stdev(out))
        means.append(statistics.mean(dec))
    between = 100 * statistics.stdev(means)
    return (f"{path.name}: run-to-run decode_tok_s {100 * statistics.mean(within):.2f}%, output_tok_s "
            f"{100 * statistics.mean(out_within):.2f}%; between-start sd of decode means {between:.2f}%")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(spread(Path(name)))
