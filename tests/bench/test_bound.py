"""bench.calibrate.bound: the starts any paired test needs at a measured noise (computed, no engine)."""

from __future__ import annotations

import math

from bench.calibrate import bound


def test_the_known_noise_z_test_needs_the_textbook_count() -> None:
    # n = ((z_0.99 + z_0.95) * sqrt(2) * s / ln(1/0.95))^2 at s = 3%: (3.971 * 0.04243 / 0.05129)^2 = 10.79
    assert bound.z_starts(0.03, 0.05, 0.02, 0.95) == 11
    assert bound.z_power(0.03, 0.05, 0.02, 11) >= 0.95 > bound.z_power(0.03, 0.05, 0.02, 10)


def test_estimating_the_noise_and_looking_early_each_cost_starts() -> None:
    for s in (0.01, 0.021, 0.03):
        n = bound.need(s, 0.05, 0.02, 0.95, cap=10)
        assert n.t_starts is not None and n.z_starts <= n.t_starts
        assert n.gate_starts is None or n.t_starts <= n.gate_starts
        assert n.t_power <= n.z_power


def test_the_largest_noise_for_a_cap_is_where_the_z_test_needs_exactly_the_cap() -> None:
    s = bound.largest_noise(10, 0.05, 0.02, 0.95)
    assert bound.z_starts(s * 0.999, 0.05, 0.02, 0.95) <= 10 < bound.z_starts(s * 1.01, 0.05, 0.02, 0.95)
    assert math.isclose(bound.z_power(s, 0.05, 0.02, 10), 0.95, abs_tol=1e-6)


def test_the_table_names_what_no_test_can_do() -> None:
    text = bound.table([0.021, 0.0412], effect=0.05, cap=10)
    rows = [line for line in text.splitlines() if line.startswith("| 2.10%") or line.startswith("| 4.12%")]
    assert len(rows) == 2 and "> 20" in rows[1]  # the gate's plan cannot reach 95% within 20 rounds at 4.1%
    assert "at most 10 starts: 2.72%" in text  # at the metric's share of alpha, 0.01
