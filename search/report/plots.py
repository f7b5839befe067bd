"""The report's plots: matplotlib drawn into inline SVG (text kept as text), and parameter
importances."""

from __future__ import annotations

import io
import math
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from search.store.results import ResultsError, TrialRecord
from search.store.results import TrialState as RecordState
from search.store.summary import StudyView

BLUE, GREEN, ORANGE, RED, GREY = "#2f6db5", "#1b9e4b", "#e08a1e", "#c62828", "#8a8f98"
PHASE_COLORS = ("#2f6db5", "#e08a1e", "#1b9e4b", "#8e44ad", "#c62828", "#16a2b8", "#795548", "#d81b60")


def _violates(r: TrialRecord) -> bool:
    """Measured but outside a constraint. A duplicate is a copy of another trial's result, drawn once
    as that trial, never as a second point (it used to appear as "infeasible (constraint violated)")."""
    return (r.objective_values is not None and r.state != RecordState.DUPLICATE
            and not StudyView.is_feasible(r))


def _figure(width: float, height: float) -> Any:
    try:
        from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend
    except ImportError:
        raise ResultsError("the HTML report draws its plots with matplotlib: "
                           "pip install matplotlib") from None
    return Figure(figsize=(width, height), layout="constrained")


def _svg(fig: Any) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "font.size": 9.5, "axes.titlesize": 11,
                                "font.family": ["DejaVu Sans", "sans-serif"]}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: invalid inside HTML
    # Scale with the page: keep the viewBox, let CSS decide the width.
    return re.sub(r'<svg([^>]*?) width="[^"]+" height="[^"]+"', r'<svg\1', text, count=1)


