"""The engine contract. Everything that differs between engines lives in one module per engine:
flag spelling, readiness, log lines, metric names, tokenizer endpoint."""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx

from harness.launch.spec import LaunchSpec, Ulimit, Volume
from harness.quality.logprobs import Position, forced_by_resuming


@dataclass(frozen=True)
class EngineSettings:
    """How to start one engine, as the space file states it (resolved, validated)."""

    name: str  # the key in the space's `engines:` map, e.g. "vllm" or "atlas"
    dialect: str  # which engine module speaks for it: vllm | llamacpp | sglang | command
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    launcher: str = "process"
    image: str | None = None
    host: str = "127.0.0.1"
    volumes: tuple[Volume, ...] = ()
    gpus: str | None = None
    shm_size: str | None = None
    ipc_host: bool = False
    privileged: bool = False
    ready_timeout_s: float = 900.0
    flag_map: Mapping[str, str] = field(default_factory=dict)  # command engine: param -> flag
    python: str | None = None  # the engine environment's interpreter, for the fingerprint
    cpus: str | None = None  # pin the server to these CPUs (a Linux cpu list, e.g. "2-9")
    # docker only (harness/launch/spec.py LaunchSpec says what each becomes)
    ulimits: tuple[Ulimit, ...] = ()
    cap_add: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    mem_limit: str | None = None
    memswap_limit: str | None = None
    pids_limit: int | None = None


@dataclass(frozen=True)
class ModelChoice:
    """One checkpoint the space may pick: where it is and what it is."""

    name: str
    path: str
    format: str = "unknown"
    size_gb: float | None = None
    has_mtp: bool = False
    active_params_b: float | None = None
    bytes_per_param: float | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class StartupInfo:
    """What the engine's startup log told us: phase durations, chosen backends, KV capacity."""

    phases_s: dict[str, float] = field(default_factory=dict)
    backends: dict[str, str] = field(default_factory=dict)
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    version: str | None = None
    facts: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FailureCause:
    cause: str  # bad_flag | model_not_found | oom | max_model_len | port_in_use | timeout | crashed ...
    line: str  # the deciding log line, or a short description
    # bad_flag only, when the log names what was rejected: the flag as the log spells it (map it to a
    # space parameter with Engine.param_for_flag) and the rejected value as printed. value None: the
    # flag itself is unknown to this build, so every value of it fails.
    flag: str | None = None  # the flag the engine rejected, when its log names one
    value: str | None = None  # and the rejected value, when printed


@dataclass(frozen=True)
class FeatureExpectation:
    """A feature the launch asked for, and the counter that proves it is active."""

    feature: str
    metric: str  # canonical counter name (see MetricNames)
    reason: str


@dataclass(frozen=True)
class TokenCount:
    count: int
    context_limit: int | None  # the server's max context (max-model-len), when it tells


@dataclass(frozen=True)
class MetricNames:
    """Canonical names -> this engine's Prometheus sample names (None: not exposed)."""

    generation_tokens: str | None = None
    prompt_tokens: str | None = None
    prompt_tokens_cached: str | None = None
    spec_drafts: str | None = None
    spec_draft_tokens: str | None = None
    spec_accepted_tokens: str | None = None
    prefix_cache_queries: str | None = None
    prefix_cache_hits: str | None = None
    preemptions: str | None = None
    kv_cache_usage: str | None = None
    decode_calls: str | None = None
    decode_seconds: str | None = None
    requests_running: str | None = None
    requests_waiting: str | None = None

    def items(self) -> list[tuple[str, str]]:
        return [(k, v) for k, v in self.__dict__.items() if v]


# KV-cache bytes per token relative to a 16-bit cache, by the dtype names engines use (vLLM's
# --kv-cache-dtype, SGLang's --kv-cache-dtype, llama.cpp's --cache-type-k). Unknown names count as
# 16-bit: the estimate then errs towards "needs more", never towards a false "fits".
KV_BYTES_FACTOR: dict[str, float] = {
    "auto": 1.0, "bfloat16": 1.0, "bf16": 1.0, "float16": 1.0, "fp16": 1.0, "f16": 1.0,
    "float32": 2.0, "f32": 2.0,
    "fp8": 0.5, "fp8_e4m3": 0.5, "fp8_e5m2": 0.5, "fp8_inc": 0.5, "fp8_per_token_head": 0.5,
    "int8_per_token_head": 0.5, "q8_0": 0.53, "q5_1": 0.38, "q5_0": 0.34, "q4_1": 0.31, "q4_0": 0.28,
    "iq4_nl": 0.28, "nvfp4": 0.28, "fp4_e2m1": 0.28, "int4_per_token_head": 0.28,
    "turboquant_k8v4": 0.38, "turboquant_4bit_nc": 0.25, "turboquant_k3v4_nc": 0.22,
    "turboquant_3bit_nc": 0.19,
    # The INT4-AutoRound recipe's own TurboQuant patch (its v2-tq image): 4x the tokens of its 16-bit
    # cache (1.4M vs 355K) in the same memory.
    "turboquant35": 0.25,
}


