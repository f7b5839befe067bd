"""What a measurement ran on: host, accelerator, engine environment, model and launch.

Comparisons of measurements whose fingerprints differ in a material field are refused or
loudly flagged (a prebuilt wheel that silently pulled CPU torch is the classic trap).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psutil

from harness.launch.spec import LaunchSpec, redact_env

# Fields whose difference makes two measurements incomparable unless the comparison is about them.
MATERIAL = ("cpu_model", "cpu_count", "gpu_name", "gpu_compute_capability", "gpu_driver", "torch",
            "torch_cuda", "engine", "engine_version", "model_id")

_ENGINE_PROBE = r"""
import json, importlib
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
except Exception as exc:
    out["torch"] = None
for name in ("vllm", "sglang"):
    try:
        out["engine_version"] = importlib.import_module(name).__version__
        break
    except Exception:
        pass
print(json.dumps(out))
"""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gpus() -> dict[str, Any]:
    if not shutil.which("nvidia-smi"):
        return {}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True).stdout.strip().splitlines()
    except (subprocess.SubprocessError, OSError):
        return {}
    if not out:
        return {}
    name, cc, driver, memory = (x.strip() for x in out[0].split(","))
    return {"gpu_name": name, "gpu_compute_capability": cc, "gpu_driver": driver, "gpu_memory": memory,
            "gpu_count": len(out)}


def host_fingerprint() -> dict[str, Any]:
    return {"host": platform.node(), "os": platform.platform(), "cpu_model": _cpu_model(),
            "cpu_count": os.cpu_count(), "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
            **_gpus()}


def engine_env_fingerprint(python: str | None) -> dict[str, Any]:
    """torch / CUDA / engine version as seen by the engine's own interpreter."""
    if not python or not Path(python).exists():
        return {}
    try:
        proc = subprocess.run([python, "-c", _ENGINE_PROBE], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return {}


def model_fingerprint(path: str) -> dict[str, Any]:
    """A cheap identity for a checkpoint: total size and a hash of file names, sizes and configs."""
    p = Path(path)
    if not p.exists():
        return {"model_path": path}
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    digest = hashlib.sha256()
    size = 0
    for f in files:
        st = f.stat()
        size += st.st_size
        digest.update(f"{f.name}:{st.st_size}".encode())
        if f.suffix == ".json" and st.st_size < 1_000_000:
            digest.update(f.read_bytes())
    return {"model_path": path, "model_bytes": size, "model_id": digest.hexdigest()[:16]}


def fingerprint(spec: LaunchSpec, model_path: str, engine_python: str | None,
                engine_version: str | None = None) -> dict[str, Any]:
    out = {**host_fingerprint(), **engine_env_fingerprint(engine_python), **model_fingerprint(model_path)}
    out["engine"] = spec.engine
    if engine_version and not out.get("engine_version"):
        out["engine_version"] = engine_version
    out["launcher"] = spec.launcher
    if spec.image:
        out["image"] = spec.image
    out["command"] = spec.command_line()
    out["env"] = redact_env(spec.env)
    return out


def material_differences(a: dict[str, Any], b: dict[str, Any], allowed: tuple[str, ...] = ()) -> list[str]:
    """Material fields that differ, as 'field: a != b' lines (empty when comparable)."""
    return [f"{k}: {a.get(k)!r} != {b.get(k)!r}" for k in MATERIAL
            if k not in allowed and a.get(k) != b.get(k)]
