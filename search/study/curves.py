"""Per-load results: every server start is measured at every load point the space declares
(request-side params), so a trial holds a curve, not a point.

Metric names: `<workload>@<point>.<metric>` is the value at one load point (e.g.
`chat@concurrency=4.output_tok_s`); `<workload>.<metric>` is the curve's summary, the geometric
mean over the points (scale-free: ranking configs by it is ranking them by their mean log-ratio
to any reference config), or the sum for counts (errors), as harness/measure/metric_registry.py declares.
Objectives and constraints may name either.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from harness.measure.metric_registry import aggregate_of


def split_name(key: str) -> tuple[str, str | None, str] | None:
    """`w@c=4.m` -> (w, "c=4", m); `w.m` -> (w, None, m); None for names without a workload."""
    workload, dot, metric = key.partition(".")
    if not dot:
        return None
    base, at, point = workload.partition("@")
    return base, (point if at else None), metric


def add_curve_summaries(metrics: dict[str, float]) -> None:
    """Add `<workload>.<metric>` summaries over the load points, in place."""
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for key, value in metrics.items():
        parts = split_name(key)
        if parts and parts[1] is not None and value is not None:
            groups[(parts[0], parts[2])].append(float(value))
    for (base, metric), values in groups.items():
        if aggregate_of(metric) == "sum":
            metrics[f"{base}.{metric}"] = sum(values)
        elif values and all(v > 0 for v in values):
            metrics[f"{base}.{metric}"] = math.exp(sum(math.log(v) for v in values) / len(values))


@dataclass(frozen=True)
class PointBest:
    point: str
    number: int
    value: float
    runner_up: int | None
    runner_up_value: float | None


def best_per_point(records: list[Any], metric: str, maximize: bool) -> list[PointBest]:
    """For a curve objective `<workload>.<metric>`: the best feasible trial at each load point."""
    base, _, leaf = metric.partition(".")
    points: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for r in records:
        for key, value in r.metrics.items():
            parts = split_name(key)
            if parts and parts[0] == base and parts[2] == leaf and parts[1] is not None and value is not None:
                points[parts[1]].append((float(value), r.number))
    out = _best_of_each(points, maximize)
    return sorted(out, key=lambda p: _point_order(p.point))


def best_per_workload(records: list[Any], leaf: str, maximize: bool) -> list[PointBest]:
    """Without a request-side ladder, a space's workloads are its load levels (e.g. `single` and
    `four_streams`): the best feasible trial for `leaf` in each workload, in measurement order."""
    by_workload: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for r in records:
        for key, value in r.metrics.items():
            parts = split_name(key)
            if parts and parts[1] is None and parts[2] == leaf and value is not None:
                by_workload[parts[0]].append((float(value), r.number))
    return _best_of_each(by_workload, maximize)


def _best_of_each(groups: dict[str, list[tuple[float, int]]], maximize: bool) -> list[PointBest]:
    """(value, trial) pairs per level -> the best and the runner-up of each level, in input order."""
    out = []
    for level, values in groups.items():
        ranked = sorted(values, reverse=maximize)
        second = ranked[1] if len(ranked) > 1 else None
        out.append(PointBest(level, ranked[0][1], ranked[0][0], second[1] if second else None,
                             second[0] if second else None))
    return out


def switch_points(bests: list[PointBest]) -> list[str]:
    """Where the best config changes along the ladder: 'from #3 at concurrency=1 to #5 at concurrency=4'."""
    out = []
    for prev, cur in itertools.pairwise(bests):
        if prev.number != cur.number:
            out.append(f"#{prev.number} is best up to {prev.point}, #{cur.number} from {cur.point}")
    return out


def _point_order(point: str) -> tuple[Any, ...]:
    keys = []
    for part in point.split(","):
        _, _, value = part.partition("=")
        try:
            keys.append((0, float(value), ""))
        except ValueError:
            keys.append((1, 0.0, value))
    return tuple(keys)
