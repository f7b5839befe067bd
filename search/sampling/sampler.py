"""The study's sampler: a space-filling start, then the guided phase (Optuna's GPSampler where torch is
importable, else flagsearch's own GP; TPE or NSGA-II for several objectives or a continuous space); failures
rank last; one seed per worker; a proposal that repeats a measured config is replaced.

How the loop must tell a trial (see `tell_failed_args` and docs/search.md):
- completed: state COMPLETE with its objective values; its constraints via `trial.set_constraint`
  (<= 0 feasible), plus `set_constraint(FAILED_KEY, 0.0)`.
- failed (did not start, crashed, unresponsive, won't fit, degenerate output, ...): state COMPLETE
  (not PRUNED, not FAIL) with `failure_values(directions)` as its values and
  `set_constraint(FAILED_KEY, FAILED_VIOLATION)`. Why: Optuna 5's TPE ranks feasible COMPLETE >
  PRUNED > infeasible (by total violation), so a violation larger than any real one puts a failure
  below every completed trial, feasible or not; NSGA-II reads only COMPLETE trials and ranks
  infeasible ones by total violation, so the same telling ranks failures last there too. Both
  read only the violation of an infeasible trial, never its values, so the values only need to be
  finite (NaN and inf break NSGA-II's crowding distance) and obviously not results.
- interrupted (the worker died): FAIL, as today; samplers ignore FAIL trials and it is re-run.

The initial design is shared by all workers (built from the space's seed, row = trial number
minus the enqueued trials before it), so two workers on one study take different rows; the
model-based phase uses the worker's own seed (`worker_seed`).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal, cast

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers import BaseSampler, GPSampler, NSGAIISampler, RandomSampler, TPESampler
from optuna.samplers._ga import BaseGASampler
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState, create_trial

from harness.launch.reaper import worker_tag
from search.sampling.surrogate import FailureModel, Observation, improvement_scores
from search.space.schema import REQUEST_SIDE, FixedParam
from search.space.space import Space
from search.space.values import default_value, distribution
from search.store.summary import GUIDE_ATTR
from search.store.trial_index import RECORD_ATTR

FAILED_KEY = "failed"
QUEUED_ATTR = "queued"  # user attr of a trial queued by the space's `queue:` (its label)
FAILED_VIOLATION = 1e15  # larger than any real constraint violation (metric - threshold)
FAILED_VALUE = 1e15  # |value| of a failed trial's objectives: finite, and never mistaken for a result
MAX_ENUMERATE = 100_000  # spaces with more discrete configs are sampled, not enumerated
RESAMPLE_TRIES = 3
GP_ASK_AGAIN = 3  # GPSampler asked again, a measured config it proposed shown once more (FlagSampler)
NOISE_ATTR = "noise_probes"  # search/study/noise.py's study attr: the default re-measured on fresh starts

SamplerKind = Literal["tpe", "nsga2"]
# How the guided phase picks (make_sampler): "optuna-gp" Optuna's GPSampler proposes, "gp" flagsearch's own GP
# (search/sampling/surrogate.py) picks the untried config of highest expected improvement, "inner" TPE or
# NSGA-II proposes; "auto" chooses (choose_guide).
Guide = Literal["auto", "gp", "optuna-gp", "inner"]


def worker_seed(base_seed: int, worker_tag: str) -> int:
    """A seed of its own for each worker of one study, stable for a given (seed, worker)."""
    digest = hashlib.sha256(f"{base_seed}|{worker_tag}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def failure_values(directions: Sequence[StudyDirection | str]) -> list[float]:
    """Objective values to tell for a failed trial: the worst finite value in every direction."""
    out = []
    for d in directions:
        maximize = d == StudyDirection.MAXIMIZE or d == "maximize"
        out.append(-FAILED_VALUE if maximize else FAILED_VALUE)
    return out


def is_failed(trial: FrozenTrial) -> bool:
    return trial.constraints.get(FAILED_KEY, 0.0) > 0


def is_reused(trial: FrozenTrial) -> bool:
    """A trial whose config was measured before: the loop copied that result instead of starting
    it again (search/study/scoring.py: copy_duplicate). It is no second measurement: a model that took it
    for one would learn a zero spread between "repeats" and shrink its noise towards nothing."""
    record = trial.user_attrs.get(RECORD_ATTR)
    return isinstance(record, dict) and record.get("duplicate_of") is not None


def observation(trial: FrozenTrial, dists: dict[str, BaseDistribution]) -> Observation:
    """A COMPLETE trial as the surrogate model sees it: failed (value None), infeasible, or a value."""
    params = trial.params or trial.system_attrs.get("fixed_params", {})
    feasible = all(v <= 0 for v in trial.constraints.values())
    value = None if is_failed(trial) or not trial.values else trial.values[0]
    return Observation({k: params.get(k, INACTIVE) for k in dists}, value, feasible)


def probe_observations(study: Study, dists: dict[str, BaseDistribution]) -> list[Observation]:
    """The noise probes (search/study/noise.py: the default, trial 0, re-measured on fresh starts) as
    repeated observations of the default config: the model learns its noise from them."""
    probes = [p.get("value") for p in study.user_attrs.get(NOISE_ATTR, [])]
    first = next((t for t in study.get_trials(deepcopy=False) if t.number == 0), None)
    if first is None or not probes:
        return []
    params = first.params or first.system_attrs.get("fixed_params", {})
    if not {k for k, d in dists.items() if not _has_inactive(d)} <= set(params):
        return []
    return [Observation({k: params.get(k, INACTIVE) for k in dists}, float(v)) for v in probes if v]


def design_space(space: Space) -> dict[str, BaseDistribution]:
    """Launch-side params every config has (no `when`), with their distributions: what the
    initial design spreads over and what duplicates are judged on."""
    out: dict[str, BaseDistribution] = {}
    if len(space.m.engines) > 1:
        out["engine"] = CategoricalDistribution(list(space.m.engines))
    if len(space.m.models) > 1:
        out["model"] = CategoricalDistribution([m.name for m in space.m.models])
    for name, param in space.m.params.items():
        if param.when or isinstance(param, FixedParam) or param.side == "request":
            continue
        dist = distribution(param)
        if dist is not None:
            out[name] = dist
    return out


INACTIVE = None  # a conditional param's value in a config where its `when` does not hold (not set)


def model_space(space: Space) -> dict[str, BaseDistribution]:
    """The params a config is identified by and the model of results sees: `design_space`'s, then every
    conditional launch-side param with finite choices, as a categorical whose extra choice INACTIVE
    stands for "not set" (its `when` does not hold). Two configs that differ only in a conditional param
    (a quantized V cache where flash attention is on) are two configs, not one measured twice."""
    out = design_space(space)
    for name, param in space.m.params.items():
        if not param.when or isinstance(param, FixedParam) or param.side == "request":
            continue
        dist = distribution(param)
        choices = _finite_choices(dist) if dist is not None else None
        if choices is not None:
            out[name] = CategoricalDistribution([*choices, INACTIVE])
    return out


def conditional_space(space: Space) -> dict[str, BaseDistribution]:
    """The conditional launch-side params' own distributions (what the trial suggests where they apply)."""
    out: dict[str, BaseDistribution] = {}
    for name, param in space.m.params.items():
        if param.when and not isinstance(param, FixedParam) and param.side != "request":
            dist = distribution(param)
            if dist is not None:
                out[name] = dist
    return out


