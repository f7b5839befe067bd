"""Replays with noise: the benchmark of the search (`python -m bench.replay --noise ...`).

Each replayed start of a config draws its value from the table's own measured spread: the point's
median x exp(start effect + the median of the table's repeats' residuals drawn again), at every
load level, the start's value the best of its curve. The start effect is N(0, s) in log units,
s = the noise level (2%, 5%, 10%; `table`: the table's own start-to-start spread where it has
several starts per config, else none). One draw per (seed, config, k-th start of that config),
shared by every arm: the arms meet the same luck.

Every arm ends with its own pick, after the same stop rule (search/sampling/stopping.py) and the same
confirmation: the model's two best measured configs re-measured CONFIRM_ROUNDS times each on fresh
starts (counted), then the model's incumbent with those repeats is the pick. Arms differ only in
what they measure next: random configs; plain TPE (Optuna's TPESampler); Optuna's GPSampler
(needs torch; skipped without it); flagsearch (search/sampling/sampler.py's space-filling design, then the
highest expected improvement over the model's incumbent); the product's sampler itself (make_sampler) with
its own GP and with Optuna's GPSampler guiding (the latter needs torch); and random configs at fixed budgets
(no stop rule), to read the starts random needs for a given pick rate. A config an Optuna sampler
proposes again is not started again (the loop reuses the result); 25 such in a row end the
search, as in the loop. Score: the share of seeds whose pick is best-equivalent, and the starts
used (search + confirmation).

With `--confirmation product` (CONFIRMATION) every arm ends instead with the product's own confirmation
(search/confirm/confirm.py: judge, confirmation_answer, as `search run` ends): the best measured config
other than the default (confirm.top_k 1, the product's default) against the default, both started in
rounds (the default's starts count too), looks at 3..6 rounds, the blocked paired test at the study's
alpha, stopped once settled; the pick is the confirmed winner, else the default (kept when nothing is
confirmed: "no config is distinguishable", "the default stays best", "not better"). The replay's default
is the first config of the grid that starts (each param's first choice: the tables list the engine's
defaults first). Each seed's answer is counted by kind; raw outcomes go to replay_noise_<table>_product.json.

`--confirmation two-stage` ends every arm with the two-stage confirmation of bench/two_stage.py instead (TWO_STAGE:
the two best measured configs and the default for 2 rounds, then the best-looking one and the default up to 5
rounds: at most 12 starts, as the product's 6 rounds of two arms), answered alike (replay_noise_<table>_two_stage.json).
`--default-near X` (DEFAULT_NEAR) makes the replay's default the config whose true value is nearest (1 - X) x the
table's best, so that "no config distinguishable" and "the default stays best" can be the answer.
"""

from __future__ import annotations

import csv
import math
import random
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution

from bench.common import typed_cell
from bench.two_stage import TwoStagePlan, two_stage_confirmation
from search.sampling import stopping
from search.sampling.sampler import latin_design
from search.sampling.stopping import nothing_left_to_win
from search.sampling.surrogate import FailureModel, Observation, fit_gp, improvement_scores

if TYPE_CHECKING:
    from bench.replay import Config, Table


MAX_STARTS_PER_CONFIG = 40
CONFIRM_TOP = 2
CONFIRM_ROUNDS = 2
ADAPTIVE = True
CONTENTION = 0.1
STATED_FLOOR = 0.05  # the space schema's default measure.noise_floor: every arm's noise prior
EXHAUSTED_AFTER = 25
STOP_SHARE: float | None = None  # None: search/sampling/stopping.py's
N_DESIGN: int | None = None  # None: search/sampling/sampler.py's default_design_size
MIN_RESULTS: int | None = None  # None: search/sampling/stopping.py's study_should_stop (one per param, plus two)
CONFIRMATION = "model"  # "product": every arm ends with the product's confirmation against the default; "two-stage"
PRODUCT_ROUNDS = 6  # the product's confirm.max_rounds default
TWO_STAGE = TwoStagePlan(top_k=2, stage1_rounds=2, max_rounds=5)  # at most 12 starts, as the product's 6 rounds
# None: the replay's default is the grid's first config that starts; x: the config whose true value (its curve's best
# median) is closest to (1 - x) times the table's best, so that the confirmation's answer is not settled in advance.
DEFAULT_NEAR: float | None = None


