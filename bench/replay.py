"""Replay searches over a measured ground-truth table (no engine; seconds): how many server starts
and measured points each method needs to reach a config as good as the table's best.

Methods (each seeded; the grid is one fixed order):
- grid: server configs in declared order, every request-side point measured on each start;
- random points: (server config, concurrency) points in random order, one per trial; a start
  whenever the server config changes (the old loop's unit);
- random configs: server configs in random order, every point measured on each start;
- plain TPE: Optuna's TPE over server params and concurrency, one point per trial, failures told
  as PRUNED (the old loop); a repeated point costs a trial but no start;
- flagsearch: search/sampling/sampler.py's make_sampler over the server params; every start measures all
  points and tells the best of its curve; failures told as search/sampling/sampler.py says; duplicates
  drawn again; "+ stop" also runs search/sampling/stopping.py's rule after every start and, when it
  fires, spends one confirmation start on the incumbent (counted).

"Best-equivalent": a point whose CI reaches within `--tolerance` (3%) of the best point's CI:
ci_high >= (1 - tolerance) x best ci_low, where the best point has the highest median. Replayed
values are each point's median over its repeats (the value one start's measurement gives).

    .venv/bin/python -m bench.replay bench/data/cpu_llamacpp_smollm2.csv --seeds 50
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import random
import statistics
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import optuna

from bench.common import typed_cell
from search.sampling.sampler import FAILED_KEY, FAILED_VIOLATION, failure_values, make_sampler
from search.sampling.stopping import study_should_stop
from search.space.space import Space, parse_space

MEASURE_COLUMNS = {"concurrency", "start", "repeat", "status", "failure", "output_tok_s", "ttft_p50_s",
                   "stream_tok_s", "errors", "ready_s", "max_tokens", "loadavg_1m", "loadavg_5m", "measured_at",
                   "excluded", "tok_s", "ttft_s", "decode_tok_s", "output_tokens", "wall_s", "load", "card", "machine",
                   "unix_time", "note", "notes", "label", "plan", "config", "host"}
Config = tuple[Any, ...]


@dataclass(frozen=True)
class Point:
    median: float
    ci_low: float
    ci_high: float
    n: int


@dataclass
class Table:
    name: str
    params: list[str]
    choices: dict[str, list[Any]]
    levels: list[int]
    configs: list[Config]  # grid order
    failed: set[Config]
    points: dict[Config, dict[int, Point]]
    best: Point = field(init=False)
    good: set[tuple[Config, int]] = field(init=False)

    def judge(self, tolerance: float) -> None:
        everything = [(c, lv, p) for c, pts in self.points.items() for lv, p in pts.items()]
        self.best = max((p for _, _, p in everything), key=lambda p: p.median)
        self.good = {(c, lv) for c, lv, p in everything if p.ci_high >= (1 - tolerance) * self.best.ci_low}

    @property
    def curves_or_failed(self) -> set[Config]:
        return set(self.points) | self.failed

    @property
    def noise(self) -> float:
        """The table's own noise floor: median relative half-width of its points' CIs."""
        widths = [(p.ci_high - p.ci_low) / (2 * p.median) for pts in self.points.values() for p in pts.values()
                  if p.median > 0]
        return float(np.median(widths)) if widths else 0.03

    def curve(self, config: Config) -> dict[int, Point] | None:
        return None if config in self.failed else self.points.get(config)



def _ordered(values: set[Any]) -> list[Any]:
    try:
        return sorted(values)
    except TypeError:
        return sorted(values, key=str)


def table_metric(rows: Sequence[Mapping[str, str]]) -> str:
    """The throughput column a table is judged on: the decode window (`decode_tok_s`) where
    bench.ground_truth recorded it, else its end-to-end `output_tok_s`, else the H100 table's `tok_s`."""
    if "output_tok_s" not in rows[0]:
        return "tok_s"
    return "decode_tok_s" if any(r.get("decode_tok_s") for r in rows) else "output_tok_s"


