"""python -m bench.calibrate {measure,analyze,confirmations,rejudge,gpu,power,simulate,errors,bound}: see
bench/calibrate/__init__.py."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.calibrate import bound, confirmations, live, power, rejudge, replay, simulate
from bench.common import DATA
from search.regress.baseline import parse_assignments
from search.verdicts.boundaries import BOUNDARY_KINDS


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def analyze(paths: list[Path], caps: list[int], runs: list[int]) -> str:
    """Either kind of measure file: live-ab repetitions, or the earlier tool's rotated rounds."""
    if json.loads(paths[0].read_text()).get("format") == "live-ab":
        return replay.analyze_live(paths)
    return replay.analyze(paths, caps, runs)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["power"]:  # its own options (bench.calibrate.power)
        return power.main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m bench.calibrate", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="repetitions of `search ab` for pairs of arms (live, starts servers)")
    m.add_argument("--space", type=Path, default=live.DEFAULT_SPACE)
    m.add_argument("--set", action="append", help="pin a param of the space: k=v (repeatable)")
    m.add_argument("--pairs", default="A-A2,A-T10", help="comma-separated A-B pairs of arms (live.py lists them)")
    m.add_argument("--metric", default="single.decode_tok_s", help="the gated metric (default: the decode window)")
    m.add_argument("--reps", type=int, default=10, help="repetitions of every pair")
    m.add_argument("--cap", type=int, default=6, help="rounds cap of each repetition (search ab --rounds)")
    m.add_argument("--minutes", type=float, default=15.0, help="start no repetition after this")
    m.add_argument("--boundary", choices=BOUNDARY_KINDS, default="pocock", help="the gate's thresholds")
    m.add_argument("--sides", type=int, choices=(1, 2), default=2,
                   help="1: judged as `search regress` (is B worse?), 2: as `search ab` (default)")
    m.add_argument("--out", type=Path, default=DATA / "calibration_cpu_llama_live.json")
    a = sub.add_parser("analyze", help="rates and noise of measure files (either format)")
    a.add_argument("paths", nargs="+", type=Path)
    a.add_argument("--caps", default="6,10", help="rotated-rounds files: caps to replay")
    a.add_argument("--runs", default="1,3", help="rotated-rounds files: runs per start to replay with")
    c = sub.add_parser("confirmations", help="paired noise of stored `search run` confirmations (rounds)")
    c.add_argument("paths", nargs="+", type=Path)
    r = sub.add_parser("rejudge", help="stored confirmations: their verdicts as stored and judged by the test used now")
    r.add_argument("paths", nargs="+", type=Path)
    g = sub.add_parser("gpu", help="the gate replayed on the H100 calibration CSV")
    g.add_argument("path", nargs="?", type=Path, default=DATA / "gpu_calib_h100.csv")
    g.add_argument("--caps", default="6,10")
    g.add_argument("--runs", default="1,4")
    sub.add_parser("power", help="H100 noise components, resampled and model power (own options: power -h)")
    s = sub.add_parser("simulate", help="the gate on simulated noise components")
    s.add_argument("--sd-between", type=float, required=True)
    s.add_argument("--sd-within", type=float, required=True)
    s.add_argument("--runs", default="1,3")
    s.add_argument("--caps", default="6,10")
    s.add_argument("--effects", default="0,0.05,0.10")
    s.add_argument("--trials", type=int, default=1000)
    s.add_argument("--boundary", choices=BOUNDARY_KINDS, default="pocock")
    s.add_argument("--looks", default="", help="plans to compare, ';'-separated: 'every' (after each round "
                   "from the third) or rounds, e.g. 'every;5,10'")
    e = sub.add_parser("errors", help="the error-rate verdict on simulated counts")
    e.add_argument("--rates", default="0.005,0.02,0.1")
    e.add_argument("--requests", default="100,1000")
    e.add_argument("--trials", type=int, default=2000)
    b = sub.add_parser("bound", help="starts any paired test needs at measured per-start noise (computed)")
    b.add_argument("--per-start", required=True, help="comma-separated paired residuals per start, e.g. 0.021,0.031")
    b.add_argument("--effect", type=float, default=0.05, help="the slowdown to find (0.05: -5%%)")
    b.add_argument("--cap", type=int, default=10, help="the starts per side the goal allows")
    args = p.parse_args(argv)
    if args.cmd == "measure":
        pairs = [(x.split("-", 1)[0], x.split("-", 1)[1]) for x in args.pairs.split(",")]
        live.measure(args.out, args.space, parse_assignments(args.set), pairs, args.metric, args.reps, args.cap,
                     args.minutes, args.boundary, args.sides)
        print(replay.analyze_live([args.out]))
    elif args.cmd == "analyze":
        print(analyze(args.paths, _ints(args.caps), _ints(args.runs)))
    elif args.cmd == "confirmations":
        print(confirmations.table(args.paths))
    elif args.cmd == "rejudge":
        print(rejudge.table(args.paths))
    elif args.cmd == "gpu":
        print(replay.gpu_replay(args.path, _ints(args.caps), _ints(args.runs)))
    elif args.cmd == "bound":
        print(bound.table(_floats(args.per_start), args.effect, args.cap))
    elif args.cmd == "errors":
        print(simulate.simulate_errors(_floats(args.rates), _ints(args.requests), args.trials))
    else:
        plans = tuple(() if p in ("", "every") else tuple(_ints(p)) for p in (args.looks or "every").split(";"))
        print(simulate.simulate(args.sd_between, args.sd_within, _ints(args.runs), _ints(args.caps),
                                _floats(args.effects), args.trials, plans=plans, boundary=args.boundary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
