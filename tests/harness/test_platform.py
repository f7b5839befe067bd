"""Nothing assumes x86-64: the CPU model on a host whose /proc/cpuinfo has no "model name" (aarch64: a
DGX Spark, GH200), and no workflow or build example that names one platform's wheel unasked."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.host import fingerprint

REPO = Path(__file__).resolve().parents[2]
# /proc/cpuinfo of an Arm core: processor, BogoMIPS, Features, CPU implementer/part; no model name.
ARM_CPUINFO = ("processor\t: 0\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm aes sha2 crc32 atomics sve2\n"
               "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd85\n")


def test_cpu_model_without_a_model_name_line_comes_from_lscpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fingerprint.Path, "read_text", lambda self, *a, **k: ARM_CPUINFO)
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    names = [ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name:")]
    assert fingerprint._cpu_model() == "+".join(dict.fromkeys(names)) != ""


def test_no_workflow_names_an_x86_wheel() -> None:
    for wf in (REPO / ".github" / "workflows").glob("*.yml"):
        assert "x86_64.whl" not in wf.read_text(), wf
