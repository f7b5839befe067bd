"""The gate's statistics on controlled samples: verdicts, error rates, claims, exit codes, reports."""

from __future__ import annotations

import math
from xml.etree import ElementTree as ET

import numpy as np
import pytest

from search.exit_codes import Exit
from search.regress.claims import judge_claim, parse_claim
from search.regress.gate_report import GateReport
from search.verdicts.gate import (
    EXIT_INCONCLUSIVE,
    EXIT_PASS,
    EXIT_REGRESSION,
    compare,
    metric_direction,
    min_rounds_for_alpha,
    repeats_needed,
)
from search.verdicts.sequential import compare_quality


def noisy(median: float, cv: float, n: int, seed: int) -> list[float]:
    return list(median * np.exp(np.random.default_rng(seed).normal(0.0, cv, n)))


def test_direction_from_metric_names() -> None:
    assert metric_direction("four_streams.output_tok_s") == "higher"
    assert metric_direction("quality.score") == "higher"
    assert metric_direction("single.ttft_p50_s") == "lower"
    assert metric_direction("single.errors") == "lower"
    with pytest.raises(ValueError, match="descriptive"):
        metric_direction("single.requests")


def test_clear_slowdown_is_regressed_and_speedup_improved() -> None:
    a = noisy(75.0, 0.02, 6, 1)
    slow = noisy(75.0 * 0.85, 0.02, 6, 2)
    v = compare("w.output_tok_s", a, slow)
    assert v.verdict == "regressed"
    assert v.ci_high < 1.0 and v.p_value < 0.02 and -20 < v.change_pct < -10
    assert compare("w.output_tok_s", slow, a).verdict == "improved"


def test_latency_going_up_is_a_regression() -> None:
    a = noisy(0.050, 0.02, 6, 3)
    b = noisy(0.060, 0.02, 6, 4)
    assert compare("w.ttft_p50_s", a, b).verdict == "regressed"
    assert compare("w.ttft_p50_s", b, a).verdict == "improved"


def test_small_real_change_below_min_effect_is_unchanged() -> None:
    # 1% slower with 0.3% noise: significant, but below the 3% that matters.
    a = noisy(100.0, 0.003, 10, 5)
    b = noisy(99.0, 0.003, 10, 6)
    v = compare("w.output_tok_s", a, b)
    assert v.p_value < 0.02
    assert v.verdict == "unchanged"


def test_noisy_few_samples_are_inconclusive_with_rounds_needed() -> None:
    a = noisy(75.0, 0.08, 3, 7)
    b = noisy(72.0, 0.08, 3, 8)
    v = compare("w.output_tok_s", a, b)
    assert v.verdict == "inconclusive"
    assert v.repeats_needed is not None and v.repeats_needed > 3
    assert "rounds" in v.note


def test_one_sample_per_side_cannot_decide() -> None:
    v = compare("w.output_tok_s", [70.0], [50.0])
    assert v.verdict == "inconclusive" and math.isnan(v.ratio)


def test_errors_against_a_zero_baseline() -> None:
    assert compare("w.errors", [0, 0, 0, 0], [2, 1, 3, 2]).verdict == "regressed"
    assert compare("w.errors", [0, 0, 0, 0], [0, 0, 0, 0]).verdict == "unchanged"


def test_exact_test_needs_enough_rounds_for_alpha() -> None:
    assert min_rounds_for_alpha(0.05) == 4  # 2/C(8,4) = 0.029
    assert min_rounds_for_alpha(0.02) == 5  # 2/C(10,5) = 0.0079
    assert repeats_needed(0.01, 0.03) == 5
    assert repeats_needed(0.03, 0.03) > repeats_needed(0.015, 0.03)  # type: ignore[operator]


def test_aa_false_alarm_rate_matches_the_exact_size() -> None:
    """Size of the gate: A/A draws from one distribution must rarely be called a regression.

    With 6 rounds a side, p < 0.02 needs U <= 3: an exact one-sided size of 7/924 = 0.76%. The bound
    below leaves room for the sampling error of 400 trials (about 0.45%) yet fails for alpha = 0.05
    (one-sided size 19/924 = 2.1%)."""
    trials = 400
    alarms = sum(compare("w.output_tok_s", noisy(75, 0.04, 6, 1000 + i), noisy(75, 0.04, 6, 5000 + i),
                         seed=i).verdict == "regressed" for i in range(trials))
    assert alarms / trials <= 0.015


def test_detection_of_a_ten_percent_slowdown_at_two_percent_noise() -> None:
    trials = 100
    hits = sum(compare("w.output_tok_s", noisy(75, 0.02, 6, 2000 + i), noisy(67.5, 0.02, 6, 7000 + i),
                       seed=i).verdict == "regressed" for i in range(trials))
    assert hits / trials >= 0.95


