"""bench/experiments/confirm_design/design.py: the fit behind the confirmation's design
(docs/search.md, "What a confirmation can see on a host that changes speed")."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from bench.experiments.confirm_design.design import components, position_means

HERE = Path(__file__).resolve().parents[2] / "bench" / "experiments" / "confirm_design"


def synthetic(run_sd: float, start_sd: float, round_sd: float, rounds: int, runs: int, control: float,
              position: float = 0.0, seed: int = 1) -> list[dict]:
    """Rows as measure.py writes them, from the model design.py fits (log scale): arm + round +
    start + run, with an optional trend per run position."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in range(rounds):
        shared = rng.normal(0, round_sd)
        for arm, mu in (("default", 0.0), ("control", control)):
            level = math.log(100.0) + mu + shared + rng.normal(0, start_sd)
            logs = level + position * np.arange(runs) + rng.normal(0, run_sd, runs)
            rows.append({"round": n, "arm": arm, "runs": np.exp(logs).tolist(), "wall_s": 50.0})
    return rows


def test_the_fit_recovers_the_components_it_models() -> None:
    c = components(synthetic(run_sd=0.08, start_sd=0.04, round_sd=0.05, rounds=400, runs=5, control=math.log(0.9)))
    assert abs(c["run_sd"] - 0.08) < 0.005 and abs(c["start_sd"] - 0.04) < 0.01 and abs(c["round_sd"] - 0.05) < 0.01
    assert abs(c["control_ratio"] - 0.9) < 0.01 and c["runs"] == 5
    _, slope, half = position_means(synthetic(0.08, 0.0, 0.0, 100, 5, 0.0))
    assert abs(slope) < half  # no trend modelled, none found
    _, slope, half = position_means(synthetic(0.08, 0.0, 0.0, 100, 5, 0.0, position=-0.03))
    assert slope + half < 0 and abs(slope + 0.03) < 0.01  # a 3%-per-run fall is found


def test_the_committed_rows_give_the_published_components() -> None:
    """The numbers docs/search.md and the demo space quote, from the committed rows."""
    control = components(json.loads((HERE / "rows.json").read_text()))
    assert [round(100 * control[k], 1) for k in ("run_sd", "start_sd", "round_sd", "diff_sd")] == [6.4, 3.9, 5.0, 6.9]
    assert round(control["control_ratio"], 2) == 0.83
    aa = components(json.loads((HERE / "rows_aa.json").read_text()))
    assert [round(100 * aa[k], 1) for k in ("run_sd", "start_sd", "round_sd", "diff_sd")] == [8.0, 0.0, 3.0, 4.9]
    for name in ("rows.json", "rows_aa.json"):
        _, slope, half = position_means(json.loads((HERE / name).read_text()))
        assert slope - half < 0 < slope + half, name  # no run-position trend
