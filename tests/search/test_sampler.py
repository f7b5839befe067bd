"""The study's sampler (search/sampling/sampler.py): failures rank below every completed trial for TPE
(single- and multi-objective) and NSGA-II, shown by what the sampler proposes next; seeds per
worker; the space-filling start; duplicates drawn again; exhaustion.

The failure tests tell trials exactly as the study loop must (set_constraint, then tell) and
compare with the old telling (failures as PRUNED), which they show to be wrong for TPE."""

from __future__ import annotations

from typing import Any

import optuna
import pytest
from optuna.samplers import NSGAIISampler
from optuna.trial import TrialState

from search.sampling.sampler import (
    FAILED_KEY,
    FAILED_VIOLATION,
    design_space,
    failure_values,
    latin_design,
    launch_configs,
    make_sampler,
    space_exhausted,
    worker_seed,
)
from search.sampling.stopping import study_observations
from search.sampling.surrogate import repeat_spread
from search.space.space import Space, parse_space
from search.store.trial_index import RECORD_ATTR

optuna.logging.set_verbosity(optuna.logging.ERROR)
LIMIT = "errors == 0"


def make_space(params: dict[str, Any], objectives: int = 1, trials: int = 40) -> Space:
    objs = [{"metric": "w.output_tok_s"}, {"metric": "w.ttft_p50_s", "direction": "minimize"}][:objectives]
    return parse_space({"name": "t", "engines": {"llamacpp": {"command": ["llama-server"]}},
                        "models": [{"name": "m", "path": "m.gguf"}], "params": params,
                        "workloads": [{"name": "w", "streams": ["qa"]}], "objectives": objs,
                        "budget": {"trials": trials}})


LINE = {"x": {"type": "int", "low": 0, "high": 39}}


def tell(study: optuna.Study, space: Space, params: dict[str, Any], kind: str, value: float = 1.0) -> None:
    """One trial told as the loop tells it: kind = feasible | infeasible | failed | failed_as_pruned."""
    study.enqueue_trial(params)
    trial = study.ask()
    space.sample(trial)
    directions = study.directions
    if kind == "failed_as_pruned":  # the old telling
        study.tell(trial, state=TrialState.PRUNED)
        return
    if kind == "failed":
        trial.set_constraint(FAILED_KEY, FAILED_VIOLATION)
        study.tell(trial, failure_values(directions))
        return
    trial.set_constraint(FAILED_KEY, 0.0)
    trial.set_constraint(LIMIT, 0.0 if kind == "feasible" else 2.0)
    values = [value] if len(directions) == 1 else [value, 1.0 / value]
    study.tell(trial, values)


def scarce_feasible_study(space: Space, failure: str, seed: int, guide: str = "inner") -> optuna.Study:
    """Failures at x 0..4, completed-but-infeasible configs at x 35..39 (better values further
    right), one feasible config at x 20: feasible results are scarce, as early in a study."""
    directions = [o.direction for o in space.m.objectives]
    sampler = make_sampler(space, seed, n_design=0, guide=guide)  # type: ignore[arg-type]
    study = optuna.create_study(directions=directions, sampler=sampler)
    for x in range(5):
        tell(study, space, {"x": x}, failure)
    for x in range(35, 40):
        tell(study, space, {"x": x}, "infeasible", value=float(x))
    tell(study, space, {"x": 20}, "feasible", value=10.0)
    return study


def next_x(study: optuna.Study, space: Space) -> int:
    trial = study.ask()
    return int(space.sample(trial).values["x"])


@pytest.mark.parametrize("objectives", [1, 2])
def test_tpe_proposes_away_from_failures(objectives: int) -> None:
    """TPE's "good" set holds the top 10%: the feasible trial (x 20) plus one more. Told as
    PRUNED, a failure fills that slot (PRUNED ranks above infeasible) and every proposal moves
    from x 20 towards the failures; told COMPLETE with the failure violation, the slot goes to the
    least-violating infeasible result and every proposal moves away from the failures."""
    space = make_space(LINE, objectives)
    new = [next_x(scarce_feasible_study(space, "failed", seed), space) for seed in range(20)]
    old = [next_x(scarce_feasible_study(space, "failed_as_pruned", seed), space) for seed in range(20)]
    assert min(new) > 20, new
    assert max(old) < 20, old  # the old telling is what this test guards against