@dataclass(frozen=True)
class Outcome:
    good: bool  # the pick is best-equivalent
    starts: int  # search + confirmation
    search_starts: int
    answer: str = ""  # the product's confirmation: what kind of answer it gave (ANSWERS)


class Noise:
    """A table's measured spread, and the replayed starts drawn from it."""

    def __init__(self, table: Table, runs: dict[tuple[Config, int], list[list[float]]]):
        self.table = table
        residuals = [math.log(v / float(np.median(start))) for starts in runs.values() for start in starts
                     for v in start if v > 0]
        self.residuals = np.array(residuals or [0.0])
        self.repeats = 3
        diffs = []
        for starts in runs.values():
            meds = [math.log(float(np.median(s))) for s in starts if s]
            if len(meds) >= 2:
                diffs.append(float(np.var(meds, ddof=1)))
        self.start_sd = math.sqrt(float(np.mean(diffs))) if diffs else 0.0

    def median_run_sd(self) -> float:
        """The sd of a start's value from its runs alone (the median of `repeats` drawn residuals)."""
        picks = np.random.default_rng(0).integers(len(self.residuals), size=(20_000, self.repeats))
        return float(np.std(np.median(self.residuals[picks], axis=1)))

    def draws(self, seed: int, start_sd: float) -> np.ndarray:
        """values[config index, k]: the k-th start's value (NaN: the config fails)."""
        t = self.table
        rng = np.random.default_rng(seed)
        n, k, lv = len(t.configs), MAX_STARTS_PER_CONFIG, len(t.levels)
        eff = rng.normal(0.0, start_sd, size=(n, k))
        res = self.residuals[rng.integers(len(self.residuals), size=(n, k, lv, self.repeats))]
        run = np.median(res, axis=3)
        true = np.full((n, lv), np.nan)
        for i, c in enumerate(t.configs):
            curve = t.curve(c)
            if curve is not None:
                true[i] = [curve[x].median if x in curve else np.nan for x in t.levels]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmax(true[:, None, :] * np.exp(eff[:, :, None] + run), axis=2)


def measured_runs(path: Path, table: Table) -> dict[tuple[Config, int], list[list[float]]]:
    """The table's run values per (config, load level), one list per fresh start (as load_table
    keeps them: clean runs, warm-up and errored runs left out)."""
    from bench.replay import table_metric  # imported here, as load_table is in benchmark()

    with path.open() as f:
        rows = list(csv.DictReader(f))
    metric = table_metric(rows)
    level = "concurrency" if "concurrency" in rows[0] else "load"
    out: dict[tuple[Config, int], dict[str, list[float]]] = {}
    for row in rows:
        if row.get("status") != "ok" or row.get(metric) in (None, "") or row.get("excluded") == "1":
            continue
        if row.get("repeat") == "-1":
            continue
        config = tuple(typed_cell(row[p]) for p in table.params)
        if config in table.points:
            point = out.setdefault((config, int(row[level])), {})
            point.setdefault(row.get("start", "0"), []).append(float(row[metric]))
    return {k: list(v.values()) for k, v in out.items()}


