"""A two-stage confirmation, measured against the product's (search/confirm/confirm.py) in the noisy replay.

Today a finished `search run` confirms its top `confirm.top_k` configs (1 by default) against the default: every
arm is started once a round, each judged by the paired test on its own within-round differences from the default
(search/verdicts/blocked.py) at the study's alpha split over the claims, looks at 3..max rounds, stopped once every
comparison is settled. With one top config the pick rests on the search's single noisy start of each config.

The two-stage design (`TwoStagePlan`) gives the best-looking arm more starts instead:
- stage 1: `stage1_rounds` rounds of the default and the top `top_k` configs;
- then the arm whose mean within-round difference from the default is the best (the best-looking one) is carried;
  the others are dropped, their verdicts those of their last look (none before the plan's first look: inconclusive);
- stage 2: the rounds left up to `max_rounds` start only the default and the carried arm, stopped once it is settled.
Every arm is judged by the paired test on the rounds it shares with the default, at alpha / top_k, with the
threshold of the whole plan (looks at 3..max_rounds, as if it were never dropped).

Why it holds alpha whatever the arms' noise and however the carried arm is chosen: think of every arm's
differences from the default as continuing to max_rounds, measured or not. For an arm with no true difference,
its sequential test over that whole path crosses with chance at most alpha / top_k: the paired t test's null
distribution depends on no variance, so neither another arm's noise nor the default's shared with it matters.
Dropping an arm, or stopping the whole confirmation, only cuts its path short at a look; a false call in the
two-stage confirmation is a crossing of some arm's whole-path test, so the chance of any is at most top_k x alpha /
top_k = alpha (Bonferroni). The dropped arms' shares are not spent again on the carried one: judging the
carried arm at the whole alpha would let the data choose which test to run, and the best-looking of several equal
arms starts with its stage-1 luck on its side (simulated, `python -m bench.two_stage`: 2.0-2.5% at alpha 0.02, a
small excess, but one nothing bounds). tests/bench/test_two_stage.py checks the false-call rate under the issue's
unequal-noise cases.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from search.confirm.confirm import Arm, confirmation_answer
from search.verdicts.boundaries import paired_p_threshold
from search.verdicts.gate import DEFAULT_ALPHA, MetricVerdict
from search.verdicts.sequential import MIN_STARTS, compare_paired, family_alpha, paired_logs, settled

METRIC = "w.tok_s"  # the replay's metric name: any throughput (higher is better)


@dataclass(frozen=True)
class TwoStagePlan:
    top_k: int  # stage 1's top configs beside the default
    stage1_rounds: int  # rounds every arm is started before one is carried
    max_rounds: int  # the cap on the carried arm's rounds (stage 1's included)

    @property
    def looks(self) -> tuple[int, ...]:
        return tuple(range(MIN_STARTS, self.max_rounds + 1))

    def max_starts(self) -> int:
        """The most starts it spends, the default's included."""
        return (self.top_k + 1) * self.stage1_rounds + 2 * (self.max_rounds - self.stage1_rounds)

    @property
    def name(self) -> str:
        return f"two-stage top {self.top_k}, {self.stage1_rounds} rounds, then the best-looking to {self.max_rounds}"


@dataclass
class TwoStageResult:
    arms: list[Arm]  # the default first
    verdicts: dict[str, MetricVerdict]
    carried: str  # the carried arm's key
    rounds: int  # the default's rounds
    starts: int
    answer: str
    winner: int | None


def mean_difference(default: Arm, arm: Arm) -> float:
    """The arm's mean within-round log difference from the default (nan without a paired round)."""
    pairs = paired_logs(default.runs, arm.runs)
    return sum(b - a for a, b in pairs) / len(pairs) if pairs else math.nan


def judge_arm(default: Arm, arm: Arm, plan: TwoStagePlan, min_effect: float, alpha: float) -> MetricVerdict:
    """The arm against the default on the rounds both were measured in, at its share of alpha and the threshold of
    the whole plan; before the plan's first look it is not tested (inconclusive)."""
    verdict = compare_paired(METRIC, default.runs, arm.runs, direction="higher", min_effect=min_effect,
                             alpha=family_alpha(alpha, plan.top_k), looks=plan.looks)
    if verdict.n_a < plan.looks[0]:
        return dataclasses.replace(verdict, verdict="inconclusive",
                                   note=f"dropped after {verdict.n_a} rounds, before the plan's first look: not tested")
    return verdict


