"""Hugging Face Transformers' own OpenAI-compatible server, `transformers serve` (Transformers 5.x).

Everything this engine needs is here, so that adding it touched no other module:
- The model is served pinned (`transformers serve MODEL`), and a request must name it exactly. The
  server's /v1/models lists only what the Hugging Face cache holds (it fails with HTTP 500 when
  there is no cache), while the harness takes the served model's id from /v1/models. So a local
  model folder is given a cache entry of its own (`flagsearch/<folder name>`, files linked, not
  copied) under FLAGSEARCH_HOME, the server runs offline on that cache, and /v1/models names
  exactly the pinned model.
- Flags are typer options: `--x VALUE`, booleans as `--x` / `--no-x`; a parameter name maps to
  `--name-with-dashes` (e.g. `continuous_batching`, `attn_implementation`, `dtype`, `device`).
- Readiness is GET /health; there is no /metrics and no tokenizer endpoint (prompt tokens are
  counted through a 1-token request's `usage`); a request with a field the server does not know
  (`ignore_eos`) is refused with 422, so none is added.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from harness import flagsearch_home
from harness.engines.base import (
    Engine,
    EngineSettings,
    ModelChoice,
    StartupInfo,
    TokenCount,
    dashed_flags,
    launch_spec,
)
from harness.launch.spec import LaunchSpec

ORG = "flagsearch"  # the cache entry's owner: `flagsearch/<folder name>`
_SNAPSHOT = "0" * 40  # the one revision of a local folder
COUNT_TIMEOUT_S = 120.0

_FAILURES: list[tuple[str, re.Pattern[str]]] = [
    # typer/click: "No such option '--x'.", "Invalid value for '--reasoning': 'maybe' is not one of ..."
    ("bad_flag", re.compile(r"No such option|Invalid value for '-|Got unexpected extra argument",
                            re.I)),
    ("port_in_use", re.compile(r"address already in use", re.I)),
    ("oom", re.compile(r"out of memory|OutOfMemoryError|Cannot allocate memory", re.I)),
    ("model_not_found", re.compile(r"LocalEntryNotFoundError|does not appear to have a file|Repo id must|"
                                   r"is not a local folder|No such file or directory|Can't load the configuration",
                                   re.I)),
    ("crashed", re.compile(r"Traceback \(most recent call last\)|Segmentation fault|core dumped")),
]

# Startup facts: the model loaded, the transformers version its config names, the address served.
_FACTS: list[tuple[str, re.Pattern[str]]] = [
    ("model", re.compile(r"\[transformers\] Loading (\S+)")),
    ("config_transformers_version", re.compile(r'"transformers_version": "([^"]+)"')),
    ("listening", re.compile(r"Uvicorn running on (\S+)")),
]


def cache_entry(model: ModelChoice, hub: Path) -> str:
    """Give a local model folder a Hugging Face cache entry under `hub` (idempotent) and return its
    repo id. A model that is already a repo id (no such folder) is returned as it is."""
    folder = Path(model.path)
    if not folder.is_dir():
        return model.path
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", folder.name).strip("-.") or "model"
    repo = hub / f"models--{ORG}--{name}"
    snapshot = repo / "snapshots" / _SNAPSHOT
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(_SNAPSHOT)
    for item in folder.iterdir():
        if item.is_file() and not item.name.startswith("."):
            link = snapshot / item.name
            if link.is_symlink() and link.resolve() == item.resolve():
                continue
            link.unlink(missing_ok=True)
            link.symlink_to(item.resolve())
    return f"{ORG}/{name}"


class TransformersServeEngine(Engine):
    dialect = "transformers_serve"
    failure_patterns = _FAILURES
    ready_path = "/health"
    # No tokenizer endpoint: prompts are sized by a request, under a separate nonce (see workloads).
    counts_by_request = True

    def build_launch(self, settings: EngineSettings, model: ModelChoice, flags: Mapping[str, Any],
                     env: Mapping[str, str], port: int) -> LaunchSpec:
        hub = flagsearch_home.home() / "cache" / "transformers-serve-hub"
        repo_id = cache_entry(model, hub)
        negatable = frozenset(k for k, v in flags.items() if isinstance(v, bool))
        argv = [*settings.command, repo_id, "--host", settings.host, "--port", str(port)]
        argv += dashed_flags(flags, negatable)
        if "--log-level" not in argv:
            argv += ["--log-level", "info"]  # the load and dtype lines parse_startup reads
        return launch_spec(settings, argv, {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", **env}, port)

    def parse_startup(self, log_text: str) -> StartupInfo:
        info = StartupInfo()
        dtype = re.search(r"Will use dtype=torch\.(\w+)", log_text)
        if dtype:
            info.backends["dtype"] = dtype.group(1)
        for fact, pattern in _FACTS:
            found = pattern.search(log_text)
            if found:
                info.facts[fact] = found.group(1)
        return info

    async def count_tokens(self, client: httpx.AsyncClient, base_url: str, model_id: str,
                           messages: list[dict[str, str]]) -> TokenCount:
        """Through a 1-token request's usage. Generation here runs on the server's event loop, so a
        request can take seconds on a busy CPU: the client's 5 s default is too short for it."""
        resp = await client.post(base_url + "/v1/chat/completions", timeout=COUNT_TIMEOUT_S,
                                 json={"model": model_id, "messages": messages, "max_tokens": 1})
        resp.raise_for_status()
        return TokenCount(int(resp.json()["usage"]["prompt_tokens"]), None)

    def request_extras(self) -> dict[str, Any]:
        return {}  # unknown request fields are refused with 422

    exact_output_tokens = False  # no ignore_eos: a stream may end at end of sequence
