"""`search show STUDY` and `search best STUDY`: a stored study's trials, per-load results and
verdict; the winning launch command(s), ready to paste."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path
from typing import Any

import optuna
from rich.table import Table

from harness.engines import get_engine
from harness.secrets import launch_secrets, scrub_text
from search.exit_codes import Exit
from search.space.space import Config, Space, load_space
from search.store.results import TrialRecord
from search.store.storage import open_existing, storage_for
from search.store.summary import StudyView, load_view
from search.study.curves import best_per_point, best_per_workload, switch_points
from search.study.noise import noise_line
from search.terminal import err, safe
from search.terminal import out as console


def fmt_number(value: float | None, digits: int = 3) -> str:
    """A measured number to `digits` significant digits, never in exponent form for large numbers
    (1234.5 -> "1230", not "1.23e+03")."""
    if value is None:
        return "-"
    text = f"{value:.{digits}g}"
    return f"{float(text):.0f}" if "e+" in text else text


def print_study(view: StudyView, starts: int | None = None, saved: int | None = None, guide: bool = True) -> None:
    """The study's table, best config(s), per-load bests, noise and verdict; `guide`: its guided-phase line too
    (`search run` said it as the run began)."""
    metric_names = [m for m, _ in view.objectives]
    table = Table(title=f"study {view.name}", show_lines=False)
    for col in ("#", "state", "params", *metric_names, "x default", "quality", "errors", "ready s", "note"):
        table.add_column(col, overflow="fold")
    base_params = view.baseline.params if view.baseline else {}
    for r in sorted(view.records, key=lambda r: r.number):
        # Only what differs from the default config: the table stays readable in 100 columns.
        changed = {k: v for k, v in r.params.items() if base_params.get(k, object()) != v}
        params = ", ".join(f"{k}={v}" for k, v in changed.items()) or ("(defaults)" if base_params else "")
        values = [fmt_number(v) for v in r.objective_values] if r.objective_values else ["-"] * len(metric_names)
        ratio = view.ratio_to_default(r)
        note = ""
        if r.failure:
            note = f"{r.failure.cause}: {r.failure.detail[:120]}"
        elif r.duplicate_of is not None:
            note = f"same as #{r.duplicate_of}"
        elif any(c > 0 for c in r.constraint_values):
            note = "infeasible (constraint)"
        if r.number == view.baseline_number:
            note = ("default; " + note).strip("; ")
        q = r.metrics.get("quality.score")
        table.add_row(str(r.number), r.state, safe(params), *values, fmt_number(ratio), fmt_number(q),
                      fmt_number(r.metrics.get("errors")), fmt_number(r.ready_s), safe(note))
    console.print(table)
    if starts is not None:
        console.print(f"server starts: {starts}, saved by reuse: {saved}")
    best = view.best()
    if not best:
        console.print("[red]no feasible config[/]: every trial failed or violated a constraint")
        return
    for r in best:
        ratio = view.ratio_to_default(r)
        pairs = zip(metric_names, r.objective_values or [], strict=False)
        desc = ", ".join(f"{m}={fmt_number(v, 4)}" for m, v in pairs)
        console.print(f"\n[bold green]best[/] trial #{r.number} (ranking, measured once): {desc}"
                      + (f" ({ratio:.2f}x the default)" if ratio else ""))
        console.print(safe(r.command))
    print_per_load(view)
    noise = noise_line(view)
    if noise:
        console.print(f"\n{safe(noise)}")
    guided = view.guide_line()
    if guide and guided:
        console.print(f"\n{safe(guided)}")
    console.print(f"\n[bold]verdict[/]: {safe(view.verdict())}")


def print_per_load(view: StudyView) -> None:
    """The best config at each load point of the first objective's curve, and where it switches."""
    metric, direction = view.objectives[0]
    bests = best_per_point(view.feasible, metric, direction == "maximize")
    what = f"{metric} at each load point"
    if len(bests) < 2:  # no ladder: the workloads are the load levels
        leaf = metric.rpartition(".")[2]
        bests, what = best_per_workload(view.feasible, leaf, direction == "maximize"), f"{leaf} in each workload"
    if len(bests) < 2:
        return
    console.print(f"\n[bold]per load[/] ({what}; each config measured at every level in one start):")
    for b in bests:
        other = f"; next #{b.runner_up} = {fmt_number(b.runner_up_value, 4)}" if b.runner_up is not None else ""
        console.print(f"  {safe(b.point)}: best #{b.number} = {fmt_number(b.value, 4)}{other}")
    for line in switch_points(bests) or ["the same config is best at every load point"]:
        console.print(f"  {safe(line)}")