@pytest.mark.parametrize(("text", "leaf", "ratio"), [
    ("+24% tok/s", "decode_tok_s", 1.24), ("1.93x", "decode_tok_s", 1.93), ("-10% ttft", "ttft_p50_s", 0.9),
    ("2x ttft", "ttft_p50_s", 0.5), ("+5% stream_tok_s", "stream_tok_s", 1.05),
    ("24 % throughput", "decode_tok_s", 1.24), ("+24% e2e", "output_tok_s", 1.24),
])
def test_parse_claim(text: str, leaf: str, ratio: float) -> None:
    claim = parse_claim(text)
    assert claim.metric_leaf == leaf
    assert claim.ratio == pytest.approx(ratio)


@pytest.mark.parametrize("text", ["faster", "+24% bananas", "0x", "-120%"])
def test_parse_claim_rejects_nonsense(text: str) -> None:
    with pytest.raises(ValueError):
        parse_claim(text)


def test_claim_contradicted_like_the_gb10_story() -> None:
    # PR claimed +24% end to end; on GB10: 16.9 vs 17.0 tok/s, the fast kernel never selected.
    a = noisy(16.9, 0.01, 6, 11)
    b = noisy(17.0, 0.01, 6, 12)
    result = judge_claim(parse_claim("+24% tok/s"), compare("w.output_tok_s", a, b))
    assert result.verdict == "contradicted"
    assert "claimed +24.0%" in result.explanation


def test_claim_reproduced_and_undecided() -> None:
    a = noisy(20.0, 0.02, 6, 13)
    assert judge_claim(parse_claim("+24% tok/s"),
                       compare("w.output_tok_s", a, noisy(24.8, 0.02, 6, 14))).verdict == "reproduced"
    wide_a, wide_b = noisy(20.0, 0.25, 3, 15), noisy(22.0, 0.25, 3, 16)
    assert judge_claim(parse_claim("+10% tok/s"),
                       compare("w.output_tok_s", wide_a, wide_b)).verdict == "undecided"


def test_claim_on_latency() -> None:
    a = noisy(0.100, 0.01, 6, 17)
    b = noisy(0.080, 0.01, 6, 18)
    assert judge_claim(parse_claim("-20% ttft"), compare("w.ttft_p50_s", a, b)).verdict == "reproduced"
    assert judge_claim(parse_claim("-50% ttft"), compare("w.ttft_p50_s", a, b)).verdict == "contradicted"


def _report(b_median: float, quality_b: float = 1.0) -> GateReport:
    v = compare("w.output_tok_s", noisy(75, 0.01, 6, 21), noisy(b_median, 0.01, 6, 22))
    info = compare("w.ttft_p50_s", noisy(0.05, 0.3, 3, 23), noisy(0.05, 0.3, 3, 24), gated=False)
    checks = [f"c{i}" for i in range(10)]
    passed_b = {c: [i < round(10 * quality_b)] for i, c in enumerate(checks)}
    test = compare_quality({c: [True] for c in checks}, passed_b)
    return GateReport("regress t", "A", "B", [v, info],
                      quality={"score_a": 1.0, "score_b": quality_b, "test": test, "starts_a": 2, "starts_b": 2})


def test_exit_codes_follow_gated_verdicts_and_quality() -> None:
    assert _report(75 * 0.8).exit_code() == EXIT_REGRESSION
    assert _report(75.0).exit_code() in (EXIT_PASS, EXIT_INCONCLUSIVE)
    assert _report(75 * 1.2).exit_code() == EXIT_PASS  # the ungated, noisy TTFT does not matter
    assert _report(75 * 1.2, quality_b=0.1).exit_code() == EXIT_REGRESSION  # 9 of 10 checks lost: the test says so
    # 5 of 10 lost is not significant at alpha 0.02 (McNemar p 0.03): inconclusive, never a regression by itself
    assert _report(75 * 1.2, quality_b=0.5).exit_code() == EXIT_INCONCLUSIVE
    broken = _report(75 * 1.2)
    broken.errors.append("B did not start")
    assert broken.exit_code() == Exit.FAILED and broken.outcome == "error"


def test_markdown_and_junit() -> None:
    report = _report(75 * 0.8, quality_b=0.1)
    report.fingerprint_differences.append("engine_version: '0.31.0' != '0.32.0'")
    md = report.markdown()
    assert "REGRESSION" in md and "**regressed**" in md and "engine_version" in md
    assert "Quality score: A 1.0 / B 0.1: regressed (McNemar over 10 checks on 2/2 starts" in md
    suite = ET.fromstring(report.junit_xml())
    assert suite.get("failures") == "2"  # throughput and quality
    names = [c.get("name") for c in suite.iter("testcase")]
    assert "w.output_tok_s" in names and "quality.score" in names and "w.ttft_p50_s" not in names