def _has_inactive(dist: BaseDistribution) -> bool:
    return isinstance(dist, CategoricalDistribution) and INACTIVE in dist.choices


def launch_configs(space: Space) -> list[dict[str, Any]] | None:
    """Every config of a discrete space over `model_space`'s params, a conditional param INACTIVE where
    its `when` does not hold: what the space can start. None when a searched launch-side param has no
    finite choices or there are more than MAX_ENUMERATE."""
    partials = [{"engine": e, "model": m.name} for e in space.m.engines for m in space.m.models]
    for name, param in space.m.params.items():
        if param.side == "request":
            continue
        dist = distribution(param)
        if isinstance(param, FixedParam) or dist is None:  # one value: for the `when` of later params only
            partials = [{**c, name: default_value(param)} if space.applies(name, c) else c for c in partials]
            continue
        choices = _finite_choices(dist)
        if choices is None:
            return None
        partials = [grown for c in partials
                    for grown in ([{**c, name: v} for v in choices] if space.applies(name, c) else [c])]
        if len(partials) > MAX_ENUMERATE:
            return None
    dists = model_space(space)
    return [{k: c.get(k, INACTIVE) for k in dists} for c in partials]


def config_key(params: dict[str, Any], dists: dict[str, BaseDistribution]) -> str | None:
    """Identity of a config over `dists` (model_space's: a conditional param absent is INACTIVE); None when
    it lacks a param every config has."""
    if not {k for k, d in dists.items() if not _has_inactive(d)} <= set(params):
        return None
    return repr([(k, params.get(k, INACTIVE)) for k in dists])


