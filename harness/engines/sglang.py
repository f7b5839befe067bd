"""SGLang's dialect: `python -m sglang.launch_server` flags, its startup log lines and metric names.

SGLang needs a CUDA GPU; it cannot run on the CPU machines where the tests run, so this module is
tested on recorded log text (tests/data/sglang_*.log) and its command building only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from harness.engines.base import (
    Engine,
    EngineSettings,
    FeatureExpectation,
    MemoryParams,
    MetricNames,
    ModelChoice,
    StartupInfo,
    launch_spec,
)
from harness.launch.spec import LaunchSpec

# space param -> SGLang flag where the spelling is not simply --param-with-dashes. The speculative
# params are spelled by _speculative_flags: `speculative_method` -> --speculative-algorithm (mtp ->
# NEXTN), vLLM's `num_speculative_tokens` -> --speculative-num-steps (an EAGLE/NEXTN chain of N steps
# at top-1 drafts N tokens and verifies N + 1, as vLLM's MTP drafts N).
FLAGS: dict[str, str] = {
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
    failure_patterns = _FAILURES
    kernel_paths: ClassVar[dict[str, str]] = {
        "attention": "attention backend", "sampling": "sampling backend", "speculative": "speculative algorithm",
        "kv_cache_dtype": "KV cache dtype"}
    source_paths: ClassVar[tuple[tuple[str, tuple[str, ...]], ...]] = (
        ("python/sglang/srt/layers/attention/", ("attention",)), ("python/sglang/srt/layers/sampler", ("sampling",)),
        ("python/sglang/srt/speculative/", ("speculative",)),
    )
    distributions = ("sglang",)

    def tokenize_bodies(self, model_id: str, text: str) -> list[dict[str, Any]]:
        return [{"model": model_id, "prompt": text}]
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
        """Lines as SGLang's logger spells them (tests/data/sglang_0.5.23_log_strings.json names the
        file and line of each in SGLang 0.5.23; older spellings kept where they differ)."""
        info = StartupInfo()
        load = re.search(r"Load weight end\.(?: elapsed=" + _NUM + r" s,)?.*?type=(\w+)[^\n]*?"
                         r"(?:mem usage=([\d.]+) GB)?\.?$", log_text, re.M)
        if load:
            if load.group(1):
                info.phases_s["weight_loading"] = float(load.group(1))
            info.facts["model_class"] = load.group(2)
            if load.group(3):
                info.facts["weight_mem_usage_gb"] = load.group(3)
        # "Capture cuda graph end. Time elapsed: 12.3 s" (older), "Capture decode CUDA graph end.
        # elapsed=14.62 s" (0.5.x, one per runner: decode, prefill; draft ones for speculative decoding).
        for name, seconds in re.findall(r"Capture ((?:\w+ )*?)(?:cuda|CUDA|npu) graph end\. (?:Time elapsed: |elapsed=)"
                                        + _NUM + " s", log_text):
            phase = "draft_graph_capture" if name.startswith("draft") else "graph_capture"
            info.phases_s[phase] = round(info.phases_s.get(phase, 0.0) + float(seconds), 3)
        kv = re.search(r"KV Cache is allocated\.(?: dtype: (\S+),)? #tokens: (\d+)", log_text)
        if kv:
            info.kv_cache_tokens = int(kv.group(2))
            if kv.group(1):
                info.facts["kv_cache_dtype"] = kv.group(1)
        mamba = re.search(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+)", log_text)
        if mamba:
            info.facts["mamba_cache_size"] = mamba.group(1)
        summary = re.search(r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), max_prefill_tokens=(\d+), "
                            r"max_running_requests=(\d+), context_len=(\d+)", log_text)
        if summary:
            info.kv_cache_tokens = info.kv_cache_tokens or int(summary.group(1))
            info.facts["chunked_prefill_size"] = summary.group(2)
            info.facts["max_running_requests"] = summary.group(4)
            info.facts["context_len"] = summary.group(5)
            info.max_concurrency = round(int(summary.group(1)) / int(summary.group(5)), 2)
        # server_args: ServerArgs(attention_backend='x', ...) (older) or a dict {'attention_backend': 'x'}.
        for key, name in (("attention", "attention_backend"), ("sampling", "sampling_backend"),
                          ("moe_runner", "moe_runner_backend"), ("speculative", "speculative_algorithm"),
                          ("kv_cache_dtype", "kv_cache_dtype")):
            match = re.search(name + r"(?:=|': )'(\w+)'", log_text)
            if match and match.group(1) not in ("None", "auto"):
                info.backends[key] = match.group(1)
        chosen = re.search(r"(?:Attention backend not (?:set|specified)\. )?Use (\w+) (?:attention )?backend "
                           r"by default", log_text)
        if chosen and "attention" not in info.backends:
            info.backends["attention"] = chosen.group(1)
        version = re.search(r"sglang(?: version|==)\s*([\w.+\-]+)", log_text, re.I)
        if version:
            info.version = version.group(1)
        if "The server is fired up and ready to roll" in log_text:
            info.facts["ready_line"] = "The server is fired up and ready to roll!"
        return info

    def expected_features(self, flags: Mapping[str, Any]) -> list[FeatureExpectation]:
        # No speculative counters to check against; prefix caching has the cached-token counter.
        if flags.get("enable_prefix_caching") is True:
            return [FeatureExpectation("prefix_caching", "prompt_tokens_cached", "radix cache is on")]
        return []


    def param_for_flag(self, flag: str, flags: Mapping[str, Any]) -> str | None:
        wanted = flag.split("=", 1)[0].strip()
        steps = "speculative_num_steps" if "speculative_num_steps" in flags else "num_speculative_tokens"
        mapped = {"--speculative-algorithm": "speculative_method", "--speculative-num-steps": steps,
                  **{f: name for name, f in FLAGS.items()}, **{f: name for name, f in _OFF_SWITCH.items()}}
        if mapped.get(wanted) in flags:
            return mapped[wanted]
        return super().param_for_flag(flag, flags)

    def thinking_extras(self, on: bool) -> dict[str, Any]:
        # SGLang's OpenAI server passes chat_template_kwargs to the template, as vLLM does.
        return {"chat_template_kwargs": {"enable_thinking": on}}


_SPEC_KEYS = ("speculative_method", "num_speculative_tokens", "speculative_num_steps", "speculative_eagle_topk",
              "speculative_num_draft_tokens")


def _speculative_flags(rest: dict[str, Any]) -> list[str]:
    """Pops the speculative keys; returns the flags SGLang honours for them ([] when off).

    SGLang's server_args sets --speculative-num-draft-tokens to steps + 1 whenever
    --speculative-eagle-topk is 1 (a warning, "speculative_num_draft_tokens is adjusted to
    speculative_num_steps + 1 when speculative_eagle_topk == 1"), so at top-1 only the steps change
    anything and the draft count is left out; it is passed only where topk > 1. The steps are
    `speculative_num_steps` (SGLang's name, first) or `num_speculative_tokens` (vLLM's); 0 of either,
    or a method none/off, is no speculation at all: no speculative flag on the command line. topk is
    always passed with the steps: SGLang compares it with 1 and crashes on an unset one.
    """
    values = {k: rest.pop(k) for k in _SPEC_KEYS if k in rest}
    method = values.get("speculative_method")
    named = values.get("speculative_num_steps")
    steps = int((values.get("num_speculative_tokens") if named is None else named) or 0)
    if method in (None, "none", "off") or not steps:
        return []
    algorithm = "NEXTN" if str(method).lower() == "mtp" else str(method)  # SGLang's name for a model's MTP head
    topk = int(values.get("speculative_eagle_topk") or 1)
    argv = ["--speculative-algorithm", algorithm, "--speculative-num-steps", str(steps),
            "--speculative-eagle-topk", str(topk)]
    draft_tokens = values.get("speculative_num_draft_tokens")
    if topk > 1 and draft_tokens is not None:
        argv += ["--speculative-num-draft-tokens", str(int(draft_tokens))]
    return argv


def sglang_flags(flags: Mapping[str, Any]) -> list[str]:
    rest = dict(flags)
    argv = _speculative_flags(rest)
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
