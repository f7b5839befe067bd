"""A small Gaussian-process model of a discrete config space, shared by the sampler's guided phase
(search/sampling/sampler.py) and the stop rule (search/sampling/stopping.py).

Log objective values (a relative scale: the noise floor is a fraction), a kernel that adds one
effect per param value (learnt from every config that shares it: main effects) to a local term
(what only near configs share: interactions), over Hamming distance for categorical params and
absolute distance for numeric ones; kernel weights and length by marginal likelihood over a small
grid; the noise learnt from the study's own repeated measurements (the same config measured on
several fresh starts) and by marginal likelihood around them. Failed configs stay out of the
model; `likely_to_fail` judges untried ones from their neighbours.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

LENGTHS = (0.15, 0.3, 0.6, 1.2)  # kernel length scales tried (fraction of params that differ)


@dataclass(frozen=True)
class Observation:
    params: dict[str, Any]
    value: float | None  # None: the config failed
    feasible: bool = True  # False: it ran but broke a constraint (not a value to model, not a failure)

    @property
    def usable(self) -> bool:
        return self.value is not None and self.feasible and self.value > 0


def encode(configs: Sequence[dict[str, Any]], dists: dict[str, BaseDistribution]) -> list[np.ndarray]:
    """One column block per param: category index (compared for equality) or a value in [0, 1]."""
    cols = []
    for name, d in dists.items():
        if isinstance(d, CategoricalDistribution):
            index = {repr(c): i for i, c in enumerate(d.choices)}
            cols.append(np.array([index.get(repr(c.get(name)), -1) for c in configs], dtype=float))
        else:
            assert isinstance(d, FloatDistribution | IntDistribution)
            lo, hi = (math.log(d.low), math.log(d.high)) if d.log else (float(d.low), float(d.high))
            span = (hi - lo) or 1.0
            xs = [math.log(c[name]) if d.log else float(c[name]) for c in configs]
            cols.append((np.array(xs) - lo) / span)
    return cols


def distance(a: list[np.ndarray], b: list[np.ndarray], dists: dict[str, BaseDistribution]) -> np.ndarray:
    total = np.zeros((len(a[0]) if a else 0, len(b[0]) if b else 0))
    for d, ca, cb in zip(dists.values(), a, b, strict=True):
        if isinstance(d, CategoricalDistribution):
            total += (ca[:, None] != cb[None, :]).astype(float)
        else:
            total += np.abs(ca[:, None] - cb[None, :])
    return total / max(1, len(dists))


def kernel(d: np.ndarray, additive: float, local: float, length: float) -> np.ndarray:
    """additive x (1 - d): one effect per param value, learnt from every config that shares it
    (main effects); local x exp(-d / length): what only near configs share (interactions)."""
    return additive * (1.0 - d) + local * np.exp(-d / length)


NOISE_PRIOR_DF = 2.0  # how many repeat pairs the stated noise floor counts as, before the study's own repeats
NOISE_STEPS = (0.5, 0.71, 1.0, 1.41, 2.0)  # noise sds tried around the repeats' estimate


def _key(params: dict[str, Any]) -> str:
    return repr(sorted(params.items()))


def repeat_spread(observed: Sequence[Observation]) -> tuple[float, int]:
    """The study's own repeated measurements (the same config measured on several fresh starts:
    noise probes of the default, confirmation rounds): (sum of squares of log values about each
    config's mean, degrees of freedom)."""
    groups: dict[str, list[float]] = {}
    for o in observed:
        if o.usable and o.value is not None:
            groups.setdefault(_key(o.params), []).append(math.log(o.value))
    ss = sum(float(np.sum((np.array(v) - np.mean(v)) ** 2)) for v in groups.values())
    return ss, sum(len(v) - 1 for v in groups.values())


def learned_noise(observed: Sequence[Observation], noise_floor: float) -> tuple[float, float]:
    """(sd of one start's log value, its weight in degrees of freedom): the repeats' pooled
    spread, shrunk towards half the stated noise floor (worth NOISE_PRIOR_DF repeats)."""
    ss, df = repeat_spread(observed)
    prior = max(noise_floor / 2, 1e-3)
    return math.sqrt((ss + NOISE_PRIOR_DF * prior ** 2) / (df + NOISE_PRIOR_DF)), df + NOISE_PRIOR_DF


@dataclass
class GPModel:
    """A fitted model: `predict(configs)` gives the posterior mean and std of the latent log value
    (negated for minimize: larger is better); `noise` is the sd of one start's log value that the
    fit settled on (learnt from the repeats, then by marginal likelihood around them)."""

    dists: dict[str, BaseDistribution]
    x: list[np.ndarray]
    mean: float
    hyper: tuple[float, float, float]
    factor: Any
    alpha: np.ndarray
    noise: float
    configs: list[dict[str, Any]]  # the distinct observed configs
    sign: float

    def predict(self, candidates: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        from scipy.linalg import solve_triangular  # lazily: scipy costs every CLI start ~0.25 s
        if not candidates:
            return np.zeros(0), np.zeros(0)
        additive, local, length = self.hyper
        k_c = kernel(distance(encode(list(candidates), self.dists), self.x, self.dists), additive, local, length)
        mu = self.mean + k_c @ self.alpha
        v = solve_triangular(self.factor[0], k_c.T, lower=True)
        return mu, np.sqrt(np.maximum(additive + local - np.sum(v * v, axis=0), 1e-12))

    def incumbent(self) -> tuple[dict[str, Any], float, float]:
        """The measured config the model rates best, with its posterior mean and std: the model's
        estimate, not the highest single observation (one lucky start does not make a winner)."""
        mu, sd = self.predict(self.configs)
        i = int(np.argmax(mu))
        return self.configs[i], float(mu[i]), float(sd[i])


def grid_fits(observed: Sequence[Observation], dists: dict[str, BaseDistribution], noise_floor: float,
              maximize: bool = True) -> list[tuple[float, GPModel]]:
    """Every point of the kernel-weight, length and noise grid fitted: (negative log marginal
    likelihood with the noise penalty, model), in grid order. The noise is centred on
    `learned_noise` (the study's repeats) with a penalty as strong as their count. Empty without a
    usable observation."""
    from scipy.linalg import cho_factor, cho_solve  # lazily: scipy costs every CLI start ~0.25 s
    observed = [o for o in observed if o.usable]
    if not observed:
        return []
    sign = 1.0 if maximize else -1.0
    y = np.array([sign * math.log(o.value) for o in observed if o.value is not None])
    x = encode([o.params for o in observed], dists)
    d_xx = distance(x, x, dists)
    mean = float(np.mean(y))
    yc = y - mean
    centre, weight = learned_noise(observed, noise_floor)
    spread = float(np.var(y)) or 0.01
    eye = np.eye(len(y))
    weights = (0.0, spread / 2, spread, 2 * spread), (0.0, spread / 8, spread / 2, spread)
    kernels = [(a, loc, ln) for a in weights[0] for loc in weights[1] for ln in (LENGTHS if loc else LENGTHS[:1])
               if a or loc]
    seen: dict[str, dict[str, Any]] = {}
    for o in observed:
        seen.setdefault(_key(o.params), dict(o.params))
    configs = list(seen.values())
    fits: list[tuple[float, GPModel]] = []
    for step in NOISE_STEPS:
        noise = centre * step
        penalty = weight * math.log(step) ** 2
        for additive, local, length in kernels:
            try:
                factor = cho_factor(kernel(d_xx, additive, local, length) + noise ** 2 * eye, lower=True)
            except np.linalg.LinAlgError:
                continue
            alpha = cho_solve(factor, yc)
            nll = 0.5 * float(yc @ alpha) + float(np.sum(np.log(np.diag(factor[0])))) + penalty
            fits.append((nll, GPModel(dists, x, mean, (additive, local, length), factor, alpha, noise, configs, sign)))
    assert fits
    return fits


def fit_gp(observed: Sequence[Observation], dists: dict[str, BaseDistribution], noise_floor: float,
           maximize: bool = True) -> GPModel | None:
    """The grid point of highest marginal likelihood (grid_fits; the first of equals). None without
    a usable observation."""
    fits = grid_fits(observed, dists, noise_floor, maximize)
    return min(fits, key=lambda f: f[0])[1] if fits else None


def gp_posterior(observed: Sequence[Observation], candidates: Sequence[dict[str, Any]],
                 dists: dict[str, BaseDistribution], noise_floor: float,
                 maximize: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and std of log(value) (negated for minimize) at each candidate (fit_gp)."""
    model = fit_gp(observed, dists, noise_floor, maximize)
    if model is None or not candidates:
        return np.zeros(len(candidates)), np.full(len(candidates), np.inf)
    return model.predict(candidates)


def improvement_scores(observed: Sequence[Observation], candidates: Sequence[dict[str, Any]],
                       dists: dict[str, BaseDistribution], noise_floor: float, maximize: bool = True) -> np.ndarray:
    """Expected improvement of each candidate over the model's incumbent (the posterior mean of
    the best measured config, not its highest observation), with the noise the model learnt."""
    model = fit_gp(observed, dists, noise_floor, maximize)
    if model is None or not candidates:
        return np.zeros(len(candidates))
    mu, sd = model.predict(candidates)
    return expected_improvement(mu, sd, model.incumbent()[1])


def detectable(noise: float, rounds: int) -> float:
    """The smallest relative (log) difference a confirmation of `rounds` fresh starts per arm
    tells apart from zero at about 95% (two-sided), at a start-to-start noise sd of `noise`."""
    return 1.96 * noise * math.sqrt(2.0 / max(1, rounds))


class FailureModel:
    """Which untried configs will likely fail, from the finished ones: a config fails when it
    holds a param value, or a pair of values, that at least two finished configs held and that
    every finished config holding it failed with (flash attention off with a quantized V cache),
    or when most of its finished neighbours (one param changed) failed, at least two of them."""

    def __init__(self, observed: Sequence[Observation], dists: dict[str, BaseDistribution]):
        self.observed = observed
        self.names = list(dists)
        self.counts: dict[tuple[Any, ...], list[int]] = {}  # (param, value[, param, value]) -> [failed, ok]
        for o in observed:
            for key in self._keys(o.params):
                self.counts.setdefault(key, [0, 0])[0 if o.value is None else 1] += 1

    def _keys(self, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        single = [(k, repr(params.get(k))) for k in self.names]
        return single + [a + b for a, b in itertools.combinations(single, 2)]

    def fails(self, config: dict[str, Any]) -> bool:
        for key in self._keys(config):
            failed, ok = self.counts.get(key, (0, 0))
            if failed >= 2 and ok == 0:
                return True
        near = [o for o in self.observed if sum(o.params.get(k) != config.get(k) for k in self.names) == 1]
        failed = sum(o.value is None for o in near)
        return failed >= 2 and failed > len(near) - failed


def likely_to_fail(config: dict[str, Any], observed: Sequence[Observation],
                   dists: dict[str, BaseDistribution]) -> bool:
    return FailureModel(observed, dists).fails(config)


def expected_improvement(mu: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """EI over `best` (all on the model's scale, larger is better)."""
    from scipy.stats import norm

    sd = np.maximum(sd, 1e-9)
    z = (mu - best) / sd
    return sd * (z * norm.cdf(z) + norm.pdf(z))
