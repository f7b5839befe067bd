"""Positive controls in the confirmation: a config known to be worse must be found worse, or the
confirmation says it could not see a real difference instead of calling configs indistinguishable."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from search.confirm import Arm, _answer
from search.gate import MetricVerdict
from search.space import SpaceError, parse_space


def verdict(kind: str, ratio: float) -> MetricVerdict:
    return MetricVerdict(metric="w.output_tok_s", direction="higher", verdict=kind,  # type: ignore[arg-type]
                         median_a=100.0, median_b=100.0 * ratio, ratio=ratio, ci_low=ratio - 0.05,
                         ci_high=ratio + 0.05, p_value=0.01, n_a=4, n_b=4, cv=0.02, repeats_needed=None,
                         min_effect=0.03)


ARMS = [Arm(0, "default", {}, key="0"), Arm(3, "#3", {}, key="3"),
        Arm(-1, "control1", {"dtype": "float32"}, key="control1", control={"dtype": "float32"})]


def test_a_detected_control_leaves_the_answer_standing() -> None:
    answer, winner = _answer(ARMS, {"3": verdict("unchanged", 1.01), "control1": verdict("regressed", 0.6)},
                             contended=False, direction="maximize")
    assert answer.startswith("no config is distinguishable"), answer
    assert "positive control (dtype=float32)" in answer and "found worse" in answer and winner is None


def test_a_missed_control_withholds_the_verdict() -> None:
    answer, winner = _answer(ARMS, {"3": verdict("improved", 1.2), "control1": verdict("inconclusive", 0.9)},
                             contended=False, direction="maximize")
    assert answer.startswith("verdict withheld: the positive control was not found worse"), answer
    assert "NOT found worse (inconclusive)" in answer and winner is None


def test_a_winner_is_confirmed_beside_a_detected_control() -> None:
    answer, winner = _answer(ARMS, {"3": verdict("improved", 1.2), "control1": verdict("regressed", 0.6)},
                             contended=False, direction="maximize")
    assert answer.startswith("confirmed: #3 is 1.20x") and winner == 3, answer


def test_controls_must_name_parameters_of_the_space(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parent.parent / "spaces" / "smollm2-cpu.yaml").read_text()
    good = parse_space(yaml.safe_load(doc), "smollm2-cpu.yaml")
    assert good.m.confirm.controls and set(good.m.confirm.controls[0]) <= set(good.m.params)
    with pytest.raises(SpaceError, match=r"confirm.controls\[0\].*unknown: no_such_flag"):
        bad = doc.replace("controls:\n    - {", "controls:\n    - {no_such_flag: 1, ")
        parse_space(yaml.safe_load(bad), "bad.yaml")
