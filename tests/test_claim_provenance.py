"""Claims that say where they were measured and what they need ('+24% tok/s on B200 needs X')."""

from __future__ import annotations

import pytest

from search.claims import hardware_here, hardware_matches, judge_claim, missing_prerequisites, parse_claim
from search.gate import compare


def test_parse_hardware_and_prerequisites() -> None:
    c = parse_claim("+24% tok/s on B200 needs FlashInfer CUTLASS MoE; fp4 GEMM")
    assert (c.metric_leaf, round(c.ratio, 3), c.hardware, c.needs) == (
        "output_tok_s", 1.24, "B200", ("FlashInfer CUTLASS MoE", "fp4 GEMM"))
    plain = parse_claim("-10% ttft")
    assert (plain.hardware, plain.needs, round(plain.ratio, 3)) == (None, (), 0.9)
    assert parse_claim("1.93x on H100 SXM").hardware == "H100 SXM"
    with pytest.raises(ValueError, match="cannot read"):
        parse_claim("faster on B200")


def test_hardware_matching() -> None:
    assert hardware_matches("B200", "NVIDIA B200")
    assert hardware_matches("H100 SXM", "8x NVIDIA H100 80GB HBM3 SXM")
    assert not hardware_matches("B200", "NVIDIA H100 80GB HBM3")
    assert hardware_matches("CPU", hardware_here({"cpu_model": "AMD EPYC 9654", "cpu_count": 2}))
    assert hardware_here({"gpu_name": "NVIDIA B200", "gpu_count": 8}) == "8x NVIDIA B200"


def test_prerequisite_words_must_share_one_log_line() -> None:
    claim = parse_claim("+20% needs FlashInfer CUTLASS MoE; triton attention")
    log = "INFO Using FlashInfer CUTLASS MoE backend for FP4\nINFO attention: TORCH_SDPA\nINFO triton off"
    # 'triton' and 'attention' appear, but never on one line: not selected.
    assert missing_prerequisites(claim, log) == ["triton attention"]
    assert missing_prerequisites(parse_claim("+20%"), log) == []


def test_verdict_says_when_the_hardware_differs() -> None:
    measured = compare("w.output_tok_s", [100, 101, 99, 100, 102], [100, 99, 101, 100, 100])
    other = judge_claim(parse_claim("+24% tok/s on B200"), measured, here="CPU: AMD EPYC (2 cores)")
    assert other.verdict == "contradicted"
    assert "measured on B200" in other.explanation and "not about B200" in other.explanation
    same = judge_claim(parse_claim("+24% tok/s on EPYC"), measured, here="CPU: AMD EPYC (2 cores)")
    assert "same kind" in same.explanation
    assert "B200" not in judge_claim(parse_claim("+24%"), measured, here="x").explanation