@dataclass(frozen=True)
class MemoryParams:
    """Which space parameters carry an engine's memory settings (first one set wins)."""

    utilization: tuple[str, ...] = ()  # share of device memory the engine may take
    context: tuple[str, ...] = ()  # longest sequence (prompt + output) a request may have
    kv_dtype: tuple[str, ...] = ()
    max_seqs: tuple[str, ...] = ()  # sequences the engine runs at once
    default_utilization: float | None = None  # the engine's own default when the knob is unset
    context_is_total: bool = False  # llama.cpp: the context is shared by the parallel slots


@dataclass(frozen=True)
class MemoryKnobs:
    """A launch's memory settings as its engine reads them; None: not set (engine default unknown)."""

    utilization: float | None = None
    context_tokens: int | None = None  # per sequence
    kv_cache_dtype: str | None = None
    max_seqs: int | None = None

    @property
    def kv_bytes_factor(self) -> float:
        return KV_BYTES_FACTOR.get(str(self.kv_cache_dtype or "auto").lower(), 1.0)


def read_memory_knobs(params: MemoryParams, flags: Mapping[str, Any]) -> MemoryKnobs:
    def first(names: tuple[str, ...]) -> Any:
        return next((flags[n] for n in names if flags.get(n) is not None), None)

    util, context, kv, seqs = (first(params.utilization), first(params.context), first(params.kv_dtype),
                               first(params.max_seqs))
    per_seq = int(context) if context is not None else None
    if per_seq is not None and params.context_is_total and seqs:
        per_seq //= max(1, int(seqs))
    return MemoryKnobs(utilization=float(util) if util is not None else params.default_utilization,
                       context_tokens=per_seq, kv_cache_dtype=str(kv) if kv is not None else None,
                       max_seqs=int(seqs) if seqs is not None else None)


def flag_name(key: str) -> str:
    return "--" + key.replace("_", "-")


def value_text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def dashed_flags(flags: Mapping[str, Any], negatable: frozenset[str] = frozenset()) -> list[str]:
    """`max_num_seqs: 4` -> `--max-num-seqs 4`; True -> bare flag; False -> omitted, or
    `--no-x` for flags that are on by default (listed in `negatable`); None -> omitted."""
    argv: list[str] = []
    for key, value in flags.items():
        if value is None:
            continue
        if value is True:
            argv.append(flag_name(key))
        elif value is False:
            if key in negatable:
                argv.append("--no-" + key.replace("_", "-"))
        else:
            argv += [flag_name(key), value_text(value)]
    return argv


def launch_spec(settings: EngineSettings, argv: list[str], env: Mapping[str, str], port: int) -> LaunchSpec:
    """A LaunchSpec for an engine's argv: where and how to run it comes from the space's settings."""
    return LaunchSpec(
        engine=settings.name, argv=tuple(argv), host=settings.host, port=port,
        env={**settings.env, **env}, launcher=settings.launcher, image=settings.image,
        volumes=settings.volumes, gpus=settings.gpus, shm_size=settings.shm_size,
        ipc_host=settings.ipc_host, privileged=settings.privileged,
        ready_timeout_s=settings.ready_timeout_s, cpus=settings.cpus, ulimits=settings.ulimits,
        cap_add=settings.cap_add, devices=settings.devices, mem_limit=settings.mem_limit,
        memswap_limit=settings.memswap_limit, pids_limit=settings.pids_limit,
    )


