"""bench/release_sweep.py's bookkeeping (no engine; under a second): the order of the releases in a
round, and each fresh start summarized with its load and position."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import release_sweep  # noqa: E402

VERSIONS = ["0.28.0", "0.29.0", "0.30.0"]


def test_round_order() -> None:
    assert release_sweep.round_order(VERSIONS, 0, "alternate") == VERSIONS
    assert release_sweep.round_order(VERSIONS, 1, "alternate") == VERSIONS[::-1]
    assert release_sweep.round_order(VERSIONS, 2, "alternate") == VERSIONS
    assert release_sweep.round_order(VERSIONS, 0, "reverse") == VERSIONS[::-1]
    assert release_sweep.round_order(VERSIONS, 1, "forward") == VERSIONS


def test_per_start() -> None:
    rows = [{"version": "0.28.0", "round": "1", "position": "0", "loadavg_1m_before": "3.5", "output_tok_s": str(v),
             "error": ""} for v in (10.0, 12.0, 11.0)]
    rows += [{"version": "0.28.0", "round": "2", "position": "4", "loadavg_1m_before": "1.0", "output_tok_s": "",
              "error": "oom: killed"}]
    rows += [{"version": "0.29.0", "round": "1", "position": "1", "loadavg_1m_before": "9", "output_tok_s": "5",
              "error": ""}]
    starts = release_sweep.per_start(rows, "0.28.0")
    assert starts["1"]["median"] == 11.0 and starts["1"]["n"] == 3 and starts["1"]["position"] == 0
    assert starts["1"]["loadavg_1m_before"] == 3.5 and starts["1"]["ci_low"] <= 11.0 <= starts["1"]["ci_high"]
    assert starts["2"]["error"].startswith("failed: oom") and "median" not in starts["2"]