def _style(ax: Any) -> None:
    ax.grid(True, color="#e3e6ea", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _label(metric: str, direction: str) -> str:
    return f"{metric} ({'higher' if direction == 'maximize' else 'lower'} is better)"


def _value(r: TrialRecord, i: int) -> float:
    """Objective i of a record that has been measured (callers filter on objective_values)."""
    assert r.objective_values is not None
    return float(r.objective_values[i])


def objective_plot_svg(view: StudyView) -> str | None:
    """Several objectives: the Pareto front of the first two. One: objective vs trial, best so far."""
    measured = [r for r in view.records if r.objective_values is not None]
    if not measured:
        return None
    return _pareto_svg(view) if len(view.objectives) >= 2 else _history_svg(view)


def _history_svg(view: StudyView) -> str:
    metric, direction = view.objectives[0]
    better: Callable[[float, float], bool] = ((lambda a, b: a > b) if direction == "maximize"
                                              else (lambda a, b: a < b))
    records = sorted(view.records, key=lambda r: r.number)
    fig = _figure(8.6, 3.6)
    ax = fig.add_subplot()
    _style(ax)
    feas = [r for r in records if StudyView.is_feasible(r)]
    infeas = [r for r in records if _violates(r)]
    failed = [r for r in records if r.objective_values is None]
    ax.scatter([r.number for r in feas], [_value(r, 0) for r in feas], color=BLUE, s=36, zorder=3,
               label="feasible trial")
    if infeas:
        ax.scatter([r.number for r in infeas], [_value(r, 0) for r in infeas], facecolors="none",
                   edgecolors=ORANGE, s=40, linewidths=1.5, zorder=3,
                   label="infeasible (constraint violated)")
    xs, ys, best = [], [], None
    for r in feas:
        value = _value(r, 0)
        if best is None or better(value, best):
            best = value
        xs.append(r.number)
        ys.append(best)
    if xs:
        last = records[-1].number
        ax.step([*xs, last], [*ys, ys[-1]], where="post", color=GREEN, linewidth=2, zorder=2,
                label="best so far")
    base = view.baseline
    if base and base.objective_values:
        ax.axhline(base.objective_values[0], color=GREY, linestyle="--", linewidth=1, zorder=1)
        ax.annotate("default", (base.number, base.objective_values[0]), textcoords="offset points",
                    xytext=(6, 6), color="#555")
    if failed:
        ax.scatter([r.number for r in failed], [0.02] * len(failed), transform=ax.get_xaxis_transform(),
                   marker="x", color=RED, s=40, zorder=3, label="failed (no measurement)")
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title(_label(metric, direction), loc="left")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(loc="best", frameon=False, fontsize=8.5)
    return _svg(fig)


def _pareto_svg(view: StudyView) -> str:
    (m0, d0), (m1, d1) = view.objectives[0], view.objectives[1]
    records = [r for r in view.records if r.objective_values is not None]
    front = {r.number for r in view.best()}
    fig = _figure(8.6, 4.4)
    ax = fig.add_subplot()
    _style(ax)

    def xy(rs: Sequence[TrialRecord]) -> tuple[list[float], list[float]]:
        return [_value(r, 0) for r in rs], [_value(r, 1) for r in rs]

    dominated = [r for r in records if StudyView.is_feasible(r) and r.number not in front]
    infeas = [r for r in records if _violates(r)]
    on_front = sorted((r for r in records if r.number in front), key=lambda r: (r.objective_values or [0])[0])
    if dominated:
        ax.scatter(*xy(dominated), color=BLUE, alpha=0.55, s=34, zorder=3, label="feasible, dominated")
    if infeas:
        ax.scatter(*xy(infeas), facecolors="none", edgecolors=ORANGE, s=40, linewidths=1.5, zorder=3,
                   label="infeasible (constraint violated)")
    if on_front:
        fx, fy = xy(on_front)
        # The staircase bounds what the front dominates: its corners are points the front attains
        # (vertical first when x is maximized, horizontal first when it is minimized).
        ax.plot(fx, fy, color=GREEN, linewidth=1.5, zorder=2,
                drawstyle="steps-pre" if d0 == "maximize" else "steps-post")
        ax.scatter(fx, fy, color=GREEN, s=60, zorder=4, label="Pareto front (feasible)")
        for r, x, y in zip(on_front, fx, fy, strict=True):
            ax.annotate(f"#{r.number}", (x, y), textcoords="offset points", xytext=(6, 5), fontsize=8.5)
    base = view.baseline
    if base and base.objective_values:
        ax.scatter([base.objective_values[0]], [base.objective_values[1]], marker="*", s=180, color=GREY,
                   edgecolors="#333", zorder=5, label=f"engine default (#{base.number})")
    ax.set_xlabel(_label(m0, d0))
    ax.set_ylabel(_label(m1, d1))
    extra = f" (front over all {len(view.objectives)} objectives)" if len(view.objectives) > 2 else ""
    ax.set_title(f"Pareto front: {m0} vs {m1}{extra}", loc="left")
    ax.legend(loc="best", frameon=False, fontsize=8.5)
    return _svg(fig)


def _objective_target(i: int, sign: float) -> Callable[[optuna.trial.FrozenTrial], float]:
    """Optuna's importance target for objective i, oriented so that higher is better."""
    def target(t: optuna.trial.FrozenTrial) -> float:
        return sign * t.values[i]
    return target


@dataclass
class Importances:
    """Parameter importances per objective (PED-ANOVA), or why they could not be computed."""

    values: dict[str, dict[str, float]] = field(default_factory=dict)  # objective -> param -> share
    reason: str | None = None
    n_trials: int = 0
    top_quantile: float = 0.0


def param_importances(study: optuna.Study | None, view: StudyView) -> Importances:
    """PED-ANOVA (optuna.importance): which parameters it takes to reach the top trials.

    PED-ANOVA rather than optuna's default fANOVA: it needs no scikit-learn, is meant for small
    studies, and is what optuna-dashboard shows, so the page and the dashboard agree. The top
    group is the best `top_quantile` of the complete trials, sized to hold about 5 of them (the
    method's own advice) but never more than half.
    """
    if study is None:
        return Importances(reason="the study storage is not available")
    n = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    if n < MIN_IMPORTANCE_TRIALS:
        return Importances(reason=f"only {n} complete trial(s); importances need at least "
                                  f"{MIN_IMPORTANCE_TRIALS} (and 20+ to be stable)", n_trials=n)
    quantile = min(0.5, max(0.1, 5 / n))
    out = Importances(n_trials=n, top_quantile=quantile)
    evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=quantile)
    for i, (metric, direction) in enumerate(view.objectives):
        # With a target, PED-ANOVA treats lower as better: flip objectives that are maximized.
        sign = -1.0 if direction == "maximize" else 1.0
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "experimental" and "lower target is better" notices
                values = optuna.importance.get_param_importances(
                    study, evaluator=evaluator, target=_objective_target(i, sign))
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:
            return Importances(reason=f"importances could not be computed: {exc}", n_trials=n)
        if values:
            out.values[metric] = dict(values)
    if not out.values:
        out.reason = "no parameter took more than one value in the complete trials"
    return out

