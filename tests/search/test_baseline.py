"""Baseline files: pinning a config, writing and reading back, and saving a stored study's trial."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from search.regress.baseline import (
    FORMAT,
    Baseline,
    baseline_from_study,
    config_params,
    load_baseline,
    parse_assignments,
    pin,
    pinned_space,
    raw_space_doc,
    samples_from_workloads,
    save_baseline,
)
from search.space.space import load_space
from search.store.results import ResultsError, TrialRecord, write_json_atomic
from search.study.study import RECORD_ATTR, default_storage

SPACE = Path(__file__).resolve().parents[2] / "spaces" / "smollm2-cpu.yaml"


def _workloads() -> dict[str, object]:
    def sample(repeat: int, tok_s: float) -> dict[str, object]:
        return {"repeat": repeat, "wall_s": 3.0, "server": {}, "errors_by_kind": {}, "requests": [],
                "metrics": {"output_tok_s": tok_s, "ttft_p50_s": 0.05, "errors": 0.0, "requests": 4.0}}

    return {"four_streams": {"name": "four_streams", "samples": [sample(0, 80.0), sample(1, 82.5)]},
            "single": {"name": "single", "samples": [sample(0, 24.0), sample(1, 25.0)]}}


def _baseline(name: str = "smollm2-eager") -> Baseline:
    params = config_params(load_space(SPACE), {"max_num_batched_tokens": 512})
    return Baseline(name=name, config=pin(raw_space_doc(SPACE), params), params=params,
                    samples=samples_from_workloads(_workloads()), sample_unit="repeat",
                    fingerprint={"cpu_model": "x", "engine_version": "0.32.0"}, quality={"score": 1.0})


def test_config_params_resolves_defaults_overrides_and_conditions() -> None:
    space = load_space(SPACE)
    params = config_params(space, {"dtype": "float32", "speculative_method": "ngram"})
    assert params["dtype"] == "float32"
    assert params["num_speculative_tokens"] == 3  # switched on by the override, at its default
    assert params["prompt_lookup_max"] == 4  # fixed, active under the condition
    with pytest.raises(ValueError, match="not a parameter"):
        config_params(space, {"threads": 2})
    with pytest.raises(ValueError, match="not in"):
        config_params(space, {"max_num_seqs": 3})


def test_pinned_config_launches_the_same_flags() -> None:
    space = load_space(SPACE)
    params = config_params(space, {"max_num_batched_tokens": 512, "omp_threads_bind": "0-1"})
    pinned, config = pinned_space(raw_space_doc(SPACE), params, "pinned")
    flags, env, _ = pinned.split(config)
    assert flags["max_num_batched_tokens"] == 512 and flags["max_model_len"] == 2048
    assert flags["enforce_eager"] is True  # the engine's fixed args come along
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    assert all(p.type == "fixed" for p in pinned.m.params.values())
    # Paths stay portable: the document keeps ${FLAGSEARCH_HOME}, the loaded space expands it.
    doc = pin(raw_space_doc(SPACE), params)
    assert "${FLAGSEARCH_HOME}" in doc["models"][0]["path"]
    assert "${" not in pinned.model_choice(config.model).path


def test_pin_rejects_unknown_parameters() -> None:
    with pytest.raises(ValueError, match="not declared"):
        pin(raw_space_doc(SPACE), {"engine": "vllm", "model": "smollm2-135m", "bogus": 1})


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    path = save_baseline(_baseline(), tmp_path)
    assert path == tmp_path / "smollm2-eager.json"
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT and data["created"]
    assert data["samples"]["four_streams.output_tok_s"] == [80.0, 82.5]
    assert "four_streams.requests" not in data["samples"]  # only the kept metrics
    back = load_baseline(path)
    assert back.params == _baseline().params
    assert back.gated_metrics() == ["four_streams.decode_tok_s"]  # the space's objective
    assert back.pinned_config().values["max_num_batched_tokens"] == 512
    with pytest.raises(ValueError, match="--force"):
        save_baseline(_baseline(), tmp_path)
    save_baseline(_baseline(), tmp_path, overwrite=True)
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(("content", "message"), [
    ('{"format": "flagsearch-baseline/1", "name": "x"', "corrupted"),
    ('{"format": "other"}', "not a baseline"),
    ('{"format": "flagsearch-baseline/1", "name": "x"}', "lacks"),
    ('{"format": "flagsearch-baseline/1", "name": "x", "config": {}, "params": {}, "samples": {"m": ["a"]}}',
     "lists of numbers"),
])
def test_bad_baseline_files_are_refused(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ResultsError, match=message):
        load_baseline(path)


def test_bad_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="baseline name"):
        save_baseline(_baseline("../escape"), tmp_path)


def test_parse_assignments() -> None:
    assert parse_assignments(["threads=1", "flash_attn=on", "x=true", "y=0.5"]) == {
        "threads": 1, "flash_attn": "on", "x": True, "y": 0.5}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_assignments(["threads"])


def test_baseline_from_a_stored_study(tmp_path: Path) -> None:
    """A study as `search run` stores it: trial records in Optuna, raw samples in result.json."""
    results = tmp_path / "mystudy"
    study = optuna.create_study(storage=default_storage(results), study_name="mystudy", directions=["maximize"])
    study.set_user_attr("objectives", [["four_streams.output_tok_s", "maximize"]])
    study.set_user_attr("space_source", str(SPACE))
    params = config_params(load_space(SPACE), {"max_num_batched_tokens": 512})
    for number, tok_s in ((0, 70.0), (1, 81.0)):
        trial = study.ask()
        record = TrialRecord(number=trial.number, state="complete", params=params, engine="vllm",
                             model="smollm2-135m", command="python -m vllm ...", metrics={}, quality={"score": 1.0},
                             objective_values=[tok_s], fingerprint={"cpu_model": "x"})
        workloads = _workloads() if number == 1 else {}
        write_json_atomic(results / "trials" / f"{number:04d}" / "result.json",
                          {**record.summary(), "workloads": workloads})
        trial.set_user_attr(RECORD_ATTR, record.summary())
        study.tell(trial, [tok_s])
    baseline = baseline_from_study(results, "from-study")
    assert baseline.source["trial"] == 1  # the best
    assert baseline.samples["four_streams.output_tok_s"] == [80.0, 82.5]
    assert baseline.params == params and baseline.quality == {"score": 1.0}
    save_baseline(baseline, tmp_path / "b")
    with pytest.raises(ResultsError, match="no raw samples"):
        baseline_from_study(results, "t0", trial=0)
    with pytest.raises(ResultsError, match="not a completed trial"):
        baseline_from_study(results, "t9", trial=9)
