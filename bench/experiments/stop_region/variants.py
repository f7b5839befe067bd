"""The levers tried on the noisy replay's flagsearch arm (bench/noisy_replay.py), as patches of the
product's functions for the length of one replay: the stop rule's gain counted against the
incumbent's own uncertainty ("joint"), a stop rule by the chance an untried config beats the
incumbent by what a confirmation detects ("pi"), a confirmation whose arms are the measured configs
with a chance of being the best ("pbest"), an upper-confidence-bound acquisition ("ucb"), the
noise prior at the whole stated floor, and fixed search budgets (no stop rule: the frontier any stop
rule could reach with a budget known in hindsight). None was adopted: see README.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from scipy.stats import norm

import bench.noisy_replay as nr
from search.sampling import stopping, surrogate
from search.sampling.surrogate import (
    FailureModel,
    GPModel,
    Observation,
    detectable,
    distance,
    encode,
    expected_improvement,
    fit_gp,
    kernel,
)


def joint(model: GPModel, configs: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and covariance of the latent log values of `configs`, jointly."""
    additive, local, length = model.hyper
    xc = encode(list(configs), model.dists)
    k_c = kernel(distance(xc, model.x, model.dists), additive, local, length)
    v = np.linalg.solve(np.tril(model.factor[0]), k_c.T)
    cov = kernel(distance(xc, xc, model.dists), additive, local, length) - v.T @ v
    return model.mean + k_c @ model.alpha, (cov + cov.T) / 2


def prob_best(model: GPModel, configs: Sequence[dict[str, Any]], seed: int, draws: int = 4000) -> np.ndarray:
    mu, cov = joint(model, configs)
    w, u = np.linalg.eigh(cov)
    z = np.random.default_rng(seed).standard_normal((draws, len(mu)))
    best = np.argmax(mu + z @ (u * np.sqrt(np.maximum(w, 0.0))).T, axis=1)
    return np.bincount(best, minlength=len(mu)) / draws


def stop_rule(kind: str, pi_stop: float = 0.05):  # type: ignore[no-untyped-def]
    """nothing_left_to_win's judgement with the gain counted another way (only .stop is read)."""
    def rule(observed: Sequence[Observation], untried: Sequence[dict[str, Any]], dists: dict[str, BaseDistribution],
             noise_floor: float, maximize: bool = True, min_results: int = 6, roofline_fraction: float | None = None,
             rounds: int = stopping.CONFIRM_ROUNDS, share: float = stopping.STOP_SHARE) -> stopping.StopDecision:
        if kind == "region":  # the product's rule, and every one-param neighbour of the incumbent measured
            said = stopping.nothing_left_to_win(observed, untried, dists, noise_floor, maximize, min_results,
                                                roofline_fraction, rounds, share)
            fitted = fit_gp(observed, dists, noise_floor, maximize)
            if not said.stop or fitted is None or not untried:
                return said
            inc = fitted.incumbent()[0]
            fails = FailureModel(observed, dists)
            near = [c for c in untried if sum(c[k] != inc[k] for k in dists) == 1 and not fails.fails(c)]
            return stopping.StopDecision(not near, "region")
        model = fit_gp(observed, dists, noise_floor, maximize)
        if not untried:
            return stopping.StopDecision(True, "all tried")
        if model is None or len(model.configs) < min_results:
            return stopping.StopDecision(False, "too few")
        failures = FailureModel(observed, dists)
        left = [c for c in untried if not failures.fails(c)] or list(untried)
        inc = model.incumbent()[0]
        m, cov = joint(model, [inc, *left])
        diff = m[1:] - m[0]
        diff_sd = np.sqrt(np.maximum(np.diag(cov)[1:] + cov[0, 0] - 2 * cov[0, 1:], 1e-12))
        delta = detectable(model.noise, rounds)
        if kind == "joint":  # expected gain over the incumbent's latent value, its own uncertainty counted
            return stopping.StopDecision(bool(np.max(expected_improvement(diff, diff_sd, 0.0)) < share * delta), kind)
        chance = norm.sf((delta - diff) / diff_sd)  # "pi"
        return stopping.StopDecision(bool(np.max(chance) < pi_stop), kind)
    return rule


def neighbours_first(run: nr.Run, rng: np.random.Generator) -> None:
    """The guided step, but while the product's rule would stop, the incumbent's untried one-param
    neighbour of highest expected improvement (the "region" stop rule waits for them)."""
    left = [run.params(i) for i in run.untried()]
    said = stopping.nothing_left_to_win(run.observed, left, run.dists, nr.STATED_FLOOR,
                                        min_results=nr.MIN_RESULTS or len(run.dists) + 2)
    model = fit_gp(run.observed, run.dists, nr.STATED_FLOOR)
    if said.stop and model is not None:
        inc = model.incumbent()[0]
        fails = FailureModel(run.observed, run.dists)
        near = [i for i in run.untried() if sum(run.params(i)[k] != inc[k] for k in run.dists) == 1
                and not fails.fails(run.params(i))]
        if near:
            ei = nr.improvement_scores(run.observed, [run.params(i) for i in near], run.dists, nr.STATED_FLOOR)
            run.measure(near[int(np.argmax(ei))])
            return
    GUIDED(run, rng)


