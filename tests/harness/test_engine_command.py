"""The `command` engine: any OpenAI-compatible server from an argv template and a flag_map. Safety
of the template (never a shell, no argument injection) and a real llama-server driven as a plain
command through the generic path (ready on /v1/models, tokens counted from `usage`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from harness import flagsearch_home
from harness.engines import EngineSettings, ModelChoice, get_engine
from harness.engines.command import CommandEngine, CommandError, mapped_flags, render_template
from harness.launch import StartupError, get_launcher, wait_ready
from search.space.space import parse_space
from search.study.study import free_port

ATLAS = ("/opt/atlas/bin/atlas-serve", "--model", "{model}", "--port", "{port}", "--host={host}")
FLAG_MAP = {"max_batch_size": "--max-batch-size", "mtp_k": "--mtp-k", "chunked": "--chunked-prefill",
            "gpu_memory_utilization": "--gpu-memory-utilization=", "max_seq_len": "--max-seq-len"}


def atlas(flags: dict[str, object], model_path: str = "/models/q") -> list[str]:
    settings = EngineSettings(name="atlas", dialect="command", command=ATLAS, flag_map=FLAG_MAP)
    return list(CommandEngine().build_launch(settings, ModelChoice("q", model_path), flags, {}, 8888).argv)


def test_template_and_flag_map_make_an_argv() -> None:
    argv = atlas({"max_batch_size": 1, "mtp_k": 2, "chunked": True, "gpu_memory_utilization": 0.99,
                  "max_seq_len": None})
    assert argv == ["/opt/atlas/bin/atlas-serve", "--model", "/models/q", "--port", "8888", "--host=127.0.0.1",
                    "--max-batch-size", "1", "--mtp-k", "2", "--chunked-prefill", "--gpu-memory-utilization=0.99"]
    assert atlas({"chunked": False}) == argv[:6]


def test_values_stay_one_argument_and_cannot_add_flags() -> None:
    # Spaces, quotes and shell syntax stay inside one element: nothing is ever given to a shell.
    argv = atlas({}, model_path="/models/my model; rm -rf / $(x)")
    assert argv[2] == "/models/my model; rm -rf / $(x)" and len(argv) == 6
    with pytest.raises(CommandError, match="would read as a flag"):
        atlas({"max_batch_size": "--evil"})
    with pytest.raises(CommandError, match="would read as a flag"):
        atlas({}, model_path="--config=/etc/shadow")
    with pytest.raises(CommandError, match="control characters"):
        atlas({"max_seq_len": "4096\n--evil"})
    assert atlas({"max_seq_len": -1})[-2:] == ["--max-seq-len", "-1"]  # negative numbers are values


def test_template_errors_are_named() -> None:
    with pytest.raises(CommandError, match="no entry in the engine's flag_map"):
        atlas({"unknown_knob": 1})
    with pytest.raises(CommandError, match="unknown placeholder"):
        render_template(["serve", "{model.__class__}"], {"model": "/m"})
    with pytest.raises(CommandError, match="not a single flag"):
        mapped_flags({"x": 1}, {"x": "--x 1"})
    settings = EngineSettings(name="bad", dialect="command", command=("serve", "{model}"))
    with pytest.raises(CommandError, match=r"\{port\}"):
        CommandEngine().build_launch(settings, ModelChoice("q", "/m"), {}, {}, 1)


def test_a_space_with_a_command_engine_loads_and_dry_runs() -> None:
    from search.study.dryrun import dry_run

    space = parse_space({
        "name": "atlas-demo",
        "engines": {"atlas": {"dialect": "command", "command": list(ATLAS), "flag_map": FLAG_MAP}},
        "models": [{"name": "q", "path": "/models/q"}],
        "params": {"max_batch_size": {"type": "categorical", "choices": [1, 2]},
                   "mtp_k": {"type": "int", "low": 0, "high": 2}},
        "workloads": [{"name": "qa", "streams": ["qa"]}],
        "objectives": [{"metric": "qa.output_tok_s"}],
    })
    lines = dry_run(space, 3)
    commands = [line for line in lines if not line.startswith("#")]
    assert len([line for line in lines if line.startswith("# trial ")]) == 3
    assert len(commands) == 4 and all("--max-batch-size" in line for line in commands)  # engine default + 3


def _llama_as_command(port_flag: bool = True) -> EngineSettings:
    binary = flagsearch_home.llama_server()
    if not binary.exists():
        pytest.fail(f"llama-server is missing at {binary}: run `make setup` first", pytrace=False)
    command = (str(binary), "-m", "{model}", "--host", "{host}", "--port", "{port}")
    return EngineSettings(name="llama-plain", dialect="command", command=command, ready_timeout_s=120,
                          flag_map={"threads": "-t", "slots": "--parallel", "context": "--ctx-size"})


@pytest.mark.e2e
def test_llama_server_as_a_plain_command(tmp_path: Path) -> None:
    gguf = flagsearch_home.smollm2_gguf()
    if not gguf.exists():
        pytest.fail(f"the SmolLM2 GGUF is missing at {gguf}: run `make setup` first", pytrace=False)
    engine = get_engine("command")
    spec = engine.build_launch(_llama_as_command(), ModelChoice("smollm2", str(gguf)),
                               {"threads": 2, "slots": 1, "context": 2048}, {}, free_port())
    server = get_launcher("process").start(spec, tmp_path / "server.log")
    try:
        wait_ready(server, engine.ready_path, spec.ready_timeout_s, poll_s=0.1)
        messages = [{"role": "user", "content": "What is 2+2?"}]

        async def go() -> tuple[int, int | None, int]:
            async with httpx.AsyncClient(timeout=300) as client:
                counted = await engine.count_tokens(client, spec.base_url, "smollm2", messages)
                native = await client.post(spec.base_url + "/v1/chat/completions/input_tokens",
                                           json={"messages": messages})
                return counted.count, counted.context_limit, native.json()["input_tokens"]

        count, limit, native = asyncio.run(go())
        assert count == native  # the generic usage-based count equals llama.cpp's own chat count
        assert limit == 2048  # from /v1/models meta.n_ctx
        assert engine.request_extras() == {}
    finally:
        server.stop()
    assert server.owned_pids() == []


@pytest.mark.e2e
def test_a_bad_mapped_flag_fails_as_bad_flag(tmp_path: Path) -> None:
    settings = _llama_as_command()
    settings = EngineSettings(**{**settings.__dict__, "flag_map": {"fa": "--flash-attn"}})
    spec = get_engine("command").build_launch(settings, ModelChoice("m", str(flagsearch_home.smollm2_gguf())),
                                              {"fa": "sometimes"}, {}, free_port())
    server = get_launcher("process").start(spec, tmp_path / "server.log")
    try:
        with pytest.raises(StartupError):
            wait_ready(server, "/v1/models", 60, poll_s=0.05)
    finally:
        server.stop()
    found = get_engine("command").classify_failure((tmp_path / "server.log").read_text())
    assert found is not None and found.cause == "bad_flag"
