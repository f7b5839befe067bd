"""`search`: run | show | best. Spaces in, decisions out."""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from rich.table import Table

from harness import secrets
from harness.launch.registry import Terminated, install_signal_handlers, stop_all
from search import commands
from search.curves import best_per_point, best_per_workload, switch_points
from search.results import ResultsError, TrialRecord
from search.space import Config, SpaceError, load_space
from search.study import StudyRunner, default_storage
from search.summary import StudyView, load_view
from search.terminal import err, install_scrubbing_streams, safe
from search.terminal import out as console

# console/err (search.terminal): messages never folded, tables at the terminal's width or 160 columns
# when piped; user and engine text goes through safe() before it meets rich markup.
__all__ = ["console", "err"]


class ConsoleReporter:
    """Human progress: which trial, which phase, elapsed time; one line per event (CI-friendly)."""

    def __init__(self, quiet: bool = False, as_json: bool = False, maximize: bool = True):
        self.best: tuple[int, float] | None = None  # (trial, first objective) among feasible trials
        self.sign = 1.0 if maximize else -1.0
        self.quiet = quiet
        self.as_json = as_json
        self.t0 = time.monotonic()
        self.trial_t0 = self.t0
        self.prefix = ""
        self.durations: list[float] = []

    def _emit(self, event: str, **fields: Any) -> None:
        if self.as_json:
            print(json.dumps({"event": event, "elapsed_s": round(time.monotonic() - self.t0, 1), **fields},
                             default=str), flush=True)

    def trial_started(self, number: int, index: int, total: int, config: Config) -> None:
        self.trial_t0 = time.monotonic()
        self.prefix = f"trial {index}/{total} (#{number})"
        params = ", ".join(f"{k}={v}" for k, v in config.values.items())
        eta = ""
        if self.durations:
            avg = sum(self.durations) / len(self.durations)
            eta = f" · ETA ~{avg * (total - index + 1) / 60:.0f} min"
        self._emit("trial_started", number=number, index=index, total=total, params=config.as_params())
        if not self.quiet and not self.as_json:
            console.print(f"[bold]{self.prefix}[/] {safe(config.engine)}/{safe(config.model)}: {safe(params)}{eta}")

    def phase(self, text: str) -> None:
        self._emit("phase", text=text)
        if not self.quiet and not self.as_json:
            console.print(f"  [dim]{time.monotonic() - self.trial_t0:6.1f}s[/] {safe(text)}")

    def trial_finished(self, record: TrialRecord) -> None:
        self.durations.append(record.wall_s or 0.0)
        self._emit("trial_finished", number=record.number, state=record.state, metrics=record.metrics,
                   failure=record.failure.__dict__ if record.failure else None)
        if self.as_json or self.quiet:
            return
        if record.failure:
            console.print(f"  [red]failed[/]: {safe(record.failure.cause)}: {safe(record.failure.detail)}")
        else:
            shown = {k: v for k, v in record.metrics.items() if k.endswith(("output_tok_s", "quality.score"))}
            console.print("  [green]done[/]: " + ", ".join(f"{k}={v:.3g}" for k, v in shown.items()))
            feasible = all(c <= 0 for c in record.constraint_values)
            if feasible and record.objective_values and (self.best is None or record.objective_values[0]
                                                        * self.sign > self.best[1] * self.sign):
                self.best = (record.number, record.objective_values[0])
            if not feasible:
                console.print("  [yellow]infeasible[/]: a constraint is violated "
                              f"({', '.join(f'{c:+.3g}' for c in record.constraint_values)})")
        if self.best:
            console.print(f"  best so far: trial #{self.best[0]} = {self.best[1]:.4g}")
        for p in record.placebo:
            console.print(f"  [yellow]placebo?[/] {safe(p)}")

    def note(self, text: str) -> None:
        self._emit("note", text=text)
        if not self.as_json:
            console.print(safe(text))


def _fmt(value: float | None, digits: int = 3) -> str:
    """A measured number to `digits` significant digits, never in exponent form for large numbers
    (1234.5 -> "1230", not "1.23e+03")."""
    if value is None:
        return "-"
    text = f"{value:.{digits}g}"
    return f"{float(text):.0f}" if "e+" in text else text


