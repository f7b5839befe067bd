"""A small Gaussian-process model of a discrete config space, shared by the sampler's guided phase
(search/sampler.py) and the stop rule (search/stopping.py).

Log objective values (a relative scale: the noise floor is a fraction), a kernel that adds one
effect per param value (learnt from every config that shares it: main effects) to a local term
(what only near configs share: interactions), over Hamming distance for categorical params and
absolute distance for numeric ones; kernel weights and length by marginal likelihood over a small
grid, noise from the noise floor. Failed configs stay out of the model; `likely_to_fail` judges
untried ones from their neighbours.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from scipy.linalg import cho_factor, cho_solve, solve_triangular

LENGTHS = (0.15, 0.3, 0.6, 1.2)  # kernel length scales tried (fraction of params that differ)


@dataclass(frozen=True)
class Observation:
    params: dict[str, Any]
    value: float | None  # None: the config failed
    feasible: bool = True  # False: it ran but broke a constraint (not a value to model, not a failure)

    @property
    def usable(self) -> bool:
        return self.value is not None and self.feasible and self.value > 0


def _encode(configs: Sequence[dict[str, Any]], dists: dict[str, BaseDistribution]) -> list[np.ndarray]:
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


def _distance(a: list[np.ndarray], b: list[np.ndarray], dists: dict[str, BaseDistribution]) -> np.ndarray:
    total = np.zeros((len(a[0]) if a else 0, len(b[0]) if b else 0))
    for d, ca, cb in zip(dists.values(), a, b, strict=True):
        if isinstance(d, CategoricalDistribution):
            total += (ca[:, None] != cb[None, :]).astype(float)
        else:
            total += np.abs(ca[:, None] - cb[None, :])
    return total / max(1, len(dists))


def _kernel(d: np.ndarray, additive: float, local: float, length: float) -> np.ndarray:
    """additive x (1 - d): one effect per param value, learnt from every config that shares it
    (main effects); local x exp(-d / length): what only near configs share (interactions)."""
    return additive * (1.0 - d) + local * np.exp(-d / length)


def gp_posterior(observed: Sequence[Observation], candidates: Sequence[dict[str, Any]],
                    dists: dict[str, BaseDistribution], noise_floor: float,
                    maximize: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and std of log(value) (negated for minimize) at each candidate. Kernel
    weights and length by marginal likelihood over a small grid; noise from the floor."""
    observed = [o for o in observed if o.usable]
    if not observed or not candidates:
        return np.zeros(len(candidates)), np.full(len(candidates), np.inf)
    sign = 1.0 if maximize else -1.0
    y = np.array([sign * math.log(o.value) for o in observed if o.value is not None])
    x = _encode([o.params for o in observed], dists)
    xc = _encode(list(candidates), dists)
    d_xx = _distance(x, x, dists)
    d_cx = _distance(xc, x, dists)
    mean = float(np.mean(y))
    yc = y - mean
    noise = max(noise_floor / 2, 1e-3) ** 2 * np.eye(len(y))
    spread = float(np.var(y)) or 0.01
    best: tuple[float, tuple[float, float, float], Any] | None = None
    for additive in (0.0, spread / 2, spread, 2 * spread):
        for local in (0.0, spread / 8, spread / 2, spread):
            for length in LENGTHS if local else LENGTHS[:1]:
                if additive == local == 0.0:
                    continue
                try:
                    factor = cho_factor(_kernel(d_xx, additive, local, length) + noise, lower=True)
                except np.linalg.LinAlgError:
                    continue
                alpha = cho_solve(factor, yc)
                nll = 0.5 * float(yc @ alpha) + float(np.sum(np.log(np.diag(factor[0]))))
                if best is None or nll < best[0]:
                    best = (nll, (additive, local, length), (factor, alpha))
    assert best is not None
    (additive, local, length), (factor, alpha) = best[1], best[2]
    k_c = _kernel(d_cx, additive, local, length)
    mu = mean + k_c @ alpha
    v = solve_triangular(factor[0], k_c.T, lower=True)
    var = np.maximum(additive + local - np.sum(v * v, axis=0), 0.0)
    return mu, np.sqrt(var)


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
