"""Stored data survives upgrades: files written by the previous release load with this one.

tests/data/formats/0.1.0/ holds what flagsearch 0.1.0 (commit f93f57e, before formats carried
versions on trial records) wrote in a real llama-server search: a study database, each trial's
result.json, and a committed baseline. Readers here must load every one of them (migrating where
the format moved on) and refuse a file from a newer release by name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna
import pytest

from search.regress.baseline import FORMAT, load_baseline
from search.store.results import RECORD_FORMAT, STUDY_FORMAT, ResultsError, TrialRecord, check_study_format, read_record
from search.store.summary import load_view
from search.study.study import default_storage

OLD = Path(__file__).resolve().parents[1] / "data" / "formats" / "0.1.0"


def test_baseline_of_the_previous_release_loads() -> None:
    baseline = load_baseline(OLD / "baseline.json")
    assert baseline.name == "smollm2-llamacpp-cpu-t1"
    assert baseline.gated_metrics() and all(len(v) >= 1 for v in baseline.samples.values())
    space = baseline.space()  # the pinned one-point space still validates
    config = baseline.pinned_config()
    assert config.engine in space.m.engines and space.split(config)[0]


def test_result_records_of_the_previous_release_load() -> None:
    paths = sorted((OLD / "study" / "trials").glob("*/result.json"))
    assert len(paths) >= 2
    records = [read_record(p) for p in paths]
    assert {r.state for r in records} >= {"complete"}
    assert any(r.failure is not None or r.state != "complete" for r in records), "fixture lacks a failure"
    for path, r in zip(paths, records, strict=True):
        assert "format" not in json.loads(path.read_text())  # 0.1.0 wrote no version: read as 1
        if r.state == "complete":
            assert r.metrics and r.objective_values


def test_study_of_the_previous_release_loads(tmp_path: Path) -> None:
    """The study database (records in trial user attrs, objectives in study user attrs)."""
    copy = tmp_path / "study"
    shutil.copytree(OLD / "study", copy)
    study = optuna.load_study(study_name="formats-0.1.0", storage=default_storage(copy))
    view = load_view(study)
    assert view.records and view.best()
    assert view.objectives[0][0] == "single.output_tok_s"


def test_new_records_carry_their_format_and_newer_ones_are_refused(tmp_path: Path) -> None:
    record = TrialRecord(number=0, state="complete", params={"engine": "e", "model": "m"}, engine="e", model="m",
                         metrics={"w.x": 1.0}, objective_values=[1.0])
    summary = record.summary()
    assert summary["format"] == RECORD_FORMAT
    assert TrialRecord.from_dict(summary).objective_values == [1.0]
    newer = {**summary, "format": "flagsearch-trial/99"}
    with pytest.raises(ResultsError, match="newer flagsearch"):
        TrialRecord.from_dict(newer)
    data = json.loads((OLD / "baseline.json").read_text())
    assert data["format"] == FORMAT
    path = tmp_path / "b.json"
    path.write_text(json.dumps({**data, "format": "flagsearch-baseline/99"}))
    with pytest.raises(ResultsError, match="newer flagsearch"):
        load_baseline(path)


def test_a_study_from_a_newer_release_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "study"
    shutil.copytree(OLD / "study", copy)
    study = optuna.load_study(study_name="formats-0.1.0", storage=default_storage(copy))
    assert check_study_format(study.user_attrs, "s") == 1  # 0.1.0 set no format
    study.set_user_attr("format", STUDY_FORMAT)
    assert load_view(study).records
    study.set_user_attr("format", "flagsearch-study/99")
    with pytest.raises(ResultsError, match="newer flagsearch"):
        load_view(study)


def test_show_and_report_read_the_previous_release_study(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from search.cli import main

    copy = tmp_path / "study"
    shutil.copytree(OLD / "study", copy)
    url = f"sqlite:///{copy / 'study.db'}"
    assert main(["show", "formats-0.1.0", "--storage", url]) == 0
    assert "bogus" in capsys.readouterr().out  # the failed trial's row
    assert main(["report", "formats-0.1.0", "--storage", url, "--results-dir", str(copy), "--html",
                 str(tmp_path / "r.html"), "--csv", str(tmp_path / "csv")]) == 0
    assert (tmp_path / "r.html").stat().st_size > 0 and (tmp_path / "csv" / "requests.csv").exists()