def load_table(path: Path, metric: str | None = None, level: str | None = None) -> Table:
    """A tidy CSV, one row per measured run: config columns, the load level (`concurrency`, or
    `load` in the GPU table), `status`, the metric (table_metric: `decode_tok_s`, `output_tok_s` or
    `tok_s`); warmup runs
    (repeat -1) and runs with request errors are left out; repeats of every start are pooled."""
    with path.open() as f:
        rows = list(csv.DictReader(f))
    metric = metric or table_metric(rows)
    level_col = level or ("concurrency" if "concurrency" in rows[0] else "load")
    params = [c for c in rows[0] if c not in MEASURE_COLUMNS and c not in (metric, level_col)]
    samples: dict[Config, dict[int, list[float]]] = {}
    failed: set[Config] = set()
    for row in rows:
        config = tuple(typed_cell(row[p]) for p in params)
        if row.get("status") == "failed":
            failed.add(config)
            continue
        if row.get(metric) in (None, "") or row.get("excluded") == "1":  # a stalled run the harness re-measured
            continue
        if row.get("repeat") == "-1" or row.get("status") not in (None, "ok"):
            continue
        samples.setdefault(config, {}).setdefault(int(row[level_col]), []).append(float(row[metric]))
    n_levels = len({r[level_col] for r in rows if r.get(level_col)})
    points: dict[Config, dict[int, Point]] = {}
    for config, by_level in samples.items():
        if config in failed:
            continue
        if len(by_level) < n_levels:
            failed.add(config)  # a level never measured cleanly: the config did not hold up
            continue
        points[config] = {}
        for lv, values in by_level.items():
            # With 3 repeats a bootstrap CI of the median is [min, max]: stated directly.
            points[config][lv] = Point(statistics.median(values), min(values), max(values), len(values))
    choices = {p: _ordered({c[i] for c in (*points, *failed)}) for i, p in enumerate(params)}
    known = set(points) | failed
    configs = [c for c in itertools.product(*choices.values()) if c in known]
    levels = _ordered({lv for pts in points.values() for lv in pts})
    return Table(path.stem, params, choices, levels, configs, failed, points)


@dataclass(frozen=True)
class Run:
    starts: int | None  # to the first best-equivalent point (None: never)
    trials: int | None
    stop_starts: int | None = None  # starts when the stop rule fired, confirmation included
    stop_trials: int | None = None
    picked_good: bool | None = None  # the incumbent at the stop is best-equivalent


class Counter:
    def __init__(self, table: Table):
        self.table = table
        self.starts = 0
        self.trials = 0
        self.reached: tuple[int, int] | None = None

    def point(self, config: Config, level: int) -> None:
        self.trials += 1
        if self.reached is None and (config, level) in self.table.good:
            self.reached = (self.starts, self.trials)

    def measure_config(self, config: Config) -> float | None:
        """One start measuring every point of a config; the best median of its curve (None: failed)."""
        self.starts += 1
        curve = self.table.curve(config)
        if curve is None:
            self.trials += 1
            return None
        for level in self.table.levels:
            if level in curve:
                self.point(config, level)
        return max(p.median for p in curve.values())

    def run(self, **extra: Any) -> Run:
        return Run(*(self.reached or (None, None)), **extra)


def grid(table: Table, seed: int) -> Run:
    c = Counter(table)
    for config in table.configs:
        c.measure_config(config)
        if c.reached:
            break
    return c.run()


def random_configs(table: Table, seed: int) -> Run:
    c = Counter(table)
    order = list(table.configs)
    random.Random(seed).shuffle(order)
    for config in order:
        c.measure_config(config)
        if c.reached:
            break
    return c.run()


