"""The run-to-run spread per window length in rows.json (measure.py): the sd of log decode_tok_s
over the runs of the one start, its median, and the window's seconds."""

from __future__ import annotations

import json
import statistics
from math import log
from pathlib import Path


def main() -> None:
    rows = json.loads((Path(__file__).parent / "rows.json").read_text())
    print("| window (tokens per stream) | runs | window s (median) | decode_tok_s median (min-max) | run-to-run sd |")
    print("|---|---|---|---|---|")
    for n in sorted({r["max_tokens"] for r in rows}):
        dec = [r["dec"] for r in rows if r["max_tokens"] == n and not r["excluded"]]
        win = [r["window_s"] for r in rows if r["max_tokens"] == n]
        sd = statistics.stdev(log(d) for d in dec)
        print(f"| {n} | {len(dec)} | {statistics.median(win):.1f} | {statistics.median(dec):.0f} "
              f"({min(dec):.0f}-{max(dec):.0f}) | {100 * sd:.1f}% |")


if __name__ == "__main__":
    main()
