"""The GPU measurement-setup analysis without a GPU (under a few seconds): `python -m bench.calibrate
power --setups` groups the calibration CSVs' starts by setup and session and gives the live gate's
sequential verdicts (search ab's stop rule and report, bench.calibrate.gate)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from bench.calibrate import setups
from bench.calibrate.power import DEFAULT

COLUMNS = ("plan", "config", "load", "start", "repeat", "status", "tok_s", "label", "run", "model", "pin",
           "max_tokens")  # the calibration CSVs' columns this analysis reads


def _write_calib(path: Path, sessions: dict[str, tuple[str, list[list[float]]]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for run, (model, starts) in sessions.items():
            for i, runs in enumerate(starts):
                for rep, v in enumerate(runs):
                    w.writerow({"plan": "calib", "config": DEFAULT, "load": 1, "start": i // 2,
                                "repeat": rep, "status": "ok", "tok_s": v, "label": f"base.{i % 2 + 1}",
                                "run": run, "model": model, "pin": "", "max_tokens": 256})


def test_setup_starts_are_grouped_by_setup_and_session(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    _write_calib(path, {"a": ("big.gguf", [[100.0, 101.0]] * 4), "b": ("big.gguf", [[99.0, 98.0]] * 2),
                        "c": ("", [[50.0, 51.0, 52.0]] * 2)})
    starts = setups.load_setup_starts([path])
    assert len(starts) == 8
    assert {s.setup for s in starts} == {"big pin=- tokens=256", "random-1b-f16 pin=- tokens=256"}
    assert {s.session for s in starts if s.setup.startswith("big")} == {"c:a", "c:b"}
    assert all(s.runs == [50.0, 51.0, 52.0] for s in starts if s.setup.startswith("random"))


def test_the_sequential_verdict_finds_a_clear_change_and_not_a_null_one() -> None:
    rng = np.random.default_rng(3)

    def side(level: float) -> list[list[float]]:
        return (level * np.exp(rng.normal(0, 0.005, (6, 1)) + rng.normal(0, 0.01, (6, 4)))).tolist()

    assert setups.seq_verdict(side(100.0), side(90.0), 6) == "regressed"
    assert setups.seq_verdict(side(100.0), side(100.0), 6) in ("unchanged", "inconclusive")
    # noise far above the change: never settled as a regression at 3..4 starts
    noisy = [[100.0 * (1 + 0.2 * (-1) ** i)] * 2 for i in range(4)]
    assert setups.seq_verdict(noisy, [[x * 0.97 for x in s] for s in noisy], 4) != "regressed"
