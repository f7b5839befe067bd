"""What a measurement ran on: host, accelerator, engine environment, model and launch.

Comparisons of measurements whose fingerprints differ in a material field are refused (or,
when the caller forces them, loudly flagged): a prebuilt wheel that silently pulled CPU torch
is the classic trap (docs/domain.md, trap 5). torch and `torch.version.cuda` are read from the
ENGINE's own interpreter, never from ours.
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

from harness.builds.provenance import Inside, try_read_inside
from harness.engines import DIALECTS, Engine, get_engine
from harness.launch.cpus import format_cpu_list, parse_cpu_list
from harness.launch.spec import LaunchSpec, redact_argv, redact_env

# Fields whose difference makes two measurements incomparable unless the comparison is about them
# (an A/B of two engine versions passes allowed=("engine_version", "engine_commit", "torch", ...)).
MATERIAL = ("cpu_model", "cpu_count", "gpu_name", "gpu_count", "gpu_compute_capability", "gpu_driver",
            "torch", "torch_cuda", "torch_device", "engine", "engine_version", "engine_commit", "model_id", "cpus")

# argv[1]: {"distributions": [...], "commit_modules": [...]} from the engine modules (Engine.distributions).
_ENGINE_PROBE = r"""
import json, importlib, importlib.metadata as md, platform, sys
asked = json.loads(sys.argv[1])
out = {"engine_python_version": platform.python_version()}
for dist in asked["distributions"]:
    try:
        out.setdefault("engine_version", md.version(dist)); out.setdefault("engine_dist", dist)
    except md.PackageNotFoundError:
        pass
for module in asked["commit_modules"]:
    try:  # read <module>/_version.py as text: importing vllm itself takes tens of seconds
        import importlib.util, pathlib, re
        spec = importlib.util.find_spec(module)
        text = (pathlib.Path(spec.origin).parent / "_version.py").read_text()
        commit = re.search(r"commit_id\s*=\s*['\"]([0-9a-f]+)['\"]", text)
        out["engine_commit"] = commit.group(1) if commit else None
        break
    except Exception:
        pass
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["torch_device"] = "cuda" if torch.cuda.is_available() else "cpu"
    if torch.cuda.is_available():
        cc = torch.cuda.get_device_capability(0)
        out["torch_gpu_name"] = torch.cuda.get_device_name(0)
        out["torch_gpu_capability"] = f"{cc[0]}.{cc[1]}"
except Exception as exc:
    out["torch"] = None
    out["torch_error"] = f"{type(exc).__name__}: {exc}"[:200]
