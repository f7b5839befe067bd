"""Claims that say where they were measured and what they need ('+24% tok/s on B200 needs X')."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engines import get_engine
from search.regress.claims import (
    claimed_hardware,
    hardware_gap,
    hardware_here,
    hardware_matches,
    judge_claim,
    missing_prerequisites,
    parse_claim,
)
from search.verdicts.gate import compare


def test_parse_hardware_and_prerequisites() -> None:
    c = parse_claim("+24% tok/s on B200 needs FlashInfer CUTLASS MoE; fp4 GEMM")
    assert (c.metric_leaf, round(c.ratio, 3), c.hardware, c.needs) == (
        "decode_tok_s", 1.24, "B200", ("FlashInfer CUTLASS MoE", "fp4 GEMM"))
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
    assert "Claimed on B200 (sm_100, 180 GB), measured on CPU" in other.explanation
    assert "not about B200" in other.explanation
    same = judge_claim(parse_claim("+24% tok/s on EPYC"), measured, here="CPU: AMD EPYC (2 cores)")
    assert "same kind" in same.explanation
    assert "B200" not in judge_claim(parse_claim("+24%"), measured, here="x").explanation


DATA = Path(__file__).resolve().parents[1] / "data"
GB10 = {"gpu_name": "NVIDIA GB10", "gpu_compute_capability": "12.1", "gpu_memory": "122502 MiB", "gpu_count": 1}


def test_claimed_hardware_is_compared_with_this_machines_fingerprint() -> None:
    assert hardware_here(GB10) == "NVIDIA GB10 (sm_121, 119.6 GiB)"
    gap = hardware_gap(parse_claim("+24% tok/s on B200 needs FlashInfer CUTLASS MoE"), GB10)
    assert gap == "claimed on B200 (sm_100, 180 GB), measured on NVIDIA GB10 (sm_121, 119.6 GiB)"
    assert hardware_gap(parse_claim("+24% on GB10"), GB10) is None  # the same kind: nothing to say
    assert hardware_gap(parse_claim("+24%"), GB10) is None
    assert claimed_hardware("GB200 NVL72") == "GB200 NVL72 (sm_100, 186 GB)"  # not taken for a B200
    assert claimed_hardware("TPU v5e") == "TPU v5e"  # unknown hardware is named as written


def test_prerequisite_found_in_the_paths_the_engine_parser_reports() -> None:
    # A recorded vLLM GPU startup: the NvFp4 MoE backend line lists every candidate, MARLIN among them,
    # and selects FLASHINFER_CUTLASS; the engine's parser reports moe=FLASHINFER_CUTLASS.
    log = (DATA / "vllm_gpu_documented.log").read_text()
    info = get_engine("vllm").parse_startup(log)
    assert info.backends["moe"] == "FLASHINFER_CUTLASS"
    claim = parse_claim("+20% on B200 needs flashinfer cutlass moe; marlin moe")
    assert missing_prerequisites(claim, log, info.backends) == ["marlin moe"]  # a candidate is no selection
    assert missing_prerequisites(claim, "", {"moe": "MARLIN"}) == ["flashinfer cutlass moe"]
