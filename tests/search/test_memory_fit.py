"""The memory-fit estimate rejects configs that certainly cannot fit, before any launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from search.sampling.sampler import is_failed
from search.space.space import Config, Space, parse_space
from search.study.memory_fit import estimate
from search.study.study import StudyRunner, default_storage
from tests.conftest import Quiet


def space(command: str = "/nonexistent/vllm") -> dict:
    return {
        "name": "fit",
        "device": {"name": "GB10", "memory_gb": 128, "bandwidth_gbs": 273},
        "engines": {"vllm": {"command": [command]}},
        "models": [{"name": "nvfp4", "path": "/models/q", "size_gb": 75.6, "kv_bytes_per_token": 24576}],
        "params": {
            "gpu_memory_utilization": {"type": "categorical", "choices": [0.9, 0.5], "default": 0.9},
            "max_model_len": {"type": "categorical", "choices": [131072, 4194304], "default": 131072},
            "kv_cache_dtype": {"type": "categorical", "choices": ["auto", "fp8"], "default": "auto"},
        },
        "workloads": [{"name": "w", "profile": "uniform_short"}],
        "quality": {"suite": None},
        "objectives": [{"metric": "w.output_tok_s"}],
    }


def config_of(s: Space, **params: object) -> Config:
    study = optuna.create_study()
    study.enqueue_trial(params)
    return s.sample(study.ask())


def test_estimate_rejects_only_certain_misfits() -> None:
    s = parse_space(space())
    ok = estimate(s, config_of(s, gpu_memory_utilization=0.9, max_model_len=131072, kv_cache_dtype="auto"))
    assert ok is not None and ok.fits and ok.need_gb < ok.available_gb
    small = estimate(s, config_of(s, gpu_memory_utilization=0.5, max_model_len=131072, kv_cache_dtype="auto"))
    assert small is not None and not small.fits and "75.6 GB" in small.detail
    huge = estimate(s, config_of(s, gpu_memory_utilization=0.9, max_model_len=4194304, kv_cache_dtype="auto"))
    assert huge is not None and not huge.fits
    fp8 = estimate(s, config_of(s, gpu_memory_utilization=0.9, max_model_len=4194304, kv_cache_dtype="fp8"))
    assert fp8 is not None and fp8.need_gb < huge.need_gb


def test_estimate_needs_the_facts() -> None:
    doc = space()
    del doc["device"]
    s = parse_space(doc)
    assert estimate(s, config_of(s, gpu_memory_utilization=0.5, max_model_len=131072, kv_cache_dtype="auto")) is None


def test_study_records_a_misfit_without_launching(tmp_path: Path) -> None:
    # The command does not exist: had the study tried to launch, the cause would be bad_command.
    s = parse_space(space())
    runner = StudyRunner(s, default_storage(tmp_path), "fit", tmp_path, Quiet())
    runner.study.enqueue_trial({"gpu_memory_utilization": 0.5, "max_model_len": 131072, "kv_cache_dtype": "auto"},
                               skip_if_exists=False)
    runner.run(n_trials=2)
    records = {t.number: t.user_attrs["flagsearch_record"] for t in runner.study.trials}
    assert records[0]["failure"]["cause"] == "bad_command"  # the default: launched, command missing
    assert records[1]["failure"]["cause"] == "wont_fit" and "rejected before launch" in records[1]["failure"]["detail"]
    assert runner.starts == 1  # only the default was attempted; the misfit never was
    # Failures are told so that every sampler ranks them below any measured config (search/sampling/sampler.py).
    assert all(t.state == optuna.trial.TrialState.COMPLETE and is_failed(t) for t in runner.study.trials)


def test_a_trial_resolves_its_config_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory guard, the fit estimate, the context check and the run read one resolution of the
    trial's config (Space.resolve), not one each."""
    s = parse_space(space())
    runner = StudyRunner(s, default_storage(tmp_path), "once", tmp_path, Quiet())
    runner.study.enqueue_trial({"gpu_memory_utilization": 0.5, "max_model_len": 131072, "kv_cache_dtype": "auto"},
                               skip_if_exists=False)
    splits: list[int] = []  # per trial: how often its config was turned into flags, env and request fields
    real_split, real_objective = Space.split, StudyRunner._objective

    def split(self: Space, config: Config) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
        if splits:
            splits[-1] += 1
        return real_split(self, config)

    def objective(self: StudyRunner, trial: optuna.Trial) -> list[float]:
        splits.append(0)
        return real_objective(self, trial)

    monkeypatch.setattr(Space, "split", split)
    monkeypatch.setattr(StudyRunner, "_objective", objective)
    runner.run(n_trials=2)
    # Trial 0 (the default) was launched (and failed: no such command), trial 1 was rejected by the estimate.
    assert [t.user_attrs["flagsearch_record"]["failure"]["cause"] for t in runner.study.trials] == \
        ["bad_command", "wont_fit"]
    assert splits == [1, 1]