def two_stage_confirmation(measure: Callable[[int], float | None], default: int, tops: list[int],
                           plan: TwoStagePlan, min_effect: float = 0.03, alpha: float = DEFAULT_ALPHA,
                           control: float | None = None) -> TwoStageResult:
    """Confirm `tops` (config numbers, best measured first, at most plan.top_k) against `default` by the two-stage
    plan; `measure(number)` is one fresh start's value (None: it failed; number -1: the positive control, the
    default behind a `control` slowdown, started every round as in the product: it shows the power of the carried
    arm's comparison and takes no share of alpha). A failed start ends the confirmation (its round cannot be
    paired), as in the product."""
    arms = [Arm(default, "default", {}, key=str(default))] + [Arm(t, f"#{t}", {}, key=str(t))
                                                              for t in tops[:plan.top_k]]
    controls = [Arm(-1, "control1", {}, key="control1", control={"slowdown": control})] if control else []
    verdicts: dict[str, MetricVerdict] = {}
    active = [*arms, *controls]
    starts, rounds = 0, 0
    carried = arms[1].key if len(arms) > 1 else ""
    for rnd in range(plan.max_rounds):
        for arm in active:
            value = measure(arm.number)
            starts += 1
            arm.runs.append([value] if value is not None else [])
            if value is None:
                arm.failures.append("did not start")
        rounds = rnd + 1
        if any(a.failures for a in active):
            break
        for arm in active[1:]:
            verdicts[arm.key] = judge_arm(arms[0], arm, plan, min_effect, alpha)
        if rounds == plan.stage1_rounds and len(arms) > 2:
            best = max(arms[1:], key=lambda a: mean_difference(arms[0], a))
            carried, active = best.key, [arms[0], best, *controls]
        if rounds >= plan.looks[0] and all(settled(verdicts[a.key]) for a in active[1:]):
            break
    arms += controls
    answer, winner = confirmation_answer(arms, verdicts, False, "maximize")
    return TwoStageResult(arms, verdicts, carried, rounds, starts, answer, winner)


def simulated_false_calls(scale: tuple[float, ...], plan: TwoStagePlan, sims: int, rng: np.random.Generator,
                          alpha: float = DEFAULT_ALPHA, carried_alpha: float | None = None) -> np.ndarray:
    """Whether each of `sims` simulated two-stage confirmations with no true difference calls some arm different,
    by the statistic `judge_arm` uses: every arm at the looks up to stage 1's end, the carried arm (the best mean
    difference over stage 1) at every look; `scale`: each arm's start noise (log), the default's first, top_k + 1 of
    them. Each arm at alpha / top_k with the whole plan's threshold; `carried_alpha`: the carried arm at that
    instead (the rule that spends the dropped arms' shares on it). The confirmation stops at the first look with a
    call (min_effect 0: a call is a crossing) and a dropped arm keeps its verdict, so where stage 1 ends before or
    at the plan's first look this is exactly whether it makes a false call (more looks in stage 1: an upper bound,
    since a crossing there can be looked at again)."""
    from scipy import special  # lazily, as everywhere in the product

    k = plan.top_k
    x = rng.standard_normal((sims, k + 1, plan.max_rounds)) * np.array(scale)[None, :, None]
    d = x[:, 1:, :] - x[:, :1, :]
    carried = d[:, :, :plan.stage1_rounds].mean(axis=2).argmax(axis=1)
    own = paired_p_threshold(plan.looks, family_alpha(alpha, k))
    chosen = own if carried_alpha is None else paired_p_threshold(plan.looks, carried_alpha)
    called = np.zeros(sims, dtype=bool)
    for n in plan.looks:
        y = d[:, :, :n]
        t = y.mean(axis=2) / (y.std(axis=2, ddof=1) / math.sqrt(n))
        p = 2 * special.stdtr(n - 1, -np.abs(t))  # sims x arms
        p_carried = p[np.arange(sims), carried]
        called |= p_carried < chosen
        if n <= plan.stage1_rounds:
            called |= (p < own).any(axis=1)
    return called


# The noise cases (default first, then the top configs; a third top config as quiet as the last).
CASES = [(0.02, 0.02, 0.02), (0.02, 0.05, 0.02), (0.05, 0.02, 0.02), (0.015, 0.06, 0.015), (0.06, 0.015, 0.015)]
PLANS = [TwoStagePlan(2, 2, 5), TwoStagePlan(2, 3, 6), TwoStagePlan(3, 2, 4)]


def case_scale(case: tuple[float, ...], plan: TwoStagePlan) -> tuple[float, ...]:
    return (*case, *[case[-1]] * (plan.top_k + 1 - len(case)))


def false_call_table(sims: int, seed: int = 20261202) -> str:
    """Markdown: per plan and noise case, the simulated false-call rate of the two-stage rule and of the carried
    config judged at the whole alpha."""
    rng = np.random.default_rng(seed)
    lines = ["| plan | start noise (default, top configs) | false calls: each at alpha / top_k | "
             "the carried one at the whole alpha |", "|---|---|---|---|"]
    for plan in PLANS:
        for case in CASES:
            scale = case_scale(case, plan)
            own = float(simulated_false_calls(scale, plan, sims, rng).mean())
            naive = float(simulated_false_calls(scale, plan, sims, rng, carried_alpha=DEFAULT_ALPHA).mean())
            noise = ", ".join(f"{100 * s:g}%" for s in scale)
            lines.append(f"| {plan.name} | {noise} | {100 * own:.2f}% | {100 * naive:.2f}% |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(false_call_table(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000))