# Lines in which an engine's argument parser names the flag it rejected. `why` holds the parser's
# reason, from which the rejected value is read (see _rejected_value).
_REJECTED_FLAG: list[re.Pattern[str]] = [
    # llama.cpp (common/arg.cpp): a value the flag's handler refused.
    re.compile(r'error while handling argument "(?P<flag>-[^"]+)": (?P<why>[^\n]*)'),
    # llama.cpp: a token it does not know. Only a token that looks like a flag is taken: a stray
    # value (a switch given a value) is named without its flag.
    re.compile(r"error: invalid argument: (?P<flag>-\S+)"),
    # argparse (vLLM, SGLang): flags it does not know; the first one is named.
    re.compile(r"error: unrecognized arguments: (?P<flag>-[^\s=]+)"),
    # argparse: a value refused by a known flag (`argument --x/-y: invalid choice: 'v' (choose...)`).
    re.compile(r"error: argument (?P<flag>-[^\s:/]+)(?:/\S+)?: (?P<why>[^\n]*)"),
    # click/typer (`transformers serve`): an unknown option, or a value an option refused.
    re.compile(r"No such option:? '?(?P<flag>-[^\s.,']+)"),
    re.compile(r"Invalid value for '(?P<flag>-[^']+)'(?: / '[^']+')?: (?P<why>[^\n]*)"),
]


def _rejected_value(why: str) -> str | None:
    """The value a parser's reason quotes: `... 'maybe'` or a trailing `...: q9_0`; None if none."""
    quoted = re.search(r"'([^']*)'", why)
    if quoted:
        return quoted.group(1)
    trailing = re.search(r":\s*([^\s:'\"]+)\s*$", why)
    return trailing.group(1) if trailing else None


def rejected_flag(text: str) -> tuple[str, str | None] | None:
    """(flag, value) of the first rejection a log names, or None.

    value None means the flag itself is unknown. A reason that names no value (`expected value for
    argument`, `stoi`) tells nothing about which value to avoid, so it gives None as a whole.
    """
    for pattern in _REJECTED_FLAG:
        match = pattern.search(text)
        if not match:
            continue
        flag = match.group("flag")
        value = None
        if "why" in pattern.groupindex:
            value = _rejected_value(match.group("why"))
            if value is None:
                continue
        return flag, value
    return None


def first_match(patterns: list[tuple[str, re.Pattern[str]]], text: str) -> FailureCause | None:
    """The earliest class whose pattern matches, with the matching line; a bad_flag also carries the
    flag and value the log names."""
    for cause, pattern in patterns:
        match = pattern.search(text)
        if match:
            start = text.rfind("\n", 0, match.start()) + 1
            end = text.find("\n", match.end())
            found = FailureCause(cause, text[start : end if end != -1 else len(text)].strip()[:500])
            named = rejected_flag(text) if cause == "bad_flag" else None
            if named:
                found = FailureCause(cause, found.line, *named)
            return found
    return None


async def count_tokens_via_usage(client: httpx.AsyncClient, base_url: str, model_id: str,
                                 messages: list[dict[str, str]]) -> TokenCount:
    """For servers without a chat-aware tokenizer endpoint: a 1-token chat request, whose `usage`
    counts the templated prompt exactly as the measured requests will see it. The context limit
    comes from /v1/models where the server tells it (vLLM/SGLang: max_model_len)."""
    resp = await client.post(base_url + "/v1/chat/completions",
                             json={"model": model_id, "messages": messages, "max_tokens": 1, "temperature": 0})
    resp.raise_for_status()
    count = int(resp.json()["usage"]["prompt_tokens"])
    limit: int | None = None
    try:
        models = (await client.get(base_url + "/v1/models")).json().get("data") or []
        found = next((m for m in models if m.get("id") == model_id), models[0] if models else {})
        raw = found.get("max_model_len") or (found.get("meta") or {}).get("n_ctx")
        limit = int(raw) if raw else None
    except (httpx.HTTPError, ValueError, AttributeError):
        limit = None
    return TokenCount(count, limit)


async def server_field(client: httpx.AsyncClient, url: str, key: str, name: str) -> dict[str, str]:
    """{name: str(field `key` of the JSON at url)}, or {} when the server does not answer it."""
    try:
        resp = await client.get(url, timeout=5.0)
        body = resp.json() if resp.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}
    return {name: str(body[key])} if isinstance(body, dict) and key in body else {}


@dataclass(frozen=True)
class KnownEnv:
    """Where an engine build lists the environment variables it reads: a dict literal `table` in
    `module`/`file` of its Python package (vLLM: vllm/envs.py `environment_variables`). Variables
    starting with `prefix` that the table lacks are unknown to that build (preflight warns)."""

    prefix: str
    module: str
    file: str
    table: str