def set_values(config: dict[str, Any]) -> dict[str, Any]:
    """A config as a trial's params: INACTIVE (not set) conditional params left out."""
    return {k: v for k, v in config.items() if v is not INACTIVE}


def _finite_choices(dist: BaseDistribution) -> list[Any] | None:
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, IntDistribution) and (dist.high - dist.low) // dist.step < 1000:
        return list(range(dist.low, dist.high + 1, dist.step))
    if isinstance(dist, FloatDistribution) and dist.step is not None:
        n = round((dist.high - dist.low) / dist.step)
        if n < 1000:
            return [dist.low + i * dist.step for i in range(n + 1)]
    return None


def enumerate_configs(dists: dict[str, BaseDistribution]) -> list[dict[str, Any]] | None:
    """Every config of a discrete space (None when it is continuous or too large)."""
    choices = [_finite_choices(d) for d in dists.values()]
    if any(c is None for c in choices) or math.prod(len(c or []) for c in choices) > MAX_ENUMERATE:
        return None
    return [dict(zip(dists, values, strict=True)) for values in itertools.product(*(c or [] for c in choices))]


def _random_value(dist: BaseDistribution, rng: np.random.Generator) -> Any:
    choices = _finite_choices(dist)
    if choices is not None:
        return choices[int(rng.integers(len(choices)))]
    assert isinstance(dist, FloatDistribution | IntDistribution)
    lo, hi = (math.log(dist.low), math.log(dist.high)) if dist.log else (dist.low, dist.high)
    x = rng.uniform(lo, hi)
    return _on_grid(dist, math.exp(x) if dist.log else x)


def _on_grid(dist: FloatDistribution | IntDistribution, x: float) -> Any:
    if isinstance(dist, IntDistribution):
        return min(dist.high, dist.low + round((x - dist.low) / dist.step) * dist.step)
    return float(min(dist.high, max(dist.low, x)))


def latin_design(dists: dict[str, BaseDistribution], n: int, seed: int, candidates: int = 64) -> list[dict[str, Any]]:
    """n configs spread over the space: every choice of every param appears about equally often
    (a Latin hypercube over categorical levels; continuous ranges are stratified), and of
    `candidates` such designs the one whose closest two configs differ most (maximin, Hamming
    distance over the params) is kept, with no config repeated."""
    rng = np.random.default_rng(seed)
    names = list(dists)
    best: list[dict[str, Any]] = []
    best_score = (-1, -1.0)
    for _ in range(candidates):
        columns: dict[str, list[Any]] = {}
        for name in names:
            choices = _finite_choices(dists[name])
            if choices is not None:
                col = [choices[i % len(choices)] for i in range(n)]
                columns[name] = [col[i] for i in rng.permutation(n)]
            else:
                d = dists[name]
                assert isinstance(d, FloatDistribution | IntDistribution)
                lo, hi = (math.log(d.low), math.log(d.high)) if d.log else (d.low, d.high)
                strata = (rng.permutation(n) + rng.random(n)) / n
                xs = [lo + s * (hi - lo) for s in strata]
                xs = [math.exp(x) for x in xs] if d.log else xs
                columns[name] = [_on_grid(d, x) for x in xs]
        rows = [{name: columns[name][i] for name in names} for i in range(n)]
        distinct = len({repr(sorted(r.items())) for r in rows})
        dmin = min((sum(a[k] != b[k] for k in names) for a, b in itertools.combinations(rows, 2)), default=0)
        mean = float(np.mean([sum(a[k] != b[k] for k in names)
                              for a, b in itertools.combinations(rows, 2)])) if n > 1 else 0.0
        score = (distinct, dmin + mean / (len(names) + 1))
        if score > best_score:
            best, best_score = rows, score
    return best


