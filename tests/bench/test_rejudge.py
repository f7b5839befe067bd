"""bench.calibrate rejudge on the committed demos (no engine): both tests on the same rounds."""

from __future__ import annotations

from pathlib import Path

from bench.calibrate import rejudge

DATA = Path(__file__).resolve().parents[2] / "bench" / "data"


def test_demo_h_control_missed_by_the_paired_test_is_found_by_the_blocked_one() -> None:
    text = rejudge.table([DATA / "demo_confirmations_20261128.json"])
    row = next(line for line in text.splitlines() if line.startswith("| H |") and "control1" in line)
    assert "0.87x (0.74-1.02) inconclusive | 0.87x (0.76-0.99) regressed" in row, row
    assert "- H: paired: verdict withheld" in text and "blocked: no config is distinguishable" in text
    # The continued demo M: its stored plan of looks (5..7) is read from its verdicts' note.
    assert any(line.startswith("| M | 7 (5..7)") for line in text.splitlines()), text
