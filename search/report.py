"""A stored study as a report: pandas tables (trials, runs, every raw request) and one HTML page.

The page is a single self-contained file: plots are drawn with matplotlib into inline SVG with
their text kept as text, and the only script is a few lines that sort tables. Nothing is fetched
when the page is viewed (no CDN, no fonts), it stays small (tens of KB per plot, where plotly
would inline ~4 MB of JavaScript), looks the same in every browser, prints, and can be mailed or
attached to a CI run. Interactive exploration is optuna-dashboard's job: it opens the same storage.

Raw samples live in <results>/<study>/trials/NNNN/result.json (see search.study); the study
storage holds each trial's summary (search.results.TrialRecord), which is what the tables use.
"""

from __future__ import annotations

import html
import io
import json
import math
import re
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import TrialState

from search.results import ResultsError, TrialRecord, read_json, scrub_text
from search.space import REQUEST_SIDE
from search.summary import StudyView, load_view

# Fewer complete trials than this and parameter importances are not computed: an importance
# estimated from two or three points is noise presented as insight.
MIN_IMPORTANCE_TRIALS = 5
LOG_TAIL_LINES = 30
SHOWN_BEST = 4  # Pareto-front configs shown open; the others fold under a summary line
# Columns of the sample tables that exist even when no sample does (an empty export keeps its header).
REQUEST_COLUMNS = ("study", "trial", "trial_state", "workload", "concurrency", "repeat", "run_wall_s",
                   "request", "ok", "status", "error_kind", "error_body", "ttft_s", "tpot_s", "e2e_s",
                   "output_tokens", "prompt_tokens", "cached_prompt_tokens", "finish_reason", "start_s",
                   "end_s", "chunks", "chunk_gaps_s")
RUN_COLUMNS = ("study", "trial", "trial_state", "workload", "concurrency", "repeat", "wall_s",
               "errors_by_kind")
INTEGER_COLUMNS = ("trial", "repeat", "request", "status", "output_tokens", "prompt_tokens",
                   "cached_prompt_tokens", "concurrency", "chunks")


@dataclass
class ReportInput:
    """Everything a report is made of: the study view, the study (importances) and raw results."""

    view: StudyView
    study: optuna.Study | None = None
    storage: str = ""
    results_dir: Path | None = None
    results: dict[int, dict[str, Any]] = field(default_factory=dict)  # trial number -> result.json
    problems: list[str] = field(default_factory=list)  # unreadable files, trials without a record


def find_results_dir(target: str, study_name: str, view: StudyView) -> Path | None:
    """Where the trials' result.json files are: the given folder, ./results/NAME, or (for a
    database storage) the folder the trials' server logs were written to on this host."""
    candidates = [Path(target), Path("results") / study_name]
    for r in view.records:
        if r.log_path:
            candidates.append(Path(r.log_path).parent.parent.parent)
    for c in candidates:
        if (c / "trials").is_dir():
            return c
    return None


def load_results(results_dir: Path, numbers: Iterable[int]) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """Read trials/NNNN/result.json for the given trials; a missing or corrupt file is a problem
    reported on the page and in the exports' absence, never a crash of the report."""
    out: dict[int, dict[str, Any]] = {}
    problems: list[str] = []
    for n in sorted(numbers):
        path = results_dir / "trials" / f"{n:04d}" / "result.json"
        if not path.exists():
            continue
        try:
            data = read_json(path)
        except ResultsError as exc:
            problems.append(str(exc))
            continue
        if not isinstance(data, dict):
            problems.append(f"{path}: expected a JSON object")
            continue
        out[n] = data
    return out, problems


def load_report_input(study: optuna.Study, storage: str, results_dir: Path | None = None,
                      target: str | None = None) -> ReportInput:
    """The study and its raw results. Without `results_dir`, look for them from `target` (the
    folder or name the user gave) with find_results_dir."""
    view = load_view(study)
    if results_dir is None and target is not None:
        results_dir = find_results_dir(target, study.study_name, view)
    inp = ReportInput(view=view, study=study, storage=storage, results_dir=results_dir)
    if results_dir is not None:
        inp.results, inp.problems = load_results(results_dir, (r.number for r in view.records))
    recorded = {r.number for r in view.records}
    for t in study.get_trials(deepcopy=False):
        if t.number in recorded:
            continue
        if t.state == TrialState.RUNNING:
            inp.problems.append(f"trial #{t.number} is still running (or its worker died and it was "
                                "not retried)")
        elif t.state != TrialState.WAITING:
            inp.problems.append(f"trial #{t.number} ({t.state.name.lower()}) has no flagsearch record")
    return inp


