"""Any OpenAI-compatible server started from a command template (Atlas, trtllm-serve, ...).

The space gives the command as an argv list with placeholders, and a `flag_map` that says how
each parameter is spelled on that server's command line:

    engines:
      atlas:
        dialect: command
        command: ["/opt/atlas/bin/atlas-serve", "--model", "{model}", "--port", "{port}"]
        flag_map: {max_batch_size: "--max-batch-size", mtp_k: "--mtp-k", chunked: "--chunked-prefill"}

Safety: the argv is never given to a shell. A placeholder is replaced inside its one argv
element, so a value with spaces or quotes stays one argument; values that would read as a flag
(a leading '-') or hold control characters are refused, so no value can add arguments.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from harness.engines.base import (
    Engine,
    EngineSettings,
    MemoryKnobs,
    MemoryParams,
    MetricNames,
    ModelChoice,
    StartupInfo,
    launch_spec,
    read_memory_knobs,
    value_text,
)
from harness.launch.spec import LaunchSpec

PLACEHOLDERS = ("model", "model_name", "host", "port")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)\}")  # JSON such as {"a":1} is left alone
_NUMBER = re.compile(r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$")
_FLAG = re.compile(r"^-{1,2}[A-Za-z0-9][A-Za-z0-9_.\-]*=?$")

_FAILURES: list[tuple[str, re.Pattern[str]]] = [
    ("bad_flag", re.compile(r"unrecognized arguments|error: argument|invalid choice|"
                            r"unknown (?:option|argument|flag|value)|unexpected argument|invalid value|"
                            r"error while handling argument", re.I)),
    ("port_in_use", re.compile(r"address already in use|couldn't bind", re.I)),
    ("oom", re.compile(r"out of memory|OutOfMemoryError|cudaMalloc failed|cannot allocate memory", re.I)),
    ("model_not_found", re.compile(r"No such file or directory|not found.*model|model.*not found|"
                                   r"failed to (?:open|load) model", re.I)),
    ("crashed", re.compile(r"Traceback \(most recent call last\)|Segmentation fault|core dumped|panicked at")),
]


# The flag spellings OpenAI-compatible servers use for their memory settings (Atlas, vLLM-like and
# SGLang-like servers, llama.cpp-like ones): the space's flag_map says which parameter sets which flag.
_MEMORY_FLAGS = {
    "utilization": ("--gpu-memory-utilization", "--mem-fraction-static", "--gpu-mem-fraction"),
    "context": ("--max-seq-len", "--max-model-len", "--context-length", "--max-context-len", "--ctx-size", "-c"),
    "kv_dtype": ("--kv-cache-dtype", "--cache-type-k", "--kv-dtype"),
    "max_seqs": ("--max-batch-size", "--max-num-seqs", "--max-running-requests", "--parallel", "-np"),
}


class CommandError(ValueError):
    """A command template or a value for it cannot be used safely."""


def _check_value(name: str, text: str) -> str:
    if any(ord(c) < 32 for c in text):
        raise CommandError(f"value for {name!r} contains control characters: {text!r}")
    if text.startswith("-") and not _NUMBER.match(text):
        raise CommandError(f"value for {name!r} starts with '-' and would read as a flag: {text!r}")
    return text


def render_template(template: tuple[str, ...] | list[str], values: Mapping[str, str]) -> list[str]:
    """Fill {model}, {model_name}, {host}, {port} inside each argv element; no element ever splits."""
    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise CommandError(f"unknown placeholder {{{name}}} in command element {match.string!r} "
                               f"(known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})")
        return _check_value(name, values[name])

    return [_PLACEHOLDER.sub(sub, element) for element in template]


def mapped_flags(flags: Mapping[str, Any], flag_map: Mapping[str, str]) -> list[str]:
    """Params -> argv through the space's flag_map; True is a bare switch, False/None are left out.
    A flag ending in '=' joins its value into one element (`--x=1`)."""
    argv: list[str] = []
    for key, value in flags.items():
        if key not in flag_map:
            raise CommandError(f"parameter {key!r} has no entry in the engine's flag_map "
                               f"(mapped: {', '.join(sorted(flag_map)) or 'none'})")
        flag = flag_map[key]
        if not _FLAG.match(flag):
            raise CommandError(f"flag_map[{key!r}] = {flag!r} is not a single flag like --name or -n")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag.rstrip("="))
            continue
        text = _check_value(key, value_text(value))
        argv += [flag + text] if flag.endswith("=") else [flag, text]
    return argv


class CommandEngine(Engine):
    dialect = "command"
    failure_patterns = _FAILURES
    # Tokens are counted by sending the prompt (no tokenizer endpoint): workloads size prompts under a
    # separate nonce so the counting request cannot warm the prefix cache for the measured one.
    counts_by_request = True
    ready_path = "/v1/models"  # every OpenAI-compatible server has it; /health is not universal
    metric_names = MetricNames()  # unknown server: no Prometheus names assumed

    def build_launch(self, settings: EngineSettings, model: ModelChoice, flags: Mapping[str, Any],
                     env: Mapping[str, str], port: int) -> LaunchSpec:
        if not any("{port}" in element for element in settings.command):
            raise CommandError(f"engine {settings.name!r}: the command must contain {{port}} "
                               "so that each trial's server listens where flagsearch looks")
        argv = render_template(settings.command, {"model": model.path, "model_name": model.name,
                                                  "host": settings.host, "port": str(port)})
        argv += mapped_flags(flags, settings.flag_map)
        return launch_spec(settings, argv, env, port)

    def memory_knobs(self, settings: EngineSettings, flags: Mapping[str, Any]) -> MemoryKnobs:
        def params_for(kind: str) -> tuple[str, ...]:
            return tuple(p for p, flag in settings.flag_map.items() if flag.rstrip("=") in _MEMORY_FLAGS[kind])

        return read_memory_knobs(MemoryParams(utilization=params_for("utilization"), context=params_for("context"),
                                              kv_dtype=params_for("kv_dtype"), max_seqs=params_for("max_seqs")),
                                 flags)

    def parse_startup(self, log_text: str) -> StartupInfo:
        info = StartupInfo()
        listening = re.search(r"(?:listening on|Uvicorn running on|Serving on)\s+(\S+)", log_text, re.I)
        if listening:
            info.facts["listening"] = listening.group(1)
        return info


    def request_extras(self) -> dict[str, Any]:
        return {}  # a strict OpenAI server may refuse unknown fields such as ignore_eos

    exact_output_tokens = False  # without ignore_eos a stream may end early: the window says so