def default_design_size(space: Space) -> int:
    """Space-filling configs before the model takes over: about one per searched param plus two,
    at most a quarter of the budget, between 4 and 10."""
    n_params = len(design_space(space))
    return max(4, min(10, n_params + 2, space.m.budget.trials // 4))


INNER_NAMES = {"TPESampler": "guided: TPE", "NSGAIISampler": "guided: NSGA-II",
               "GPSampler": "guided: Optuna's GPSampler", "RandomSampler": "random"}


@functools.cache
def torch_version() -> str | None:
    """torch's version where it imports (the `gp` extra, docs/setup.md), else None: Optuna's GPSampler needs it."""
    try:
        import torch
    except (ImportError, OSError):  # OSError: a torch whose shared libraries do not load
        return None
    return str(torch.__version__)


def gp_view(trials: Sequence[FrozenTrial], directions: Sequence[StudyDirection]) -> list[FrozenTrial]:
    """Trials as Optuna's GPSampler must see them. A failure is told with a value of 1e15 and a violation of
    1e15 (the module docstring), which TPE and NSGA-II only rank, but GPSampler standardises values and
    violations and fits a GP to them: one failure would flatten every other result to the same number. So a
    failure is shown with the worst measured value and a violation of 1 of FAILED_KEY (its region learnt as
    infeasible, ranked last), a reused duplicate not at all (no second measurement: is_reused), and only
    constraints some trial violates are shown, every trial with the same keys (GPSampler requires it; a
    key a trial lacks, e.g. a failure's unmeasured metrics, reads 0). Running trials pass unchanged."""
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.values and not is_reused(t)]
    measured = [t for t in complete if not is_failed(t)]
    keys = sorted({k for t in complete for k, v in t.constraints.items() if v > 0 and k != FAILED_KEY})
    if any(is_failed(t) for t in complete) and measured:
        keys.append(FAILED_KEY)
    shown = {id(t) for t in (complete if measured else [])}
    out: list[FrozenTrial] = []
    for t in trials:
        if t.state != TrialState.COMPLETE:
            out.append(t)
            continue
        if id(t) not in shown:
            continue
        values = list(t.values)
        constraints = {k: t.constraints.get(k, 0.0) for k in keys}
        if is_failed(t):
            values = [min(m.values[i] for m in measured) if d == StudyDirection.MAXIMIZE
                      else max(m.values[i] for m in measured) for i, d in enumerate(directions)]
            constraints = {k: 0.0 for k in keys} | {FAILED_KEY: 1.0}
        out.append(create_trial(state=TrialState.COMPLETE, values=values, params=t.params,
                                distributions=t.distributions, constraints=constraints or None))
    return out


class GPView:
    """A study as Optuna's GPSampler reads it: its trials through gp_view, plus `again` (measured trials shown a
    second time: FlagSampler's re-ask), everything else the study's own."""

    def __init__(self, study: Study, again: Sequence[FrozenTrial] = ()):
        self._study = study
        self._again = list(again)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _shown(self, trials: list[FrozenTrial], states: Sequence[TrialState] | None) -> list[FrozenTrial]:
        again = self._again if states is None or TrialState.COMPLETE in states else []
        return gp_view(trials, self._study.directions) + again

    def _get_trials(self, deepcopy: bool = True, states: Sequence[TrialState] | None = None,
                    use_cache: bool = False) -> list[FrozenTrial]:
        return self._shown(self._study._get_trials(deepcopy=deepcopy, states=states, use_cache=use_cache), states)

    def get_trials(self, deepcopy: bool = True, states: Sequence[TrialState] | None = None) -> list[FrozenTrial]:
        return self._shown(self._study.get_trials(deepcopy=deepcopy, states=states), states)


class FlagSampler(BaseSampler):
    """A fixed space-filling design for the first trials, then the guided phase: `guide` "gp" the own model of
    results, "optuna-gp" `inner` (Optuna's GPSampler, over gp_view's trials), "inner" `inner` (TPE or NSGA-II).
    Every proposal is a config not yet measured, failed, running or queued: a proposal that repeats one is no
    trial (it would start nothing and teach nothing), so it is drawn again (RESAMPLE_TRIES times, TPE or
    NSGA-II only) and then replaced by the untried config of highest expected improvement under the own model
    of results ("gp", "optuna-gp"), or where the model cannot judge yet by the closest untried config. Only
    when no config is left untried does a repeat come back."""

    def __init__(self, dists: dict[str, BaseDistribution], inner: BaseSampler, n_design: int,
                 design_seed: int, seed: int, guide: Literal["gp", "optuna-gp", "inner"] = "gp",
                 noise_floor: float = 0.03,
                 allowed: Callable[[dict[str, Any]], bool] | None = None,
                 model_dists: dict[str, BaseDistribution] | None = None,
                 conditional: dict[str, BaseDistribution] | None = None,
                 configs: list[dict[str, Any]] | None = None):
        self.dists = dists
        # The params a config is identified by (the design's and the conditional ones, INACTIVE where not set),
        # the conditional params' own distributions, and every config of a discrete space (make_sampler).
        self.model_dists = model_dists if model_dists is not None else dists
        self.conditional = conditional or {}
        self.inner = inner
        self.n_design = n_design
        self.guide = guide
        self.noise_floor = noise_floor
        # `allowed`: configs worth proposing at all (e.g. not rejected by a memory-fit check).
        self.allowed = allowed or (lambda _: True)
        self.design = latin_design(dists, n_design, design_seed) if dists and n_design > 0 else []
        if any(not self.allowed(row) for row in self.design):
            # Spread over the allowed configs only (e.g. the engine/checkpoint pairs an engine loads).
            wider = latin_design(dists, n_design * 4, design_seed)
            self.design = [row for row in wider if self.allowed(row)][:n_design]
        self._rng = np.random.default_rng(seed)
        self._random = RandomSampler(seed=seed)
        if configs is None and not self.conditional:
            configs = enumerate_configs(dists) if dists else None
        self.all_configs = None if configs is None else [c for c in configs if self.allowed(set_values(c))]
        self.origins: dict[int, str] = {}  # trial number -> how its config was chosen (shown in progress)
        # What guides after the design, in words (make_sampler's describe_guide): recorded on the study (GUIDE_ATTR).
        self.guided_by = INNER_NAMES.get(type(inner).__name__, type(inner).__name__).removeprefix("guided: ")

    # ---- BaseSampler --------------------------------------------------------------------------
    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        inner = self.inner.infer_relative_search_space(study, trial)
        return {**inner, **self.dists, **self.conditional}

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        inner_space = {k: v for k, v in search_space.items() if k in self.inner.infer_relative_search_space(
            study, trial)}
        row = self._design_row(study, trial)
        if self.guide == "optuna-gp":
            # GPSampler fits its GP at every call: asked only in the guided phase, over gp_view's trials.
            proposal = {} if row is not None else self._gp_sampler_proposal(study, trial, inner_space)
        else:
            # Always asked, so that NSGA-II counts design trials in its generations.
            proposal = self.inner.sample_relative(study, trial, inner_space)
        origin = INNER_NAMES.get(type(self.inner).__name__, type(self.inner).__name__)
        taken = self._taken(study, trial)
        if row is not None:
            proposal = {**proposal, **self.design[row]}
            origin = f"space-filling design {row + 1}/{len(self.design)}"
        elif self.guide == "optuna-gp" and not proposal:
            origin = "random (Optuna's GPSampler has fewer than two results)"
        elif self.guide == "gp":
            guided = self._gp_choice(study, taken)
            if guided is not None:
                self.origins[trial.number] = "guided: the highest expected improvement under the model of results"
                return {**proposal, **set_values(guided)}
        config = self._untried_match(self._complete(proposal), taken)
        # GPSampler would propose the same config again from the same results: not drawn again.
        for _ in range(RESAMPLE_TRIES if row is None and self.guide != "optuna-gp" else 0):
            if config is not None:
                break
            proposal = self._complete(self.inner.sample_relative(study, trial, inner_space))
            config = self._untried_match(proposal, taken)
        if config is None:
            # The proposal repeats a config already taken: the untried one the own GP expects most of, else
            # the closest untried one. None: every config is taken, the repeat stands (the loop says so).
            config = self._gp_choice(study, taken) if self.guide in ("gp", "optuna-gp") else None
            if config is not None:
                origin = (f"guided: the highest expected improvement under the model of results ({origin} "
                          "proposed a measured config)")
            else:
                config = self._untried(taken, proposal)
                if config is not None:
                    origin = f"the closest untried config ({origin} proposed a measured config)"
        self.origins[trial.number] = origin
        return {**proposal, **set_values(config)} if config is not None else self._complete(proposal)

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        if self._design_row(study, trial) is not None:
            return self._random.sample_independent(study, trial, param_name, param_distribution)
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)
        if isinstance(self.inner, BaseGASampler):
            # NSGA-II assigns a trial's generation only when it samples it: enqueued trials (the
            # default config, warm-start configs) would never enter a generation otherwise.
            self.inner.get_trial_generation(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()
        self._random.reseed_rng()

    # ---- helpers ------------------------------------------------------------------------------
    def _gp_sampler_proposal(self, study: Study, trial: FrozenTrial,
                             search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        """GPSampler's proposal. Where it is a measured config, GPSampler is asked again with that config's
        result shown once more (up to GP_ASK_AGAIN times), as Optuna's own loop would reuse the result and go
        on: its GP then holds that config as known better and proposes elsewhere. Nothing shown again is
        stored, and the own GP never sees it. GPSampler learns the results' noise and, left alone, keeps
        proposing its incumbent: on a 24-config table 14 of 18 guided proposals were measured configs."""
        view = GPView(study)
        proposal = self.inner.sample_relative(cast(Study, view), trial, search_space)
        for _ in range(GP_ASK_AGAIN):
            key = self._key(self._complete(proposal)) if proposal else None
            measured = [t for t in view.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                        if self._key(t.params) == key] if key is not None else []
            if not measured:  # untried, or taken by a running or queued trial: no result to show
                return proposal
            view = GPView(study, [*view._again, measured[0]])
            proposal = self.inner.sample_relative(cast(Study, view), trial, search_space)
        return proposal

    def _design_row(self, study: Study, trial: FrozenTrial) -> int | None:
        if not self.design:
            return None
        trials = study._get_trials(deepcopy=False, use_cache=True)
        enqueued = sum(1 for t in trials if t.number < trial.number and "fixed_params" in t.system_attrs)
        row = trial.number - enqueued
        return row if 0 <= row < len(self.design) else None

    def _left(self, taken: set[str]) -> list[dict[str, Any]]:
        """The untried configs of a discrete space ([] for another space)."""
        return [c for c in self.all_configs or [] if self._key(c) not in taken]

    def _gp_choice(self, study: Study, taken: set[str]) -> dict[str, Any] | None:
        """The untried config of highest expected improvement under search/sampling/surrogate.py's model
        (single objective, enumerable spaces; None otherwise, or with fewer than two results)."""
        if len(study.directions) != 1 or self.all_configs is None:
            return None
        observed: list[Observation] = []
        for t in study._get_trials(deepcopy=False, states=(TrialState.COMPLETE,), use_cache=False):
            key = self._key(t.params)
            if key is not None and t.values and not is_reused(t):
                observed.append(observation(t, self.model_dists))
        if sum(o.usable for o in observed) < 2:
            return None
        untried = self._left(taken)
        if not untried:
            return None
        failures = FailureModel(observed, self.model_dists)
        candidates = [c for c in untried if not failures.fails(c)] or untried
        maximize = study.directions[0] == StudyDirection.MAXIMIZE
        observed += probe_observations(study, self.model_dists)
        ei = improvement_scores(observed, candidates, self.model_dists, self.noise_floor, maximize)
        top = np.flatnonzero(ei >= ei.max() * (1 - 1e-9))
        return candidates[int(top[int(self._rng.integers(len(top)))])]

    def _untried_match(self, proposal: dict[str, Any], taken: set[str]) -> dict[str, Any] | None:
        """The proposal as an untried config, or None when it repeats a taken one. Of a discrete space,
        the untried config with the proposal's design params (its conditional params as proposed where
        that one is untried, else the first untried setting of them); of another space, the proposal
        itself where its design params are new."""
        if self.all_configs is None:
            return proposal if self._key(proposal) not in taken and self.allowed(proposal) else None
        same = [c for c in self._left(taken) if all(c[k] == proposal.get(k) for k in self.dists)]
        exact = [c for c in same if all(c[k] == proposal.get(k, INACTIVE) for k in self.conditional)]
        return (exact or same)[0] if same else None

    def _complete(self, proposal: dict[str, Any]) -> dict[str, Any]:
        """Design params the inner sampler left out (its random start, NSGA-II's mutations) are
        drawn at random here, so that every proposal can be checked for duplicates."""
        missing = {k: _random_value(d, self._rng) for k, d in self.dists.items() if k not in proposal}
        return {**missing, **proposal}

    def _key(self, params: dict[str, Any]) -> str | None:
        """Identity of a config over the design and conditional params; None when it lacks a design param."""
        if not self.dists:
            return None
        return config_key(params, self.model_dists)

    def _taken(self, study: Study, trial: FrozenTrial) -> set[str]:
        """Configs already measured, failed, running or queued (FAIL = interrupted: to be re-run).
        Only trials with no params beyond the identifying ones count: params sampled later
        could still make a new config differ."""
        out = set()
        states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
        for t in study._get_trials(deepcopy=False, states=states, use_cache=False):
            if t.number == trial.number:
                continue
            params = t.params or t.system_attrs.get("fixed_params", {})
            # Request-side params are measured at every start: they never make a config new.
            if set(params) - set(self.model_dists) - {"engine", "model"} - set(REQUEST_SIDE):
                continue
            key = self._key(params)
            if key is not None:
                out.add(key)
        return out

    def _untried(self, taken: set[str], near: dict[str, Any]) -> dict[str, Any] | None:
        """An untried config: of a discrete space, one closest to what was proposed (fewest
        params changed; ties at random), so the proposal still steers."""
        if self.all_configs is not None:
            left = self._left(taken)
            if not left:
                return None
            distance = [sum(c[k] != near.get(k, INACTIVE) for k in self.model_dists) for c in left]
            closest = [c for c, d in zip(left, distance, strict=True) if d == min(distance)]
            return closest[int(self._rng.integers(len(closest)))]
        for _ in range(1000):
            config = {k: _random_value(d, self._rng) for k, d in self.dists.items()}
            if self._key(config) not in taken and self.allowed(config):
                return config
        return None


def study_sampler(space: Space, seed: int | None = None) -> BaseSampler:
    """The sampler of one worker of a study (search.store.storage.open_study asks it)."""
    # An explicit seed reproduces one worker exactly; otherwise every process (worker, resumed run)
    # mixes its identity into the space's seed, so that two workers or a resumed run do not replay
    # the same suggestions.
    base = space.m.seed if seed is None else seed
    # The space-filling design comes from the base seed (one design per study, workers take different
    # rows); the guided phase from the worker's own seed unless one was given explicitly.
    return make_sampler(space, seed if seed is not None else worker_seed(base, worker_tag()), design_seed=base,
                        noise_floor=space.m.measure.noise_floor)


def choose_guide(space: Space, kind: SamplerKind | None = None) -> Literal["gp", "optuna-gp"]:
    """The guided phase where the caller chose none: Optuna's GPSampler for one objective over an enumerable
    space when torch imports and no sampler `kind` was named, else flagsearch's own GP (which itself hands
    several objectives and continuous spaces to TPE). GPSampler picked better on the product's replays
    (docs/search.md); several objectives stay with TPE: GPSampler in Optuna 5.0 handles them (log expected
    hypervolume improvement), but no replay measured that and the repeat replacement is single-objective."""
    if (kind is None and len(space.m.objectives) == 1 and launch_configs(space) is not None
            and torch_version() is not None):
        return "optuna-gp"
    return "gp"


def describe_guide(guide: str, inner: BaseSampler, space: Space) -> str:
    """What guides a study's proposals after the design, in words (GUIDE_ATTR, `search run`, `search show`)."""
    if guide == "optuna-gp":
        return (f"Optuna's GPSampler (torch {torch_version()}; a proposal of a measured config is replaced by the "
                "own GP's untried config of highest expected improvement)")
    several = len(space.m.objectives) > 1
    if guide == "gp" and not several and launch_configs(space) is not None:
        return "flagsearch's own GP (expected improvement)" + (
            "; Optuna's GPSampler needs torch (the `gp` extra), not installed" if torch_version() is None else "")
    name = INNER_NAMES.get(type(inner).__name__, type(inner).__name__).removeprefix("guided: ")
    if guide == "gp":
        return f"{name} ({'several objectives' if several else 'a space with continuous params'})"
    return name


def make_sampler(space: Space, seed: int | None = None, kind: SamplerKind | None = None,
                 n_design: int | None = None, guide: Guide = "auto",
                 noise_floor: float = 0.03, allowed: Callable[[dict[str, Any]], bool] | None = None,
                 design_seed: int | None = None) -> BaseSampler:
    """The study's sampler.

    `seed`: this worker's seed (see worker_seed; the space's seed when None); `design_seed`: the
    initial design's, the same for every worker of a study (the space's seed when None).
    `n_design`: space-filling configs first (default_design_size). Then the guided phase (`guide`; "auto":
    choose_guide): with "optuna-gp", Optuna's GPSampler proposes (over gp_view's trials); with "gp", for one
    objective over an enumerable space, the untried config of highest expected improvement under
    search/sampling/surrogate.py's model; otherwise `kind`: TPE for any number of objectives
    (multi-objective TPE learns from fewer trials than NSGA-II's generations) or NSGA-II. A proposal that
    repeats a taken config is replaced by the own GP's untried config of highest expected improvement
    ("gp", "optuna-gp"). All honour the constraints each trial sets, and a failure told as the module
    docstring says ranks below every completed trial. `allowed`: configs worth proposing at all."""
    seed = space.m.seed if seed is None else seed
    n_design = default_design_size(space) if n_design is None else n_design
    chosen = choose_guide(space, kind) if guide == "auto" else guide
    if chosen == "optuna-gp":
        # Two results are the least a GP fits; the design before it is FlagSampler's own.
        inner: BaseSampler = GPSampler(seed=seed, n_startup_trials=2, warn_independent_sampling=False)
    elif kind == "nsga2":
        inner = NSGAIISampler(seed=seed, population_size=max(4, n_design))
    else:
        # constant_liar: running trials of other workers count as bad, so workers spread out.
        with warnings.catch_warnings():  # multivariate and constant_liar are "experimental" since 2.x
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            inner = TPESampler(seed=seed, n_startup_trials=n_design, multivariate=True, constant_liar=True)
    design_seed = space.m.seed if design_seed is None else design_seed
    if allowed is None and any(e.models is not None for e in space.m.engines.values()):
        engines, models = list(space.m.engines), [m.name for m in space.m.models]

        def allowed(config: dict[str, Any]) -> bool:  # the pairs the space's engines load
            return space.loads(config.get("engine", engines[0]), config.get("model", models[0]))
    conditional = conditional_space(space)
    configs = launch_configs(space) if conditional else None
    sampler = FlagSampler(design_space(space), inner, n_design, design_seed, seed, chosen, noise_floor, allowed,
                          model_dists=model_space(space) if configs is not None else None,
                          conditional=conditional if configs is not None else None, configs=configs)
    sampler.guided_by = describe_guide(chosen, inner, space)
    return sampler


def record_guide(study: Study) -> str | None:
    """Add what guides this worker's sampler (FlagSampler.guided_by) to the study's GUIDE_ATTR, a list: the
    workers of one study, or a resumed run, may differ (one has torch, another not). Returns it (None for a
    sampler of another kind). Call under the study's lock: it reads, then writes."""
    guided = getattr(study.sampler, "guided_by", None)
    if not isinstance(guided, str):
        return None
    seen = study.user_attrs.get(GUIDE_ATTR)
    seen = list(seen) if isinstance(seen, list) else []
    if guided not in seen:
        study.set_user_attr(GUIDE_ATTR, [*seen, guided])
    return guided


def space_exhausted(study: Study, space: Space) -> bool:
    """True when every config of a discrete space (over its launch-side params, conditional ones where
    their `when` holds) has been measured, failed, or is running or queued: nothing new is left to try."""
    configs = launch_configs(space)
    if configs is None:
        return False
    dists = model_space(space)
    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
    seen = {config_key(t.params or t.system_attrs.get("fixed_params", {}), dists)
            for t in study.get_trials(deepcopy=False, states=states)}
    return {config_key(c, dists) for c in configs} <= seen


def tell_failed_args(directions: Sequence[StudyDirection | str]) -> dict[str, Any]:
    """What `study.tell` needs for a failed trial (after `set_constraint(FAILED_KEY,
    FAILED_VIOLATION)`): COMPLETE with the worst finite values."""
    return {"values": failure_values(directions), "state": TrialState.COMPLETE}


def trial_origin(study: Study, trial: optuna.Trial) -> str:
    """How a trial's config was chosen: the sampler's phase, or queued (the default, a resume,
    a warm start) when the sampler did not propose it."""
    origins = getattr(study.sampler, "origins", {})
    if trial.number in origins:
        return str(origins[trial.number])
    stored = study._storage.get_trial(trial._trial_id)
    if "fixed_params" in stored.system_attrs:
        if stored.user_attrs.get(QUEUED_ATTR):
            return f"queued by the space: {stored.user_attrs[QUEUED_ATTR]}"
        return "queued (the default config, a resumed trial or a warm start)"
    return type(study.sampler).__name__
