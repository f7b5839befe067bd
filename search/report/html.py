"""The report as one self-contained HTML page: sections, tables, CSS and a few lines of sorting JS."""

from __future__ import annotations

import html
import math
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from search.report.data import ReportInput, ratio, starts_summary
from search.report.plots import (
    importance_plot_svg,
    objective_plot_svg,
    param_importances,
    startup_plot_svg,
    startup_rows,
)
from search.report.tables import trials_frame
from search.space.schema import REQUEST_SIDE
from search.store.results import TrialRecord, TrialState, scrub_text
from search.store.summary import StudyView
from search.study.curves import best_per_point, best_per_workload, switch_points
from search.study.noise import noise_line


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
        classes.append(_row_class(r, best))
    legend = ('<p class="hint">Rows in green are the best feasible config(s); orange rows violate a '
              "constraint; red rows failed; grey rows are duplicates (an identical config's result, not "
              "run again). × default is each objective's value over the engine "
              "default's (trial #" + fmt(view.baseline_number) + "). Click a header to sort.</p>")
    return legend + html_table(columns, rows, "trials", classes)


def _row_class(r: TrialRecord, best: set[int]) -> str:
    """A trials-table row's class: a duplicate is a copy, not a constraint violation."""
    if r.number in best:
        return "best"
    if r.state == TrialState.FAILED:
        return "failed"
    if r.state == TrialState.DUPLICATE:
        return "duplicate"
    return "infeasible" if not StudyView.is_feasible(r) else ""


def _md(text: str) -> str:
    """Escaped text with its Markdown `code` spans (a command to paste) as <code>, not literal backticks."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _e(text))


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
            value = r.objective_values[i] if r.objective_values else None
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
             ("complete / failed", f"{counts.get(TrialState.COMPLETE, 0)} / {counts.get(TrialState.FAILED, 0)}"),
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

LOG_TAIL_LINES = 30
SHOWN_BEST = 4  # Pareto-front configs shown open; the others fold under a summary line


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
tr.duplicate td { color: #777; }
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


def _verdict_section(view: StudyView) -> str:
    """The confirmation (fresh starts, interleaved) apart from the single-measurement ranking."""
    c = view.confirmation
    noise = noise_line(view)
    guided = view.guide_line()
    text = (f"<p><strong>{_md(view.verdict())}</strong></p>" + (f"<p>{_md(noise)}</p>" if noise else "")
            + (f"<p>{_md(guided)}</p>" if guided else ""))
    if c is None:
        return text
    rows = []
    for key, v in sorted(c.get("verdicts", {}).items(), key=lambda kv: (not kv[0].isdigit(), kv[0].zfill(9))):
        label = f"#{_e(key)}" if key.isdigit() else f"{_e(key)} (positive control)"
        rows.append([label, _e(v.get("verdict")), fmt(v.get("ratio")),
                     f"{fmt(v.get('ci_low'))} .. {fmt(v.get('ci_high'))}", _e(v.get("n_b")), _e(v.get("note"))])
    load = c.get("load") or []
    foreign = max((w.get("foreign_cores", 0.0) for w in load), default=0.0)
    note = (f"<p class=\"hint\">{_e(c.get('rounds'))} rounds, {_e(c.get('wall_s'))} s; other programs used at most "
            f"{foreign:.2f} cores while confirming{' (contended)' if c.get('contended') else ''}.</p>")
    table = html_table(["config", "verdict", "x default", "interval", "starts", "note"], rows) if rows else ""
    return text + table + note


def _per_load_section(view: StudyView) -> str:
    metric, direction = view.objectives[0]
    bests = best_per_point(view.feasible, metric, direction == "maximize")
    if len(bests) < 2:
        bests = best_per_workload(view.feasible, metric.rpartition(".")[2], direction == "maximize")
    if len(bests) < 2:
        return "<p>One load level only.</p>"
    rows = [[_e(b.point), f"#{b.number}", fmt(b.value), f"#{b.runner_up}" if b.runner_up is not None else "",
             fmt(b.runner_up_value)] for b in bests]
    switches = switch_points(bests) or ["the same config is best at every load level"]
    return (html_table(["load level", "best", "value", "next", "its value"], rows)
            + "".join(f"<p>{_e(line)}</p>" for line in switches))


def render_html(inp: ReportInput) -> str:
    """The whole report as one self-contained HTML document."""
    view = inp.view
    objectives = ", ".join(f"{m} ({d})" for m, d in view.objectives)
    plot = objective_plot_svg(view)
    plot_title = "Pareto front" if len(view.objectives) >= 2 else "Objective by trial"
    plot_html = (f'<figure id="objective-plot">{plot}</figure>' if plot
                 else "<p>No trial produced a measurement yet.</p>")
    sections = [
        ("verdict", "Confirmed verdict", _verdict_section(view)),
        ("best", "Best config" + ("s" if len(view.objectives) > 1 else "") + " (ranking, measured once)",
         _best_section(inp)),
        ("per-load", "Best config per load level", _per_load_section(view)),
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
