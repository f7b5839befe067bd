"""The demo's own budget replayed (`python -m bench.replay TABLE --demo K=V ... --noise LEVELS`): the
default first, the space-filling design, then guided configs up to the demo's trials, each start
drawn from the table's spread (bench/noisy_replay.py: Noise); then the demo's confirmation of the
best config other than the default against it and the 10% positive control, with the product's test and
answer (search/confirm/confirm.py: judge, confirmation_answer): DEMO_ROUNDS rounds at most, DEMO_REPEATS runs a start,
each start's level N(0, the noise level) and its runs the table's run residuals drawn again. Two
scores per noise level: the ranking's best within 5% of the table's best median at the demo's load,
and the answer within 5%: the confirmed winner, else the default (kept when nothing is confirmed,
also when the verdict is withheld, which is counted apart)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.common import typed_cell
from bench.noisy_replay import Noise, Run, guided_step, level_sd, measured_runs
from search.confirm.confirm import Arm, confirmation_answer, judge
from search.sampling.sampler import latin_design
from search.verdicts.sequential import MIN_STARTS, settled

if TYPE_CHECKING:
    from bench.replay import Table

# The demo space's (spaces/smollm2-cpu.yaml: budget.trials, confirm.max_rounds, confirm.repeats, its
# control's slowdown; a test holds them equal) and the design size its sampler gives it.
DEMO_TRIALS = 10
DEMO_DESIGN = 4
DEMO_ROUNDS = 6
DEMO_REPEATS = 3
DEMO_CONTROL = 0.1


def demo_ranking(table: Table, values: np.ndarray, seed: int, default: int, trials: int, design: int) -> list[int]:
    """A replay of `make demo`'s search: the default first, `design` space-filling configs, then
    configs guided by the model until `trials` starts; returns the measured configs, best first."""
    run = Run(table, values)
    run.measure(default)
    rows = [r for r in latin_design(run.dists, design * 4, seed) if tuple(r.values()) in run.index]
    for row in [r for r in rows if run.index[tuple(r[p] for p in table.params)] != default][:design]:
        run.measure(run.index[tuple(row[p] for p in table.params)])
    rng = np.random.default_rng(seed)
    while run.untried() and run.starts < trials:
        guided_step(run, rng)
    measured = sorted(((o.value, run.index[tuple(o.params[p] for p in table.params)]) for o in run.observed
                       if o.value is not None), reverse=True)
    return list(dict.fromkeys(i for _, i in measured))


def demo_pick(table: Table, values: np.ndarray, seed: int, default: int, trials: int, design: int) -> int | None:
    """The demo's ranking's best measured config (None when nothing was measured)."""
    ranked = demo_ranking(table, values, seed, default, trials, design)
    return ranked[0] if ranked else None


def demo_confirm(medians: dict[str, float], noise: Noise, start_sd: float, seed: int) -> tuple[bool, bool]:
    """The demo's confirmation of a top config against the default (true medians at the demo's load,
    keys "default" and "top") beside the default behind a DEMO_CONTROL slowdown: (the top confirmed
    better, the verdict withheld)."""
    rng = np.random.default_rng([seed, 7])
    arms = [Arm(0, "default", {}, key="0"), Arm(1, "#1", {}, key="1"),
            Arm(-1, "control1", {}, key="control1", control={"slowdown": DEMO_CONTROL})]
    truth = [medians["default"], medians["top"], medians["default"] * (1 - DEMO_CONTROL)]
    looks = tuple(range(MIN_STARTS, DEMO_ROUNDS + 1))
    verdicts = {}
    for rnd in range(DEMO_ROUNDS):
        for arm, mu in zip(arms, truth, strict=True):
            runs = noise.residuals[rng.integers(len(noise.residuals), size=DEMO_REPEATS)]
            arm.runs.append([float(v) for v in mu * np.exp(rng.normal(0.0, start_sd) + runs)])
        if rnd + 1 >= MIN_STARTS:
            verdicts = judge(arms, "demo.decode_tok_s", "maximize", 0.03, looks)
            if all(settled(v) for v in verdicts.values()):
                break
    answer, winner = confirmation_answer(arms, verdicts, False, "maximize")
    return winner is not None, answer.startswith("verdict withheld")


def demo_report(path: Path, default: dict[str, Any], levels: list[str], seeds: int, trials: int = DEMO_TRIALS,
                design: int = DEMO_DESIGN, within: float = 0.05, level: int | None = None) -> str:
    """Per noise level: how often the demo's ranking's best and its confirmed answer are within
    `within` of the table's best median at `level` (default: the table's highest load level)."""
    from bench.replay import load_table

    table = load_table(path)
    table.judge(0.03)
    noise = Noise(table, measured_runs(path, table))
    key = tuple(typed_cell(str(default[p])) for p in table.params)
    if key not in table.points:
        raise SystemExit(f"{path}: the default {default} is not a measured config of the table")
    lv = level or max(table.levels)
    best = max(pts[lv].median for pts in table.points.values() if lv in pts)
    home = table.configs.index(key)

    def median(i: int) -> float:
        point = table.points.get(table.configs[i], {}).get(lv)
        return point.median if point is not None else 0.0

    lines = [f"demo budget on {table.name}: default + {design} space-filling + {trials - 1 - design} guided = "
             f"{trials} starts, then the confirmation of the best config other than the default "
             f"({DEMO_ROUNDS} rounds at most, {DEMO_REPEATS} runs a start, a {100 * DEMO_CONTROL:.0f}% control); "
             f"within {100 * within:.0f}% of the best median at load {lv} ({best:.4g}; the default "
             f"{median(home):.4g}); {seeds} seeds", "",
             "| start noise | ranking's best within | answer within | confirmed | withheld | ranking's best "
             "(config: count) |", "|---|---|---|---|---|---|"]
    for name in levels:
        sd = level_sd(name, noise)
        picks: dict[int, int] = {}
        near = answered = confirmed = withheld = 0
        for s in range(seeds):
            ranked = demo_ranking(table, noise.draws(s, sd), s, home, trials, design)
            if not ranked:
                continue
            i = ranked[0]
            picks[i] = picks.get(i, 0) + 1
            near += median(i) >= (1 - within) * best
            # As the product (search/confirm/confirm.py: candidates), the confirmation's top config is the best
            # measured one other than the default, also when the default ranked first.
            top = next((j for j in ranked if j != home), None)
            won, held = (False, False) if top is None else demo_confirm(
                {"default": median(home), "top": median(top)}, noise, sd, s)
            confirmed += won
            withheld += held
            answered += median(top if won and top is not None else home) >= (1 - within) * best
        counts = ", ".join(f"{'/'.join(str(x) for x in table.configs[i])}: {n}"
                           for i, n in sorted(picks.items(), key=lambda kv: -kv[1])[:4])
        lines.append(f"| {name} ({100 * sd:.1f}%) | {near} of {seeds} ({100 * near / seeds:.0f}%) | {answered} of "
                     f"{seeds} ({100 * answered / seeds:.0f}%) | {confirmed} | {withheld} | {counts} |")
    return "\n".join(lines)
