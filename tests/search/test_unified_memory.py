"""Unified memory (search/study/unified_memory.py): free memory is read before every start from the device
(here a fake device report: FLAGSEARCH_DEVICE_REPORT), a start refused for memory that something else
holds is re-tried once and recorded as a memory failure (not a config failure: no budget, hidden from
the sampler, never taken for a known result), and a refusal while enough was free is the config's."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from harness.failure import Failure
from search.space.space import parse_space
from search.store.results import TrialState
from search.store.storage import counted_trials, stored_records
from search.study.study import StudyRunner
from search.study.unified_memory import MEMORY_HELD, MemoryGuard

SERVER = (Path(__file__).resolve().parents[1] / "memory_refusing_server.py")
REFUSAL = ("ValueError: Free memory on device cuda:0 (40.0/121.7 GiB) on startup is less than desired GPU memory "
           "utilization (0.9, 109.53 GiB).")


class Recorder:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def trial_started(self, *args: Any) -> None: ...

    def phase(self, text: str) -> None:
        self.lines.append(f"phase: {text}")

    def trial_finished(self, record: Any) -> None: ...

    def note(self, text: str) -> None:
        self.lines.append(f"note: {text}")


def _report(path: Path, available: float, cache: float = 70.0) -> Path:
    path.write_text(json.dumps({"total_gb": 121.7, "available_gb": available, "page_cache_gb": cache}))
    return path


def _space(tmp_path: Path, refusals: int) -> Any:
    counter = tmp_path / "refusals"
    counter.write_text(str(refusals))
    return parse_space({
        "name": "um", "objectives": [{"metric": "w.output_tok_s"}], "workloads": [{"name": "w", "streams": ["qa"]}],
        "device": {"memory_gb": 121.7, "unified_memory": True,
                   # Fault injection: the "drop" only says that it ran (this machine is shared).
                   "drop_page_cache": ["sh", "-c", f"echo dropped >> {tmp_path / 'drops'}"]},
        "engines": {"fake": {"dialect": "command", "ready_timeout_s": 30,
                             "command": [sys.executable, str(SERVER), "--port", "{port}", "--refusals", str(counter)],
                             "flag_map": {"gpu_memory_utilization": "--gpu-memory-utilization"}}},
        "models": [{"name": "m", "path": "fake-model", "size_gb": 10}],
        "params": {"gpu_memory_utilization": {"type": "fixed", "value": 0.9}},
        "budget": {"trials": 1}, "confirm": {"top_k": 0},
    }, "um.yaml")


def test_free_memory_is_read_before_every_start_and_the_page_cache_dropped_once_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = _report(tmp_path / "device.json", 40.0)
    monkeypatch.setenv("FLAGSEARCH_DEVICE_REPORT", str(report))
    space = _space(tmp_path, 0)
    said: list[str] = []
    guard = MemoryGuard(space, said.append)
    config = space.sample(optuna.trial.FixedTrial({}))
    assert guard.share_gb(config) == pytest.approx(121.7 * 0.9)
    assert guard.before_start(config).free_gb == 40.0  # type: ignore[union-attr]
    _report(report, 115.0)
    assert guard.before_start(config).free_gb == 115.0  # type: ignore[union-attr]  # read again, not cached
    _report(report, 40.0)
    for _ in range(2):
        guard.before_start(config)
    # Dropped before each start that found 40 GB free (three), never at 115 GB; said once.
    assert (tmp_path / "drops").read_text().splitlines() == ["dropped"] * 3
    assert len(said) == 1 and said[0].startswith("unified memory: the page cache holds memory") and "echo dropped" \
        in said[0]
    refused = Failure("crashed", "exited", [REFUSAL])
    assert guard.held(config, refused) is not None  # 40 GB free < 109.5 GB asked: held elsewhere
    _report(report, 118.0)
    guard.before_start(config)
    assert guard.held(config, refused) is None  # enough was free: the config's own failure
    assert guard.held(config, Failure("bad_flag", "unrecognized arguments: --x")) is None


def test_a_start_refused_for_memory_held_elsewhere_is_retried_and_recorded_as_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGSEARCH_DEVICE_REPORT", str(_report(tmp_path / "device.json", 40.0)))
    space = _space(tmp_path, refusals=4)  # every start of two trials, retries included
    reporter = Recorder()
    runner = StudyRunner(space, f"sqlite:///{tmp_path / 'study.db'}", "um", tmp_path / "results", reporter,
                         drop_page_cache=["sh", "-c", f"echo dropped >> {tmp_path / 'drops'}"])
    runner.run()
    records = stored_records(runner.study)
    assert len(records) == 2, reporter.lines
    for record in records:
        assert record.state == TrialState.SKIPPED and record.failure is not None
        assert record.failure.cause == MEMORY_HELD, record.failure
        assert "109.5 GB" in record.failure.detail and "40.0 of 121.7 GB were free" in record.failure.detail
    assert (tmp_path / "refusals").read_text() == "0"  # 4 starts: each trial's start and its one retry
    assert sum("re-trying once" in line for line in reporter.lines) == 2
    assert counted_trials(runner.study) == 0  # no budget spent, and the sampler saw no result
    assert all(t.state == optuna.trial.TrialState.FAIL for t in runner.study.trials)
    assert runner.stop_reason is not None and "refused for memory held elsewhere" in runner.stop_reason
    assert runner.index.identical(records[0].params) is None  # not a known (failed) config
    assert sum(line.startswith("note: unified memory: the page cache holds memory") for line in reporter.lines) == 1


def test_a_refusal_while_enough_memory_was_free_is_the_configs_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGSEARCH_DEVICE_REPORT", str(_report(tmp_path / "device.json", 118.0, cache=1.0)))
    space = _space(tmp_path, refusals=1)
    reporter = Recorder()
    runner = StudyRunner(space, f"sqlite:///{tmp_path / 'study.db'}", "um", tmp_path / "results", reporter)
    runner.run()
    (record,) = stored_records(runner.study)
    assert record.state == TrialState.FAILED and record.failure is not None and record.failure.cause != MEMORY_HELD
    assert not any("re-trying once" in line for line in reporter.lines)
    assert counted_trials(runner.study) == 1 and (tmp_path / "refusals").read_text() == "0"