def print_study(view: StudyView, starts: int | None = None, saved: int | None = None) -> None:
    metric_names = [m for m, _ in view.objectives]
    table = Table(title=f"study {view.name}", show_lines=False)
    for col in ("#", "state", "params", *metric_names, "x default", "quality", "errors", "ready s", "note"):
        table.add_column(col, overflow="fold")
    base_params = view.baseline.params if view.baseline else {}
    for r in sorted(view.records, key=lambda r: r.number):
        # Only what differs from the default config: the table stays readable in 100 columns.
        changed = {k: v for k, v in r.params.items() if base_params.get(k, object()) != v}
        params = ", ".join(f"{k}={v}" for k, v in changed.items()) or ("(defaults)" if base_params else "")
        values = [_fmt(v) for v in (r.objective_values or [None] * len(metric_names))]
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
        table.add_row(str(r.number), r.state, safe(params), *values, _fmt(ratio), _fmt(q),
                      _fmt(r.metrics.get("errors")), _fmt(r.ready_s), safe(note))
    console.print(table)
    if starts is not None:
        console.print(f"server starts: {starts}, saved by reuse: {saved}")
    best = view.best()
    if not best:
        console.print("[red]no feasible config[/]: every trial failed or violated a constraint")
        return
    for r in best:
        ratio = view.ratio_to_default(r)
        desc = ", ".join(f"{m}={_fmt(v, 4)}" for m, v in zip(metric_names, r.objective_values or [], strict=False))
        console.print(f"\n[bold green]best[/] trial #{r.number} (ranking, measured once): {desc}"
                      + (f" ({ratio:.2f}x the default)" if ratio else ""))
        console.print(safe(r.command))
    print_per_load(view)
    noise = view.noise()
    if noise:
        console.print(f"\n{safe(noise)}")
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
        other = f"; next #{b.runner_up} = {_fmt(b.runner_up_value, 4)}" if b.runner_up is not None else ""
        console.print(f"  {safe(b.point)}: best #{b.number} = {_fmt(b.value, 4)}{other}")
    for line in switch_points(bests) or ["the same config is best at every load point"]:
        console.print(f"  {safe(line)}")


def storage_for(target: str, storage: str | None) -> tuple[str, str]:
    """(storage URL, study name) from a study name or a results folder."""
    path = Path(target)
    if storage:
        return storage, target
    if path.is_dir() and (path / "study.db").exists():
        return default_storage(path), path.name
    candidate = Path("results") / target
    if (candidate / "study.db").exists():
        return default_storage(candidate), target
    raise ResultsError(f"no study found at {target!r} (give a results folder, or --storage URL with the name)")


def cmd_run(args: argparse.Namespace) -> int:
    space = load_space(args.space)
    if args.dry_run is not None:
        from search.dryrun import dry_run, previous_records

        records = previous_records(Path(args.results) / (args.study or space.name), args.storage)
        for line in dry_run(space, args.dry_run, records):
            print(line)
        return 0
    study_name = args.study or space.name
    results_dir = Path(args.results) / study_name
    storage = args.storage or default_storage(results_dir)
    reporter = ConsoleReporter(quiet=args.quiet, as_json=args.json,
                               maximize=space.m.objectives[0].direction == "maximize")
    runner = StudyRunner(space, storage, study_name, results_dir, reporter, seed=args.seed,
                         budget_s=args.budget_hours * 3600 if args.budget_hours else None)
    if args.warm_start:
        from search.warmstart import warm_start

        warm_url, warm_name = storage_for(args.warm_start, args.warm_storage)
        queued, added = warm_start(runner.study, optuna.load_study(study_name=warm_name, storage=warm_url))
        if queued or added:
            reporter.note(f"warm start from {warm_name}: its top {queued} config(s) run first; {added} of its trials "
                          "inform the sampler")
    if not args.json:
        console.print(f"study [bold]{safe(study_name)}[/] in {safe(storage)}; results in {safe(results_dir)}")
    try:
        runner.run(n_trials=args.trials, timeout_s=args.timeout or space.m.budget.timeout_s)
    except KeyboardInterrupt as exc:
        stop_all()
        err.print("[yellow]interrupted[/]: servers stopped; finished trials are stored; "
                  "run the same command again to resume")
        return 143 if isinstance(exc, Terminated) else 130  # the shell's codes for SIGTERM / SIGINT
    if space.m.confirm.top_k and not args.no_confirm and not runner.confirmation_fits():
        reporter.note("no confirmation: the time budget has no room for it (run `search confirm` later)")
    elif space.m.confirm.top_k and not args.no_confirm:
        from search.commands.confirm import confirm_study

        reporter.note(f"confirming: the top {space.m.confirm.top_k} config(s) and the default, fresh starts, "
                      "interleaved")
        confirmation = confirm_study(runner.study, space, results_dir, space.m.confirm.top_k,
                                     space.m.confirm.max_rounds, reporter.phase)
        if confirmation is not None:
            reporter.note(f"verdict: {confirmation.answer}")
    view = load_view(runner.study)
    if args.json:
        best = view.best()
        print(json.dumps({"event": "done", "best": [b.summary() for b in best],
                          "starts": runner.starts, "starts_saved": runner.starts_saved}, default=str))
    else:
        print_study(view, runner.starts, runner.starts_saved)
    return 0 if view.best() else 1


