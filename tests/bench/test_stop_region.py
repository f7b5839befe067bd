"""The model-averaging lever of bench/experiments/stop_region (variants.py): the mixture is a proper
average of its grid's fits, and the patch is undone after its replay."""

from __future__ import annotations

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution

import bench.noisy_replay as nr
from bench.experiments.stop_region.variants import MixtureGP, applied, fit_mixture
from search.sampling import stopping, surrogate
from search.sampling.surrogate import Observation, fit_gp

DISTS: dict[str, BaseDistribution] = {"a": CategoricalDistribution([0, 1, 2]), "b": CategoricalDistribution(["x", "y"])}
OBSERVED = [Observation({"a": a, "b": b}, v) for (a, b), v in
            {(0, "x"): 10.0, (1, "x"): 12.0, (2, "x"): 11.0, (0, "y"): 9.0, (1, "y"): 14.5}.items()]
UNTRIED = [{"a": 2, "b": "y"}]


def test_a_mixture_of_one_fit_is_that_fit_and_the_average_lies_between_its_parts() -> None:
    single = fit_gp(OBSERVED, DISTS, 0.05)
    assert single is not None
    alone = MixtureGP([(1.0, single)])
    for got, want in zip(alone.predict(UNTRIED), single.predict(UNTRIED), strict=True):
        assert np.allclose(got, want)
    mixed = fit_mixture(OBSERVED, DISTS, 0.05)
    assert mixed is not None and len(mixed.parts) > 1
    assert abs(sum(w for w, _ in mixed.parts) - 1) < 1e-9
    mus = [m.predict(UNTRIED)[0][0] for _, m in mixed.parts]
    mu, sd = mixed.predict(UNTRIED)
    assert min(mus) <= mu[0] <= max(mus) and sd[0] > 0
    # The incumbent is the measured config the averaged model rates best: here the highest by far.
    assert mixed.incumbent()[0] == {"a": 1, "b": "y"}


def test_the_patch_is_undone_after_its_replay() -> None:
    before = (surrogate.fit_gp, stopping.fit_gp, nr.fit_gp)
    with applied({"bma": True}, 2):
        assert surrogate.fit_gp is fit_mixture and stopping.fit_gp is fit_mixture and nr.fit_gp is fit_mixture
    assert (surrogate.fit_gp, stopping.fit_gp, nr.fit_gp) == before
