"""The paired noise of stored rounds: `bench.calibrate confirmations` (a study's confirmation) and
`bench.calibrate analyze` on live `search ab` repetitions."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench.calibrate.confirmations import residuals, table
from bench.calibrate.replay import paired_noise


def _arm(label: str, values: list[float]) -> dict[str, object]:
    return {"label": label, "runs": [[v] for v in values]}


def test_a_shared_round_shift_is_removed_and_one_slow_default_start_is_named(tmp_path: Path) -> None:
    """Both arms move together from round to round (removed by pairing); round 1's default start is
    20% slow, which shows in both comparisons and is the round left out of the trimmed line."""
    shift = [1.0, 1.05, 0.97, 1.02]
    default = [20.0 * s for s in shift]
    default[0] *= 0.8
    confirmation = {"arms": [_arm("default", default), _arm("#2", [50.0 * s for s in shift]),
                             _arm("control1", [18.0 * s for s in shift])]}
    r = residuals(confirmation)
    assert set(r) == {"#2", "control1"} and r["#2"] == pytest.approx(r["control1"])
    assert r["#2"][0] == pytest.approx(-math.log(0.8) * 3 / 4)  # the slow start, centred on its mean
    assert all(x == pytest.approx(0, abs=1e-12) for x in residuals(confirmation, drop_round=0)["#2"])
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"confirmations": [confirmation]}))
    text = table([path])
    assert "| c[0] | control1 | 4 | " in text and "without round 1 of c[0]" in text
    assert text.rstrip().endswith("0.0% (4 degrees of freedom), 0.0% per start and side")


def _rep(diffs: list[float], runs: int = 2, wobble: float = 0.0) -> dict[str, Any]:
    """A live repetition whose round r has B / A = exp(diffs[r]); runs of a start differ by +-wobble (log)."""
    def start(level: float) -> list[float]:
        return [level * math.exp(wobble * (1 if i % 2 else -1)) for i in range(runs)]
    return {"run": {"a": {"runs": {"m": [start(100.0) for _ in diffs]}},
                    "b": {"runs": {"m": [start(100.0 * math.exp(d)) for d in diffs]}}}}


def test_paired_noise_pools_the_centered_round_differences_of_every_repetition() -> None:
    # Rep 1: differences 0, +-1% around 0; rep 2: around +5%, +-2%. Sum of squares 0.0002 + 0.0008 over
    # 4 degrees of freedom: sd 1.58% a round, 1.12% a start on each side; runs identical, so all of it
    # is between starts.
    pn = paired_noise([_rep([0.01, -0.01, 0.0]), _rep([0.07, 0.03, 0.05])], "m")
    assert pn is not None and (pn.rounds, pn.df) == (6, 4)
    assert pn.mean_change == pytest.approx(0.025)
    assert pn.per_start == pytest.approx(math.sqrt(0.001 / 4) / math.sqrt(2))
    assert pn.run_to_run == pytest.approx(0.0, abs=1e-12) and pn.between == pytest.approx(pn.per_start)
    # Spread within starts only (every start's mean the same): run to run, nothing between starts.
    noisy = paired_noise([_rep([0.0, 0.0, 0.0], runs=2, wobble=0.02)], "m")
    assert noisy is not None and noisy.run_to_run == pytest.approx(0.02 * math.sqrt(2))
    assert noisy.per_start == pytest.approx(0.0, abs=1e-12) and noisy.between == 0.0
    assert paired_noise([_rep([0.01])], "m") is None  # one round: no spread to estimate