print(json.dumps(out))
"""

class IncomparableError(ValueError):
    """Two measurements differ in a material fingerprint field."""

    def __init__(self, differences: list[str]):
        self.differences = differences
        super().__init__("measurements are not comparable: " + "; ".join(differences))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    # aarch64 (a DGX Spark, GH200) has no "model name" in /proc/cpuinfo; lscpu names each core type
    # ("Cortex-X925", "Cortex-A725" on a GB10).
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        names = list(dict.fromkeys(ln.split(":", 1)[1].strip() for ln in out.splitlines()
                                   if ln.startswith("Model name:")))
        if names:
            return "+".join(names)
    except (OSError, subprocess.SubprocessError):
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


def _asked(engine: Engine | None) -> dict[str, list[str]]:
    """What the probe looks for: the engine's own distributions, or every engine module's."""
    engines = [engine] if engine is not None else [get_engine(d) for d in DIALECTS]
    return {"distributions": list(dict.fromkeys(d for e in engines for d in e.distributions)),
            "commit_modules": list(dict.fromkeys(m for e in engines for m in e.commit_modules))}


def engine_env_fingerprint(python: str | None, engine: Engine | None = None) -> dict[str, Any]:
    """torch / CUDA / engine version and commit as seen by the engine's own interpreter."""
    if not python or not Path(python).exists():
        return {}
    try:
        proc = subprocess.run([python, "-c", _ENGINE_PROBE, json.dumps(_asked(engine))], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        found: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return found
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return {"engine_probe_error": f"could not run {python}"}


def _edges_digest(path: Path, size: int, n: int = 1 << 20) -> bytes:
    """Hash of the first and last MiB: tells apart checkpoints of equal size, without reading 80 GB."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        h.update(f.read(n))
        if size > 2 * n:
            f.seek(size - n)
            h.update(f.read(n))
    return h.digest()


def model_fingerprint(path: str) -> dict[str, Any]:
    """A cheap identity for a checkpoint: total size, and a hash of file names, sizes, config
    files and the edges of every weight file."""
    p = Path(path)
    if not p.exists():
        return {"model_path": path}
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    digest = hashlib.sha256()
    size = 0
    for f in files:
        st = f.stat()
        size += st.st_size
        digest.update(f"{f.relative_to(p) if p.is_dir() else f.name}:{st.st_size}".encode())
        if f.suffix == ".json" and st.st_size < 1_000_000:
            digest.update(f.read_bytes())
        elif f.suffix in (".safetensors", ".gguf", ".bin", ".pt"):
            digest.update(_edges_digest(f, st.st_size))
    return {"model_path": path, "model_bytes": size, "model_id": digest.hexdigest()[:16]}


def fingerprint(spec: LaunchSpec, model_path: str, engine_python: str | None,
                engine_version: str | None = None, engine: Engine | None = None) -> dict[str, Any]:
    out = {**host_fingerprint(), **engine_env_fingerprint(engine_python, engine), **model_fingerprint(model_path)}
    out["engine"] = spec.engine
    if engine_version and not out.get("engine_version"):
        out["engine_version"] = engine_version
    out["launcher"] = spec.launcher
    if spec.image:
        out["image"] = spec.image
    if spec.launcher == "docker" and spec.image:
        # A container's engine environment is the image's: what it holds, read inside it (once per image).
        inside = image_inside(spec.image)
        if inside is not None:
            out["image_inside"] = inside.as_dict()
            for key, value in (("torch", inside.torch), ("torch_cuda", inside.torch_cuda),
                               ("engine_commit", inside.commit), ("engine_version", inside.version)):
                if out.get(key) is None and value is not None:
                    out[key] = value
    out["argv"] = redact_argv(spec.argv)
    out["command"] = spec.command_line()  # redacts secret flags, values and env itself
    out["env"] = redact_env(spec.env)
    # The CPUs the server was pinned to (None: not pinned). Material: pinning changed a small
    # model's GPU decode spread from ~2% to ~1%, so a pinned and an unpinned side are not alike.
    out["cpus"] = format_cpu_list(parse_cpu_list(spec.cpus)) if spec.cpus else None
    return out


_INSIDE: dict[str, Inside | None] = {}


def image_inside(image: str) -> Inside | None:
    """What a local image holds (harness/builds/provenance.py), cached for the process; None when it
    cannot be read (no Python in it, no Docker engine)."""
    if image not in _INSIDE:
        _INSIDE[image] = try_read_inside(image)[0]
    return _INSIDE[image]


def material_differences(a: dict[str, Any], b: dict[str, Any], allowed: tuple[str, ...] = ()) -> list[str]:
    """Material fields that differ, as 'field: a != b' lines (empty when comparable)."""
    return [f"{k}: {a.get(k)!r} != {b.get(k)!r}" for k in MATERIAL
            if k not in allowed and a.get(k) != b.get(k)]


def check_comparable(a: dict[str, Any], b: dict[str, Any], allowed: tuple[str, ...] = (),
                     force: bool = False) -> list[str]:
    """Refuse (raise IncomparableError) a comparison whose fingerprints differ materially; with
    `force`, return the differences as loud warnings instead."""
    diffs = material_differences(a, b, allowed)
    if diffs and not force:
        raise IncomparableError(diffs)
    return [f"NOT COMPARABLE (forced): {d}" for d in diffs]
