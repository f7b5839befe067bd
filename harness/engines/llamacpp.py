"""llama.cpp's dialect: `llama-server` flags, its health/tokenizer endpoints, log lines and metrics.

Space parameter names map to llama-server flags through `FLAGS` below (the spelling a user reads in
`llama-server --help`). A name that is not in the table is passed as `--name-with-dashes`, so a
new llama.cpp flag works without a code change.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import httpx

from harness.engines.base import (
    Engine,
    EngineSettings,
    FailureCause,
    FeatureExpectation,
    MemoryParams,
    MetricNames,
    ModelChoice,
    StartupInfo,
    TokenCount,
    flag_name,
    launch_spec,
    server_field,
    value_text,
)
from harness.launch.spec import LaunchSpec

# space param -> llama-server flag (this version: llama-cpp-python 0.3.36's vendored llama.cpp, 0c1e570)
FLAGS: dict[str, str] = {
    "n_gpu_layers": "-ngl",
    "flash_attn": "-fa",  # on | off | auto (True/False are spelled on/off)
    "batch_size": "-b",
    "ubatch_size": "-ub",
    "threads": "-t",
    "threads_batch": "-tb",
    "parallel": "-np",
    "ctx_size": "-c",
    "cache_type_k": "--cache-type-k",
    "cache_type_v": "--cache-type-v",
    "kv_unified": "--kv-unified",
    "cont_batching": "--cont-batching",
    "cache_reuse": "--cache-reuse",
    "cache_ram": "--cache-ram",
    "spec_type": "--spec-type",  # none | draft-simple | ngram-simple | ... (--draft-max is gone)
    "spec_draft_n_max": "--spec-draft-n-max",
    "spec_draft_n_min": "--spec-draft-n-min",
    "draft_model": "-md",
    "n_gpu_layers_draft": "-ngld",
    "alias": "--alias",
    "jinja": "--jinja",
}
# Boolean flags whose False must be spelled out, because the default is on.
_NEGATED = {"cont_batching": "--no-cont-batching", "kv_unified": "--no-kv-unified", "jinja": "--no-jinja"}
# Flags that take on/off values rather than being bare switches.
_ON_OFF = frozenset({"flash_attn"})

_FAILURES: list[tuple[str, re.Pattern[str]]] = [
    ("bad_flag", re.compile(r"error: invalid argument|error while handling argument|unknown value for|"
                            r"invalid value|error: unknown argument|"
                            r"quantized V cache requires flash_attn|requires a draft (?:model|context)|"
                            r"cache type \w+ with block size \d+ does not divide", re.I)),
    ("port_in_use", re.compile(r"couldn't bind HTTP server socket|Address already in use", re.I)),
    ("oom", re.compile(r"out of memory|cudaMalloc failed|failed to allocate (?:\w+ )?buffer|"
                       r"unable to allocate|std::bad_alloc|cannot allocate memory", re.I)),
    ("model_not_found", re.compile(r"failed to open GGUF file|No such file or directory|"
                                   r"error loading model|failed to load model", re.I)),
    ("kv_too_small", re.compile(r"exceed_context_size_error|exceeds the available context size|"
                                r"failed to find (?:a )?(?:free )?(?:memory|KV) slot", re.I)),
    ("crashed", re.compile(r"GGML_ASSERT|Segmentation fault|terminate called|Aborted|core dumped")),
]

_KV_BLOCK = re.compile(r"[^\n]*\b([KV]) cache type (\w+) with block size \d+ does not divide[^\n]*")

_MIB = r"([\d.]+) MiB"


def _mib(pattern: str, text: str) -> dict[str, float]:
    """Every `<DEVICE> <what> buffer size = N MiB` of one kind, summed per device."""
    out: dict[str, float] = {}
    for match in re.finditer(r"(\w+) " + pattern + r" buffer size =\s*" + _MIB, text):
        out[match.group(1)] = out.get(match.group(1), 0.0) + float(match.group(2))
    return out


# Log lines that open or close a startup phase (llama-server -lv 4 --log-timestamps).
_MARKS: list[tuple[str, str]] = [
    ("load_start", r"load_model: loading model"),
    ("context_start", r"llama_context: constructing llama_context"),
    ("warmup_start", r"warming up the model"),
    ("slots", r"load_model: initializing, n_slots"),
    ("listening", r"(?:server is )?listening on http"),
]
_PHASE_SPANS = [("model_loading", "load_start", "context_start"),  # fit to memory, mmap/copy weights
                ("context_init", "context_start", "warmup_start"),  # KV cache, compute graph reserve
                ("warmup", "warmup_start", "slots"),
                ("slots_to_listening", "slots", "listening")]

_TIMESTAMP = re.compile(r"^(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) \w ", re.M)


def _stamp(line_start: int, text: str) -> float | None:
    """Seconds since start from a `--log-timestamps` prefix (`M.SS.mmm.uuu`), if the line has one."""
    match = _TIMESTAMP.match(text, line_start)
    if not match:
        return None
    minutes, seconds, millis, micros = (int(g) for g in match.groups())
    return minutes * 60 + seconds + millis / 1e3 + micros / 1e6


def _line_time(pattern: str, text: str) -> float | None:
    match = re.search(pattern, text, re.M)
    if not match:
        return None
    return _stamp(text.rfind("\n", 0, match.start()) + 1, text)


class LlamaCppEngine(Engine):
    dialect = "llamacpp"
    failure_patterns = _FAILURES
    # Selections its startup log names (CUDA graphs have no such line: GGML_CUDA_DISABLE_GRAPHS=1 turns
    # them off silently, so they are not a path that can be compared).
    kernel_paths: ClassVar[dict[str, str]] = {"weights": "weights on", "flash_attn": "flash attention",
                                              "kv_cache_type": "KV cache type"}
    source_paths: ClassVar[tuple[tuple[str, tuple[str, ...]], ...]] = (
        ("ggml/src/ggml-cuda/fattn", ("flash_attn",)), ("ggml/src/ggml-cpu/", ("weights",)),
        ("ggml/src/ggml-cuda/", ("weights",)), ("src/llama-kv-cache", ("kv_cache_type",)),
    )

    def tokenize_bodies(self, model_id: str, text: str) -> list[dict[str, Any]]:
        return [{"content": text, "add_special": True}]
    ready_path = "/health"  # refused, then 503 "Loading model", then 200
    # -c is the context of all slots together (-np of them); llama.cpp has no memory-share knob.
    memory_params = MemoryParams(context=("ctx_size",), kv_dtype=("cache_type_k",), max_seqs=("parallel",),
                                 context_is_total=True)
    metric_names = MetricNames(
        generation_tokens="llamacpp:tokens_predicted_total",
        prompt_tokens="llamacpp:prompt_tokens_total",
        prompt_tokens_cached="llamacpp:prompt_tokens_cached_total",
        spec_drafts="llamacpp:spec_decode_num_drafts_total",
        spec_draft_tokens="llamacpp:spec_decode_num_draft_tokens_total",
        spec_accepted_tokens="llamacpp:spec_decode_num_accepted_tokens_total",
        decode_calls="llamacpp:n_decode_total",
        decode_seconds="llamacpp:tokens_predicted_seconds_total",
        requests_running="llamacpp:requests_processing",
        requests_waiting="llamacpp:requests_deferred",
    )

    def __init__(self) -> None:
        self._context_limits: dict[str, int | None] = {}

    def build_launch(self, settings: EngineSettings, model: ModelChoice, flags: Mapping[str, Any],
                     env: Mapping[str, str], port: int) -> LaunchSpec:
        argv = [*settings.command, "-m", model.path, "--host", settings.host, "--port", str(port)]
        argv += server_flags(flags)
        # Always: counters for the measurement; timestamps and verbosity 4 for the startup phases,
        # buffers and selected kernels (the default verbosity hides load_tensors/llama_context lines).
        for fixed in (["--metrics"], ["--log-timestamps"], ["-lv", "4"]):
            if fixed[0] not in argv:
                argv += fixed
        return launch_spec(settings, argv, env, port)

    def param_for_flag(self, flag: str, flags: Mapping[str, Any]) -> str | None:
        wanted = flag.split("=", 1)[0].strip()
        for name in flags:
            spellings = {FLAGS.get(name), _NEGATED.get(name), flag_name(name)}
            if wanted in spellings:
                return name
        return None

    def parse_startup(self, log_text: str) -> StartupInfo:
        info = StartupInfo()
        build = re.search(r"build (\d+) \((\w+)\)", log_text)
        if build:
            info.version = f"b{build.group(1)}-{build.group(2)}"
        # Phases from the log's own timestamps (--log-timestamps: minutes.seconds.millis.micros).
        marks = {name: _line_time(pattern, log_text) for name, pattern in _MARKS}
        for phase, start, end in _PHASE_SPANS:
            begun, done = marks[start], marks[end]
            if begun is not None and done is not None:
                info.phases_s[phase] = round(done - begun, 3)
        if marks["listening"] is not None:
            info.phases_s["process_to_listening"] = round(marks["listening"], 3)
        for device, mib in _mib("model", log_text).items():
            info.facts[f"model_buffer_mib.{device}"] = f"{mib:.2f}"
        for device, mib in _mib("KV", log_text).items():
            info.facts[f"kv_buffer_mib.{device}"] = f"{mib:.2f}"
        for device, mib in _mib("compute", log_text).items():
            info.facts[f"compute_buffer_mib.{device}"] = f"{mib:.2f}"
        devices = sorted({k.split(".", 1)[1] for k in info.facts if k.startswith("model_buffer_mib.")})
        if devices:
            info.backends["weights"] = ",".join(devices)
        gpu = (re.search(r"Device \d+: (.+?), compute capability ([\d.]+)", log_text)
               or re.search(r"^\S+ \w cmn  common_param:\s+- (?:CUDA|ROCm|Vulkan)\d+\s*: (.+?) \(", log_text, re.M))
        if gpu:
            info.facts["gpu"] = gpu.group(1)
            if gpu.lastindex == 2:
                info.facts["compute_capability"] = gpu.group(2)
        archs = re.search(r"CUDA : ARCHS = ([\d,]+)", log_text)
        if archs:  # the kernels compiled in, e.g. 900 = sm_90
            info.facts["cuda_archs"] = archs.group(1)
            info.facts.setdefault("compute_capability", f"{int(archs.group(1).split(',')[0]) / 100:.1f}")
        graphs = re.search(r"USE_GRAPHS = (\d)", log_text)
        if graphs:  # a compile-time switch from system_info: what the build could do, not what this run did
            info.facts["cuda_graphs_compiled"] = "yes" if graphs.group(1) == "1" else "no"
        reused = re.findall(r"graphs reused =\s*(\d+)", log_text)
        if reused:
            info.facts["graphs_reused"] = reused[-1]
        offload = re.search(r"offloaded (\d+)/(\d+) layers to GPU", log_text)
        if offload:
            info.facts["gpu_layers"] = f"{offload.group(1)}/{offload.group(2)}"
        # What was selected, not what was asked: "-fa auto" resolves to enabled/disabled per device.
        fa = (re.search(r"Flash Attention (enabled|disabled)", log_text)
              or re.search(r"Flash Attention was \w+, set to (\w+)", log_text))
        if fa:
            info.backends["flash_attn"] = fa.group(1)
        asked = re.search(r"llama_context: flash_attn\s*=\s*(\w+)", log_text)
        if asked:
            info.facts["flash_attn_requested"] = asked.group(1)
            if not fa and asked.group(1) in ("enabled", "disabled"):  # set explicitly: no resolve line
                info.backends["flash_attn"] = asked.group(1)
        kv = re.search(r"llama_kv_cache: size = .*?\(\s*(\d+) cells.*?K \((\w+)\).*?V \((\w+)\)", log_text)
        if kv:
            info.kv_cache_tokens = int(kv.group(1))
            info.backends["kv_cache_type"] = f"K={kv.group(2)},V={kv.group(3)}"
        n_ctx = re.search(r"llama_context: n_ctx\s*=\s*(\d+)", log_text)
        if n_ctx:  # cells are per stream when the KV cache is not unified; n_ctx is the whole capacity
            info.kv_cache_tokens = int(n_ctx.group(1))
        slots = re.search(r"n_slots = (\d+)(?:, n_ctx_slot = (\d+))?(?:, kv_unified = '(\w+)')?", log_text)
        if slots:
            info.facts["slots"] = slots.group(1)
            if slots.group(2):
                info.facts["slot_ctx_tokens"] = slots.group(2)
                info.max_concurrency = float(slots.group(1))
            if slots.group(3):
                info.facts["kv_unified"] = slots.group(3)
        for key, pattern in (("graph_splits", r"graph: nodes = \d+, splits = (\d+)|graph splits = (\d+)"),
                             ("graph_nodes", r"graph: nodes = (\d+)|graph nodes\s*=\s*(\d+)"),
                             ("n_ctx", r"llama_context: n_ctx\s*=\s*(\d+)"),
                             ("n_batch", r"llama_context: n_batch\s*=\s*(\d+)"),
                             ("n_ubatch", r"llama_context: n_ubatch\s*=\s*(\d+)"),
                             ("threads", r"system_info: n_threads = (\d+)"),
                             ("cuda_graphs", r"(CUDA graphs? (?:are )?(?:disabled|enabled)[^\n]*)"),
                             ("speculative", r"(speculative decoding context initialized|"
                                             r"draft model[^\n]*loaded[^\n]*)")):
            match = re.search(pattern, log_text)
            if match:
                info.facts[key] = next(g for g in match.groups() if g is not None).strip()
        fit = re.search(r"fitting params to free memory took ([\d.]+) seconds", log_text)
        if fit:
            info.phases_s["fit_params"] = float(fit.group(1))
        return info

    def kv_sequences(self, startup: StartupInfo, context_tokens: int) -> float | None:
        """llama-server gives each of its n_slots slots a fixed n_ctx_slot share of the cache; with a
        unified cache the slots share all n_ctx cells: min(slots, n_ctx // context)."""
        slots, per_slot = startup.facts.get("slots"), startup.facts.get("slot_ctx_tokens")
        if not slots or not per_slot or context_tokens <= 0:
            return super().kv_sequences(startup, context_tokens)
        if startup.facts.get("kv_unified") == "true" and startup.kv_cache_tokens:
            return float(min(int(slots), startup.kv_cache_tokens // context_tokens))
        return float(int(slots) if context_tokens <= int(per_slot) else 0)

    def classify_failure(self, log_text: str) -> FailureCause | None:
        found = super().classify_failure(log_text)
        if found and found.cause == "bad_flag" and found.flag is None:
            # A KV cache type whose block does not divide this model's head size: the value is wrong
            # for this model whatever else is set.
            block = _KV_BLOCK.search(log_text)
            if block:
                param = "cache_type_k" if block.group(1) == "K" else "cache_type_v"
                found = replace(found, line=block.group(0).strip(), flag=FLAGS[param], value=block.group(2))
        return found

    def expected_features(self, flags: Mapping[str, Any]) -> list[FeatureExpectation]:
        spec = flags.get("spec_type")
        if spec not in (None, "none", False) and int(flags.get("spec_draft_n_max") or 1) > 0:
            return [FeatureExpectation("speculative_decoding", "spec_drafts", f"--spec-type {spec} was requested")]
        return []

    async def count_tokens(self, client: httpx.AsyncClient, base_url: str, model_id: str,
                           messages: list[dict[str, str]]) -> TokenCount:
        """Counted through the chat template, as the chat endpoint will see the prompt.

        `/tokenize` alone knows no chat template (it would undercount by the template's tokens);
        this version offers `/v1/chat/completions/input_tokens`, which applies the template and
        tokenizes with special tokens, exactly as a chat request does.
        """
        resp = await client.post(base_url + "/v1/chat/completions/input_tokens",
                                 json={"model": model_id, "messages": messages})
        if resp.status_code == 404:  # older servers: template first, then tokenize the text
            templ = await client.post(base_url + "/apply-template", json={"messages": messages})
            templ.raise_for_status()
            tok = await client.post(base_url + "/tokenize",
                                    json={"content": templ.json()["prompt"], "add_special": True})
            tok.raise_for_status()
            count = len(tok.json()["tokens"])
        else:
            resp.raise_for_status()
            count = int(resp.json()["input_tokens"])
        if base_url not in self._context_limits:
            self._context_limits[base_url] = await _slot_context(client, base_url)
        return TokenCount(count, self._context_limits[base_url])

    def request_extras(self) -> dict[str, Any]:
        return {"ignore_eos": True}

    def timing_metrics(self, timings: Mapping[str, Any]) -> dict[str, float]:
        # The last streamed chunk (with stream_options.include_usage) carries llama.cpp's `timings`.
        names = {"predicted_per_second": "engine_decode_tok_s", "prompt_per_second": "engine_prefill_tok_s"}
        return {metric: float(timings[key]) for key, metric in names.items() if timings.get(key)}

    def cached_prompt_tokens(self, timings: Mapping[str, Any]) -> int | None:
        return int(timings["cache_n"]) if "cache_n" in timings else None

    distributions = ("llama-cpp-python",)  # a Python-wrapped build; llama-server itself reports /props

    async def server_info(self, client: httpx.AsyncClient, base_url: str) -> dict[str, str]:
        return await server_field(client, base_url + "/props", "build_info", "server_build_info")

    def thinking_extras(self, on: bool) -> dict[str, Any]:
        # llama-server renders the GGUF's Jinja template (--jinja, on by default) and takes the same
        # per-request chat_template_kwargs (this version: tools/server/server-common.cpp reads
        # body["chat_template_kwargs"] and its enable_thinking); server-wide: --reasoning-budget 0.
        return {"chat_template_kwargs": {"enable_thinking": on}}


async def _slot_context(client: httpx.AsyncClient, base_url: str) -> int | None:
    """The context one request may use: -c divided over the slots (llama.cpp splits it)."""
    try:
        resp = await client.get(base_url + "/props")
        resp.raise_for_status()
        n_ctx = resp.json().get("default_generation_settings", {}).get("n_ctx")
        return int(n_ctx) if n_ctx else None
    except (httpx.HTTPError, ValueError):
        return None


def server_flags(flags: Mapping[str, Any]) -> list[str]:
    """Space params -> llama-server argv, through the FLAGS table (unknown names as --dashed-name)."""
    argv: list[str] = []
    for key, value in flags.items():
        if value is None:
            continue
        flag = FLAGS.get(key, flag_name(key))
        if key in _ON_OFF:
            argv += [flag, {True: "on", False: "off"}.get(value, str(value))] if isinstance(value, bool) \
                else [flag, str(value)]
        elif value is True:
            argv.append(flag)
        elif value is False:
            if key in _NEGATED:
                argv.append(_NEGATED[key])
        else:
            argv += [flag, value_text(value)]
    return argv