GUIDED = nr.guided_step


def confirm_pbest(run: nr.Run) -> nr.Outcome:
    """Rounds of fresh starts of the measured configs with at least CONTENTION chance of being the best
    (at most CONFIRM_TOP; the leader alone in a first round when nothing else is), while two or more
    are in contention, at most CONFIRM_ROUNDS rounds; the pick is the model's incumbent."""
    search = run.starts
    model = fit_gp(run.observed, run.dists, nr.STATED_FLOOR)
    if model is None:
        return nr.Outcome(False, run.starts, search)
    for r in range(nr.CONFIRM_ROUNDS):
        p = prob_best(model, model.configs, seed=r)
        arms = [int(j) for j in np.argsort(-p)[:nr.CONFIRM_TOP] if p[j] >= nr.CONTENTION]
        if len(arms) < 2 and r > 0:
            break
        for j in arms or [int(np.argmax(p))]:
            run.measure(run.index[tuple(model.configs[j][q] for q in run.table.params)])
        model = fit_gp(run.observed, run.dists, nr.STATED_FLOOR)
        assert model is not None
    pick = tuple(model.incumbent()[0][q] for q in run.table.params)
    return nr.Outcome(any((pick, lv) in run.table.good for lv in run.table.levels), run.starts, search)


def ucb_scores(beta: float):  # type: ignore[no-untyped-def]
    def scores(observed: Sequence[Observation], candidates: Sequence[dict[str, Any]],
               dists: dict[str, BaseDistribution], noise_floor: float, maximize: bool = True) -> np.ndarray:
        model = fit_gp(observed, dists, noise_floor, maximize)
        if model is None or not candidates:
            return np.zeros(len(candidates))
        mu, sd = model.predict(candidates)
        return mu + beta * sd - float(np.min(mu + beta * sd)) + 1e-12
    return scores


def noise_prior(share: float):  # type: ignore[no-untyped-def]
    def learned(observed: Sequence[Observation], noise_floor: float) -> tuple[float, float]:
        ss, df = surrogate.repeat_spread(observed)
        prior = max(noise_floor * share, 1e-3)
        return math.sqrt((ss + surrogate.NOISE_PRIOR_DF * prior ** 2) / (df + surrogate.NOISE_PRIOR_DF)), \
            df + surrogate.NOISE_PRIOR_DF
    return learned