# ---- tables ---------------------------------------------------------------------------------------

def _shown_params(records: Sequence[TrialRecord]) -> list[str]:
    """Parameter columns in first-seen order; engine/model only when they vary."""
    names: list[str] = []
    for r in records:
        for k in r.params:
            if k not in names:
                names.append(k)
    return [k for k in names if k not in ("engine", "model")
            or len({repr(r.params.get(k)) for r in records}) > 1]


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0 or not math.isfinite(base):
        return None
    return value / base


def feasible(r: TrialRecord) -> bool:
    return (r.state in ("complete", "duplicate") and r.objective_values is not None
            and all(c <= 0 for c in r.constraint_values))


def starts_summary(view: StudyView) -> dict[str, int]:
    """Server starts made, starts saved by reusing a running server, identical configs not re-run."""
    return {
        "starts": sum(1 for r in view.records
                      if r.log_path and not r.reused_server and r.duplicate_of is None),
        "reused": sum(1 for r in view.records if r.reused_server),
        "duplicates": sum(1 for r in view.records if r.duplicate_of is not None),
    }


def trial_note(view: StudyView, r: TrialRecord) -> str:
    notes = []
    if r.number == view.baseline_number:
        notes.append("engine default")
    if r.failure:
        notes.append(f"{r.failure.cause}: {r.failure.detail}")
    elif r.duplicate_of is not None:
        notes.append(f"same config as #{r.duplicate_of}, not re-run")
    violated = [i for i, c in enumerate(r.constraint_values) if c > 0]
    if violated and not r.failure:
        notes.append(f"infeasible: constraint {', '.join(f'#{i + 1}' for i in violated)} violated")
    notes.extend(f"placebo? {p}" for p in r.placebo)
    return "; ".join(notes)


def trials_frame(view: StudyView) -> pd.DataFrame:
    """One row per trial: params, objectives, × default per objective, quality, errors, startup."""
    records = sorted(view.records, key=lambda r: r.number)
    params = _shown_params(records)
    metrics = [m for m, _ in view.objectives]
    base = view.baseline
    rows = []
    for r in records:
        row: dict[str, Any] = {"trial": r.number, "state": r.state}
        for p in params:
            row[f"param.{p}"] = r.params.get(p)
        values = r.objective_values or [None] * len(metrics)
        base_values = base.objective_values if base and base.objective_values else [None] * len(metrics)
        for m, v, b in zip(metrics, values, base_values, strict=True):
            row[m] = v
            row[f"{m} ×default"] = ratio(v, b)
        row["feasible"] = feasible(r)
        row["quality"] = r.metrics.get("quality.score")
        row["errors"] = r.metrics.get("errors")
        row["ready_s"] = r.ready_s
        row["reused_server"] = r.reused_server
        row["wall_s"] = r.wall_s
        row["failure_cause"] = r.failure.cause if r.failure else None
        row["note"] = trial_note(view, r)
        row["command"] = r.command
        rows.append(row)
    return pd.DataFrame(rows)


def _trial_columns(view: StudyView, number: int, state: str, params: dict[str, Any],
                   shown: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"study": view.name, "trial": number, "trial_state": state}
    for p in shown:
        out[f"param.{p}"] = params.get(p)
    return out