def random_points(table: Table, seed: int) -> Run:
    c = Counter(table)
    order = [(cfg, lv) for cfg in table.configs for lv in table.levels]
    random.Random(seed).shuffle(order)
    last = None
    for config, level in order:
        if config != last:
            c.starts += 1
            last = config
        curve = table.curve(config)
        if curve is None or level not in curve:
            c.trials += 1
            last = None  # a failed start leaves no server to reuse
            continue
        c.point(config, level)
        if c.reached:
            break
    return c.run()


def _quiet_study(directions: list[Literal["minimize", "maximize"]],
                 sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna.create_study(directions=directions, sampler=sampler)


def plain_tpe(table: Table, seed: int) -> Run:
    c = Counter(table)
    study = _quiet_study(["maximize"], optuna.samplers.TPESampler(seed=seed, n_startup_trials=4))
    last = None
    seen: dict[tuple[Config, int], float | None] = {}
    known = table.curves_or_failed
    points_left = {(cfg, lv) for cfg in known for lv in table.levels}
    rng = random.Random(seed)
    skipped = 0
    while c.trials < 3 * len(table.configs) * len(table.levels) and skipped < 2_000:
        trial = study.ask()
        config = tuple(trial.suggest_categorical(p, table.choices[p]) for p in table.params)
        level = trial.suggest_categorical("concurrency", table.levels)
        if config not in known:  # not in a table cut short: asked again, at no cost
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            skipped += 1
            if skipped % 20 == 0:  # TPE stuck on configs the table lacks: a random measured point instead
                config, level = rng.choice(sorted(points_left - set(seen), key=repr) or sorted(points_left, key=repr))
                study.enqueue_trial({**dict(zip(table.params, config, strict=True)), "concurrency": level})
            continue
        if (config, level) in seen:  # the old loop: not launched again, the earlier result reused
            c.trials += 1
            value = seen[(config, level)]
        else:
            curve = table.curve(config)
            if config != last:
                c.starts += 1
                last = config
            if curve is None or level not in curve:
                c.trials += 1
                last, value = None, None
            else:
                c.point(config, level)
                value = curve[level].median
            seen[(config, level)] = value
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, value)
        if c.reached:
            break
    return c.run()


def table_space(table: Table, seed: int = 0) -> Space:
    params = {p: {"type": "categorical", "choices": table.choices[p]} for p in table.params}
    return parse_space({"name": table.name.replace(" ", "_"), "engines": {"llamacpp": {"command": ["replay"]}},
                        "models": [{"name": "m", "path": "m"}], "params": params,
                        "workloads": [{"name": "w", "streams": ["qa"]}],
                        "objectives": [{"metric": "w.output_tok_s"}],
                        "budget": {"trials": len(table.configs)}, "seed": seed})


def flagsearch(table: Table, seed: int, stop_rule: bool = False, noise_floor: float | None = None,
               guide: Literal["gp", "inner"] = "gp") -> Run:
    """The strategy: make_sampler over server configs, full curves, failures told as failures,
    duplicates drawn again, stop when the space is exhausted (and, with `stop_rule`, when
    nothing is left to win, plus one confirmation start)."""
    c = Counter(table)
    noise_floor = table.noise if noise_floor is None else noise_floor
    space = table_space(table, seed)  # the space's seed drives the initial design: one per replay
    known = set(table.configs)  # a table cut short: only its measured configs can be proposed

    def allowed(values: dict[str, Any]) -> bool:
        return tuple(values[p] for p in table.params) in known

    study = _quiet_study(["maximize"], make_sampler(space, seed, guide=guide, allowed=allowed,
                                                    noise_floor=noise_floor))
    measured: set[Config] = set()
    best: tuple[float, Config] | None = None
    while True:
        trial = study.ask()
        values = space.sample(trial).values
        config = tuple(values[p] for p in table.params)
        if config in measured:  # the sampler found nothing new: the space is exhausted
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            break
        measured.add(config)
        value = c.measure_config(config)
        if value is None:
            trial.set_constraint(FAILED_KEY, FAILED_VIOLATION)
            study.tell(trial, failure_values(study.directions))
        else:
            trial.set_constraint(FAILED_KEY, 0.0)
            study.tell(trial, value)
            if best is None or value > best[0]:
                best = (value, config)
        if stop_rule and study_should_stop(study, space, noise_floor, allowed=allowed).stop:
            break
        if not stop_rule and c.reached:
            break
        if len(measured) == len(table.configs):
            break
    if not stop_rule:
        return c.run()
    c.starts += 1  # the confirmation start of the incumbent
    c.trials += len(table.levels)
    picked = best is not None and any((best[1], lv) in table.good for lv in table.levels)
    return c.run(stop_starts=c.starts, stop_trials=c.trials, picked_good=picked)


