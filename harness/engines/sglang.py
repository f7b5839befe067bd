"""SGLang's dialect: `python -m sglang.launch_server` flags, its startup log lines and metric names.

SGLang needs a CUDA GPU; it cannot run on the CPU machines where the tests run, so this module is
tested on recorded log text (tests/data/sglang_*.log) and its command building only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

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
    count_tokens_via_usage,
    first_match,
    launch_spec,
)
from harness.launch.spec import LaunchSpec

# space param -> SGLang flag where the spelling is not simply --param-with-dashes
FLAGS: dict[str, str] = {
    "speculative_method": "--speculative-algorithm",  # EAGLE | EAGLE3 | NEXTN (MTP) | NGRAM ...
    "num_speculative_tokens": "--speculative-num-draft-tokens",
    "tp": "--tp-size",
    "max_model_len": "--context-length",  # vLLM's name, accepted for spaces shared between engines
    "gpu_memory_utilization": "--mem-fraction-static",
    "max_num_seqs": "--max-running-requests",
    "max_num_batched_tokens": "--chunked-prefill-size",
}
# Flags that exist only as on-switches in SGLang, and the switch that turns them off.
_OFF_SWITCH = {"enable_prefix_caching": "--disable-radix-cache", "cuda_graph": "--disable-cuda-graph"}

_FAILURES: list[tuple[str, re.Pattern[str]]] = [
    ("bad_flag", re.compile(r"error: unrecognized arguments|error: argument|invalid choice", re.I)),
    ("max_model_len", re.compile(r"context_length .* is (?:greater|larger) than|"
                                 r"exceeds the model's max(?:imum)? (?:position|context)", re.I)),
    ("kv_too_small", re.compile(r"max_total_num_tokens.*(?:too small|smaller than)|"
                                r"Not enough memory\. Please try to increase --mem-fraction-static", re.I)),
    ("oom", re.compile(r"CUDA out of memory|OutOfMemoryError|out of memory", re.I)),
    ("model_not_found", re.compile(r"HFValidationError|does not appear to have a file|Repo id must|"
                                   r"No such file or directory|is not a local folder", re.I)),
    ("port_in_use", re.compile(r"Address already in use|address already in use", re.I)),
    ("crashed", re.compile(r"Traceback \(most recent call last\)|Segmentation fault|core dumped|"
                           r"Received sigquit from a child process")),
]

_NUM = r"([\d.]+)"


class SglangEngine(Engine):
    dialect = "sglang"
    # Tokens are counted by sending the prompt (no tokenizer endpoint): workloads size prompts under a
    # separate nonce so the counting request cannot warm the prefix cache for the measured one.
    counts_by_request = True
    ready_path = "/health"
    metric_names = MetricNames(
        generation_tokens="sglang:generation_tokens_total",
        prompt_tokens="sglang:prompt_tokens_total",
        prompt_tokens_cached="sglang:cached_tokens_total",
        kv_cache_usage="sglang:token_usage",
        requests_running="sglang:num_running_reqs",
        requests_waiting="sglang:num_queue_reqs",
        # SGLang reports speculative acceptance as a gauge (sglang:spec_accept_length), no counters.
    )

    # Its own names and the vLLM names that FLAGS maps onto them. --mem-fraction-static has no fixed
    # default (SGLang derives it from the GPU's memory), so an unset one is left unknown.
    memory_params = MemoryParams(utilization=("mem_fraction_static", "gpu_memory_utilization"),
                                 context=("context_length", "max_model_len"), kv_dtype=("kv_cache_dtype",),
                                 max_seqs=("max_running_requests", "max_num_seqs"))

    def build_launch(self, settings: EngineSettings, model: ModelChoice, flags: Mapping[str, Any],
                     env: Mapping[str, str], port: int) -> LaunchSpec:
        argv = [*settings.command, "--model-path", model.path, "--host", settings.host, "--port", str(port)]
        argv += sglang_flags(flags)
        if "--enable-metrics" not in argv:
            argv.append("--enable-metrics")
        return launch_spec(settings, argv, env, port)

    def parse_startup(self, log_text: str) -> StartupInfo:
        info = StartupInfo()
        load = re.search(r"Load weight end\.(?: elapsed=" + _NUM + r" s,)?.*?type=(\w+)", log_text)
        if load:
            if load.group(1):
                info.phases_s["weight_loading"] = float(load.group(1))
            info.facts["model_class"] = load.group(2)
        graph = re.search(r"Capture (?:cuda|npu) graph end\. Time elapsed: " + _NUM + " s", log_text)
        if graph:
            info.phases_s["graph_capture"] = float(graph.group(1))
        kv = re.search(r"KV Cache is allocated\. #tokens: (\d+)", log_text)
        if kv:
            info.kv_cache_tokens = int(kv.group(1))
        summary = re.search(r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), max_prefill_tokens=(\d+), "
                            r"max_running_requests=(\d+), context_len=(\d+)", log_text)
        if summary:
            info.kv_cache_tokens = info.kv_cache_tokens or int(summary.group(1))
            info.facts["chunked_prefill_size"] = summary.group(2)
            info.facts["max_running_requests"] = summary.group(4)
            info.facts["context_len"] = summary.group(5)
            info.max_concurrency = round(int(summary.group(1)) / int(summary.group(5)), 2)
        for key, pattern in (("attention", r"attention_backend='(\w+)'"),
                             ("sampling", r"sampling_backend='(\w+)'"),
                             ("moe_runner", r"moe_runner_backend='(\w+)'"),
                             ("speculative", r"speculative_algorithm='(\w+)'"),
                             ("kv_cache_dtype", r"kv_cache_dtype='(\w+)'")):
            match = re.search(pattern, log_text)
            if match and match.group(1) not in ("None", "auto"):
                info.backends[key] = match.group(1)
        chosen = re.search(r"(?:Attention backend not set\. )?Use (\w+) (?:attention )?backend by default", log_text)
        if chosen and "attention" not in info.backends:
            info.backends["attention"] = chosen.group(1)
        version = re.search(r"sglang(?: version|==)\s*([\w.+\-]+)", log_text, re.I)
        if version:
            info.version = version.group(1)
        if "The server is fired up and ready to roll" in log_text:
            info.facts["ready_line"] = "The server is fired up and ready to roll!"
        return info

    def classify_failure(self, log_text: str) -> FailureCause | None:
        return first_match(_FAILURES, log_text)

    def expected_features(self, flags: Mapping[str, Any]) -> list[FeatureExpectation]:
        # No speculative counters to check against; prefix caching has the cached-token counter.
        if flags.get("enable_prefix_caching") is True:
            return [FeatureExpectation("prefix_caching", "prompt_tokens_cached", "radix cache is on")]
        return []

    async def count_tokens(self, client: httpx.AsyncClient, base_url: str, model_id: str,
                           messages: list[dict[str, str]]) -> TokenCount:
        return await count_tokens_via_usage(client, base_url, model_id, messages)

    def thinking_extras(self, on: bool) -> dict[str, Any]:
        # SGLang's OpenAI server passes chat_template_kwargs to the template, as vLLM does.
        return {"chat_template_kwargs": {"enable_thinking": on}}


def sglang_flags(flags: Mapping[str, Any]) -> list[str]:
    rest = dict(flags)
    argv: list[str] = []
    method = rest.get("speculative_method")
    if method in (None, "none", "off") or not int(rest.get("num_speculative_tokens") or 1):
        for key in ("speculative_method", "num_speculative_tokens", "speculative_num_steps",
                    "speculative_eagle_topk"):
            rest.pop(key, None)
    elif str(method).lower() == "mtp":
        rest["speculative_method"] = "NEXTN"  # SGLang's name for a model's own MTP head
    for key, switch in _OFF_SWITCH.items():
        if key in rest and rest.pop(key) is False:
            argv.append(switch)
    for key, value in rest.items():
        if value is None or value is False:
            continue
        flag = FLAGS.get(key, "--" + key.replace("_", "-"))
        if value is True:
            argv.append(flag)
        elif isinstance(value, (dict, list)):
            argv += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            argv += [flag, str(value)]
    return argv


__all__ = ["FLAGS", "SglangEngine", "sglang_flags"]