@dataclass(frozen=True)
class BasePlan:
    """A shared base environment for one engine's pip builds, and what to fix after each install."""

    name: str
    requirements: tuple[str, ...]
    extras: tuple[str, ...] = ()  # installed into each build next to the engine (small, version-free deps)
    remove: tuple[str, ...] = ()  # GPU-only packages pip pulls that break a CPU torch; removed per build
    dist_alias: tuple[str, str] | None = None  # (installed dist, the name the engine looks itself up by)


class Engine(ABC):
    dialect: ClassVar[str]
    ready_path: ClassVar[str] = "/health"
    metric_names: ClassVar[MetricNames] = MetricNames()

    @abstractmethod
    def build_launch(self, settings: EngineSettings, model: ModelChoice, flags: Mapping[str, Any],
                     env: Mapping[str, str], port: int) -> LaunchSpec:
        """Turn sampled and fixed flags into a full server start."""

    @abstractmethod
    def parse_startup(self, log_text: str) -> StartupInfo: ...

    def kv_sequences(self, startup: StartupInfo, context_tokens: int) -> float | None:
        """How many sequences of `context_tokens` the KV cache holds at once, from the startup log
        (None when the log did not say). A paged cache (vLLM, SGLang) shares its tokens among all
        sequences; engines with fixed per-sequence slots override this."""
        if not startup.kv_cache_tokens or context_tokens <= 0:
            return None
        return float(startup.kv_cache_tokens // context_tokens)

    # (cause, pattern) pairs, most specific first: the log lines classify_failure recognises.
    failure_patterns: ClassVar[list[tuple[str, re.Pattern[str]]]] = []

    def classify_failure(self, log_text: str) -> FailureCause | None:
        """The cause of a failed start or crash, from the log; None if nothing recognised."""
        return first_match(self.failure_patterns, log_text)

    def expected_features(self, flags: Mapping[str, Any]) -> list[FeatureExpectation]:
        """Features the flags ask for that must show up in the server's counters."""
        return []

    async def count_tokens(self, client: httpx.AsyncClient, base_url: str, model_id: str,
                           messages: list[dict[str, str]]) -> TokenCount:
        """Prompt tokens of a chat request, counted by the server's own tokenizer and template
        (by sending the prompt where the server has no tokenizer endpoint: counts_by_request)."""
        if self.counts_by_request:
            return await count_tokens_via_usage(client, base_url, model_id, messages)
        resp = await client.post(base_url + "/tokenize", json={"model": model_id, "messages": messages})
        resp.raise_for_status()
        body = resp.json()
        count = int(body["count"]) if "count" in body else len(body["tokens"])
        limit = body.get("max_model_len")
        return TokenCount(count, int(limit) if limit else None)

    async def forced_positions(self, client: httpx.AsyncClient, base_url: str, model_id: str,
                               prompt_ids: list[int], token_ids: list[int], start: int, top_k: int,
                               timeout_s: float) -> tuple[dict[int, Position], int]:
        """Teacher-forced logprobs of a reference answer (`token_ids` after `prompt_ids`) at its
        positions start.., and the requests it took (harness/quality/reference.py). Default: resume
        generation from the forced prefix, which any server with completion logprobs can do."""
        return await forced_by_resuming(client, base_url, model_id, prompt_ids, token_ids, start, top_k, timeout_s)

    # Python distributions whose version is the engine's (the first installed wins), and modules
    # whose _version.py holds the build's commit: read in the engine's own interpreter (fingerprint.py).
    distributions: ClassVar[tuple[str, ...]] = ()
    commit_modules: ClassVar[tuple[str, ...]] = ()
    # What a pip build of one of the engine's distributions needs beside it (harness/builds/envs.py),
    # keyed by the distribution a requirement installs.
    pip_bases: ClassVar[dict[str, BasePlan]] = {}
    # The StartupInfo.backends keys that are run-time kernel selections, with the words a report uses
    # ("GDN prefill kernel"); the "why" of a comparison compares these and nothing else.
    kernel_paths: ClassVar[dict[str, str]] = {}
    # (source path prefix in the engine's repository, kernel path keys a change there acts on): a PR's
    # changed files name the selections its base run must show for the change to run at all.
    source_paths: ClassVar[tuple[tuple[str, tuple[str, ...]], ...]] = ()

    def kernel_path(self, startup: StartupInfo | Mapping[str, Any]) -> dict[str, str]:
        """The kernel path a start selected: {label: selection}, from its startup info (or its dict)."""
        backends = startup.backends if isinstance(startup, StartupInfo) else dict(startup.get("backends") or {})
        return {self.kernel_paths.get(k, k.replace("_", " ")): str(v) for k, v in sorted(backends.items())}

    def paths_acted_on(self, path: str) -> tuple[str, ...]:
        """The kernel path keys a change to one source file acts on: its most specific prefix's."""
        matches = [(len(prefix), keys) for prefix, keys in self.source_paths if path.startswith(prefix)]
        return max(matches)[1] if matches else ()

    def paths_touched(self, changed_files: list[str]) -> dict[str, list[str]]:
        """{kernel path key: the changed files that act on it}, for a PR's list of changed files."""
        out: dict[str, list[str]] = {}
        for path in changed_files:
            for key in self.paths_acted_on(path):
                out.setdefault(key, []).append(path)
        return out

    async def server_info(self, client: httpx.AsyncClient, base_url: str) -> dict[str, str]:
        """What the running server says about its own build (for the fingerprint); {} if nothing."""
        return {}

    # True when prompt tokens are counted by sending the prompt (no tokenizer endpoint): workloads
    # then size prompts under a separate nonce so that counting cannot warm the measured prefix.
    counts_by_request: ClassVar[bool] = False

    def tokenize_bodies(self, model_id: str, text: str) -> list[dict[str, Any]]:
        """Request bodies for this server's /tokenize of raw text with its special tokens, tried in
        order (an engine that is not sure of its server's shape lists several)."""
        return [{"model": model_id, "prompt": text, "add_special_tokens": True}, {"content": text, "add_special": True}]

    def param_for_flag(self, flag: str, flags: Mapping[str, Any]) -> str | None:
        """Which of the launch's flags (by space param name) the engine's `flag` text is, e.g. a
        rejected `--max-num-seqs` -> max_num_seqs. Engines with their own spellings override it."""
        wanted = flag.split("=", 1)[0].strip()
        return next((name for name in flags if wanted in (flag_name(name), "--no-" + name.replace("_", "-"))),
                    None)

    memory_params: ClassVar[MemoryParams] = MemoryParams()
    # Where this engine's build lists the environment variables it knows (None: not checked).
    known_env: ClassVar[KnownEnv | None] = None

    def help_args(self) -> tuple[str, ...]:
        """What, after the engine's command, makes this build print every flag it knows (preflight
        reads flag names from it: search/study/preflight.py)."""
        return ("--help",)

    def memory_knobs(self, settings: EngineSettings, flags: Mapping[str, Any]) -> MemoryKnobs:
        """The memory settings of a launch (for the fit check before it starts): which of the space's
        parameters set them is this engine's business, so no caller branches on a dialect."""
        return read_memory_knobs(self.memory_params, flags)

    def request_extras(self) -> dict[str, Any]:
        """Extra fields this engine needs in a chat request (e.g. to make output length fixed)."""
        return {"ignore_eos": True}

    def natural_extras(self) -> dict[str, Any]:
        """request_extras() without what forces the output length: answers end where the model ends
        them (harness/measure/natural_end.py)."""
        return {k: v for k, v in self.request_extras().items() if k != "ignore_eos"}

    # True when request_extras() makes the server generate exactly max_tokens (no stop at end of
    # sequence): the decode window (harness/measure/window.py) then has the same length for every engine.
    exact_output_tokens: ClassVar[bool] = True

    def timing_metrics(self, timings: Mapping[str, Any]) -> dict[str, float]:
        """Per-request speeds the server reports in its own response (`timings`), as metrics."""
        return {}

    def cached_prompt_tokens(self, timings: Mapping[str, Any]) -> int | None:
        """Prompt tokens served from the server's cache, from its own response timings, where the
        usage block does not say (`prompt_tokens_details.cached_tokens` comes first)."""
        return None

    def thinking_extras(self, on: bool) -> dict[str, Any]:
        """Chat-request fields that turn the model's thinking on or off (a space's `thinking:`).
        Default: the chat template's `enable_thinking` switch (Qwen3-style templates), which
        OpenAI-compatible servers that render Hugging Face templates take as chat_template_kwargs."""
        return {"chat_template_kwargs": {"enable_thinking": on}}
