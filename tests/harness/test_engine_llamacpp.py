"""llama.cpp dialect: flag table, log parsing and failure classes (recorded and real), token
counting through the chat template, and a real 2-trial search over spaces/llamacpp-cpu.yaml."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from harness import flagsearch_home
from harness.engines import EngineSettings, ModelChoice, get_engine
from harness.engines.llamacpp import FLAGS, LlamaCppEngine, server_flags
from harness.launch import StartupError, get_launcher, wait_ready
from harness.launch.base import Server
from harness.quality.logprobs import Position, generate
from harness.quality.reference import tokenize
from search.space.space import parse_space
from search.store.summary import load_view
from search.study.study import StudyRunner, default_storage, free_port
from tests.conftest import Quiet

DATA = Path(__file__).resolve().parents[1] / "data"
SPACE = Path(__file__).resolve().parents[2] / "spaces" / "llamacpp-cpu.yaml"


def settings(**overrides: object) -> EngineSettings:
    base = dict(name="llamacpp", dialect="llamacpp", command=(str(flagsearch_home.llama_server()),),
                ready_timeout_s=120.0)
    base.update(overrides)
    return EngineSettings(**base)  # type: ignore[arg-type]


def gguf() -> ModelChoice:
    path = flagsearch_home.smollm2_gguf()
    if not path.exists():
        pytest.fail(f"the SmolLM2 GGUF is missing at {path}: run `make setup` first", pytrace=False)
    return ModelChoice(name="smollm2-q4_1", path=str(path))


def binary() -> str:
    path = flagsearch_home.llama_server()
    if not path.exists():
        pytest.fail(f"llama-server is missing at {path}: run `make setup` first", pytrace=False)
    return str(path)


# ---- command building ------------------------------------------------------------------------

def test_flags_follow_the_table_and_spell_booleans_as_llama_server_does() -> None:
    argv = server_flags({"n_gpu_layers": 99, "flash_attn": True, "batch_size": 2048, "ubatch_size": 512,
                         "threads": 2, "parallel": 4, "ctx_size": 8192, "cache_type_k": "q8_0",
                         "cache_type_v": "q8_0", "cont_batching": False, "kv_unified": True,
                         "spec_type": "draft-simple", "spec_draft_n_max": 8, "draft_model": "/m/d.gguf",
                         "some_new_flag": 3, "unset": None})
    assert argv == ["-ngl", "99", "-fa", "on", "-b", "2048", "-ub", "512", "-t", "2", "-np", "4", "-c", "8192",
                    "--cache-type-k", "q8_0", "--cache-type-v", "q8_0", "--no-cont-batching", "--kv-unified",
                    "--spec-type", "draft-simple", "--spec-draft-n-max", "8", "-md", "/m/d.gguf",
                    "--some-new-flag", "3"]
    assert server_flags({"flash_attn": False}) == ["-fa", "off"]
    assert server_flags({"flash_attn": "auto"}) == ["-fa", "auto"]
    assert "--draft-max" not in FLAGS.values()  # gone in this llama.cpp version


def test_build_launch_has_model_port_and_always_metrics(tmp_path: Path) -> None:
    spec = LlamaCppEngine().build_launch(settings(command=("/opt/llama-server",)), ModelChoice("m", "/m.gguf"),
                                         {"threads": 1, "metrics": True}, {"LLAMA_ARG_X": "1"}, 8123)
    argv = list(spec.argv)
    assert argv[:7] == ["/opt/llama-server", "-m", "/m.gguf", "--host", "127.0.0.1", "--port", "8123"]
    assert argv.count("--metrics") == 1 and "--log-timestamps" in argv
    assert argv[argv.index("-lv") + 1] == "4"
    assert spec.env == {"LLAMA_ARG_X": "1"} and spec.base_url == "http://127.0.0.1:8123"


def test_spec_decoding_expects_the_draft_counter() -> None:
    engine = LlamaCppEngine()
    (exp,) = engine.expected_features({"spec_type": "ngram-simple"})
    assert exp.metric == "spec_drafts" and engine.metric_names.spec_drafts == "llamacpp:spec_decode_num_drafts_total"
    assert engine.expected_features({"spec_type": "none"}) == []
    assert engine.expected_features({}) == []


# ---- log parsing on recorded text ---------------------------------------------------------------

def test_parse_startup_of_a_recorded_cpu_log() -> None:
    info = LlamaCppEngine().parse_startup((DATA / "llamacpp_cpu_ready.log").read_text())
    assert info.version == "b1-1652066"
    assert set(info.phases_s) >= {"model_loading", "context_init", "warmup", "process_to_listening", "fit_params"}
    assert all(v >= 0 for v in info.phases_s.values())
    assert info.phases_s["warmup"] == pytest.approx(12.296718 - 3.406390, abs=1e-3)
    assert info.backends == {"weights": "CPU_Mapped", "flash_attn": "enabled", "kv_cache_type": "K=f16,V=f16"}
    assert info.kv_cache_tokens == 4096 and info.max_concurrency == 2.0
    assert info.facts["model_buffer_mib.CPU_Mapped"] == "92.10"
    assert info.facts["kv_buffer_mib.CPU"] == "90.00"
    assert info.facts["flash_attn_requested"] == "auto"
    assert info.facts["slot_ctx_tokens"] == "2048" and info.facts["graph_splits"] == "1"


def test_parse_startup_of_a_cuda_log() -> None:
    text = (DATA / "llamacpp_cuda_ready.log").read_text()
    info = LlamaCppEngine().parse_startup(text)
    assert "CUDA0" in info.backends["weights"]
    assert info.facts["gpu"].startswith("NVIDIA H100") and info.facts["compute_capability"] == "9.0"
    assert info.facts["gpu_layers"].split("/")[0] == info.facts["gpu_layers"].split("/")[1]
    assert float(info.facts["model_buffer_mib.CUDA0"]) > 1000
    assert info.backends["flash_attn"] in ("enabled", "disabled")


@pytest.mark.parametrize(("log", "cause", "needle"), [
    ("llamacpp_bad_value.log", "bad_flag", "unknown value for --flash-attn"),
    ("llamacpp_model_not_found.log", "model_not_found", "failed to open GGUF file"),
    ("llamacpp_quantized_v_without_fa.log", "bad_flag", "quantized V cache requires flash_attn"),
])
def test_classify_recorded_failures(log: str, cause: str, needle: str) -> None:
    found = LlamaCppEngine().classify_failure((DATA / log).read_text())
    assert found is not None and found.cause == cause and needle in found.line


@pytest.mark.parametrize(("text", "cause"), [
    ("0.01.2 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 81920.00 MiB on device 0: "
     "cudaMalloc failed: out of memory", "oom"),
    ("0.00.029.169 E srv         start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080",
     "port_in_use"),
    ('{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it",'
     '"type":"exceed_context_size_error"}}', "kv_too_small"),
    ("/src/ggml.c:1234: GGML_ASSERT(ctx->mem_buffer != NULL) failed", "crashed"),
    ("0.00.04 I srv  llama_server: listening on http://127.0.0.1:8080", None),
])
def test_classify_text(text: str, cause: str | None) -> None:
    found = LlamaCppEngine().classify_failure(text)
    assert (found.cause if found else None) == cause


# ---- real llama-server: failures in milliseconds, token counting, a search --------------------------

def _start(tmp_path: Path, flags: dict[str, object], model: ModelChoice | None = None,
           port: int | None = None) -> Server:
    engine = get_engine("llamacpp")
    spec = engine.build_launch(settings(command=(binary(),)), model or gguf(), flags, {}, port or free_port())
    return get_launcher("process").start(spec, tmp_path / "server.log")


def _failure_of(tmp_path: Path, flags: dict[str, object], model: ModelChoice | None = None,
                port: int | None = None) -> str:
    try:
        server = _start(tmp_path, flags, model, port)
    except StartupError as exc:  # the process launcher checks the port itself before starting
        return exc.cause
    try:
        with pytest.raises(StartupError) as info:
            wait_ready(server, "/health", 60, poll_s=0.05)
        assert info.value.cause == "exited"
    finally:
        server.stop()
    assert server.owned_pids() == []
    found = LlamaCppEngine().classify_failure((tmp_path / "server.log").read_text())
    assert found is not None, (tmp_path / "server.log").read_text()[-2000:]
    return found.cause


@pytest.mark.e2e
def test_real_failures_are_classified(tmp_path: Path) -> None:
    assert _failure_of(tmp_path / "a", {"flash_attn": "maybe"}) == "bad_flag"
    assert _failure_of(tmp_path / "b", {}, ModelChoice("missing", str(tmp_path / "missing.gguf"))) == "model_not_found"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        assert _failure_of(tmp_path / "c", {}, port=holder.getsockname()[1]) == "port_in_use"


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = _start(tmp_path_factory.mktemp("llama"), {"threads": 2, "parallel": 2, "ctx_size": 4096})
    try:
        wait_ready(server, "/health", 120)
        yield server
    finally:
        server.stop()


@pytest.mark.e2e
def test_count_tokens_matches_the_chat_request_usage(llama_server: Server) -> None:
    engine = LlamaCppEngine()
    base = llama_server.spec.base_url
    messages = [{"role": "user", "content": "Name three rivers of Europe."}]

    async def go() -> tuple[int, int | None, int, int]:
        async with httpx.AsyncClient(timeout=60) as client:
            counted = await engine.count_tokens(client, base, "x", messages)
            chat = await client.post(base + "/v1/chat/completions",
                                     json={"messages": messages, "max_tokens": 1, "temperature": 0})
            raw = await client.post(base + "/tokenize", json={"content": messages[0]["content"]})
            return counted.count, counted.context_limit, chat.json()["usage"]["prompt_tokens"], \
                len(raw.json()["tokens"])

    count, limit, usage, raw = asyncio.run(go())
    assert count == usage  # the templated prompt, exactly as the chat endpoint sees it
    assert raw < count  # /tokenize on the bare text misses the chat template's tokens
    assert limit == 2048  # -c 4096 over 2 slots


@pytest.mark.e2e
def test_real_startup_info_from_a_running_server(llama_server: Server) -> None:
    info = LlamaCppEngine().parse_startup(llama_server.log_path.read_text())
    assert info.phases_s["process_to_listening"] > 0
    assert info.backends["weights"] == "CPU_Mapped" and info.facts["threads"] == "2"
    assert info.kv_cache_tokens == 4096 and info.facts["slots"] == "2"


@pytest.mark.e2e
def test_teacher_forcing_by_resuming_and_the_build_the_server_reports(llama_server: Server) -> None:
    """llama.cpp reads teacher-forced logprobs by resuming generation from the forced prefix (the
    base Engine's way): forcing the greedy answer gives back the greedy run's positions, in chunks."""
    engine = LlamaCppEngine()
    base = llama_server.spec.base_url

    async def go() -> tuple[list[Position], dict[int, Position], int, dict[str, str], dict[str, object]]:
        async with httpx.AsyncClient(timeout=120) as client:
            ids = await tokenize(client, base, "x", "llamacpp", "The three primary colors are", 120)
            gen, _ = await generate(client, base, "x", ids, 12, 5, 120)
            forced, requests = await engine.forced_positions(client, base, "x", ids, [p.token for p in gen], 0, 5, 120)
            props = (await client.get(base + "/props")).json()
            return gen, forced, requests, await engine.server_info(client, base), props

    gen, forced, requests, info, props = asyncio.run(go())
    assert sorted(forced) == list(range(12)) and requests == 2  # 8 + 4 tokens: no divergence to restart at
    for i, pos in enumerate(gen):
        assert forced[i].token == pos.token and forced[i].logprob == pytest.approx(pos.logprob, abs=0.05), i
    assert props["build_info"] and info == {"server_build_info": str(props["build_info"])}


@pytest.mark.e2e
def test_search_over_the_llamacpp_cpu_space(tmp_path: Path) -> None:
    doc = yaml.safe_load(SPACE.read_text())
    # Keep the test short, and tolerant of a shared 2-core machine where -t 2 can crawl.
    doc["measure"] = {"repeats": 1, "warmup": False, "request_timeout_s": 300}
    doc["quality"] = {"suite": None}
    for workload in doc["workloads"]:
        workload["max_tokens"] = 16
    space = parse_space(doc, str(SPACE))
    results = tmp_path / "results"
    runner = StudyRunner(space, default_storage(results), "llamacpp-e2e", results, Quiet())
    runner.run(n_trials=1)  # as `search run` starts: the space's defaults (threads 2)
    default = {k: v for k, v in space.default_config().items() if k not in ("engine", "model")}
    runner.study.enqueue_trial({**default, "threads": 1})
    runner.run(n_trials=2)

    records = {r.number: r for r in load_view(runner.study).records}
    assert sorted(records) == [0, 1]
    for number, threads in ((0, 2), (1, 1)):
        rec = records[number]
        assert rec.state == "complete", rec.failure
        assert rec.params["threads"] == threads
        assert f" -t {threads} " in rec.command and "--metrics" in rec.command
        assert rec.metrics["two_streams.output_tok_s"] > 0 and rec.metrics["single.output_tok_s"] > 0
        assert rec.metrics["errors"] == 0
        assert rec.startup["backends"]["weights"] == "CPU_Mapped"
        assert rec.startup["phases_s"]["process_to_listening"] > 0
        # Token counts come from `usage`, and llama.cpp's own counter agrees with them.
        stored = json.loads((results / "trials" / f"{number:04d}" / "result.json").read_text())
        samples = stored["workloads"]["single"]["samples"]
        requests = [r for sample in samples for r in sample["requests"]]
        assert requests and all(r["output_tokens"] == 16 for r in requests)  # ignore_eos: fixed length
        for sample in samples:
            assert sample["metrics"]["server_vs_usage_tokens"] == pytest.approx(1.0, abs=0.05)
        assert Path(rec.log_path or "").exists()
