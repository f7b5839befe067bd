"""The "why" follows the evidence: a small measured change is never called "no measurable change",
and a compile-time switch in a log is never reported as what a run selected."""

from __future__ import annotations

from pathlib import Path

from harness.engines import get_engine
from search.regress.ab import SideResult
from search.regress.claims import judge_claim, parse_claim
from search.regress.explain import explain_claim
from search.verdicts.gate import MetricVerdict

CUDA_LOG = Path(__file__).resolve().parents[1] / "data" / "llamacpp_cuda_ready.log"


def verdict(ratio: float, low: float, high: float, verdict: str) -> MetricVerdict:
    return MetricVerdict(metric="single.decode_tok_s", direction="higher", verdict=verdict,  # type: ignore[arg-type]
                         median_a=100.0, median_b=100.0 * ratio, ratio=ratio, ci_low=low, ci_high=high,
                         p_value=0.01, n_a=6, n_b=6, cv=0.01, repeats_needed=None, min_effect=0.03, level=0.99)


def side(startup: dict[str, object]) -> SideResult:
    s = SideResult("x")
    s.startup = startup
    return s


def test_a_change_whose_interval_excludes_zero_is_a_change_not_a_null() -> None:
    # Seen on an H100: GGML_CUDA_DISABLE_FUSION=1, -2.3% with an interval of -4.5..-0.1%, inconclusive
    # against the 3% minimum, was explained as "no measurable change, likely not taking effect".
    measured = verdict(0.977, 0.955, 0.999, "inconclusive")
    result = judge_claim(parse_claim("+24% tok/s"), measured)
    same = {"backends": {"flash_attn": "enabled"}, "facts": {}}
    why = explain_claim(result, side(same), side(same), ["env GGML_CUDA_DISABLE_FUSION=1"]) or ""
    assert "measured change of -2.3%" in why and "excludes no change" in why
    assert "no measurable change" not in why and "not taking effect" not in why


def test_a_null_result_with_the_same_selection_is_still_explained_as_before() -> None:
    measured = verdict(1.001, 0.99, 1.012, "unchanged")
    result = judge_claim(parse_claim("+24% tok/s"), measured)
    same = {"backends": {"flash_attn": "enabled"}, "facts": {}}
    why = explain_claim(result, side(same), side(same), ["flag x"]) or ""
    assert "no measurable change" in why and "likely not taking effect" in why


def test_cuda_graphs_compiled_in_is_a_fact_not_a_selection() -> None:
    info = get_engine("llamacpp").parse_startup(CUDA_LOG.read_text())
    assert "cuda_graphs" not in info.backends  # GGML_CUDA_DISABLE_GRAPHS=1 turns them off without a log line
    assert info.facts["cuda_graphs_compiled"] == "yes"