def _iter_runs(inp: ReportInput) -> Iterable[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(trial columns, workload measurement, run sample) for every measured run of every trial."""
    shown = _shown_params(inp.view.records) if inp.view.records else []
    for number in sorted(inp.results):
        data = inp.results[number]
        cols = _trial_columns(inp.view, number, str(data.get("state")), data.get("params") or {}, shown)
        for wl in (data.get("workloads") or {}).values():
            for sample in wl.get("samples") or []:
                yield cols, wl, sample


def requests_frame(inp: ReportInput) -> pd.DataFrame:
    """Every raw sample: one row per request per repeat per workload per trial."""
    rows = []
    for cols, wl, sample in _iter_runs(inp):
        for i, req in enumerate(sample.get("requests") or []):
            gaps = list(req.get("chunk_gaps_s") or [])
            ttft, e2e, out_tokens = req.get("ttft_s"), req.get("e2e_s"), req.get("output_tokens")
            if e2e is None and req.get("end_s") is not None and req.get("start_s") is not None:
                e2e = req["end_s"] - req["start_s"]
            tpot = ((e2e - ttft) / (out_tokens - 1)
                    if ttft is not None and e2e is not None and out_tokens and out_tokens > 1 else None)
            row = {**cols, "workload": wl.get("name"), "concurrency": wl.get("concurrency"),
                   "repeat": sample.get("repeat"), "run_wall_s": sample.get("wall_s"), "request": i,
                   "ok": req.get("ok"), "status": req.get("status"), "error_kind": req.get("error_kind"),
                   "error_body": req.get("error_body"), "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e,
                   "output_tokens": out_tokens, "prompt_tokens": req.get("prompt_tokens"),
                   "cached_prompt_tokens": req.get("cached_prompt_tokens"),
                   "finish_reason": req.get("finish_reason"), "start_s": req.get("start_s"),
                   "end_s": req.get("end_s"), "chunks": len(gaps) + 1 if ttft is not None else 0,
                   "chunk_gaps_s": gaps}
            for k, v in (req.get("server_timings") or {}).items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    row[f"server_timings.{k}"] = v
            rows.append(row)
    return _tidy(pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(REQUEST_COLUMNS)))


def runs_frame(inp: ReportInput) -> pd.DataFrame:
    """One row per measured run (repeat) per workload per trial: run metrics and server counter deltas."""
    rows = []
    for cols, wl, sample in _iter_runs(inp):
        row = {**cols, "workload": wl.get("name"), "concurrency": wl.get("concurrency"),
               "repeat": sample.get("repeat"), "wall_s": sample.get("wall_s"),
               "errors_by_kind": json.dumps(sample.get("errors_by_kind") or {}, sort_keys=True)}
        row.update({f"metric.{k}": v for k, v in (sample.get("metrics") or {}).items()})
        row.update({f"server.{k}": v for k, v in (sample.get("server") or {}).items()})
        rows.append(row)
    return _tidy(pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(RUN_COLUMNS)))


def _tidy(df: pd.DataFrame) -> pd.DataFrame:
    """Types that survive Parquet: nullable integers, and one type per parameter column."""
    for col in INTEGER_COLUMNS:
        if col in df.columns:
            df[col] = pd.array([None if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)
                                for v in df[col]], dtype="Int64")
    for col in [c for c in df.columns if c.startswith("param.")]:
        kinds = {type(v) for v in df[col] if v is not None}
        if len(kinds) > 1 or kinds & {dict, list}:
            df[col] = [None if v is None else (json.dumps(v) if isinstance(v, dict | list) else str(v))
                       for v in df[col]]
    return df


def export_tables(inp: ReportInput, csv_dir: Path | None = None,
                  parquet_dir: Path | None = None) -> list[Path]:
    """Write trials, runs and requests (every raw sample) as CSV and/or Parquet; returns the paths."""
    if not inp.results:
        where = inp.results_dir / "trials" if inp.results_dir else "the results folder (give --results-dir)"
        raise ResultsError(f"no raw samples found: no trials/NNNN/result.json under {where}")
    tables = {"trials": _tidy(trials_frame(inp.view)), "runs": runs_frame(inp),
              "requests": requests_frame(inp)}
    written: list[Path] = []
    if csv_dir is not None:
        csv_dir.mkdir(parents=True, exist_ok=True)
        for name, df in tables.items():
            path = csv_dir / f"{name}.csv"
            flat = df.copy()
            for col in flat.columns:  # lists (chunk gaps) as JSON text: one cell, still parseable
                if flat[col].map(lambda v: isinstance(v, list | dict)).any():
                    flat[col] = flat[col].map(lambda v: json.dumps(v) if isinstance(v, list | dict) else v)
            flat.to_csv(path, index=False)
            written.append(path)
    if parquet_dir is not None:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ResultsError("Parquet export needs pyarrow: pip install pyarrow "
                               "(it is in flagsearch's dev extras)") from None
        parquet_dir.mkdir(parents=True, exist_ok=True)
        for name, df in tables.items():
            path = parquet_dir / f"{name}.parquet"
            df.to_parquet(path, index=False)
            written.append(path)
    return written


# ---- plots (matplotlib -> inline SVG) -----------------------------------------------------------

BLUE, GREEN, ORANGE, RED, GREY = "#2f6db5", "#1b9e4b", "#e08a1e", "#c62828", "#8a8f98"
PHASE_COLORS = ("#2f6db5", "#e08a1e", "#1b9e4b", "#8e44ad", "#c62828", "#16a2b8", "#795548", "#d81b60")


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
    feas = [r for r in records if feasible(r)]
    infeas = [r for r in records if r.objective_values is not None and not feasible(r)]
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

    dominated = [r for r in records if feasible(r) and r.number not in front]
    infeas = [r for r in records if not feasible(r)]
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
                    study, evaluator=evaluator, target=lambda t, i=i, sign=sign: sign * t.values[i])
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:
            return Importances(reason=f"importances could not be computed: {exc}", n_trials=n)
        if values:
            out.values[metric] = dict(values)
    if not out.values:
        out.reason = "no parameter took more than one value in the complete trials"
    return out


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

def fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _e(value: Any) -> str:
    return html.escape(fmt(value))


def html_table(columns: Sequence[str], rows: Sequence[Sequence[str]], table_id: str = "",
               classes: Sequence[str] = ()) -> str:
    """Cells are HTML already escaped by the caller; column headers are escaped here."""
    # <wbr> after '_' and '.': long parameter names wrap in the header instead of widening the table.
    head = "".join("<th>" + re.sub(r"([_.])", r"\1<wbr>", html.escape(c)) + "</th>" for c in columns)
    body = "\n".join(
        "<tr" + (f' class="{html.escape(classes[i])}"' if i < len(classes) and classes[i] else "") + ">"
        + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for i, row in enumerate(rows))
    ident = f' id="{html.escape(table_id)}"' if table_id else ""
    return (f'<div class="scroll"><table{ident} class="sortable"><thead><tr>{head}</tr></thead><tbody>\n'
            f"{body}\n</tbody></table></div>")


def _trials_section(view: StudyView) -> str:
    df = trials_frame(view)
    if df.empty:
        return "<p>No trial has finished yet.</p>"
    records = {r.number: r for r in view.records}
    params = [c for c in df.columns if c.startswith("param.")]
    metrics = [m for m, _ in view.objectives]
    columns = ["#", "state", *(p.removeprefix("param.") for p in params)]
    for m, d in view.objectives:
        columns += [f"{m}\u00a0{'↑' if d == 'maximize' else '↓'}", "×\u00a0default"]
    columns += ["quality", "errors", "ready\u00a0s", "wall\u00a0s", "note"]
    best = {r.number for r in view.best()}
    rows, classes = [], []
    for _, row in df.iterrows():
        r = records[int(row["trial"])]
        cells = [str(r.number), f'<span class="state {html.escape(r.state)}">{html.escape(r.state)}</span>']
        cells += [_e(row[p]) if row[p] is not None else "–" for p in params]
        for m in metrics:
            cells += [_e(row[m]), _e(row[f"{m} ×default"])]
        ready = "reused" if r.reused_server else fmt(r.ready_s)
        cells += [_e(row["quality"]), _e(row["errors"]), html.escape(ready), _e(row["wall_s"]),
                  html.escape(row["note"])]
        rows.append(cells)
        classes.append("best" if r.number in best else ("failed" if r.state == "failed" else
                                                         ("infeasible" if not feasible(r) else "")))
    legend = ('<p class="hint">Rows in green are the best feasible config(s); orange rows violate a '
              "constraint; red rows failed. × default is each objective's value over the engine "
              "default's (trial #" + fmt(view.baseline_number) + "). Click a header to sort.</p>")
    return legend + html_table(columns, rows, "trials", classes)


def _best_section(inp: ReportInput) -> str:
    view = inp.view
    best = view.best()
    if not best:
        return ('<p class="bad">No feasible config: every trial failed or violated a constraint. '
                "See the failures below.</p>")
    base = view.baseline
    parts = []
    for r in best:
        items = []
        for i, (metric, direction) in enumerate(view.objectives):
            value = (r.objective_values or [None] * (i + 1))[i]
            b = base.objective_values[i] if base and base.objective_values else None
            rr = ratio(value, b)
            spread = _spread(inp, r.number, metric)
            items.append(f"<li><b>{html.escape(metric)}</b> = {_e(value)}"
                         + (f" ({rr:.2f}× the default)" if rr is not None else "")
                         + (f' <span class="hint">{html.escape(spread)}</span>' if spread else "")
                         + f' <span class="hint">({direction})</span></li>')
        q = r.metrics.get("quality.score")
        if q is not None:
            items.append(f"<li>quality score = {_e(q)}</li>")
        request_side = {k: v for k, v in r.params.items() if k in REQUEST_SIDE}
        if request_side:
            items.append("<li>request-side settings (not in the command; set them in your client): "
                         + html.escape(", ".join(f"{k}={v}" for k, v in request_side.items())) + "</li>")
        title = f"Trial #{r.number}" + (" (the engine default)" if r.number == view.baseline_number else "")
        parts.append(f'<div class="card best"><h3>{html.escape(title)}</h3><ul>{"".join(items)}</ul>'
                     f'<div class="hint">launch command, ready to paste:</div>'
                     f'<pre class="cmd">{html.escape(r.command or "(not recorded)")}</pre></div>')
    intro = ("<p>The feasible Pareto front over all objectives: no other feasible trial is better in "
             "every objective.</p>" if len(view.objectives) > 1 else "")
    shown, rest = parts[:SHOWN_BEST], parts[SHOWN_BEST:]
    more = (f"<details><summary>{len(rest)} more config(s) on the front</summary>{''.join(rest)}</details>"
            if rest else "")
    return intro + "\n".join(shown) + more


def _spread(inp: ReportInput, number: int, metric: str) -> str:
    """'median of N runs, min–max' for a '<workload>.<metric>' objective, from the raw results."""
    workload, _, name = metric.partition(".")
    data = inp.results.get(number) or {}
    stat = (((data.get("workloads") or {}).get(workload) or {}).get("summary") or {}).get(name)
    if not stat or not stat.get("n"):
        return ""
    return f"median of {stat['n']} runs, range {fmt(stat.get('min'))}–{fmt(stat.get('max'))}"


def _importance_section(inp: ReportInput) -> str:
    imp = param_importances(inp.study, inp.view)
    svg = importance_plot_svg(imp)
    if svg is None:
        return f'<p class="hint">Parameter importances not shown: {html.escape(imp.reason or "")}.</p>'
    note = ('<p class="hint">PED-ANOVA (optuna.importance, as in optuna-dashboard) over the complete '
            "trials: how much each parameter's values differ between the top trials and all trials. "
            "Parameters not set in every trial (conditional ones) are left out. With few trials "
            "treat these as hints, not findings.</p>")
    return f'<figure id="importances-plot">{svg}</figure>{note}'


def _startup_section(view: StudyView) -> str:
    phases, rows = startup_rows(view)
    if not rows:
        return "<p>No server became ready (see the failures below).</p>"
    svg = startup_plot_svg(view)
    columns = ["#", "ready s", *phases, "KV cache tokens", "max concurrency", "state"]
    table_rows = []
    for r, got in rows:
        ready = "reused server" if r.reused_server else fmt(r.ready_s)
        table_rows.append([str(r.number), html.escape(ready), *(_e(got.get(p)) for p in phases),
                           _e(r.startup.get("kv_cache_tokens")), _e(r.startup.get("max_concurrency")),
                           html.escape(r.state)])
    note = ('<p class="hint">Phases are what the engine logged; they can nest or overlap (e.g. '
            "torch.compile runs inside engine init), so they are drawn side by side, not stacked. "
            "Ready is measured by flagsearch from launch to a healthy endpoint.</p>")
    figure = f'<figure id="startup-plot">{svg}</figure>' if svg else ""
    return figure + note + html_table(columns, table_rows, "startup")


def _failures_section(view: StudyView) -> str:
    failed = [r for r in sorted(view.records, key=lambda r: r.number) if r.failure]
    if not failed:
        return "<p>No trial failed.</p>"
    parts = []
    for r in failed:
        assert r.failure is not None
        params = ", ".join(f"{k}={v}" for k, v in r.params.items() if k not in ("engine", "model"))
        tail = r.failure.log_tail[-LOG_TAIL_LINES:]
        log = (f'<details open><summary>last {len(tail)} log lines'
               + (f" ({html.escape(r.log_path)})" if r.log_path else "") + "</summary>"
               f'<pre class="log">{html.escape(chr(10).join(tail))}</pre></details>' if tail else "")
        parts.append(f'<div class="card failed"><h3>Trial #{r.number}: {html.escape(r.failure.cause)}</h3>'
                     f"<p>{html.escape(r.failure.detail)}</p>"
                     f'<p class="hint">{html.escape(params)}</p>'
                     + (f'<pre class="cmd">{html.escape(r.command)}</pre>' if r.command else "")
                     + log + "</div>")
    return "\n".join(parts)


def _notes_section(inp: ReportInput) -> str:
    items = [html.escape(p) for p in inp.problems]
    for r in sorted(inp.view.records, key=lambda r: r.number):
        items += [f"trial #{r.number}: {html.escape(w)}" for w in r.warnings]
    if not items:
        return ""
    return ('<h2 id="notes">Warnings</h2><ul class="notes">'
            + "".join(f"<li>{i}</li>" for i in items) + "</ul>")


def _fingerprint_section(view: StudyView) -> str:
    rec = view.baseline if view.baseline and view.baseline.fingerprint else next(
        (r for r in view.records if r.fingerprint), None)
    if rec is None:
        return ""
    rows = [[html.escape(k), _e(v)] for k, v in rec.fingerprint.items()
            if k not in ("command", "env") and not isinstance(v, dict | list)]
    return (f'<h2 id="environment">Environment</h2><p class="hint">fingerprint of trial #{rec.number}</p>'
            + html_table(["what", "value"], rows, "fingerprint"))


def _summary_cards(inp: ReportInput) -> str:
    view = inp.view
    counts: dict[str, int] = {}
    for r in view.records:
        counts[r.state] = counts.get(r.state, 0) + 1
    starts = starts_summary(view)
    best = view.best()
    cards = [("trials", str(len(view.records))),
             ("complete / failed", f"{counts.get('complete', 0)} / {counts.get('failed', 0)}"),
             ("server starts", str(starts["starts"])),
             ("starts saved by reuse", str(starts["reused"])),
             ("identical configs not re-run", str(starts["duplicates"]))]
    if best and len(view.objectives) == 1:
        b = best[0]
        rr = view.ratio_to_default(b)
        cards.insert(0, (f"best {view.objectives[0][0]}",
                         fmt(b.objective_values[0] if b.objective_values else None)
                         + (f" ({rr:.2f}× default)" if rr else "")))
    elif best:
        cards.insert(0, ("configs on the Pareto front", str(len(best))))
    return '<div class="cards">' + "".join(
        f'<div class="stat"><div class="v">{html.escape(v)}</div><div class="k">{html.escape(k)}</div></div>'
        for k, v in cards) + "</div>"


CSS = """
:root { --fg:#1d232b; --muted:#5b6573; --line:#dde2e8; --bg:#f6f8fa; --green:#e7f6ec; --red:#fdecea;
        --orange:#fff4e0; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; color: var(--fg);
       margin: 0; background: #fff; }
main { max-width: 1400px; margin: 0 auto; padding: 20px 28px 60px; }
h1 { font-size: 24px; margin: 8px 0 2px; } h2 { font-size: 18px; margin: 34px 0 10px;
     border-bottom: 1px solid var(--line); padding-bottom: 4px; } h3 { font-size: 15px; margin: 0 0 6px; }
.hint { color: var(--muted); font-size: 12.5px; } .bad { color: #b71c1c; font-weight: 600; }
nav a { margin-right: 14px; color: #2f6db5; text-decoration: none; font-size: 13px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 16px 0; }
.stat { background: var(--bg); border: 1px solid var(--line); border-radius: 8px; padding: 8px 14px;
        min-width: 150px; }
.stat .v { font-size: 19px; font-weight: 650; } .stat .k { color: var(--muted); font-size: 12px; }
.card { border: 1px solid var(--line); border-left: 5px solid #9aa5b1; border-radius: 6px;
        padding: 10px 14px; margin: 10px 0; background: #fff; }
.card.best { border-left-color: #1b9e4b; } .card.failed { border-left-color: #c62828; }
.card ul { margin: 4px 0 6px; padding-left: 20px; }
pre { background: #0f1720; color: #e6edf3; padding: 9px 12px; border-radius: 6px; overflow-x: auto;
      font: 12px/1.45 ui-monospace, "DejaVu Sans Mono", monospace; margin: 4px 0; }
pre.cmd { white-space: pre-wrap; word-break: break-all; }
pre.log { white-space: pre-wrap; word-break: break-word; }
table { border-collapse: collapse; width: 100%; font-size: 12.5px; margin: 6px 0; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 7px; text-align: left; vertical-align: top; }
th { background: var(--bg); cursor: pointer; vertical-align: bottom; }
.scroll { overflow-x: auto; }
td { font-variant-numeric: tabular-nums; }
#trials td:last-child { min-width: 260px; max-width: 420px; word-break: break-word; }
tr.best td { background: var(--green); } tr.failed td { background: var(--red); }
tr.infeasible td { background: var(--orange); }
.state { font-weight: 600; } .state.failed { color: #b71c1c; } .state.complete { color: #1b7a3e; }
figure { margin: 8px 0; } figure svg { width: 100%; height: auto; max-width: 900px; display: block; }
details summary { cursor: pointer; color: var(--muted); font-size: 12.5px; margin: 6px 0 2px; }
ul.notes li { color: #7a4b00; }
footer { margin-top: 40px; color: var(--muted); font-size: 12.5px; }
"""

# Click a header to sort its table (numbers numerically, '–' last). The page works without it.
SORT_JS = """
document.querySelectorAll("table.sortable th").forEach(function (th, col) {
  th.addEventListener("click", function () {
    var body = th.closest("table").tBodies[0], dir = th.dataset.dir === "asc" ? -1 : 1;
    th.dataset.dir = dir === 1 ? "asc" : "desc";
    var key = function (tr) { var t = tr.cells[col].textContent.trim(), n = parseFloat(t.replace("#", ""));
      return t === "–" ? null : (isNaN(n) ? t : n); };
    Array.from(body.rows).sort(function (a, b) {
      var x = key(a), y = key(b);
      if (x === null) return 1; if (y === null) return -1;
      return (typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0) : (typeof x === "number" ? -1 : 1)) * dir;
    }).forEach(function (tr) { body.appendChild(tr); });
  });
});
"""


def render_html(inp: ReportInput) -> str:
    """The whole report as one self-contained HTML document."""
    view = inp.view
    objectives = ", ".join(f"{m} ({d})" for m, d in view.objectives)
    plot = objective_plot_svg(view)
    plot_title = "Pareto front" if len(view.objectives) >= 2 else "Objective by trial"
    plot_html = (f'<figure id="objective-plot">{plot}</figure>' if plot
                 else "<p>No trial produced a measurement yet.</p>")
    sections = [
        ("best", "Best config" + ("s" if len(view.objectives) > 1 else ""), _best_section(inp)),
        ("objective", plot_title, plot_html),
        ("trials-section", "Trials", _trials_section(view)),
        ("importances", "Parameter importances", _importance_section(inp)),
        ("startup", "Startup phases", _startup_section(view)),
        ("failures", "Failures", _failures_section(view)),
    ]
    nav = "".join(f'<a href="#{i}">{html.escape(t)}</a>' for i, t, _ in sections)
    body = "\n".join(f'<section><h2 id="{i}">{html.escape(t)}</h2>\n{c}</section>' for i, t, c in sections)
    generated = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    dashboard = f"optuna-dashboard {inp.storage}" if inp.storage else ""
    footer = (f"<footer>Generated by flagsearch <code>search report</code> on {generated}. "
              + (f"Storage: <code>{html.escape(inp.storage)}</code>. Explore it interactively with "
                 f"<code>{html.escape(dashboard)}</code>. " if inp.storage else "")
              + (f"Raw samples: <code>{html.escape(str(inp.results_dir))}/trials/*/result.json</code> "
                 "(export them with <code>--csv DIR</code> or <code>--parquet DIR</code>)."
                 if inp.results_dir else "") + "</footer>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>flagsearch report: {html.escape(view.name)}</title>
<style>{CSS}</style></head>
<body><main>
<h1>Study <code>{html.escape(view.name)}</code></h1>
<p class="hint">objectives: {html.escape(objectives)}</p>
<nav>{nav}</nav>
{_summary_cards(inp)}
{body}
{_notes_section(inp)}
{_fingerprint_section(view)}
{footer}
</main><script>{SORT_JS}</script></body></html>
"""


def write_html(inp: ReportInput, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(scrub_text(render_html(inp)), encoding="utf-8")  # defence in depth: records are scrubbed
    tmp.replace(path)
    return path