def test_tpe_only_failures_and_infeasible() -> None:
    """No feasible trial at all: the best infeasible results, never the failures, guide TPE."""
    space = make_space(LINE)
    proposals = []
    for seed in range(20):
        study = optuna.create_study(direction="maximize", sampler=make_sampler(space, seed, n_design=0, guide="inner"))
        for x in range(10):
            tell(study, space, {"x": x}, "failed")
        for x in range(30, 40):
            tell(study, space, {"x": x}, "infeasible", value=float(x))
        proposals.append(next_x(study, space))
    assert sum(x <= 12 for x in proposals) <= 2, proposals


def test_gp_guide_learns_from_failures_and_skips_infeasible() -> None:
    """The guided phase (single objective, enumerable space). Failures at x 0..9, results rising
    to the left from x 32 to x 12, an infeasible result at x 39 faster than all: it proposes
    next to the best feasible result, never in the failing region nor chasing the infeasible one."""
    space = make_space(LINE)
    proposals = []
    for seed in range(5):
        study = optuna.create_study(direction="maximize", sampler=make_sampler(space, seed, n_design=0))
        for x in range(10):
            tell(study, space, {"x": x}, "failed")
        tell(study, space, {"x": 39}, "infeasible", value=100.0)
        for x in (12, 16, 20, 26, 32):
            tell(study, space, {"x": x}, "feasible", value=50.0 - x)
        proposals.append(next_x(study, space))
    assert all(10 <= x <= 15 for x in proposals), proposals


def test_failed_trial_is_never_best() -> None:
    space = make_space(LINE)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(space, 0))
    tell(study, space, {"x": 1}, "failed")
    tell(study, space, {"x": 2}, "feasible", value=3.0)
    assert study.best_trial.params == {"x": 2}
    assert all(t.state == TrialState.COMPLETE for t in study.trials)


FOUR = {k: {"type": "int", "low": 0, "high": 39} for k in "abcd"}


def at(x: int) -> dict[str, int]:
    return dict.fromkeys("abcd", x)


def nsga_study(space: Space, runs: list[tuple[int, str]], seed: int = 0) -> optuna.Study:
    study = optuna.create_study(directions=["maximize", "minimize"],
                                sampler=make_sampler(space, seed, kind="nsga2", n_design=0))
    for x, kind in runs:
        tell(study, space, at(x), kind, value=float(x) + 1)
    return study


def parents(study: optuna.Study, generation: int) -> list[int]:
    inner = study.sampler.inner  # type: ignore[attr-defined]
    assert isinstance(inner, NSGAIISampler)
    return sorted(t.params["a"] for t in inner.select_parent(study, generation))


def test_nsga2_ranks_failures_last() -> None:
    """Population 4. Generation 0: 2 failures, 1 infeasible, 1 feasible; generation 1: 3
    feasible, 1 failure. The parents of generation 2 are the best 4 of both by constrained
    domination: every feasible result, no failure. Told as PRUNED, failures never enter a
    generation: NSGA-II learns nothing from them (generation 0 runs on, random, until 4 succeed)."""
    space = make_space(FOUR, objectives=2)
    runs = [(0, "failed"), (1, "failed"), (30, "infeasible"), (20, "feasible"),
            (10, "feasible"), (11, "feasible"), (12, "feasible"), (13, "failed")]
    study = nsga_study(space, runs)
    generations = [t.system_attrs.get("NSGAIISampler:generation") for t in study.trials]
    assert generations == [0, 0, 0, 0, 1, 1, 1, 1]
    assert parents(study, 2) == [10, 11, 12, 20]
    # What it proposes next: children of those parents, each param a parent's value unless
    # mutated (probability 1/4 per param, to a random value).
    values = [v for _ in range(12) for v in space.sample(study.ask()).values.values()]
    from_parents = sum(v in (10, 11, 12, 20) for v in values)
    from_failures = sum(v in (0, 1, 13) for v in values)
    assert from_parents >= 2 * len(values) // 3 and from_failures <= 3, values
    old = nsga_study(space, [(x, "failed_as_pruned" if k == "failed" else k) for x, k in runs])
    assert [t.system_attrs.get("NSGAIISampler:generation") for t in old.trials
            if t.state == TrialState.COMPLETE] == [0, 0, 0, 0, 1]


