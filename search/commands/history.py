"""`search history NAME`: a baseline's gate results over time, drift detection, export and plot."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from search.exit_codes import Exit
from search.regress import history


def cmd_history(args: argparse.Namespace) -> int:
    rows = history.load(args.baseline, args.dir)
    if not rows:
        said = f"no history for {args.baseline} in {args.dir or history.history_dir()}"
        print(json.dumps({"baseline": args.baseline, "rows": [], "drifts": [], "note": said}) if args.json else said)
        return Exit.NO_HISTORY
    drifts = [d for s in ("median_b", "ratio") for d in history.detect_drift(rows, args.min_effect, s)]
    # With --json, stdout is the one JSON object; what was written is said on stderr.
    say = (lambda text: print(text, file=sys.stderr)) if args.json else print
    if args.json:
        print(json.dumps({"baseline": args.baseline, "rows": rows[-args.last:],
                          "drifts": [d.to_dict() for d in drifts]}, default=str))
    else:
        for r in rows[-args.last:]:
            # A side that never started leaves no median (None) in its row.
            b = f"{r['median_b']:.4g}" if isinstance(r.get("median_b"), (int, float)) else "-"
            ratio = f"{100 * (r['ratio'] - 1):+.1f}%" if isinstance(r.get("ratio"), (int, float)) else "-"
            print(f"{r['time']}  {r['source']:8s} {r['metric']:28s} {r['verdict']:12s} "
                  f"B {b}  B/A {ratio}  {r['candidate']}")
        for d in drifts:
            print(d.describe())
    if args.export:
        say(f"wrote {history.export(rows, Path(args.export))}")
    if args.plot:
        metric = args.metric or rows[-1]["metric"]
        say(f"wrote {history.plot_history(rows, metric, Path(args.plot))}")
    return Exit.REGRESSION if any(d.flagged for d in drifts) else Exit.PASS


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("history", help="a baseline's regress/nightly results over time; flags slow drifts "
                                       "(exit 1 when one is found)")
    p.add_argument("baseline", help="baseline name")
    p.add_argument("--dir", type=Path, help="history folder (default FLAGSEARCH_HOME/history)")
    p.add_argument("--last", type=int, default=20, help="rows to print (default 20)")
    p.add_argument("--min-effect", type=float, default=0.03, help="a drift smaller than this is not flagged")
    p.add_argument("--export", help="write the history as .csv or .parquet")
    p.add_argument("--plot", help="plot one metric's B/A trend with CIs to this .png/.svg")
    p.add_argument("--metric", help="the metric to plot (default: the newest row's)")
    p.add_argument("--json", action="store_true", help="print the rows and the drift verdicts as one JSON object")
    p.set_defaults(func=cmd_history)