# Fewer complete trials than this and parameter importances are not computed: an importance
# estimated from two or three points is noise presented as insight.
# Columns of the sample tables that exist even when no sample does (an empty export keeps its header).
MIN_IMPORTANCE_TRIALS = 5


def importance_plot_svg(imp: Importances) -> str | None:
    if not imp.values:
        return None
    metrics = list(imp.values)
    params = sorted({p for v in imp.values.values() for p in v},
                    key=lambda p: sum(v.get(p, 0.0) for v in imp.values.values()))
    fig = _figure(8.6, 0.9 + 0.32 * len(params) * max(1, len(metrics)) ** 0.5)
    ax = fig.add_subplot()
    _style(ax)
    ax.grid(False, axis="y")
    height = 0.8 / len(metrics)
    for j, metric in enumerate(metrics):
        ys = [k + (j - (len(metrics) - 1) / 2) * height for k in range(len(params))]
        vals = [imp.values[metric].get(p, 0.0) for p in params]
        ax.barh(ys, vals, height=height * 0.92, color=PHASE_COLORS[j % len(PHASE_COLORS)], label=metric)
        for y, v in zip(ys, vals, strict=True):
            ax.text(v, y, f" {v:.2f}", va="center", fontsize=8)
    ax.set_yticks(range(len(params)), params)
    ax.set_xlabel(f"importance for reaching the top {imp.top_quantile:.0%} of trials "
                  "(PED-ANOVA, sums to 1 per objective)")
    ax.set_xlim(0, 1.08)
    ax.set_title(f"Parameter importances over {imp.n_trials} complete trials", loc="left")
    ax.legend(loc="lower right", frameon=False, fontsize=8.5)
    return _svg(fig)


def startup_rows(view: StudyView) -> tuple[list[str], list[tuple[TrialRecord, dict[str, float]]]]:
    """Phase names (first-seen order) and, per started trial, its phase durations."""
    phases: list[str] = []
    rows = []
    for r in sorted(view.records, key=lambda r: r.number):
        if r.duplicate_of is not None or (r.ready_s is None and not r.startup):
            continue
        # A reused server did not start: its record carries the first start's phases, not its own.
        got = {} if r.reused_server else {k: float(v) for k, v in (r.startup.get("phases_s") or {}).items()
                                          if isinstance(v, int | float)}
        for k in got:
            if k not in phases:
                phases.append(k)
        rows.append((r, got))
    return phases, rows


def startup_plot_svg(view: StudyView) -> str | None:
    phases, rows = startup_rows(view)
    rows = [(r, p) for r, p in rows if r.ready_s is not None]
    if not rows:
        return None
    fig = _figure(8.6, 3.8)
    ax = fig.add_subplot()
    _style(ax)
    ax.grid(False, axis="x")
    xs = list(range(len(rows)))
    ready = [0.0 if r.reused_server else (r.ready_s or 0.0) for r, _ in rows]
    ax.bar(xs, ready, width=0.86, color="#dfe4ea", edgecolor="#b8c0ca", label="ready (launch to healthy)",
           zorder=1)
    width = 0.7 / max(1, len(phases))
    for j, phase in enumerate(phases):
        offs = [x - 0.35 + width * (j + 0.5) for x in xs]
        vals = [p.get(phase, 0.0) if not r.reused_server else 0.0 for r, p in rows]
        ax.bar(offs, vals, width=width * 0.9, color=PHASE_COLORS[j % len(PHASE_COLORS)], label=phase,
               zorder=2)
    top = max(ready) if ready else 0.0
    crowded = len(rows) > 24  # past this, per-bar labels overlap: keep the axis readable instead
    for x, (r, _) in zip(xs, rows, strict=True):
        if crowded:
            break
        if r.reused_server:
            ax.text(x, top * 0.02, "reused\nserver", ha="center", va="bottom", fontsize=8, color="#555")
        else:
            ax.text(x, r.ready_s or 0.0, f"{r.ready_s:.0f} s", ha="center", va="bottom", fontsize=8)
    every = math.ceil(len(rows) / 12) if crowded else 1
    ax.set_xticks(xs[::every], [f"#{r.number}" for r, _ in rows][::every])
    ax.set_xlabel("trial")
    ax.set_ylabel("seconds")
    ax.set_ylim(0, top * 1.12 if top else 1)
    ax.set_title("Startup: time to ready and the phases the engine logged", loc="left")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8.5)
    return _svg(fig)


# ---- the page -------------------------------------------------------------------------------------

