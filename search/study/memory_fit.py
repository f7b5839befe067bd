"""Reject configs that certainly cannot run, before paying for a server start.

Memory:  need      = checkpoint size + KV cache for ONE sequence of the maximum context length
         available = device memory x the engine's memory share (1.0 where it has none) - reserve
Context: the engine's per-sequence context limit must hold the longest request of the workloads
         the objectives read (prompt + output); a shorter one answers those requests with HTTP 400.
         Other workloads longer than the limit are not measured for that config
         (workloads_beyond_context): a short context is a choice, not a failure. A quality check
         longer than the limit is warned about (it will count as lost).
Pairs:   an engine that lists the checkpoints it loads (`engines.<name>.models`) is never started
         with another one.

Which parameters set the memory share, the context length and the KV dtype is each engine module's
business (Engine.memory_knobs): nothing here branches on a dialect.

Unified memory (`device.unified_memory: true`, e.g. DGX Spark / GB10: 128 GB of LPDDR5x shared by the
CPU, the GPU, the OS and the page cache): an engine reserves its share of the total at start and
refuses to start when less than that is free (vLLM: "Free memory on device ... is less than desired
GPU memory utilization"). So where flagsearch runs on the device itself (this machine's total memory
matches `device.memory_gb`), the memory free at start (/proc/meminfo MemAvailable) caps what is
available; and a share that leaves the OS less than `device.os_reserve_gb` gets a warning.

Only a certain misfit is rejected; a config that cannot hold every concurrent stream at full length
only gets a warning (engines queue such requests).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from harness.engines import get_engine
from harness.measure.user_prompts import PromptSource, load_prompts
from harness.measure.workloads import WorkloadSpec
from harness.quality.checks import Check, checks_for
from search.space.space import Config, Resolved, Space

# A short item's prompt has no declared size: chars/2 plus a chat template is an upper bound for
# the tokenizers in use (English text runs at ~4 chars per token).
_TEMPLATE_TOKENS = 64


@dataclass(frozen=True)
class FitEstimate:
    fits: bool
    need_gb: float
    available_gb: float
    detail: str
    warning: str | None = None
    reason: str = "memory"  # memory | context: what does not fit


@dataclass(frozen=True)
class LocalMemory:
    total_gb: float
    available_gb: float  # MemAvailable: what the OS could hand out (page cache counted as free)
    page_cache_gb: float = 0.0  # Cached: file pages (a 76 GB checkpoint just read fills it)
    gpu_free_gb: float | None = None  # what the GPU reports free (vLLM's start check reads this one)

    @property
    def free_gb(self) -> float:
        """What an engine can take at start: on GB10 the GPU's own figure drops below MemAvailable
        once the page cache fills, and vLLM refuses to start on the GPU's figure."""
        return min(self.available_gb, self.gpu_free_gb) if self.gpu_free_gb is not None else self.available_gb


# A device report to read instead of this machine's (a JSON object with the LocalMemory fields): for
# reading a device from elsewhere, and for fault injection in tests.
DEVICE_REPORT_ENV = "FLAGSEARCH_DEVICE_REPORT"