def study_json(view: StudyView) -> dict[str, Any]:
    """`search show --json`: every trial's stored summary, the best, the ratios to the default, the verdict."""
    best = view.best()
    return {"study": view.name, "objectives": [{"metric": m, "direction": d} for m, d in view.objectives],
            "default_trial": view.baseline_number,
            "trials": [{**r.summary(), "ratio_to_default": view.ratio_to_default(r)}
                       for r in sorted(view.records, key=lambda r: r.number)],
            "best": [r.number for r in best], "noise": noise_line(view), "guided_by": view.guided_by,
            "confirmation": view.confirmation,
            "verdict": view.verdict()}


def cmd_show(args: argparse.Namespace) -> int:
    storage, name = storage_for(args.study, args.storage)
    view = load_view(open_existing(name, storage))
    if args.json:
        print(json.dumps(study_json(view), default=str))
    else:
        print_study(view)
    return 0


def daily_command(space: Space, record: TrialRecord, name: str, port: int) -> str:
    """The winner as a user keeps it running every day: the trial's image, flags, env and volumes, but
    a named container started detached with a restart policy and a fixed port, instead of the trial's
    throwaway `--rm` container on a free port. A process engine: its command on the fixed port."""
    config = Config(engine=record.engine, model=record.model,
                    values={k: v for k, v in record.params.items() if k not in ("engine", "model")})
    settings = space.engine_settings(config.engine)
    flags, env, _ = space.split(config)
    spec = get_engine(settings.dialect).build_launch(settings, space.model_choice(config.model), flags, env, port)
    if spec.launcher != "docker" or not spec.image:
        return spec.command_line()
    argv = spec.docker_run_argv()
    assert argv[:3] == ["docker", "run", "--rm"], argv[:3]
    daily = ["docker", "run", "-d", "--name", re.sub(r"[^A-Za-z0-9_.-]", "-", name), "--restart", "unless-stopped",
             *argv[3:]]
    return scrub_text(shlex.join(daily), launch_secrets(spec.argv, spec.env))


def _space_of(study: optuna.Study, given: str | None) -> Space | None:
    source = given or study.user_attrs.get("space_source")
    return load_space(str(source)) if source and Path(str(source)).is_file() else None


def cmd_best(args: argparse.Namespace) -> int:
    """stdout: the exact command of each best trial (paste it to run that trial's server again, in
    the foreground); stderr: the verdict and, per best trial, the command to keep it as a daily
    driver (stdout with --daily: only those)."""
    storage, name = storage_for(args.study, args.storage)
    study = open_existing(name, storage)
    view = load_view(study)
    best = view.best()
    if not args.json:
        err.print(safe(view.verdict()))
    winner = (view.confirmation or {}).get("winner")
    space = _space_of(study, args.space)
    shown = []
    for r in sorted(best, key=lambda r: r.number != winner):  # the confirmed winner first
        daily = daily_command(space, r, args.name or view.name, args.port) if space is not None else None
        if args.json:
            shown.append({"trial": r.number, "confirmed_winner": r.number == winner, "params": r.params,
                          "objective_values": r.objective_values, "command": r.command, "daily": daily})
            continue
        if args.daily:
            print(daily or r.command)
            continue
        if daily is not None:
            err.print(f"# trial #{r.number} as a daily driver (container {args.name or view.name}, port {args.port}, "
                      "restarted unless stopped, the same volumes):")
            err.print(safe(daily))
        else:
            err.print("# the daily command needs the study's space file: give --space FILE")
        err.print(f"# the exact command trial #{r.number} ran (foreground, removed when stopped):")
        print(r.command)
    if args.json:
        print(json.dumps({"study": view.name, "verdict": view.verdict(), "best": shown}, default=str))
    return Exit.PASS if best else Exit.REGRESSION


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    show = sub.add_parser("show", help="print a stored study: trials, failures, best config")
    show.add_argument("study", help="results folder or study name")
    show.add_argument("--storage")
    show.add_argument("--json", action="store_true", help="print the study as one JSON object")
    show.set_defaults(func=cmd_show)
    best = sub.add_parser("best", help="print the winning launch command(s), ready to paste")
    best.add_argument("study")
    best.add_argument("--storage")
    best.add_argument("--space", help="the space file (default: the one the study was created from)")
    best.add_argument("--name", help="the daily container's name (default: the study's name)")
    best.add_argument("--port", type=int, default=8000, help="the daily server's fixed port (default 8000)")
    best.add_argument("--daily", action="store_true", help="print only the daily command(s) on stdout")
    best.add_argument("--json", action="store_true", help="print the best trial(s), each with its exact and "
                                                          "daily command, as one JSON object")
    best.set_defaults(func=cmd_best)
