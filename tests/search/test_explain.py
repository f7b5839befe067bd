"""The "why" follows the evidence: a small measured change is never called "no measurable change",
and a compile-time switch in a log is never reported as what a run selected."""

from __future__ import annotations

from pathlib import Path

from harness.engines import get_engine
from search.regress.claims import judge_claim, parse_claim
from search.regress.explain import explain_claim
from search.regress.sides import SideResult
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


# ---- the kernel path: what the documents' PR #44700 story needs the tool to say ---------------------

DOCUMENTED = Path(__file__).resolve().parents[1] / "data" / "vllm_gpu_documented.log"
PR_FILES = Path(__file__).resolve().parents[1] / "data" / "pr44700_files.txt"


def documented_side(label: str, text: str) -> SideResult:
    from dataclasses import asdict

    s = SideResult(label, dialect="vllm")
    s.startup = asdict(get_engine("vllm").parse_startup(text))
    return s


def test_an_unchanged_pr_is_explained_by_the_gdn_path_both_builds_ran() -> None:
    from search.regress.prereq import changed_files_from_text

    a_text = DOCUMENTED.read_text()
    # B: the PR's build. Its version string, free KV memory and KV size differ, as two builds' always do;
    # the kernels it selected on the GB10 are the same lines.
    b_text = (a_text.replace("0.19.1", "0.19.2.dev44700+g3a1b2c4").replace("21.48 GiB", "21.02 GiB")
              .replace("1,689,984 tokens", "1,653,120 tokens"))
    a, b = documented_side("A", a_text), documented_side("B: pr:44700", b_text)
    touched = get_engine("vllm").paths_touched(changed_files_from_text(PR_FILES.read_text()))
    assert set(touched) == {"gdn", "gdn_spec_decode"}  # the GDN layer and its metadata builder
    result = judge_claim(parse_claim("+24% tok/s on B200"), verdict(1.004, 0.985, 1.022, "unchanged"))
    why = explain_claim(result, a, b, ["build: vllm 0.19.1 -> pr:44700"], "vllm", touched) or ""
    assert "GDN prefill kernel: Triton/FLA on A and B" in why and "gdn_linear_attn.py" in why
    assert "fast path is not the one selected on this hardware" in why
    # Version strings, free memory and KV size are not kernel paths: the sentence never rests on them.
    assert "0.19.2" not in why and "GiB" not in why and "kv_cache_tokens" not in why


def test_a_changed_kernel_selection_is_named_as_the_difference() -> None:
    a_text = DOCUMENTED.read_text()
    b_text = a_text.replace("Using Triton/FLA GDN prefill kernel (requested=auto",
                            "Using FlashInfer GDN prefill kernel (requested=auto")
    a, b = documented_side("A", a_text), documented_side("B", b_text)
    result = judge_claim(parse_claim("+24% tok/s"), verdict(1.004, 0.985, 1.022, "unchanged"))
    why = explain_claim(result, a, b, [], "vllm") or ""
    assert "GDN prefill kernel: Triton/FLA on A, FlashInfer on B" in why and "not taking effect" not in why
