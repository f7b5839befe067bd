"""The big suite's data and judging without a server: tool calls, needles, thinking, relative
verdicts against the reference's own answers, and the requirements they become."""

from __future__ import annotations

import json

import pytest

from harness.quality.checks import judge, parse_checks, strip_thinking
from harness.quality.quality import (
    CheckResult,
    QualityModel,
    QualityResult,
    constraint_names,
    constraint_values,
    quality_metrics,
    relative_to,
    suites,
)
from harness.quality.reference import ReferenceAnswers


def _check(name: str):  # type: ignore[no-untyped-def]
    return next(c for c in suites()["big"] if c.name == name)


def test_big_suite_covers_every_kind_the_issue_asks_for() -> None:
    big = suites()["big"]
    cats = {c.category for c in big}
    assert cats == {"exact", "code", "json", "tool", "multilingual", "long"}
    assert sum(c.kind == "code" and bool(c.test) for c in big) >= 4
    assert {"smoke", "hard", "big"} <= set(suites())
    for c in big:  # every expected answer passes its own judge (no check that cannot pass)
        if c.kind == "number":
            assert judge(c, f"So the answer is\n{c.value:g}").passed, c.name
        if c.kind in ("contains", "needle"):
            assert judge(c, f"It is {c.expect[0]}.").passed, c.name


def test_tool_calls_are_judged_by_name_schema_and_values() -> None:
    c = _check("tool_weather")
    ok = '{"name": "get_weather", "arguments": {"city": "Budapest", "unit": "celsius"}}'
    assert judge(c, ok).passed
    assert judge(c, f"<tool_call>\n{ok}\n</tool_call>").passed  # Qwen-style tags
    native = json.dumps({"name": "get_weather", "arguments": json.dumps({"city": "Budapest", "unit": "celsius"})})
    assert judge(c, native).passed  # native tool_calls carry arguments as a JSON string
    assert "expected 'get_weather'" in judge(c, ok.replace("get_weather", "weather")).reason
    assert not judge(c, ok.replace("celsius", "kelvin")).passed  # enum in the schema
    assert not judge(c, "I would call get_weather for Budapest.").passed


def test_thinking_is_stripped_before_judging() -> None:
    assert strip_thinking("<think>7 * 6 = 42, so</think>\n42") == "42"
    assert strip_thinking("<think>still thinking when cut") == ""
    assert strip_thinking("no thinking") == "no thinking"


def test_bad_checks_are_named() -> None:
    with pytest.raises(ValueError, match="a tool check needs `tool`"):
        parse_checks([{"name": "t", "kind": "tool", "prompt": "p"}], "mine.yaml")
    with pytest.raises(ValueError, match="needle check needs"):
        parse_checks([{"name": "n", "kind": "needle", "prompt": "p", "needle": "x"}], "mine.yaml")
    with pytest.raises(ValueError, match="unique"):
        parse_checks([{"name": "a", "kind": "regex", "prompt": "p"}] * 2, "mine.yaml")


def _ref(checks: list[tuple[str, bool, str]]) -> ReferenceAnswers:
    return ReferenceAnswers(key="k", model="m", config={}, dialect="llamacpp", tokens=4, top_k=5, items=[],
                            checks=[{"name": n, "passed": p, "answer": a} for n, p, a in checks])


def test_relative_verdicts_count_only_what_the_reference_passed() -> None:
    ref = _ref([("a", True, "42"), ("b", False, "wrong"), ("c", True, "Paris"), ("d", False, "x")])
    same = [CheckResult("a", True, "42", ""), CheckResult("b", False, "wrong", ""),
            CheckResult("c", True, "Paris", ""), CheckResult("d", False, "x", "")]
    rel = relative_to(same, ref)
    assert rel is not None and rel.lost == [] and rel.answer_match == 1.0 and rel.reference_score == 0.5
    worse = [CheckResult("a", False, "41", ""), CheckResult("b", False, "other", ""),
             CheckResult("c", True, "Paris", ""), CheckResult("d", True, "y", "")]
    rel = relative_to(worse, ref)
    assert rel is not None and rel.lost == ["a"] and rel.gained == ["d"] and rel.answer_match == 0.25

    q = QualityModel(suite="big", min_score=None, max_lost=0, min_answer_match=0.5)
    assert q.reference is not None and q.reference.suite == "big"  # the reference answers the suite
    assert constraint_names(q) == ["quality.degenerate", "quality:max_lost", "quality:min_answer_match"]
    result = QualityResult("big", 0.5, True, worse, relative=rel)
    assert quality_metrics(result)["quality.lost"] == 1.0
    assert constraint_values(result, q) == [0.0, 1.0, 0.25]  # one lost check, match 0.25 < 0.5
    # Without the reference's answers a relative requirement is unmeasured: infeasible, never a pass.
    assert constraint_values(QualityResult("big", 1.0, True, same), q) == [0.0, 1.0, 1.0]


def test_relative_settings_reach_the_reference_and_its_key() -> None:
    from harness.quality.reference import reference_key

    a = QualityModel(suite="big", min_score=None, max_lost=1, thinking=False, context_scale=0.1)
    b = QualityModel(suite="big", min_score=None, max_lost=1, thinking=True, context_scale=0.1)
    assert a.reference is not None and b.reference is not None
    assert (a.reference.thinking, a.reference.context_scale) == (False, 0.1)
    assert reference_key("m", {}, a.reference) != reference_key("m", {}, b.reference)
    plain = QualityModel(suite="smoke", max_kl=0.05)  # agreement only: the suite is not re-answered
    assert plain.reference is not None and plain.reference.suite is None