def _gpu_free_gb() -> float | None:
    """The first GPU's free memory as nvidia-smi reports it (GiB); None without one or a number."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.split()
        return float(out[0]) / 1024 if out else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None  # GB10 may print [N/A]: MemAvailable then stands for it


def local_memory(meminfo: Path = Path("/proc/meminfo")) -> LocalMemory | None:
    """This machine's memory in GiB (MemTotal, MemAvailable, Cached, and the GPU's free memory where
    nvidia-smi reports it), or the device report FLAGSEARCH_DEVICE_REPORT names; None where neither
    can be read."""
    report = os.environ.get(DEVICE_REPORT_ENV)
    if report:
        try:
            data = json.loads(Path(report).read_text())
            return LocalMemory(float(data["total_gb"]), float(data["available_gb"]),
                               float(data.get("page_cache_gb", 0.0)),
                               float(data["gpu_free_gb"]) if data.get("gpu_free_gb") is not None else None)
        except (OSError, ValueError, KeyError, TypeError):
            return None
    try:
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        kib = {k: int(v.split()[0]) for k, v in fields.items() if k in ("MemTotal", "MemAvailable", "Cached")}
        return LocalMemory(kib["MemTotal"] / 2**20, kib["MemAvailable"] / 2**20, kib.get("Cached", 0) / 2**20,
                           _gpu_free_gb())
    except (OSError, KeyError, ValueError, IndexError):
        return None


def free_at_start(space: Space) -> LocalMemory | None:
    """The device's free memory now, where it can be read: a unified-memory device that is this
    machine (its total within 10% of `device.memory_gb`). None elsewhere (a dry run on a laptop).
    Read before every start (search/study/unified_memory.py): other programs and the page cache change it."""
    device = space.m.device
    if device is None or not device.unified_memory or device.memory_gb is None:
        return None
    local = local_memory()
    if local is None or abs(local.total_gb - device.memory_gb) > 0.1 * device.memory_gb:
        return None
    return local


def stream_requests(spec: WorkloadSpec) -> list[tuple[int, int, str]]:
    """(prompt tokens, output tokens, label) of one request of each stream of a workload, before any
    server has counted them: declared context sizes exactly, short prompts by their upper bound, a
    user's prompt file by its longest prompt."""
    if spec.source is not None:
        src = spec.source
        if src.format == "documents":
            return [(src.context_tokens, spec.max_tokens or src.max_tokens, f"{spec.name}/documents")]
        chars, declared = _longest_prompt(src.path, src.format, src.limit, Path(src.path).stat().st_mtime)
        output = spec.max_tokens or declared or src.max_tokens
        return [(chars // 2 + _TEMPLATE_TOKENS, output, f"{spec.name}/{Path(src.path).name}")] * spec.concurrency
    out = []
    for name in spec.streams:
        item = spec.item(name)
        prompt = spec.context_tokens(item) or len(item.prompt) // 2 + _TEMPLATE_TOKENS
        out.append((prompt, spec.output_tokens(item), f"{spec.name}/{name}"))
    return out


@cache
def _longest_prompt(path: str, fmt: str, limit: int | None, mtime: float) -> tuple[int, int | None]:
    """(characters, declared max_tokens) of a prompt file's longest prompt; read once per file
    version (a dry run checks thousands of configs)."""
    prompts = load_prompts(PromptSource(path=path, format=fmt, limit=limit))  # type: ignore[arg-type]
    longest = max(prompts, key=lambda pr: sum(len(c) for _, c in pr.messages))
    return sum(len(c) for _, c in longest.messages), longest.max_tokens


def objective_workloads(space: Space) -> set[str]:
    """Workloads an objective reads (`qa.output_tok_s` -> qa): every config must measure these."""
    return {o.metric.split(".", 1)[0].split("@", 1)[0] for o in space.m.objectives}


def longest_request(space: Space, request: dict[str, object] | None = None,
                    only: set[str] | None = None, with_quality: bool = True) -> tuple[int, str]:
    """(tokens, "workload/item") of the longest request (prompt + output) the workloads (those in
    `only`, where given) and the quality suite's long-context checks send."""
    best = (0, "")
    for spec in space.workload_specs(request):  # type: ignore[arg-type]
        if only is not None and spec.name not in only:
            continue
        for prompt, output, label in stream_requests(spec):
            if prompt + output > best[0]:
                best = (prompt + output, label)
    quality = space.m.quality
    for check in quality_checks(space) if with_quality else ():
        need = round(check.context_tokens * quality.context_scale) + check.max_tokens
        if check.context_tokens and need > best[0]:
            best = (need, f"quality/{check.name}")
    return best


def quality_checks(space: Space) -> tuple[Check, ...]:
    suite = space.m.quality.suite
    return checks_for(suite) if suite else ()


def estimate(space: Space, config: Config | Resolved, free: LocalMemory | None = None) -> FitEstimate | None:
    """None when the space states too little to judge (no context knob set, no device or model size).
    `free`: the device's free memory at start (see free_at_start), read by the caller once per study."""
    resolved = space.resolve(config)
    config = resolved.config
    if not space.loads(config.engine, config.model):
        return FitEstimate(False, 0.0, 0.0, f"engine {config.engine} does not load checkpoint {config.model} "
                           f"(engines.{config.engine}.models)", reason="pair")
    settings, flags, request = resolved.settings, resolved.flags, dict(resolved.request)
    knobs = get_engine(settings.dialect).memory_knobs(settings, flags)
    longest, where = longest_request(space, request, only=objective_workloads(space), with_quality=False)
    if knobs.context_tokens is not None and knobs.context_tokens < longest:
        return FitEstimate(False, float(longest), float(knobs.context_tokens),
                           f"context limit {knobs.context_tokens} tokens < {longest} tokens of the longest "
                           f"request ({where}, prompt + output)", reason="context")
    device = space.m.device
    model = resolved.model
    if device is None or device.memory_gb is None or model.size_gb is None:
        return None
    util = knobs.utilization if knobs.utilization is not None else device.default_utilization
    share = device.memory_gb * util
    available = share - device.reserve_gb
    free_note = ""
    if free is not None and free.free_gb < share:
        available = free.free_gb - device.reserve_gb
        free_note = f" (only {free.free_gb:.1f} free at start, of {share:.1f} asked for)"
    kv_per_token = model.attrs.get("kv_bytes_per_token")
    context = knobs.context_tokens
    kv_one = float(kv_per_token) * context * knobs.kv_bytes_factor / 2**30 if kv_per_token and context else 0.0
    need = model.size_gb + kv_one
    detail = (f"weights {model.size_gb:.1f} GB + KV for one {context or '?'}-token sequence {kv_one:.1f} GB "
              f"= {need:.1f} GB vs {device.memory_gb:.1f} GB x {util:.2f} - {device.reserve_gb:.1f} GB reserve "
              f"= {available:.1f} GB{free_note}")
    warnings = []
    skipped = workloads_beyond_context(space, resolved)
    if skipped:
        warnings.append(f"not measured at this {knobs.context_tokens}-token context: " + ", ".join(
            f"{name} ({tokens} tokens)" for name, tokens in skipped))
    quality_need, check = longest_request(space, request, only=set())
    if context is not None and quality_need > context:
        warnings.append(f"quality check {check} needs {quality_need} tokens > the {context}-token context: "
                        "it will count as lost")
    streams = max(w.concurrency for w in space.workload_specs(request))
    if kv_one and need <= available < model.size_gb + kv_one * streams:
        warnings.append(f"KV cache cannot hold {streams} full-length sequences at once; expect queueing")
    if device.unified_memory and device.memory_gb - share < device.os_reserve_gb:
        warnings.append(f"unified memory: {util:.2f} of {device.memory_gb:.1f} GB leaves the OS and page cache "
                        f"{device.memory_gb - share:.1f} GB (< {device.os_reserve_gb:.1f} GB): OOM risk")
    return FitEstimate(need <= available, need, available, detail, "; ".join(warnings) or None)


def workloads_beyond_context(space: Space, config: Config | Resolved) -> list[tuple[str, int]]:
    """(workload, tokens of its longest request) of each workload longer than the config's context
    limit: not measured for this config (a shorter context is a choice, e.g. Atlas at 4096, not a
    failure). Those an objective reads are never among them: estimate() rejects such a config."""
    resolved = space.resolve(config)
    settings = resolved.settings
    context = get_engine(settings.dialect).memory_knobs(settings, resolved.flags).context_tokens
    if context is None:
        return []
    out = []
    for spec in space.workload_specs(dict(resolved.request)):
        longest = max(prompt + output for prompt, output, _ in stream_requests(spec))
        if longest > context:
            out.append((spec.name, longest))
    return out
