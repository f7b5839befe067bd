"""`search report STUDY --html out.html [--csv DIR] [--parquet DIR]`: the study as a page and tables."""

from __future__ import annotations

import argparse
from pathlib import Path

import optuna

from search.store.results import ResultsError
from search.store.storage import storage_for
from search.terminal import err, safe
from search.terminal import out as console


def cmd_report(args: argparse.Namespace) -> int:
    from search.report import export_tables, load_report_input, write_html

    if not (args.html or args.csv or args.parquet):
        raise ResultsError("nothing to write: give --html FILE, --csv DIR and/or --parquet DIR")
    storage, name = storage_for(args.study, args.storage)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise ResultsError(f"no study named {name!r} in {storage}") from None
    inp = load_report_input(study, storage, Path(args.results_dir) if args.results_dir else None, args.study)
    if args.html:
        console.print(f"report: {write_html(inp, Path(args.html))}")
    if args.csv or args.parquet:
        for path in export_tables(inp, Path(args.csv) if args.csv else None,
                                  Path(args.parquet) if args.parquet else None):
            console.print(f"table: {path}")
    for problem in inp.problems:
        err.print(f"[yellow]warning[/]: {safe(problem)}")  # warnings on stderr; stdout names what was written
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("report", help="write a study as one HTML page with plots, and/or CSV/Parquet "
                                             "tables of every raw sample")
    p.add_argument("study", help="results folder (results/NAME) or study name")
    p.add_argument("--storage", help="Optuna storage URL, when the study is not in a local SQLite file")
    p.add_argument("--html", metavar="FILE", help="write the self-contained HTML report here")
    p.add_argument("--csv", metavar="DIR",
                   help="write trials.csv, runs.csv and requests.csv (raw samples) here")
    p.add_argument("--parquet", metavar="DIR", help="write the same tables as Parquet files here")
    p.add_argument("--results-dir", metavar="DIR",
                   help="where trials/NNNN/result.json are (default: the study's results folder)")
    p.set_defaults(func=cmd_report)