def test_nsga2_keeps_infeasible_before_failures() -> None:
    """Fewer completed trials than parents: the infeasible result is kept, failures fill the rest."""
    space = make_space(FOUR, objectives=2)
    study = nsga_study(space, [(0, "failed"), (1, "failed"), (30, "infeasible"), (2, "failed"),
                               (3, "failed"), (4, "failed"), (20, "feasible"), (5, "failed")])
    chosen = parents(study, 2)
    assert 20 in chosen and 30 in chosen, chosen


def test_worker_seeds_differ_and_are_stable() -> None:
    seeds = {worker_seed(0, f"host-{i}:{1000 + i}") for i in range(50)}
    assert len(seeds) == 50
    assert worker_seed(0, "a") == worker_seed(0, "a") != worker_seed(1, "a")


GRID = {"a": {"type": "categorical", "choices": [1, 2, 3]}, "b": {"type": "categorical", "choices": ["x", "y"]},
        "c": {"type": "int", "low": 0, "high": 3}, "concurrency": {"type": "categorical", "choices": [1, 4],
                                                                   "side": "request"}}


def test_design_covers_every_choice() -> None:
    space = make_space(GRID)
    dists = design_space(space)
    assert set(dists) == {"a", "b", "c"}  # request-side params are measured at every start, not searched
    rows = latin_design(dists, 6, seed=0)
    assert len({repr(r) for r in rows}) == 6
    for name, choices in (("a", [1, 2, 3]), ("b", ["x", "y"])):
        counts = [sum(r[name] == c for r in rows) for c in choices]
        assert max(counts) - min(counts) <= 1, (name, counts)
    assert latin_design(dists, 6, seed=0) == rows


def test_two_workers_never_propose_the_same_config() -> None:
    """Two workers (own seeds) on one storage, each asking while the other's trials run: the 24
    launch configs are all proposed once, then the space is exhausted."""
    space = make_space(GRID)
    storage = optuna.storages.InMemoryStorage()
    studies = [optuna.create_study(storage=storage, study_name="s", direction="maximize", load_if_exists=True,
                                   sampler=make_sampler(space, worker_seed(0, tag))) for tag in ("w1", "w2")]
    studies[0].enqueue_trial(space.default_config())
    seen = []
    for i in range(12):
        running = [s.ask() for s in studies]  # both in flight at once
        for study, trial in zip(studies, running, strict=True):
            values = space.sample(trial).values
            seen.append((values["a"], values["b"], values["c"]))
            study.tell(trial, float(values["a"] * 10 + values["c"] + i))
    assert len(seen) == len(set(seen)) == 24, seen
    assert space_exhausted(studies[0], space)


def test_not_exhausted_before_the_end() -> None:
    space = make_space(GRID)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(space, 0))
    for _ in range(5):
        trial = study.ask()
        space.sample(trial)
        study.tell(trial, 1.0)
    assert not space_exhausted(study, space)


@pytest.mark.parametrize("guide", ["gp", "inner"])
def test_allowed_configs_only(guide: str) -> None:
    """`allowed` (a memory-fit check, say): configs it rejects are never proposed, in the design,
    the guided phase or the fallback."""
    space = make_space(GRID)
    study = optuna.create_study(direction="maximize",
                                sampler=make_sampler(space, 3, guide=guide, allowed=lambda c: c["a"] != 3))  # type: ignore[arg-type]
    seen = []
    for _ in range(16):
        trial = study.ask()
        values = space.sample(trial).values
        seen.append((values["a"], values["b"], values["c"]))
        study.tell(trial, float(values["c"] + values["a"]))
    assert len(set(seen)) == 16 and all(a != 3 for a, _, _ in seen), seen


def test_each_proposal_says_how_it_was_chosen() -> None:
    """The progress line of every trial names its origin: the space-filling design first, then
    configs guided by the results (the demo's output shows both)."""
    space = make_space(GRID)
    sampler = make_sampler(space, 0, n_design=3)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for i in range(6):
        trial = study.ask()
        values = space.sample(trial).values
        trial.set_constraint(FAILED_KEY, 0.0)
        study.tell(trial, float(values["a"] + values["c"] + i % 2))
    origins = sampler.origins  # type: ignore[attr-defined]
    assert [origins[n] for n in range(3)] == [f"space-filling design {k}/3" for k in (1, 2, 3)]
    assert all(origins[n].startswith("guided: ") for n in range(3, 6)), origins