class Run:
    """One replayed study: what was measured, the starts spent."""

    def __init__(self, table: Table, values: np.ndarray, default: int | None = None):
        self.table = table
        self.values = values
        self.default = default  # None: default_index's rule (the module's DEFAULT_NEAR)
        self.dists: dict[str, BaseDistribution] = {p: CategoricalDistribution(table.choices[p]) for p in table.params}
        self.index = {c: i for i, c in enumerate(table.configs)}
        self.count = [0] * len(table.configs)
        self.observed: list[Observation] = []
        self.tried: set[int] = set()
        self.starts = 0

    def params(self, i: int) -> dict[str, Any]:
        return dict(zip(self.table.params, self.table.configs[i], strict=True))

    def measure(self, i: int) -> float | None:
        self.starts += 1
        v = float(self.values[i, min(self.count[i], MAX_STARTS_PER_CONFIG - 1)])
        self.count[i] += 1
        self.tried.add(i)
        value = None if math.isnan(v) else v
        self.observed.append(Observation(self.params(i), value))
        return value

    def untried(self) -> list[int]:
        return [i for i in range(len(self.table.configs)) if i not in self.tried]

    def should_stop(self) -> bool:
        left = self.untried()
        return nothing_left_to_win(self.observed, [self.params(i) for i in left], self.dists, STATED_FLOOR,
                                   min_results=MIN_RESULTS or len(self.dists) + 2,
                                   share=stopping.STOP_SHARE if STOP_SHARE is None else STOP_SHARE).stop

    def fork(self, default: int | None = None) -> Run:
        """A copy of this study so far, to end it another way: the same draws, the starts counted so far."""
        other = Run(self.table, self.values, default)
        other.count, other.observed, other.tried, other.starts = (list(self.count), list(self.observed),
                                                                  set(self.tried), self.starts)
        return other

    def confirm_and_pick(self) -> Outcome:
        if CONFIRMATION == "two-stage":
            return self.two_stage_confirmation(TWO_STAGE)
        return self.product_confirmation() if CONFIRMATION == "product" else self.model_confirmation()

    def default_index(self) -> int:
        """The replay's default: the grid's first config that starts (each param's first choice), or with
        DEFAULT_NEAR the config nearest that far below the table's best."""
        if self.default is not None:
            return self.default
        if DEFAULT_NEAR is not None:
            return near_default(self.table, DEFAULT_NEAR)
        return next((i for i in range(len(self.table.configs)) if not math.isnan(float(self.values[i, 0]))), 0)

    def ranked_tops(self, default: int, k: int) -> list[int]:
        """The k best measured configs other than the default, by their best measured value."""
        best: dict[int, float] = {}
        for o in self.observed:
            i = self.index[tuple(o.params[p] for p in self.table.params)]
            if o.value is not None and i != default:
                best[i] = max(best.get(i, -math.inf), o.value)
        return sorted(best, key=lambda i: -best[i])[:k]

    def two_stage_confirmation(self, plan: TwoStagePlan, control: float | None = None) -> Outcome:
        """The two-stage confirmation (bench/two_stage.py): the top plan.top_k measured configs and the default for
        plan.stage1_rounds rounds, then only the best-looking of them and the default up to plan.max_rounds; with
        `control`, a positive control every round (`measure_control`)."""
        search = self.starts
        default = self.default_index()
        tops = self.ranked_tops(default, plan.top_k)
        if not tops:
            return Outcome(self.good(default), self.starts, search, "nothing to confirm")
        index = {0: default, **{i + 1: i for i in tops}}  # arm numbers: 0 the default, config i is i + 1

        def measure(number: int) -> float | None:
            return self.measure_control(default, control or 0.0) if number < 0 else self.measure(index[number])

        result = two_stage_confirmation(measure, 0, [i + 1 for i in tops], plan, control=control)
        pick = index[result.winner] if result.winner is not None else default
        return Outcome(self.good(pick), self.starts, search, answer_kind(result.answer))

    def measure_control(self, default: int, slowdown: float) -> float | None:
        """One start of a positive control: a fresh start of the default served `slowdown` slower (as
        harness/launch/throttle.py does: throughput x (1 - slowdown))."""
        value = self.measure(default)
        return None if value is None else value * (1.0 - slowdown)

    def product_confirmation(self, top_k: int = 1, max_rounds: int = PRODUCT_ROUNDS,
                             control: float | None = None) -> Outcome:
        """The product's confirmation (search/confirm/confirm.py): the `top_k` best measured configs other than the
        default against the default, every arm in every round of fresh starts, judged and answered as `search run`
        does; with `control`, a positive control of that slowdown beside them (`measure_control`)."""
        from search.confirm.confirm import Arm, confirmation_answer, judge
        from search.verdicts.sequential import MIN_STARTS, settled

        search = self.starts
        default = self.default_index()
        tops = self.ranked_tops(default, top_k)
        if not tops:
            return Outcome(self.good(default), self.starts, search, "nothing to confirm")
        arms = [Arm(0, "default", {}, key="0")] + [Arm(i + 1, f"#{i + 1}", {}, key=str(i + 1)) for i in tops]
        if control:
            arms.append(Arm(-1, "control1", {}, key="control1", control={"slowdown": control}))
        index = {0: default, **{i + 1: i for i in tops}}  # arm numbers: 0 the default, config i is i + 1
        looks = tuple(range(MIN_STARTS, max_rounds + 1))
        verdicts = {}
        for rnd in range(max_rounds):
            for arm in arms:
                value = (self.measure_control(default, control or 0.0) if arm.number < 0
                         else self.measure(index[arm.number]))
                arm.runs.append([value] if value is not None else [])
                if value is None:
                    arm.failures.append("did not start")
            if any(a.failures for a in arms):
                break
            if rnd + 1 >= MIN_STARTS:
                verdicts = judge(arms, "w.tok_s", "maximize", 0.03, looks)
                if all(settled(v) for v in verdicts.values()):
                    break
        answer, winner = confirmation_answer(arms, verdicts, False, "maximize")
        pick = index[winner] if winner is not None else default
        return Outcome(self.good(pick), self.starts, search, answer_kind(answer))

    def good(self, i: int) -> bool:
        return any((self.table.configs[i], lv) in self.table.good for lv in self.table.levels)

    def model_confirmation(self) -> Outcome:
        """The model's CONFIRM_TOP best measured configs re-measured on fresh starts, in rounds:
        each round starts the leader and every config still in contention (a chance of at least
        CONTENTION under the model that it beats the leader), at most CONFIRM_ROUNDS rounds (fixed
        rounds of every candidate when ADAPTIVE is off); the pick is then the model's incumbent."""
        search = self.starts
        model = fit_gp(self.observed, self.dists, STATED_FLOOR)
        if model is None:
            return Outcome(False, self.starts, search)
        mu, _ = model.predict(model.configs)
        keys = [tuple(model.configs[int(j)][p] for p in self.table.params) for j in np.argsort(-mu)[:CONFIRM_TOP]]
        for _ in range(CONFIRM_ROUNDS):
            for key in keys:
                self.measure(self.index[key])
            model = fit_gp(self.observed, self.dists, STATED_FLOOR)
            assert model is not None
            if not ADAPTIVE:
                continue
            mu, sd = model.predict([dict(zip(self.table.params, k, strict=True)) for k in keys])
            lead = int(np.argmax(mu))
            z = (mu - mu[lead]) / np.sqrt(sd ** 2 + sd[lead] ** 2 + 1e-12)
            chance = 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
            keys = [k for j, k in enumerate(keys) if j == lead or chance[j] >= CONTENTION]
            if len(keys) < 2:
                break
        pick = tuple(model.incumbent()[0][p] for p in self.table.params)
        good = any((pick, lv) in self.table.good for lv in self.table.levels)
        return Outcome(good, self.starts, search)


