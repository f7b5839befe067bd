"""The memory-bandwidth roofline of decoding: how close a result is to what the device allows.

Decode is memory-bound: each engine step reads the active weights once, so one stream cannot
take more than `bandwidth / bytes_per_step` steps per second. A result at 80% of that tells the
user to stop tuning flags; one at 20% says there is room (docs/domain.md, "The example hardware and the roofline").

`bytes_per_token` is the bytes read per decode step: stated in the space (model attrs
`bytes_per_token_gb`), or active parameters x bytes per weight, or (dense models) the checkpoint
size. KV-cache reads are left out, so the ceiling is optimistic and the percentage conservative.
Bandwidth is stated, or measured by a copy benchmark (read + write bytes over time) in the
engine's own Python where torch sees a GPU, else with numpy on the host memory; measured once per
boot of the machine (`per_boot`: FLAGSEARCH_HOME/cache/bandwidth.json), not once per study: the
host copy takes ~1.3 s of CPU and the GPU probe starts the engine's torch (seconds), which every
`search run` paid again for a property of the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness import flagsearch_home
from harness.engines.base import ModelChoice

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

_GPU_COPY = r"""
import json, time, torch
if not torch.cuda.is_available():
    print(json.dumps({"device": None})); raise SystemExit
n = 1 << 28  # 256 Mi floats = 1 GiB per buffer
a = torch.empty(n, dtype=torch.float32, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize(); best = float("inf")
for _ in range(10):
    t = time.perf_counter(); b.copy_(a); torch.cuda.synchronize(); best = min(best, time.perf_counter() - t)
print(json.dumps({"device": torch.cuda.get_device_name(0), "bytes_s": 2 * a.numel() * 4 / best}))
"""


@dataclass(frozen=True)
class Roofline:
    bytes_per_token: float  # bytes read per decode step of one sequence
    bandwidth_bytes_s: float
    bytes_source: str  # stated | active_params | checkpoint_size
    bandwidth_source: str  # stated | measured:<device>

    @property
    def ceiling_steps_s(self) -> float:
        return self.bandwidth_bytes_s / self.bytes_per_token

    def metrics(self, m: dict[str, float]) -> dict[str, float]:
        """roofline_pct: decode steps/s per stream as % of the ceiling (the honest one: a step reads
        the weights once, however many tokens speculative decoding accepts in it);
        roofline_tok_pct: decode tok/s per stream as % of it (can pass 100 with speculative decoding)."""
        out = {"roofline_steps_s": self.ceiling_steps_s}
        if "decode_steps_s" in m:
            out["roofline_pct"] = 100.0 * m["decode_steps_s"] / self.ceiling_steps_s
        if "stream_decode_tok_s" in m:
            out["roofline_tok_pct"] = 100.0 * m["stream_decode_tok_s"] / self.ceiling_steps_s
        return out

    def to_dict(self) -> dict[str, object]:
        return {"bytes_per_token": self.bytes_per_token, "bandwidth_bytes_s": self.bandwidth_bytes_s,
                "bytes_source": self.bytes_source, "bandwidth_source": self.bandwidth_source,
                "ceiling_steps_s": self.ceiling_steps_s}


def bytes_per_token(model: ModelChoice) -> tuple[float, str] | None:
    """Bytes read per decoded token for this checkpoint, and where the figure came from."""
    stated = model.attrs.get("bytes_per_token_gb")
    if stated:
        return float(stated) * 1e9, "stated"
    if model.active_params_b and model.bytes_per_param:
        return model.active_params_b * 1e9 * model.bytes_per_param, "active_params"
    if model.size_gb:
        return model.size_gb * 1e9, "checkpoint_size"
    path = Path(model.path)
    if path.is_file():
        return float(path.stat().st_size), "checkpoint_size"
    return None


def host_copy_bandwidth(size_mib: int = 256, rounds: int = 5) -> float:
    """Host memory copy bandwidth in bytes/s (read + write), best of `rounds` (numpy, one thread)."""
    a = np.ones(size_mib * 2**20 // 8, dtype=np.float64)
    b = np.empty_like(a)
    np.copyto(b, a)
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return 2 * a.nbytes / best


def gpu_copy_bandwidth(python: str, timeout_s: float = 180.0) -> dict[str, Any] | None:
    """The device copy benchmark in the engine's environment (torch): {"device": None} without a GPU,
    else {"device": name, "bytes_s": bandwidth}; None when it could not run."""
    try:
        proc = subprocess.run([python, "-c", _GPU_COPY], capture_output=True, text=True, timeout=timeout_s)
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return data if isinstance(data, dict) and "device" in data else None


def per_boot(key: str, measure: Callable[[], Any]) -> Any:
    """measure() once per boot of this machine (a JSON value), kept in FLAGSEARCH_HOME/cache/
    bandwidth.json; measured every time where the boot id cannot be read. None (it could not be
    measured) is not kept: the next study tries again."""
    try:
        boot = BOOT_ID.read_text().strip()
    except OSError:
        return measure()
    path = flagsearch_home.home() / "cache" / "bandwidth.json"
    try:
        data = json.loads(path.read_text())
        if data.get("boot_id") == boot and key in data.get("values", {}):
            return data["values"][key]
    except (OSError, ValueError, AttributeError):
        data = {}
    value = measure()
    if value is None:
        return None
    values = data.get("values", {}) if isinstance(data, dict) and data.get("boot_id") == boot else {}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"boot_id": boot, "values": {**values, key: value}}))
        tmp.replace(path)  # whole or not at all: two studies starting together each write a whole file
    except OSError:
        pass
    return value


def build_roofline(model: ModelChoice, bandwidth_gb_s: float | None = None,
                   engine_python: str | None = None, measure_host: bool = True) -> Roofline | None:
    """A Roofline for this model on this device, or None when the bytes per token are unknown.

    Bandwidth: stated (GB/s) > measured on the GPU through the engine's torch > measured on the
    host memory (CPU engines) when `measure_host`."""
    bpt = bytes_per_token(model)
    if bpt is None:
        return None
    if bandwidth_gb_s:
        return Roofline(bpt[0], bandwidth_gb_s * 1e9, bpt[1], "stated")
    if engine_python:
        gpu = per_boot(f"gpu|{engine_python}", lambda: gpu_copy_bandwidth(engine_python))
        if gpu and gpu.get("device"):
            return Roofline(bpt[0], float(gpu["bytes_s"]), bpt[1], f"measured:{gpu['device']}")
    if measure_host:
        return Roofline(bpt[0], float(per_boot("host", host_copy_bandwidth)), bpt[1], "measured:host")
    return None
