"""The GPU measurement-setup tooling without a GPU (under a few seconds): bench/gpu/table.py writes a
setup's columns and pins the server it starts; bench/gpu_power.py --setups groups starts by setup
and session and gives the live gate's sequential verdicts."""

from __future__ import annotations

import csv
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "gpu"))

import gpu_power  # noqa: E402
import table  # noqa: E402


def test_a_failed_start_records_the_setup_and_the_pinned_command(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # a fake llama-server that prints its arguments and exits: the start fails and its note shows them
    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\ngrep Cpus_allowed_list /proc/$$/status\necho "E args: $@"\nexit 3\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(table, "FSGPU", tmp_path)
    setup = table.Setup(name="big", model="m.gguf", pin="0", max_tokens=64)
    rows = table.measure_start(table.NAMED["otk31"], "calib", 0, {1: 2}, "card", "m1", tmp_path / "logs", "otk31",
                               setup)
    assert len(rows) == 1 and rows[0]["status"] == "failed"
    assert rows[0]["run"] == "big" and rows[0]["model"] == "m.gguf" and rows[0]["pin"] == "0"
    assert rows[0]["max_tokens"] == 64
    assert f"-m {tmp_path}/m.gguf" in str(rows[0]["note"])
    assert set(rows[0]) <= set(table.COLUMNS)
    log = next((tmp_path / "logs").iterdir()).read_text()
    assert "-ot blk\\.31\\.attn_k\\.weight=CPU" in log
    assert "Cpus_allowed_list:\t0\n" in log  # started under taskset -c 0


def _write_calib(path: Path, sessions: dict[str, tuple[str, list[list[float]]]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=table.COLUMNS)
        w.writeheader()
        for run, (model, starts) in sessions.items():
            for i, runs in enumerate(starts):
                for rep, v in enumerate(runs):
                    w.writerow({"plan": "calib", "config": gpu_power.DEFAULT, "load": 1, "start": i // 2,
                                "repeat": rep, "status": "ok", "tok_s": v, "label": f"base.{i % 2 + 1}",
                                "run": run, "model": model, "pin": "", "max_tokens": 256})


def test_setup_starts_are_grouped_by_setup_and_session(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    _write_calib(path, {"a": ("big.gguf", [[100.0, 101.0]] * 4), "b": ("big.gguf", [[99.0, 98.0]] * 2),
                        "c": ("", [[50.0, 51.0, 52.0]] * 2)})
    starts = gpu_power.load_setup_starts([path])
    assert len(starts) == 8
    assert {s.setup for s in starts} == {"big pin=- tokens=256", "random-1b-f16 pin=- tokens=256"}
    assert {s.session for s in starts if s.setup.startswith("big")} == {"c:a", "c:b"}
    assert all(s.runs == [50.0, 51.0, 52.0] for s in starts if s.setup.startswith("random"))


def test_the_sequential_verdict_finds_a_clear_change_and_not_a_null_one() -> None:
    rng = np.random.default_rng(3)

    def side(level: float) -> list[list[float]]:
        return (level * np.exp(rng.normal(0, 0.005, (6, 1)) + rng.normal(0, 0.01, (6, 4)))).tolist()

    assert gpu_power.seq_verdict(side(100.0), side(90.0), 6) == "regressed"
    assert gpu_power.seq_verdict(side(100.0), side(100.0), 6) in ("unchanged", "inconclusive")
    # noise far above the change: never settled as a regression at 3..4 starts
    noisy = [[100.0 * (1 + 0.2 * (-1) ** i)] * 2 for i in range(4)]
    assert gpu_power.seq_verdict(noisy, [[x * 0.97 for x in s] for s in noisy], 4) != "regressed"
