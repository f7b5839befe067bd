"""The dry run's time estimate learns from a real study: after one trial of a real llama-server, the
same space's dry run states the start and measuring times as measured, not assumed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from search.space.space import parse_space
from search.study.dryrun import dry_run, previous_records
from search.study.study import StudyRunner, default_storage
from tests.conftest import Quiet

ROOT = Path(__file__).resolve().parents[2]


def engine_line(lines: list[str]) -> str:
    return next(ln for ln in lines if ln.startswith("#   llamacpp: start"))


@pytest.mark.e2e
def test_dry_run_estimate_uses_the_studys_measured_times(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "spaces" / "llamacpp-cpu.yaml").read_text())
    doc["params"] = {"threads": {"type": "categorical", "choices": [1], "default": 1}}
    doc["workloads"] = [{"name": "single", "streams": ["qa"], "max_tokens": 16}]
    doc["measure"] = {"repeats": 1, "warmup": False, "request_timeout_s": 60}
    doc["quality"] = {"suite": None}
    doc["objectives"] = [{"metric": "single.output_tok_s"}]
    doc["budget"] = {"trials": 1}
    doc["confirm"] = {"top_k": 0}
    space = parse_space(doc, "tiny")
    results = tmp_path / space.name

    before = engine_line(dry_run(space, 1, previous_records(results)))
    assert re.search(r"start \d+ s \((assumed|declared)\), measuring \d+ s \(\d+ passes", before), before
    assert not results.exists()  # a dry run creates no study

    StudyRunner(space, default_storage(results), space.name, results, Quiet()).run(n_trials=1)
    records = previous_records(results)
    assert len(records) == 1 and records[0].failure is None and records[0].ready_s
    after = engine_line(dry_run(space, 1, records))
    assert re.search(r"start [\d.]+ s \(measured, 1 trials\), measuring \d+ s \(measured, 1 trials", after), after
