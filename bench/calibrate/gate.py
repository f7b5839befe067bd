"""The one place the bench replays the product's gate: stored rounds of two sides through
search.regress.ab's sequential stop rule and its report, exactly as `search ab` decides after each round."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

from harness.measure.stats import clopper_pearson, clopper_pearson_upper
from search.regress.ab import ABRun, SequentialPlan, report_from_run, sequential_stop
from search.regress.sides import SideResult
from search.verdicts.gate import MetricVerdict


@dataclass(frozen=True)
class Outcome:
    verdict: str
    rounds: int  # rounds (starts per side) used when the rule stopped, or the cap
    change_pct: float
    stopped: bool  # the stop rule ended it (settled), not the cap or the end of the data


def _side(label: str, metric: str, runs: Sequence[Sequence[float]]) -> SideResult:
    side = SideResult(label, runs={metric: [list(r) for r in runs]})
    for r in runs:
        side.add(metric, median(r))
    return side


def final_verdict(metric: str, runs_a: Sequence[Sequence[float]], runs_b: Sequence[Sequence[float]],
                  plan: SequentialPlan) -> MetricVerdict:
    """The report's verdict on `metric` after these rounds (one list of runs per start and side)."""
    run = ABRun(_side("A", metric, runs_a), _side("B", metric, runs_b), min(len(runs_a), len(runs_b)),
                looks=list(plan.looks), boundary=plan.boundary)
    report = report_from_run(run, "replay", [metric], plan.min_effect, plan.alpha)
    return next(v for v in report.verdicts if v.metric == metric)


def sequential(metric: str, runs_a: Sequence[Sequence[float]], runs_b: Sequence[Sequence[float]],
               cap: int, looks_at: tuple[int, ...] = (), boundary: str = "pocock") -> Outcome:
    """search ab with `--rounds cap` (and `--looks`): rounds in order, the stop rule after each, the report
    at the end."""
    plan = SequentialPlan((metric,), max_rounds=cap, looks_at=looks_at, boundary=boundary)
    rule = sequential_stop(plan)
    n = min(cap, len(runs_a), len(runs_b))
    for k in range(1, n + 1):
        run = ABRun(_side("A", metric, runs_a[:k]), _side("B", metric, runs_b[:k]), k)
        stopped = rule(run) is not None
        if stopped or k == n:
            v = final_verdict(metric, runs_a[:k], runs_b[:k], plan)
            return Outcome(v.verdict, k, v.change_pct, stopped)
    return Outcome("inconclusive", 0, 0.0, False)


def fmt_rate(k: int, n: int, upper: bool) -> str:
    """k of n with the one-sided 95% Clopper-Pearson bound: upper for false alarms, lower for power."""
    if n == 0:
        return "-"
    if upper:
        return f"{k}/{n} ({100 * k / n:.0f}%, 95% upper bound {100 * clopper_pearson_upper(k, n):.0f}%)"
    return f"{k}/{n} ({100 * k / n:.0f}%, 95% lower bound {100 * lower_bound(k, n):.0f}%)"


def lower_bound(k: int, n: int) -> float:
    """One-sided 95% lower Clopper-Pearson bound (the two-sided 90% interval's low end)."""
    return clopper_pearson(k, n, 0.90)[0]