ANSWERS = ("confirmed", "no config distinguishable", "default stays best", "no config better", "withheld",
           "not confirmed", "nothing to confirm")


def answer_kind(answer: str) -> str:
    """The kind of the product's answer (search/confirm/confirm.py confirmation_answer), by its opening words."""
    for kind, opening in (("confirmed", "confirmed:"), ("no config distinguishable", "no config is distinguishable"),
                          ("default stays best", "the default stays best"), ("no config better", "no config is better"),
                          ("withheld", "verdict withheld"), ("not confirmed", "not confirmed"),
                          ("nothing to confirm", "nothing to confirm")):
        if answer.startswith(opening):
            return kind
    return answer[:40]


def random_stop(table: Table, values: np.ndarray, seed: int) -> Outcome:
    run = Run(table, values)
    order = list(range(len(table.configs)))
    random.Random(seed).shuffle(order)
    for i in order:
        run.measure(i)
        if run.should_stop():
            break
    return run.confirm_and_pick()


def random_budget(budget: int) -> Callable[[Table, np.ndarray, int], Outcome]:
    def arm(table: Table, values: np.ndarray, seed: int) -> Outcome:
        run = Run(table, values)
        order = list(range(len(table.configs)))
        random.Random(seed).shuffle(order)
        for i in order[:budget]:
            run.measure(i)
        return run.confirm_and_pick()
    return arm


