"""A stored study as a report: pandas tables (trials, runs, every raw request) and one HTML page.

The page is a single self-contained file: plots are drawn with matplotlib into inline SVG with
their text kept as text, and the only script is a few lines that sort tables. Nothing is fetched
when the page is viewed (no CDN, no fonts), it stays small (tens of KB per plot, where plotly
would inline ~4 MB of JavaScript), looks the same in every browser, prints, and can be mailed or
attached to a CI run. Interactive exploration is optuna-dashboard's job: it opens the same storage.

Raw samples live in <results>/<study>/trials/NNNN/result.json (see search.study.study); the study
storage holds each trial's summary (search.store.results.TrialRecord), which is what the tables use.
"""

from __future__ import annotations

from search.report.data import ReportInput, find_results_dir, load_report_input, load_results, starts_summary
from search.report.html import render_html, write_html
from search.report.plots import (
    MIN_IMPORTANCE_TRIALS,
    Importances,
    objective_plot_svg,
    param_importances,
    startup_plot_svg,
)
from search.report.tables import export_tables, requests_frame, runs_frame, trials_frame

__all__ = ["MIN_IMPORTANCE_TRIALS", "Importances", "ReportInput", "export_tables", "find_results_dir",
           "load_report_input", "load_results", "objective_plot_svg", "param_importances", "render_html",
           "requests_frame", "runs_frame", "starts_summary", "startup_plot_svg", "trials_frame", "write_html"]
