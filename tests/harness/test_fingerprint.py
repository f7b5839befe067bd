"""Fingerprints: what is material, refusal of comparisons, secrets never stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.host.fingerprint import (
    IncomparableError,
    check_comparable,
    fingerprint,
    host_fingerprint,
    material_differences,
    model_fingerprint,
    redact_argv,
)
from harness.launch.spec import LaunchSpec

BASE = {"cpu_model": "Xeon", "cpu_count": 2, "gpu_name": "NVIDIA GB10", "gpu_compute_capability": "12.1",
        "gpu_driver": "580", "torch": "2.9.0+cu130", "torch_cuda": "13.0", "engine": "vllm",
        "engine_version": "0.19.1", "model_id": "abc", "command": "vllm serve A", "host": "spark-1"}


def test_material_difference_refuses_the_comparison() -> None:
    cpu_torch = {**BASE, "torch": "2.9.0+cpu", "torch_cuda": None}  # the wheel that pulled CPU torch
    diffs = material_differences(BASE, cpu_torch)
    assert diffs == ["torch: '2.9.0+cu130' != '2.9.0+cpu'", "torch_cuda: '13.0' != None"]
    with pytest.raises(IncomparableError, match="torch_cuda"):
        check_comparable(BASE, cpu_torch)
    forced = check_comparable(BASE, cpu_torch, force=True)
    assert len(forced) == 2 and all(w.startswith("NOT COMPARABLE (forced)") for w in forced)


def test_what_differs_on_purpose_is_allowed_and_the_rest_is_not_material() -> None:
    other = {**BASE, "command": "vllm serve B", "host": "spark-2"}  # the flags under test; the host name
    assert check_comparable(BASE, other) == []
    new_wheel = {**BASE, "engine_version": "0.20.0"}
    assert check_comparable(BASE, new_wheel, allowed=("engine_version",)) == []
    with pytest.raises(IncomparableError):
        check_comparable(BASE, new_wheel)


def test_secrets_are_redacted_from_argv_and_env() -> None:
    assert redact_argv(["serve", "--api-key", "sk-123", "--hf-token=hf_abc", "--port", "8000"]) == \
        ["serve", "--api-key", "***", "--hf-token=***", "--port", "8000"]
    spec = LaunchSpec(engine="vllm", argv=("python", "-m", "x", "--api-key", "sk-secret-value"), host="127.0.0.1",
                      port=8000, env={"HF_TOKEN": "hf_secret", "VLLM_CPU_KVCACHE_SPACE": "1"})
    fp = fingerprint(spec, "/nowhere", engine_python=None, engine_version="0.32.0")
    text = repr(fp)
    assert "sk-secret-value" not in text and "hf_secret" not in text
    assert fp["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1" and fp["engine_version"] == "0.32.0"
    assert fp["cpu_count"] and fp["ram_gb"] > 0 and fp["engine"] == "vllm"


def test_model_identity_sees_a_changed_checkpoint(tmp_path: Path) -> None:
    a = tmp_path / "a"
    a.mkdir()
    (a / "config.json").write_text('{"hidden_size": 576}')
    (a / "model.safetensors").write_bytes(b"\x01" * 4096)
    fp1 = model_fingerprint(str(a))
    assert fp1["model_bytes"] == 4096 + len('{"hidden_size": 576}')
    (a / "model.safetensors").write_bytes(b"\x02" * 4096)  # same size, other weights (another quant)
    fp2 = model_fingerprint(str(a))
    assert fp2["model_bytes"] == fp1["model_bytes"] and fp2["model_id"] != fp1["model_id"]
    assert model_fingerprint(str(tmp_path / "missing")) == {"model_path": str(tmp_path / "missing")}


def test_host_fingerprint_has_the_basics() -> None:
    fp = host_fingerprint()
    assert fp["cpu_count"] >= 1 and fp["cpu_model"] and fp["ram_gb"] > 0
