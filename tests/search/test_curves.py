"""Per-load curves: summaries over load points, the best config per point and where it switches."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from search.study.curves import add_curve_summaries, best_per_point, best_per_workload, split_name, switch_points


def test_names_split_into_workload_point_and_metric() -> None:
    assert split_name("chat@concurrency=4.output_tok_s") == ("chat", "concurrency=4", "output_tok_s")
    assert split_name("chat.output_tok_s") == ("chat", None, "output_tok_s")
    assert split_name("errors") is None


def test_summary_is_the_geometric_mean_and_errors_are_summed() -> None:
    m = {"w@c=1.output_tok_s": 20.0, "w@c=4.output_tok_s": 80.0, "w@c=1.errors": 1.0, "w@c=4.errors": 2.0,
         "v.output_tok_s": 5.0}
    add_curve_summaries(m)
    assert m["w.output_tok_s"] == pytest.approx(40.0)  # sqrt(20 * 80)
    assert m["w.errors"] == 3.0
    assert m["v.output_tok_s"] == 5.0  # a workload without points is left alone


def test_summary_ranks_like_the_mean_log_ratio_to_a_reference() -> None:
    # Two configs: A better at low load, B at high load; the geometric mean ranks them by their
    # average log-ratio, independent of the load points' scales.
    a = {"w@c=1.t": 30.0, "w@c=8.t": 150.0}
    b = {"w@c=1.t": 25.0, "w@c=8.t": 190.0}
    add_curve_summaries(a)
    add_curve_summaries(b)
    mean_log_ratio = (math.log(25 / 30) + math.log(190 / 150)) / 2
    assert math.log(b["w.t"] / a["w.t"]) == pytest.approx(mean_log_ratio)


def test_best_per_point_and_switch_points() -> None:
    records = [
        SimpleNamespace(number=0, metrics={"w@c=1.t": 30.0, "w@c=4.t": 90.0, "w@c=16.t": 150.0}),
        SimpleNamespace(number=3, metrics={"w@c=1.t": 25.0, "w@c=4.t": 95.0, "w@c=16.t": 190.0}),
    ]
    bests = best_per_point(records, "w.t", maximize=True)
    assert [(b.point, b.number) for b in bests] == [("c=1", 0), ("c=4", 3), ("c=16", 3)]  # numeric order
    assert bests[0].runner_up == 3 and bests[0].runner_up_value == 25.0
    assert switch_points(bests) == ["#0 is best up to c=1, #3 from c=4"]
    low = best_per_point(records, "w.t", maximize=False)
    assert [b.number for b in low] == [3, 0, 0]


def test_without_a_ladder_the_workloads_are_the_load_levels() -> None:
    records = [
        SimpleNamespace(number=0, metrics={"single.output_tok_s": 25.0, "four_streams.output_tok_s": 180.0}),
        SimpleNamespace(number=2, metrics={"single.output_tok_s": 27.0, "four_streams.output_tok_s": 160.0}),
    ]
    bests = best_per_workload(records, "output_tok_s", maximize=True)
    assert [(b.point, b.number) for b in bests] == [("single", 2), ("four_streams", 0)]
    assert switch_points(bests) == ["#2 is best up to single, #0 from four_streams"]
