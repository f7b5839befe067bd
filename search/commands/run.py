"""`search run SPACE`: run (or resume) a study, confirm its top configs, print the verdict."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import optuna

from harness.launch.reaper import Terminated, stop_all
from search.commands.show import print_study
from search.exit_codes import Exit
from search.shipped import resolve_space, shipped_names
from search.space.space import Config, Space, SpaceError, load_space
from search.store.results import TrialRecord
from search.store.storage import default_storage, storage_for
from search.store.storage import study_name as checked_name
from search.store.summary import load_view
from search.study.study import StudyRunner
from search.study.unified_memory import DROP_PAGE_CACHE
from search.terminal import err, printable, safe


class ConsoleReporter:
    """Human progress on stderr (stdout keeps the final table, or the JSON events with --json): which trial,
    which phase, elapsed time; one line per event (CI-friendly)."""

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
            err.print(f"[bold]{self.prefix}[/] {safe(config.engine)}/{safe(config.model)}: {safe(params)}{eta}")

    def phase(self, text: str) -> None:
        self._emit("phase", text=text)
        if not self.quiet and not self.as_json:
            err.print(f"  [dim]{time.monotonic() - self.trial_t0:6.1f}s[/] {safe(text)}")

    def trial_finished(self, record: TrialRecord) -> None:
        self.durations.append(record.wall_s or 0.0)
        self._emit("trial_finished", number=record.number, state=record.state, metrics=record.metrics,
                   failure=record.failure.__dict__ if record.failure else None)
        if self.as_json or self.quiet:
            return
        if record.failure:
            err.print(f"  [red]failed[/]: {safe(record.failure.cause)}: {safe(record.failure.detail)}")
        else:
            shown = {k: v for k, v in record.metrics.items() if k.endswith(("output_tok_s", "quality.score"))}
            err.print("  [green]done[/]: " + ", ".join(f"{k}={v:.3g}" for k, v in shown.items()))
            feasible = all(c <= 0 for c in record.constraint_values)
            if feasible and record.objective_values and (self.best is None or record.objective_values[0]
                                                        * self.sign > self.best[1] * self.sign):
                self.best = (record.number, record.objective_values[0])
            if not feasible:
                err.print("  [yellow]infeasible[/]: a constraint is violated "
                              f"({', '.join(f'{c:+.3g}' for c in record.constraint_values)})")
        if self.best:
            err.print(f"  best so far: trial #{self.best[0]} = {self.best[1]:.4g}")
        for p in record.placebo:
            err.print(f"  [yellow]placebo?[/] {safe(p)}")

    def note(self, text: str) -> None:
        self._emit("note", text=text)
        if not self.as_json:
            err.print(safe(text))


def confirm_after(runner: StudyRunner, space: Space, results_dir: Path, reporter: ConsoleReporter,
                  no_confirm: bool) -> None:
    """The confirmation at the end of a run (stored round by round: a resumed run resumes it)."""
    if space.m.confirm.top_k and not no_confirm and not runner.confirmation_fits():
        reporter.note("no confirmation: the time budget has no room for it (run `search confirm` later)")
    elif space.m.confirm.top_k and not no_confirm:
        from search.commands.confirm import confirm_study

        reporter.note(f"confirming: the top {space.m.confirm.top_k} config(s) and the default, fresh starts, "
                      "interleaved")
        confirmation = confirm_study(runner.study, space, results_dir, space.m.confirm.top_k,
                                     space.m.confirm.max_rounds, reporter.phase)
        if confirmation is not None:
            reporter.note(f"verdict: {confirmation.answer}")


def cmd_run(args: argparse.Namespace) -> int:
    source = resolve_space(args.space)
    if not Path(source).exists():
        raise SpaceError(f"{args.space}: no such file, and no shipped space of that name (shipped: "
                         f"{', '.join(shipped_names())})")
    space = load_space(source)
    if args.dry_run is not None:
        from search.study.dryrun import dry_run, previous_records

        records = previous_records(Path(args.results) / checked_name(args.study or space.name), args.storage)
        for line in dry_run(space, args.dry_run, records, confirm=not args.no_confirm):
            print(printable(line))
        return 0
    if args.preflight or not args.no_preflight:
        from search.study.preflight import preflight

        ran: list[str] = []
        problems = preflight(space, progress=lambda text: err.print(safe(text)) if not args.quiet else None,
                             warn=lambda text: err.print(f"[yellow]preflight warning[/]: {safe(text)}"), ran=ran)
        # What preflight ran is the space's own command (its --help): said, never "nothing was started".
        what_ran = f"; it ran only {', '.join(f'`{r}`' for r in ran)} to read the flags" if ran else \
            "; it ran no command (the flag lists were cached)"
        for line in problems:
            err.print(f"[red]preflight[/]: {safe(line)}")
        if problems:
            err.print(f"preflight: {len(problems)} problem(s); no server was started{safe(what_ran)}")
            return Exit.USAGE
        if args.preflight:
            err.print(f"preflight: every image, checkpoint path and flag name is fine{safe(what_ran)}")
            return 0
    study_name = checked_name(args.study or space.name)  # a folder under results/, never outside it
    results_dir = Path(args.results) / study_name
    storage = args.storage or default_storage(results_dir)
    reporter = ConsoleReporter(quiet=args.quiet, as_json=args.json,
                               maximize=space.m.objectives[0].direction == "maximize")
    runner = StudyRunner(space, storage, study_name, results_dir, reporter, seed=args.seed,
                         budget_s=args.budget_hours * 3600 if args.budget_hours else None,
                         drop_page_cache=DROP_PAGE_CACHE if args.drop_page_cache else None)
    runner.estimator.confirm = not args.no_confirm  # --budget-hours then reserves no time for a confirmation
    if args.warm_start:
        from search.sampling.warmstart import warm_start

        warm_url, warm_name = storage_for(args.warm_start, args.warm_storage)
        with runner.lock:  # workers that start together queue the earlier study's configs once
            queued, added = warm_start(runner.study, optuna.load_study(study_name=warm_name, storage=warm_url))
        if queued or added:
            reporter.note(f"warm start from {warm_name}: its top {queued} config(s) run first; {added} of its trials "
                          "inform the sampler")
    if not args.json:
        err.print(f"study [bold]{safe(study_name)}[/] in {safe(storage)}; results in {safe(results_dir)}")
    if runner.guided_by:
        reporter.note(f"guided phase (after the space-filling design): {runner.guided_by}; the stop rule's model: "
                      "flagsearch's own GP")
    try:
        runner.run(n_trials=args.trials, timeout_s=args.timeout or space.m.budget.timeout_s)
        confirm_after(runner, space, results_dir, reporter, args.no_confirm)
    except KeyboardInterrupt as exc:
        stop_all()
        err.print("[yellow]interrupted[/]: servers stopped; finished trials and confirmation rounds are stored; "
                  "run the same command again to resume")
        return Exit.TERMINATED if isinstance(exc, Terminated) else Exit.INTERRUPTED
    view = load_view(runner.study)
    if args.json:
        best = view.best()
        print(json.dumps({"event": "done", "best": [b.summary() for b in best],
                          "starts": runner.starts, "starts_saved": runner.starts_saved}, default=str))
    else:
        print_study(view, runner.starts, runner.starts_saved, guide=False)
    return Exit.PASS if view.best() else Exit.REGRESSION



def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    run = sub.add_parser("run", help="run (or resume) a search over a space file")
    run.add_argument("space", help="space YAML file, e.g. spaces/smollm2-cpu.yaml, or the name of a shipped space "
                                   "(smollm2-cpu, llamacpp-cpu, ...: search/shipped.py)")
    run.add_argument("--trials", type=int, help="total trials in the study (default: the space's budget)")
    run.add_argument("--timeout", type=float, help="stop starting new trials after this many seconds")
    run.add_argument("--study", help="study name (default: the space's name)")
    run.add_argument("--storage", help="Optuna storage URL (default: SQLite in the results folder)")
    run.add_argument("-o", "--out", "--results", dest="results", default="results", metavar="DIR",
                     help="results folder (default: ./results; --results is the old name)")
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
    run.add_argument("--drop-page-cache", action="store_true",
                     help="unified memory: drop the page cache (sync; echo 3 > /proc/sys/vm/drop_caches, as root or "
                          "through sudo -n) before a start whose memory share the page cache holds")
    run.add_argument("--preflight", action="store_true",
                     help="only check that every image, checkpoint path and flag name exists (flags against each "
                          "engine build's own --help); start nothing")
    run.add_argument("--no-preflight", action="store_true",
                     help="skip the preflight that otherwise runs before the first start")
    run.set_defaults(func=cmd_run)
