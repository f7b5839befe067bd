"""The noise store (search/verdicts/noise_store.py): runs add their residuals, a comparison borrows the stored
spread with a guard, and the borrowing rule's false calls are alpha over hours like the stored ones."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from search.confirm.confirm import Arm
from search.confirm.confirm import record_noise as record_confirmation
from search.regress.ab import ABRun, noise_key, record_noise
from search.regress.sides import SideResult
from search.verdicts import noise_store
from search.verdicts.boundaries import paired_p_threshold
from search.verdicts.sequential import compare_paired

METRIC = "w.output_tok_s"
LOOKS = tuple(range(3, 11))


def test_runs_add_their_residuals_and_a_store_of_50_rounds_is_borrowed(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    key = noise_store.setup_key("host", "llamacpp", "smollm2", "w", "output_tok_s")
    for _ in range(6):
        noise_store.add(key, list(rng.normal(0.0, 0.03, 8)), "test", tmp_path)
    assert noise_store.prior(key, tmp_path) is None  # 42 df: below MIN_DF
    for _ in range(2):
        noise_store.add(key, list(rng.normal(0.0, 0.03, 8)), "test", tmp_path)
    prior = noise_store.prior(key, tmp_path)
    assert prior is not None and prior.df == 56 and prior.runs == 8 and prior.sd == pytest.approx(0.03, rel=0.2)
    assert prior.tau < 0.6  # equal hours: little left beyond the sampling spread (8 runs: a rough estimate)
    moving = [(0.0004 * 7 * s, 7) for s in (0.3, 3.0, 0.4, 2.5, 0.5, 2.0, 1.0, 0.35)]
    assert (noise_store.prior_from(moving) or prior).tau > 0.6  # hours whose variance moves 10x: it says so


def test_a_noisier_hour_is_judged_by_its_own_spread_alone() -> None:
    """The guard: a run whose own spread is above the stored one gets exactly the verdict it gets without a store."""
    rng = np.random.default_rng(2)
    a = [[100 * math.exp(rng.normal(0, 0.05))] for _ in range(6)]
    b = [[96 * math.exp(rng.normal(0, 0.05))] for _ in range(6)]
    quiet = noise_store.SpreadPrior(0.01, 100, 10, 0.0)
    with_store = compare_paired(METRIC, a, b, looks=LOOKS, prior=quiet)
    alone = compare_paired(METRIC, a, b, looks=LOOKS)
    assert (with_store.verdict, with_store.ci_low, with_store.ci_high, with_store.p_value) == \
        (alone.verdict, alone.ci_low, alone.ci_high, alone.p_value)
    assert "used alone" in with_store.note


def test_borrowing_keeps_alpha_over_hours_like_the_stored_ones_and_finds_more() -> None:
    """40,000 simulated runs a case, looks at 3..10, alpha 0.02, a store of 100 df whose runs' spread moved by tau:
    no change is called different in at most 2.2% of runs with this hour's noise drawn as the stored hours', and
    a -5% change at 3% a start is found far more often than by the run's own spread alone. The simulated rule is
    compare_paired's: checked on 200 runs."""
    from scipy import special

    rng = np.random.default_rng(20261201)
    p_own = paired_p_threshold(LOOKS, 0.02)
    for tau in (0.0, 0.5):
        prior = noise_store.SpreadPrior(1.0, 100, 10, tau)
        p_store = noise_store.borrowed_threshold(LOOKS, 0.02, prior)
        s0 = np.sqrt(rng.chisquare(100, 40_000) / 100)
        hour = np.exp(tau / 2 * rng.standard_normal(40_000))
        null = hour[:, None] * rng.standard_normal((40_000, LOOKS[-1]))
        assert noise_store.borrowed_crossing(null, LOOKS, s0, 100, p_store, p_own).mean() <= 0.022
        shift = math.log(0.95) / (math.sqrt(2) * 0.03)  # -5% in sds of a round's difference
        borrowed = noise_store.borrowed_crossing(null + shift, LOOKS, s0, 100, p_store, p_own).mean()
        own = np.zeros(40_000, dtype=bool)
        for n in LOOKS:
            d = null[:, :n] + shift
            own |= 2 * special.stdtr(n - 1, -np.abs(d.mean(axis=1)) / (d.std(axis=1, ddof=1) / math.sqrt(n))) < p_own
        assert borrowed > own.mean() + 0.05, (tau, borrowed, own.mean())
    # The product's verdicts follow the simulated rule (a crossing at the first look that crosses).
    prior = noise_store.SpreadPrior(0.03 * math.sqrt(2), 100, 10, 0.0)
    p_store = noise_store.borrowed_threshold(LOOKS, 0.02, prior)
    for i in range(200):
        d = math.log(0.97) + math.sqrt(2) * 0.03 * rng.standard_normal(LOOKS[-1])
        a = [[100.0] for _ in d]
        b = [[100.0 * math.exp(x)] for x in d]
        calls = [compare_paired(METRIC, a[:n], b[:n], looks=LOOKS, prior=prior, min_effect=0.0).verdict
                 != "inconclusive" for n in LOOKS]
        expected = noise_store.borrowed_crossing(d[None, :] / prior.sd, LOOKS, np.array([1.0]), 100, p_store,
                                                 p_own)[0]
        assert any(calls) == expected, i