class MixtureGP:
    """Bayesian model averaging over fit_gp's kernel and noise grid ("bma"): every grid point weighted
    by its marginal likelihood (penalty included), not the best alone. An additive-only fit that
    explains the data rules out an untried param value seen only in slow regions; the mixture keeps
    the local (interaction) kernels' doubt about it. predict gives the mixture's mean and sd."""

    def __init__(self, parts: list[tuple[float, GPModel]]):
        self.parts = parts
        self.configs = parts[0][1].configs
        self.noise = float(sum(w * m.noise for w, m in parts))

    def predict(self, candidates: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        mean = np.zeros(len(candidates))
        second = np.zeros(len(candidates))
        for w, m in self.parts:
            mu, sd = m.predict(candidates)
            mean += w * mu
            second += w * (sd ** 2 + mu ** 2)
        return mean, np.sqrt(np.maximum(second - mean ** 2, 1e-12))

    def incumbent(self) -> tuple[dict[str, Any], float, float]:
        mu, sd = self.predict(self.configs)
        i = int(np.argmax(mu))
        return self.configs[i], float(mu[i]), float(sd[i])


def fit_mixture(observed: Sequence[Observation], dists: dict[str, BaseDistribution], noise_floor: float,
                maximize: bool = True) -> MixtureGP | None:
    """fit_gp's grid (surrogate.grid_fits), every point kept with weight exp(-nll) (those within 7
    nats of the best)."""
    fits = surrogate.grid_fits(observed, dists, noise_floor, maximize)
    if not fits:
        return None
    low = min(n for n, _ in fits)
    kept = [(math.exp(low - n), m) for n, m in fits if n - low < 7.0]
    total = sum(w for w, _ in kept)
    return MixtureGP([(w / total, m) for w, m in kept])

def design_size(spec: int | str, n_params: int) -> int:
    if spec == "half":  # about half the params plus one, at least 4
        return max(4, (n_params + 1) // 2 + 1)
    if spec == "halfp2":  # about half the params plus two
        return (n_params + 1) // 2 + 2
    assert isinstance(spec, int)
    return spec


@contextmanager
def applied(variant: dict[str, Any], n_params: int) -> Iterator[None]:
    """Set a variant's patches for the length of the block, then put the product's back."""
    saved: dict[str, Any] = {"guided_step": nr.guided_step, "nothing_left_to_win": nr.nothing_left_to_win,
             "improvement_scores": nr.improvement_scores,
             "learned_noise": surrogate.learned_noise, "should_stop": nr.Run.should_stop,
             "confirm": nr.Run.confirm_and_pick, "N_DESIGN": nr.N_DESIGN, "MIN_RESULTS": nr.MIN_RESULTS,
             "STOP_SHARE": nr.STOP_SHARE, "CONFIRM_ROUNDS": nr.CONFIRM_ROUNDS,
             "fit_gp": surrogate.fit_gp}
    try:
        for key, value in variant.items():
            if key == "stop":
                nr.nothing_left_to_win = stop_rule(*value)  # type: ignore[assignment]
            elif key == "neighbours_first":
                nr.guided_step = neighbours_first
            elif key == "budget":  # no stop rule: search until this many starts
                nr.Run.should_stop = lambda run, b=value: run.starts >= b  # type: ignore[method-assign,misc]
            elif key == "confirm":
                nr.Run.confirm_and_pick = confirm_pbest  # type: ignore[method-assign,assignment]
            elif key == "ucb":
                nr.improvement_scores = ucb_scores(value)
            elif key == "noise_prior":
                surrogate.learned_noise = noise_prior(value)
            elif key == "bma":  # every module that calls fit_gp by name
                surrogate.fit_gp = stopping.fit_gp = nr.fit_gp = fit_mixture  # type: ignore[assignment]
            elif key in ("N_DESIGN", "MIN_RESULTS"):
                plus = 2 if key == "MIN_RESULTS" and variant.get("min_plus2") else 0
                setattr(nr, key, design_size(value, n_params) + plus)
            elif key in ("STOP_SHARE", "CONFIRM_ROUNDS"):
                setattr(nr, key, value)
        yield
    finally:
        nr.nothing_left_to_win = saved["nothing_left_to_win"]
        nr.guided_step = saved["guided_step"]
        nr.improvement_scores = saved["improvement_scores"]
        surrogate.learned_noise = saved["learned_noise"]
        surrogate.fit_gp = stopping.fit_gp = nr.fit_gp = saved["fit_gp"]
        nr.Run.should_stop = saved["should_stop"]  # type: ignore[method-assign]
        nr.Run.confirm_and_pick = saved["confirm"]  # type: ignore[method-assign]
        for key in ("N_DESIGN", "MIN_RESULTS", "STOP_SHARE", "CONFIRM_ROUNDS"):
            setattr(nr, key, saved[key])


VARIANTS: dict[str, dict[str, Any]] = {
    "base": {},
    "pbest": {"confirm": "pbest"},
    "joint": {"stop": ("joint",)},
    "pbest_joint": {"confirm": "pbest", "stop": ("joint",)},
    "pi05": {"stop": ("pi", 0.05)},
    "region": {"stop": ("region",)},
    "region_step": {"stop": ("region",), "neighbours_first": True},
    "pi10": {"stop": ("pi", 0.10)},
    "pi05_d5": {"stop": ("pi", 0.05), "N_DESIGN": 5},
    "share02": {"STOP_SHARE": 0.2},
    "share05_pbest": {"STOP_SHARE": 0.5, "confirm": "pbest"},
    "design_half": {"N_DESIGN": "half"},
    "small": {"N_DESIGN": "half", "MIN_RESULTS": "half", "min_plus2": True},
    "d_halfp2": {"N_DESIGN": "halfp2"},
    "d_halfp2_min": {"N_DESIGN": "halfp2", "MIN_RESULTS": "halfp2"},
    "noise1": {"noise_prior": 1.0},
    "bma": {"bma": True},
    "bma_share02": {"bma": True, "STOP_SHARE": 0.2},
    "bma_share03": {"bma": True, "STOP_SHARE": 0.3},
    "bma_small": {"bma": True, "N_DESIGN": "half", "MIN_RESULTS": "half", "min_plus2": True},
    "ucb05_fixed9": {"budget": 9, "ucb": 0.5},
    "ucb1_fixed9": {"budget": 9, "ucb": 1.0},
    "ucb2_fixed9": {"budget": 9, "ucb": 2.0},
    "ucb1_fixed8_d5": {"budget": 8, "N_DESIGN": 5, "ucb": 1.0},
    **{f"fixed{b}": {"budget": b} for b in (8, 9, 10, 11, 12)},
    **{f"fixed{b}_r1": {"budget": b, "CONFIRM_ROUNDS": 1} for b in (9, 10)},
    **{f"fixed{b}_d{d}": {"budget": b, "N_DESIGN": d} for b in (8, 9, 10) for d in (3, 4, 5, 6)},
    **{f"fixed{b}_d5_r1": {"budget": b, "N_DESIGN": 5, "CONFIRM_ROUNDS": 1} for b in (9, 10)},
}