METHODS: dict[str, Callable[[Table, int], Run]] = {
    "grid (declared server order)": grid,
    "random points (old unit)": random_points,
    "random configs (full curves)": random_configs,
    "plain TPE (old loop)": plain_tpe,
    "flagsearch, TPE after the design": lambda table, seed: flagsearch(table, seed, guide="inner"),
    "flagsearch": flagsearch,
}


def q(values: list[int | None], pct: float) -> float:
    """Percentile where a run that never reached counts as infinitely many."""
    xs = [math.inf if v is None else v for v in values]
    return float(np.percentile(xs, pct, method="higher"))


def summarize(table: Table, seeds: int, with_stop: bool = True) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for name, method in METHODS.items():
        n = 1 if method is grid else seeds
        out[name] = [method(table, seed) for seed in range(n)]
    if with_stop:
        out["flagsearch + stop rule"] = [flagsearch(table, seed, stop_rule=True) for seed in range(seeds)]
    return out


def fmt(x: float) -> str:
    return "never" if math.isinf(x) else f"{x:g}"


def report(table: Table, results: dict[str, list[Run]], tolerance: float) -> str:
    n_points = sum(len(p) for p in table.points.values())
    good_configs = {c for c, _ in table.good}
    span = math.prod(len(v) for v in table.choices.values())
    lines = [f"table {table.name}: {len(table.configs)} server configs (of the {span} its values span; "
             f"{len(table.failed)} fail to start) x "
             f"{len(table.levels)} load levels {table.levels}; {n_points} measured points; best median "
             f"{table.best.median:.2f} (CI {table.best.ci_low:.2f}-{table.best.ci_high:.2f}); best-equivalent "
             f"(within {100 * tolerance:g}% by CI): {len(table.good)} points of {len(good_configs)} configs; "
             f"noise floor (median CI half-width) {100 * table.noise:.1f}%", "",
             "| method | runs | starts to best-equivalent: median | p90 | trials: median | p90 |",
             "|---|---|---|---|---|---|"]
    for name, runs in results.items():
        starts = [r.starts for r in runs]
        trials = [r.trials for r in runs]
        lines.append(f"| {name} | {len(runs)} | {fmt(q(starts, 50))} | {fmt(q(starts, 90))} | "
                     f"{fmt(q(trials, 50))} | {fmt(q(trials, 90))} |")
    stopped = results.get("flagsearch + stop rule")
    if stopped:
        lines += ["", "| flagsearch + stop rule | median | p90 | max |", "|---|---|---|---|"]
        for label, xs in (("starts when it stopped (confirmation included)", [r.stop_starts for r in stopped]),
                          ("trials when it stopped", [r.stop_trials for r in stopped])):
            lines.append(f"| {label} | {fmt(q(xs, 50))} | {fmt(q(xs, 90))} | {fmt(q(xs, 100))} |")
        hit = sum(bool(r.picked_good) for r in stopped)
        lines.append(f"| its pick is best-equivalent | {hit} of {len(stopped)} runs | | |")
    lines += ["", goal(table, results)]
    return "\n".join(lines)