def test_a_finished_run_adds_its_round_differences_under_its_setup(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGSEARCH_NOISE", str(tmp_path))
    a = SideResult("A", runs={METRIC: [[100.0], [102.0], [99.0], [101.0]]})
    b = SideResult("B", runs={METRIC: [[98.0], [101.0], [97.0], [100.0]]})
    a.fingerprint = {"host": "h", "engine": "llamacpp", "model_id": "m"}
    run = ABRun(a, b, 4)
    assert record_noise(run, [METRIC], "test") == 1
    stored = noise_store.runs(noise_key(run, METRIC))
    diffs = np.log([98 / 100, 101 / 102, 97 / 99, 100 / 101])
    assert stored == [(pytest.approx(float(((diffs - diffs.mean()) ** 2).sum())), 3)]
    run.interrupted = "interrupted"
    assert record_noise(run, [METRIC], "test") == 0  # a run cut short adds nothing


def test_a_study_reads_the_setup_a_paired_run_stores_under() -> None:
    """The stop rule's noise (search/study/study.py paired_noise) is read under the key regress and ab store under."""
    fingerprint = {"host": "h", "engine": "llamacpp", "model_id": "m"}
    fresh = ABRun(SideResult("A", samples={"startup.ready_s": [1.0] * 4}, fingerprint=fingerprint), SideResult("B"), 4)
    kept = ABRun(SideResult("A", samples={"startup.ready_s": [1.0]}, fingerprint=fingerprint), SideResult("B"), 4)
    assert noise_key(fresh, METRIC) == noise_store.key_for(fingerprint, METRIC)
    assert noise_key(kept, METRIC) == noise_store.key_for(fingerprint, METRIC, kept=True) != noise_key(fresh, METRIC)


def test_a_confirmation_adds_its_top_configs_round_differences_under_the_study_s_setup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A search's confirmation is a paired run of its setup: each top config's differences from the default are
    stored where the stop rule of the next study on that setup reads them; a positive control's are not, a
    continuation adds only its new rounds, and a failed arm adds nothing."""
    monkeypatch.setenv("FLAGSEARCH_NOISE", str(tmp_path))
    fingerprint = {"engine": "llamacpp", "model_id": "m"}
    default = Arm(0, "default", {}, key="0", runs=[[100.0], [102.0], [99.0], [101.0]], fingerprint=fingerprint,
                  host="h")
    top = Arm(3, "#3", {}, key="3", runs=[[110.0], [111.0], [108.0], [112.0]], fingerprint=fingerprint, host="h")
    control = Arm(-1, "control1", {}, key="control1", control={"slowdown": 0.1},
                  runs=[[90.0], [92.0], [89.0], [91.0]], fingerprint=fingerprint, host="h")
    assert record_confirmation([default, top, control], METRIC, 4) == 1
    key = noise_store.key_for({"host": "h", **fingerprint}, METRIC)
    stored = noise_store.runs(key)
    diffs = np.log([110 / 100, 111 / 102, 108 / 99, 112 / 101])
    assert stored == [(pytest.approx(float(((diffs - diffs.mean()) ** 2).sum())), 3)]
    assert record_confirmation([default, top], METRIC, 2) == 1 and noise_store.runs(key)[-1][1] == 1  # new rounds
    top.failures.append("did not start")
    assert record_confirmation([default, top], METRIC, 4) == 0
