"""The interleave experiment's table (bench/experiments/interleave/run.py) on its committed rounds: the designs
alternate in pairs of rounds, every start has its runs, and the table's per-start noise is the rounds'
difference sd / sqrt 2, each design apart."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from bench.experiments.interleave import run

RESULTS = Path(run.__file__).parent / "results.json"


def test_the_committed_rounds_alternate_designs_and_the_table_is_their_paired_spread() -> None:
    data = json.loads(RESULTS.read_text())
    rounds = data["rounds"]
    assert [r["design"] for r in rounds] == [("block", "alternated")[(n // 2) % 2] for n in range(len(rounds))]
    assert all(len(r["A"]) == len(r["A2"]) == data["runs"] for r in rounds)
    table = run.summary(rounds).splitlines()
    for design in ("block", "alternated"):
        d = [float(np.mean(np.log(r["A2"])) - np.mean(np.log(r["A"]))) for r in rounds if r["design"] == design]
        (row,) = [line for line in table if line.startswith(f"| {design} |")]
        assert row.split(" | ")[2] == f"{100 * float(np.std(d, ddof=1)) / math.sqrt(2):.2f}%", row
    assert (Path(run.__file__).parent / "results.txt").read_text().strip() == run.summary(rounds)