def open_study(name: str, storage: str) -> optuna.Study:
    """An existing study, or a one-line ResultsError (no such study, no driver for the URL)."""
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise ResultsError(f"no study named {name!r} in {storage}") from None
    except ImportError as exc:  # e.g. postgresql:// without psycopg2 installed
        raise ResultsError(f"storage {storage}: {exc}") from None


def cmd_show(args: argparse.Namespace) -> int:
    storage, name = storage_for(args.study, args.storage)
    print_study(load_view(open_study(name, storage)))
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    storage, name = storage_for(args.study, args.storage)
    view = load_view(open_study(name, storage))
    best = view.best()
    err.print(safe(view.verdict()))
    winner = (view.confirmation or {}).get("winner")
    for r in sorted(best, key=lambda r: r.number != winner):  # the confirmed winner first
        print(r.command)
    return 0 if best else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="search", description="Find the fastest good config of an LLM server.")
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run (or resume) a search over a space file")
    run.add_argument("space", help="space YAML file, e.g. spaces/smollm2-cpu.yaml")
    run.add_argument("--trials", type=int, help="total trials in the study (default: the space's budget)")
    run.add_argument("--timeout", type=float, help="stop starting new trials after this many seconds")
    run.add_argument("--study", help="study name (default: the space's name)")
    run.add_argument("--storage", help="Optuna storage URL (default: SQLite in the results folder)")
    run.add_argument("--results", default="results", help="results folder (default: ./results)")
    run.add_argument("--quiet", action="store_true", help="print only the final table")
    run.add_argument("--json", action="store_true", help="print JSON lines instead of text")
    run.add_argument("--budget-hours", type=float, metavar="H",
                     help="wall-time budget: no trial is started that the running estimate says cannot "
                          "finish in time (confirmation runs included)")
    run.add_argument("--no-confirm", action="store_true",
                     help="skip the confirmation runs of the top configs at the end (see `search confirm`)")
    run.add_argument("--warm-start", metavar="STUDY",
                     help="an earlier study (results folder or name) whose top configs run first and whose "
                          "trials inform the sampler")
    run.add_argument("--warm-storage", metavar="URL", help="the storage URL of the --warm-start study")
    run.add_argument("--seed", type=int, help="the sampler's seed (default: the space's seed mixed with this "
                                              "worker's identity, so that workers differ)")
    run.add_argument("--dry-run", type=int, nargs="?", const=5, metavar="N",
                     help="print the launches N sampled trials would make (default 5); start nothing")
    run.set_defaults(func=cmd_run)
    show = sub.add_parser("show", help="print a stored study: trials, failures, best config")
    show.add_argument("study", help="results folder or study name")
    show.add_argument("--storage")
    show.set_defaults(func=cmd_show)
    best = sub.add_parser("best", help="print the winning launch command(s), ready to paste")
    best.add_argument("study")
    best.add_argument("--storage")
    best.set_defaults(func=cmd_best)
    for module in sorted(m.name for m in pkgutil.iter_modules(commands.__path__)):
        importlib.import_module(f"search.commands.{module}").register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    install_signal_handlers()
    # Ctrl-C/SIGINT stops every command cleanly (KeyboardInterrupt: servers stopped, the trial
    # recorded as interrupted), also when the tool was started with SIGINT ignored, as a background
    # job of a script is: Python installs its handler only where SIGINT was not ignored at start.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    install_scrubbing_streams()
    args = build_parser().parse_args(argv)
    if getattr(args, "storage", None):
        secrets.remember(secrets.url_secrets(args.storage))  # a database password in --storage
    try:
        return int(args.func(args))
    except (SpaceError, ResultsError, ValueError) as exc:
        err.print(f"[red]error[/]: {safe(' '.join(str(exc).split()))}")
        return 2
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError, ImportError) as exc:
        # A corrupted, full or unreachable study storage: the root cause, in one line.
        root: BaseException = exc
        while root.__cause__ is not None:
            root = root.__cause__
        reason = str(getattr(root, "orig", None) or root).strip().splitlines()[0]
        disk = " (disk full)" if "full" in reason.lower() else ""
        stop_all()
        err.print(f"[red]error[/]: the study storage failed{disk}: {safe(reason)}")
        return 2
    except Terminated:
        stop_all()
        err.print("[yellow]terminated[/]: servers stopped; finished trials are stored")
        return 143


if __name__ == "__main__":
    sys.exit(main())