def goal(table: Table, results: dict[str, list[Run]]) -> str:
    """The issue's goal: <= 20% of the grid's starts and >= 2x fewer starts than random (median)."""
    ours = q([r.starts for r in results["flagsearch"]], 50)
    full_grid = len(table.configs)
    grid_reach = q([r.starts for r in results["grid (declared server order)"]], 50)
    rand = q([r.starts for r in results["random configs (full curves)"]], 50)
    rand_points = q([r.starts for r in results["random points (old unit)"]], 50)
    parts = [f"flagsearch median {fmt(ours)} starts = {100 * ours / full_grid:.0f}% of the full grid's "
             f"{full_grid} starts (goal <= 20%: {'met' if ours <= 0.2 * full_grid else 'missed'}); "
             f"the grid in declared order reached it at start {fmt(grid_reach)}",
             f"vs random configs {fmt(rand)}: {rand / ours:.2f}x fewer (goal >= 2x: "
             f"{'met' if rand >= 2 * ours else 'missed'})",
             f"vs random points {fmt(rand_points)}: {rand_points / ours:.2f}x fewer"]
    return "; ".join(parts) + "."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", type=Path, nargs="+")
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--tolerance", type=float, default=0.03)
    parser.add_argument("--metric", default=None, help="default: decode_tok_s, else output_tok_s, else tok_s")
    parser.add_argument("--level", default=None, help="load-level column; default: concurrency, else load")
    parser.add_argument("--noise", default=None, help="replay with start noise (bench/noisy_replay.py): levels, "
                        "e.g. table,0.02,0.05,0.1 (`table`: the table's own start-to-start spread)")
    parser.add_argument("--out", type=Path, default=Path("bench/data"),
                        help="with --noise: the folder of the raw outcomes (replay_noise_<table>.json, resumed)")
    parser.add_argument("--minutes", type=float, default=1e9, help="with --noise: start no new arm after this")
    parser.add_argument("--confirmation", choices=("model", "product", "two-stage"), default="model",
                        help="with --noise: how every arm ends: the model's re-measure of its top two (model), the "
                             "product's confirmation against the default, counted by answer (product; results in "
                             "replay_noise_<table>_product.json), or the two-stage one of bench/two_stage.py "
                             "(two-stage: its top two for 2 rounds, then the best-looking to 5; "
                             "replay_noise_<table>_two_stage.json)")
    parser.add_argument("--default-near", type=float, default=None, metavar="X",
                        help="with --noise: the replay's default is the config nearest (1 - X) x the table's best "
                             "instead of the grid's first (results' name ends _default<100X>pct)")
    parser.add_argument("--arms", default=None, help="with --noise: only the arms whose name holds this text")
    parser.add_argument("--demo", action="append", metavar="K=V", help="with --noise: replay the demo's budget "
                        "from this default config instead (repeat per param): picks within 5%% of the best")
    args = parser.parse_args()
    if args.demo:
        from bench.demo_replay import demo_report
        from search.regress.baseline import parse_assignments

        for path in args.tables:
            print(demo_report(path, parse_assignments(args.demo), (args.noise or "table,0.05").split(","), args.seeds))
        return
    if args.noise:
        import bench.noisy_replay as noisy
        from bench.noisy_replay import benchmark, result_path
        from bench.noisy_replay import report as noisy_report

        noisy.CONFIRMATION = args.confirmation
        noisy.DEFAULT_NEAR = args.default_near
        done = benchmark(args.tables, args.noise.split(","), args.seeds, args.out, args.minutes, only=args.arms)
        print(noisy_report([json.loads(result_path(args.out, p).read_text()) for p in args.tables
                            if result_path(args.out, p).exists()]))
        if not done:
            print(f"(cut at {args.minutes:g} minutes: run the same command again to go on)")
        return
    for path in args.tables:
        table = load_table(path, args.metric, args.level)
        table.judge(args.tolerance)
        print(report(table, summarize(table, args.seeds), args.tolerance))
        print()


if __name__ == "__main__":
    main()
