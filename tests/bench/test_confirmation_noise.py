"""bench.calibrate confirmations: the paired noise of stored confirmation rounds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.calibrate.confirmations import residuals, table


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
