"""Reject configs that certainly cannot fit in device memory, before paying for a server start.

need (certain) = checkpoint size + KV cache for ONE sequence of the maximum context length
available      = device memory x the memory-utilization knob (1.0 where the engine has none)

Only a config whose certain need exceeds what is available is rejected; one that cannot hold
every concurrent stream at full length only gets a warning (engines queue such requests).
"""

from __future__ import annotations

from dataclasses import dataclass

from search.space import Config, Space

# Per dialect: the flag names that set the memory share and the context length.
_UTILIZATION = {"vllm": "gpu_memory_utilization", "sglang": "mem_fraction_static",
                "command": "gpu_memory_utilization"}
_CONTEXT = {"vllm": "max_model_len", "sglang": "context_length", "llamacpp": "ctx_size",
            "command": "max_seq_len"}
_KV_SHRINK = {"fp8": 0.5, "fp8_e4m3": 0.5, "fp8_e5m2": 0.5, "q8_0": 0.53, "q4_0": 0.28}


@dataclass(frozen=True)
class FitEstimate:
    fits: bool
    need_gb: float
    available_gb: float
    detail: str
    warning: str | None = None


def estimate(space: Space, config: Config) -> FitEstimate | None:
    """None when the space does not state enough (device memory, model size) to judge."""
    device = space.m.device
    model = space.model_choice(config.model)
    if device is None or device.memory_gb is None or model.size_gb is None:
        return None
    dialect = space.engine_settings(config.engine).dialect
    flags, _, request = space.split(config)
    util = float(flags.get(_UTILIZATION.get(dialect, ""), device.default_utilization))
    available = device.memory_gb * util - device.reserve_gb
    kv_per_token = model.attrs.get("kv_bytes_per_token")
    context = flags.get(_CONTEXT.get(dialect, ""))
    kv_dtype = str(flags.get("kv_cache_dtype") or flags.get("cache_type_k") or "auto")
    shrink = _KV_SHRINK.get(kv_dtype, 1.0)
    kv_one = float(kv_per_token) * int(context) * shrink / 1e9 if kv_per_token and context else 0.0
    need = model.size_gb + kv_one
    detail = (f"weights {model.size_gb:.1f} GB + KV for one {context or '?'}-token sequence {kv_one:.1f} GB "
              f"= {need:.1f} GB vs {device.memory_gb:.0f} GB x {util:.2f} - {device.reserve_gb:.1f} GB reserve "
              f"= {available:.1f} GB")
    warning = None
    streams = max(w.concurrency for w in space.workload_specs(request))
    if kv_one and need <= available < model.size_gb + kv_one * streams:
        warning = f"KV cache cannot hold {streams} full-length sequences at once; expect queueing"
    return FitEstimate(need <= available, need, available, detail, warning)