def guided_step(run: Run, rng: np.random.Generator) -> None:
    """Measure the untried config of highest expected improvement (ties drawn), as the product's guided
    phase does; configs the failure model expects to fail are skipped while others are left."""
    left = run.untried()
    failures = FailureModel(run.observed, run.dists)
    cand = [i for i in left if not failures.fails(run.params(i))] or left
    ei = improvement_scores(run.observed, [run.params(i) for i in cand], run.dists, STATED_FLOOR)
    top = np.flatnonzero(ei >= ei.max() * (1 - 1e-9))
    run.measure(cand[int(top[int(rng.integers(len(top)))])])


def flagsearch(table: Table, values: np.ndarray, seed: int) -> Outcome:
    return flagsearch_search(table, values, seed).confirm_and_pick()


def flagsearch_search(table: Table, values: np.ndarray, seed: int) -> Run:
    """flagsearch's search up to its stop rule, before any confirmation."""
    run = Run(table, values)
    n_design = N_DESIGN or max(4, min(10, len(table.params) + 2, len(table.configs) // 4))  # default_design_size
    design = [r for r in latin_design(run.dists, n_design * 4, seed) if tuple(r.values()) in run.index][:n_design]
    rng = np.random.default_rng(seed)
    for row in design:
        run.measure(run.index[tuple(row[p] for p in table.params)])
    while run.untried() and not run.should_stop():
        guided_step(run, rng)
    return run


def _optuna_arm(make: Callable[[int], optuna.samplers.BaseSampler]) -> Callable[[Table, np.ndarray, int], Outcome]:
    def arm(table: Table, values: np.ndarray, seed: int) -> Outcome:
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        run = Run(table, values)
        study = optuna.create_study(direction="maximize", sampler=make(seed))
        seen: dict[int, float | None] = {}
        again = 0
        while run.untried() and again < EXHAUSTED_AFTER:
            trial = study.ask()
            config = tuple(trial.suggest_categorical(p, table.choices[p]) for p in table.params)
            i = run.index.get(config)
            if i is None:  # not in a table cut short: asked again, at no cost
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                again += 1
                continue
            if i in seen:  # the loop does not start a finished config again: the result is reused
                again += 1
                value = seen[i]
            else:
                again = 0
                value = seen[i] = run.measure(i)
            if value is None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, math.log(value))
            if again == 0 and run.should_stop():
                break
        return run.confirm_and_pick()
    return arm


def _tpe(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=seed)


def _gp(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.GPSampler(seed=seed)


def product_sampler(guide: str) -> Callable[[Table, np.ndarray, int], Outcome]:
    """The product's own sampler (search/sampling/sampler.py make_sampler, its space-filling design and guided
    phase, `guide` "gp" or "optuna-gp") over the table's configs, failures told as the study loop tells them,
    a config the sampler proposes again (every config taken) ending the search; the same stop rule and
    confirmation as every arm."""
    def arm(table: Table, values: np.ndarray, seed: int) -> Outcome:
        from bench.replay import table_space
        from search.sampling.sampler import FAILED_KEY, FAILED_VIOLATION, failure_values, make_sampler

        optuna.logging.set_verbosity(optuna.logging.ERROR)
        run = Run(table, values)
        space = table_space(table, seed)
        known = set(table.configs)

        def allowed(params: dict[str, Any]) -> bool:
            return tuple(params[p] for p in table.params) in known

        sampler = make_sampler(space, seed, guide=guide, allowed=allowed, noise_floor=STATED_FLOOR)  # type: ignore[arg-type]
        study = optuna.create_study(direction="maximize", sampler=sampler)
        while run.untried():
            trial = study.ask()
            i = run.index[tuple(space.sample(trial).values[p] for p in table.params)]
            if i in run.tried:  # nothing untried was proposed: the space is exhausted
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                break
            value = run.measure(i)
            trial.set_constraint(FAILED_KEY, FAILED_VIOLATION if value is None else 0.0)
            study.tell(trial, failure_values(study.directions) if value is None else value)
            if run.should_stop():
                break
        return run.confirm_and_pick()
    return arm


def has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def arms(budgets: tuple[int, ...]) -> dict[str, Callable[[Table, np.ndarray, int], Outcome]]:
    out: dict[str, Callable[[Table, np.ndarray, int], Outcome]] = {
        "random configs + stop rule": random_stop,
        "plain TPE + stop rule": _optuna_arm(_tpe),
    }
    if has_torch():
        out["Optuna GPSampler + stop rule"] = _optuna_arm(_gp)
    out["flagsearch + stop rule"] = flagsearch
    # The product's sampler itself, with each guided phase (search/sampling/sampler.py choose_guide).
    out["flagsearch sampler, own GP + stop rule"] = product_sampler("gp")
    if has_torch():
        out["flagsearch sampler, GPSampler + stop rule"] = product_sampler("optuna-gp")
    for b in budgets:
        out[f"random configs, {b} starts"] = random_budget(b)
    return out


def outcome_dict(o: Outcome) -> dict[str, Any]:
    return asdict(o)


def level_sd(level: str, noise: Noise) -> float:
    return noise.start_sd if level == "table" else float(level)


def true_values(table: Table) -> dict[int, float]:
    """Each config that starts: its curve's best median (the value a noiseless start gives)."""
    out = {}
    for i, c in enumerate(table.configs):
        curve = table.curve(c)
        if curve:
            out[i] = max(p.median for p in curve.values())
    return out


def near_default(table: Table, below: float) -> int:
    """The config whose true value is nearest (1 - below) x the table's best."""
    values = true_values(table)
    target = (1 - below) * max(values.values())
    return min(values, key=lambda i: (abs(values[i] - target), i))


def result_path(folder: Path, table_path: Path) -> Path:
    kind = {"product": "_product", "two-stage": "_two_stage"}.get(CONFIRMATION, "")
    near = f"_default{100 * DEFAULT_NEAR:g}pct" if DEFAULT_NEAR is not None else ""
    return folder / f"replay_noise_{table_path.stem}{kind}{near}.json"


def benchmark(paths: list[Path], levels: list[str], seeds: int, folder: Path, minutes: float,
              budgets: tuple[int, ...] = (6, 10, 16, 24, 36), only: str | None = None) -> bool:
    """Fill folder/replay_noise_<table>.json (level -> arm -> [pick good, starts] per seed),
    resuming what it holds; starts no new arm after `minutes`. True when everything is done."""
    import json
    import time

    from bench.replay import load_table

    deadline = time.monotonic() + 60 * minutes
    for path in paths:
        out = result_path(folder, path)
        entry: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {"table": path.stem, "levels": {}}
        table = load_table(path)
        table.judge(0.03)
        noise = Noise(table, measured_runs(path, table))
        entry.update(grid_starts=len(table.configs), good_configs=len({c for c, _ in table.good}),
                     run_sd=round(noise.median_run_sd(), 4), table_start_sd=round(noise.start_sd, 4))
        for level in levels:
            sd = level_sd(level, noise)
            done = entry["levels"].setdefault(level, {"start_sd": round(sd, 4), "arms": {}})["arms"]
            draws = None
            for name, arm in arms(budgets).items():
                if only and only not in name:
                    continue
                if len(done.get(name, [])) >= seeds:
                    continue
                if time.monotonic() > deadline:
                    return False
                draws = draws or [noise.draws(s, sd) for s in range(seeds)]
                t0 = time.monotonic()
                done[name] = [[int(o.good), o.starts] + ([o.answer] if o.answer else [])
                              for o in (arm(table, draws[s], s) for s in range(seeds))]
                out.write_text(json.dumps(entry, indent=1) + "\n")
                print(f"{table.name} noise {level}: {name} in {time.monotonic() - t0:.0f} s", flush=True)
    return True


def report(entries: list[dict[str, Any]], complete_only: bool = False) -> str:
    """Markdown per table and noise level; `complete_only`: levels where the flagsearch arm ran."""
    lines = []
    for entry in entries:
        lines += [f"**{entry['table']}**: {entry['grid_starts']} server configs (the grid's starts), "
                  f"{entry['good_configs']} best-equivalent; the runs' spread {100 * entry['run_sd']:.1f}% "
                  f"(of a start's value, the median of its 3 runs), its start-to-start sd "
                  f"{100 * entry['table_start_sd']:.1f}%" + (" (one start per config: not measured)"
                                                               if not entry["table_start_sd"] else ""), "",
                  "| start noise | arm | seeds | pick best-equivalent | starts: median | p90 | % of the grid | "
                  "the product's answers |", "|---|---|---|---|---|---|---|---|"]
        for level, lv in entry["levels"].items():
            if complete_only and "flagsearch + stop rule" not in lv["arms"]:
                continue
            label = f"table ({100 * lv['start_sd']:.1f}%)" if level == "table" else f"{100 * float(level):g}%"
            for arm, outs in lv["arms"].items():
                good = np.array([o[0] for o in outs])
                starts = np.array([o[1] for o in outs])
                med = float(np.median(starts))
                kinds = [o[2] for o in outs if len(o) > 2]
                answers = ", ".join(f"{k} {kinds.count(k)}" for k in dict.fromkeys(kinds)) or "-"
                lines.append(f"| {label} | {arm} | {len(outs)} | {good.mean():.2f} | {med:g} | "
                             f"{np.percentile(starts, 90, method='higher'):g} | "
                             f"{100 * med / entry['grid_starts']:.0f}% | {answers} |")
        lines += ["", *(f"- {verdict(entry, level)}" for level, lv in entry["levels"].items()
                        if "flagsearch + stop rule" in lv["arms"]), ""]
    return "\n".join(lines)


def verdict(entry: dict[str, Any], level: str = "0.05", arm: str = "flagsearch + stop rule") -> str:
    """Issue 24's goal at one noise level: the pick best-equivalent in >= 90% of runs, <= 25% of
    the grid's starts, and >= 2x fewer starts than random configs at the same pick rate (the
    fewest fixed-budget random starts whose pick rate is at least ours; random + the stop rule too)."""
    arms = entry["levels"].get(level, {}).get("arms", {})
    if arm not in arms:
        return f"(no {arm} results at noise {level})"

    def rate(name: str) -> tuple[float, float]:
        outs = arms[name]
        return float(np.mean([o[0] for o in outs])), float(np.median([o[1] for o in outs]))

    pick, starts = rate(arm)
    share = starts / entry["grid_starts"]
    matched = sorted((rate(n)[1], n) for n in arms if n.startswith("random configs") and rate(n)[0] >= pick)
    versus = (f"random configs reach at least that pick rate with {matched[0][0]:g} starts ({matched[0][1]}): "
              f"{matched[0][0] / starts:.2f}x ours (goal >= 2x: {'met' if matched[0][0] >= 2 * starts else 'missed'})"
              if matched else "no random arm reaches that pick rate (goal >= 2x: met at any budget replayed)")
    said = "the table's own noise" if level == "table" else f"{100 * float(level):g}% start noise"
    return (f"At {said}: {arm} picks a best-equivalent config in {100 * pick:.0f}% of "
            f"runs (goal >= 90%: {'met' if pick >= 0.9 else 'missed'}) with {starts:g} starts at the median, "
            f"{100 * share:.0f}% of the grid (goal <= 25%: {'met' if share <= 0.25 else 'missed'}); {versus}.")
