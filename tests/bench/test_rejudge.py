"""bench.calibrate rejudge on the committed demos (no engine): the stored verdicts beside today's test."""

from __future__ import annotations

from pathlib import Path

from bench.calibrate import rejudge

DATA = Path(__file__).resolve().parents[2] / "bench" / "data"


def test_stored_verdicts_are_judged_again_by_each_arms_own_differences() -> None:
    text = rejudge.table([DATA / "demo_confirmations_20261128.json", DATA / "demo_confirmations_20261129.json"])
    rows = text.splitlines()
    # Demo H was judged by the paired test when stored: judged now the same way, the same interval.
    h = next(line for line in rows if line.startswith("| H |") and "control1" in line)
    assert "0.87x (0.74-1.02) inconclusive | 0.87x (0.74-1.02) inconclusive | 1.00" in h, h
    # Demo Q was judged live with the arms' noise pooled: its winner's interval narrower than its own
    # differences allow; judged now, not confirmed.
    q = next(line for line in rows if line.startswith("| Q |") and "#8" in line)
    assert "1.12x (1.07-1.18) improved | 1.12x (0.98-1.27) inconclusive" in q, q
    assert "- Q: as stored: confirmed: #8" in text and "now: no config is distinguishable" in text
    # The continued demo M: its stored plan of looks (5..7) is read from its verdicts' note.
    assert any(line.startswith("| M | 7 (5..7)") for line in rows), text
