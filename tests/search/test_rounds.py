"""The file of finished rounds (search/regress/rounds.py) that `search ab`, `regress` and `baseline save`
resume from: what the same command finds again, what another comparison is refused, what a finished run
leaves. The resume itself, after a real SIGKILL on a real engine, is tests/search/test_kill_at_random.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.measure.workloads import WorkloadSpec
from search.regress.ab import ABRun
from search.regress.rounds import RoundFile, run_key
from search.regress.sides import SideResult
from search.store.results import ResultsError


def key(**change: object) -> dict[str, object]:
    parts: dict[str, object] = {"title": "ab", "workloads": [WorkloadSpec("w", ("qa",), max_tokens=16)],
                                "env": {"HF_TOKEN": "hf_secret_value_123456"}, "rounds": 6}
    return run_key(**{**parts, **change})


def a_run(rounds: int) -> ABRun:
    a, b = SideResult("A"), SideResult("B")
    for r in range(rounds):
        a.runs.setdefault("w.output_tok_s", []).append([50.0 + r])
        b.runs.setdefault("w.output_tok_s", []).append([45.0 + r])
    return ABRun(a, b, rounds, order=["A", "B", "B", "A"][: 2 * rounds], looks=[3, 4, 5, 6])


def test_the_same_command_finds_its_rounds_and_another_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "rounds.json"
    mine = RoundFile(path, key(), "A/B")
    assert mine.resume() is None  # nothing stored yet
    mine.save(2, {"run": a_run(2).to_dict()})
    text = path.read_text()
    assert "hf_secret_value_123456" not in text  # scrubbed like every file the tool writes
    # A new process builds its key again from the same command: equal through JSON and the scrub.
    again = RoundFile(path, key(), "A/B").resume()
    assert again is not None and again["rounds"] == 2
    run = ABRun.from_dict(again["run"])
    assert run.rounds_done == 2 and run.a.runs == a_run(2).a.runs and run.looks == [3, 4, 5, 6]
    with pytest.raises(ResultsError) as refused:  # another comparison's rounds are never mixed in
        RoundFile(path, key(rounds=8), "A/B").resume()
    said = str(refused.value)
    assert str(path) in said and "2 unfinished round(s)" in said and "(rounds differ)" in said
    assert json.loads(path.read_text())["rounds"] == 2  # and never overwritten
    mine.save(6, {"run": a_run(6).to_dict()}, complete=True)
    assert RoundFile(path, key(rounds=8), "A/B").resume() is None  # a finished run: the next one starts afresh


def test_a_newer_or_damaged_rounds_file_is_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "rounds.json"
    path.write_text(json.dumps({"format": "flagsearch-rounds/9", "key": {}}))
    with pytest.raises(ResultsError, match="newer flagsearch"):
        RoundFile(path, key(), "baseline").resume()
    path.write_text('{"format": "flagsearch-rounds/1", "key": ')
    with pytest.raises(ResultsError, match=r"rounds\.json"):
        RoundFile(path, key(), "baseline").resume()