def test_a_reused_result_is_no_observation_of_the_guided_phase() -> None:
    """A trial whose config the loop copied from an earlier one (search/study/scoring.py: copy_duplicate)
    is no second measurement. With one real result and its copy, the model has one observation, too
    few to guide (it needs two): the inner sampler proposes. With a second real result it guides."""
    space = make_space(LINE)
    sampler = make_sampler(space, 0, n_design=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    tell(study, space, {"x": 20}, "feasible", value=10.0)
    study.enqueue_trial({"x": 20})
    copy = study.ask()
    space.sample(copy)
    copy.set_constraint(FAILED_KEY, 0.0)
    copy.set_constraint(LIMIT, 0.0)
    copy.set_user_attr(RECORD_ATTR, {"duplicate_of": 0})  # as the loop marks a copied result
    study.tell(copy, 10.0)
    next_x(study, space)
    n = study.trials[-1].number
    assert not sampler.origins[n].startswith("guided: the highest"), sampler.origins  # type: ignore[attr-defined]
    study.tell(n, state=TrialState.FAIL)  # that proposal left unmeasured
    tell(study, space, {"x": 30}, "feasible", value=5.0)
    next_x(study, space)
    n = study.trials[-1].number
    assert sampler.origins[n].startswith("guided: the highest"), sampler.origins  # type: ignore[attr-defined]


# The space of the H200 search that gave up (flash attention, a V cache type only where it is on, and two
# more knobs): 24 configs, 8 of them differing from another only in the conditional param.
CONDITIONAL = {"threads": {"type": "categorical", "choices": [2, 1], "default": 2},
               "parallel": {"type": "categorical", "choices": [2, 1], "default": 2},
               "ubatch_size": {"type": "categorical", "choices": [512, 128], "default": 512},
               "flash_attn": {"type": "categorical", "choices": ["on", "off"], "default": "on"},
               "cache_type_v": {"type": "categorical", "choices": ["f16", "q8_0"], "default": "f16",
                                "when": {"flash_attn": "on"}}}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_conditional_param_never_makes_the_sampler_repeat_a_measured_config(seed: int) -> None:
    """The model and the design identified a config by its unconditional params, so a config measured with
    the V cache at q8_0 looked untried and was proposed again: 9-11 distinct configs in 24 proposals. Every
    proposal is now a config not yet taken, all 24 are proposed once, then (only then) the space is
    exhausted."""
    space = make_space(CONDITIONAL, trials=24)
    assert len(launch_configs(space) or []) == 24
    study = optuna.create_study(direction="maximize", sampler=make_sampler(space, seed))
    study.enqueue_trial(space.default_config())
    seen = []
    for _ in range(24):
        assert not space_exhausted(study, space)
        trial = study.ask()
        values = space.sample(trial).values
        seen.append(tuple(sorted(values.items())))
        trial.set_constraint(FAILED_KEY, 0.0)
        study.tell(trial, float(10 * values["threads"] + 5 * (values["flash_attn"] == "on") + values["parallel"]
                                + (values.get("cache_type_v") == "q8_0")))
    assert len(set(seen)) == 24, sorted(seen)
    assert space_exhausted(study, space)


def test_configs_that_differ_in_a_conditional_param_are_no_repeats_for_the_stop_rule() -> None:
    """Two configs that differ only in the V cache type were one config to the stop rule's model: their
    difference was learnt as start noise. They are two configs now, and both count as tried."""
    space = make_space(CONDITIONAL, trials=24)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(space, 0, n_design=0))
    base = {"threads": 2, "parallel": 2, "ubatch_size": 512, "flash_attn": "on"}
    tell(study, space, {**base, "cache_type_v": "f16"}, "feasible", value=100.0)
    tell(study, space, {**base, "cache_type_v": "q8_0"}, "feasible", value=80.0)
    observed, untried = study_observations(study, space)
    assert repeat_spread(observed) == (0.0, 0)  # no config measured twice
    assert len(untried) == 22
