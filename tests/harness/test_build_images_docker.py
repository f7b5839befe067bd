"""Image builds against a REAL Docker engine (scripts/dockerd.sh): a locally built image is pinned to its id
without a pull, and an `image-script:` build runs a real `docker build` once per vLLM commit of a
`file://` repository's refs/pull/1/head, then reuses the tagged image."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from harness.builds.builds import ensure_build, parse_build, pinned_text
from harness.builds.images import resolve_image
from tests.conftest import TEST_IMAGE
from tests.fake_builds import pull_request_repo

pytestmark = pytest.mark.docker

IMAGE = TEST_IMAGE
PYTHON_IMAGE = "flagsearch/debian-python:bookworm"  # scripts/setup_debian_image.sh: a base with Python


def test_a_locally_built_image_is_pinned_to_its_id_without_a_pull(docker_client: docker.DockerClient) -> None:
    seen: list[str] = []
    pinned, manifest = resolve_image(IMAGE, seen.append)
    assert pinned == docker_client.images.get(IMAGE).id and manifest["image_platform"].startswith("linux/")
    assert not any("pulling" in s for s in seen)  # no registry has it: a pull could only fail or mislead


def test_image_script_builds_once_per_commit_of_a_pull_request(docker_client: docker.DockerClient, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("FLAGSEARCH_HOME", str(home))
    repo, head = pull_request_repo(tmp_path / "vllm-src", 1, branch="feature/x")
    monkeypatch.setenv("FLAGSEARCH_VLLM_REPO", f"file://{repo}")
    # A community-style script: builds an image for the given vLLM commit and tags it as asked. The image
    # holds a vLLM `_version.py` naming that commit (what a vLLM source build writes), since a built image
    # is asked what it holds (harness/builds/provenance.py) and refused when it holds another commit.
    script = tmp_path / "build-image.sh"
    script.write_text('#!/bin/bash\nset -e\necho "building vLLM $1"\nctx=$(mktemp -d)\nmkdir -p "$ctx/vllm"\n'
                      'touch "$ctx/vllm/__init__.py"\n'
                      'printf "__version__ = version = \'0.1\'\\n__commit_id__ = commit_id = \'%s\'\\n" "$1" '
                      '> "$ctx/vllm/_version.py"\n'
                      f'printf "FROM {PYTHON_IMAGE}\\nLABEL vllm.commit=$1\\nCOPY vllm /opt/fake/vllm\\n'
                      'ENV PYTHONPATH=/opt/fake\\n" > "$ctx/Dockerfile"\n'
                      'docker build -q --network host -t "$2" "$ctx"\n')
    spec = parse_build(f"image-script:pr:1 -- bash {script} {{commit}} {{tag}}")
    tags: list[str] = []
    try:
        built = ensure_build(spec)
        tags = [t for t in docker_client.images.get(built.image).tags if t.startswith("flagsearch-script:")]
        assert built.manifest["git_commit"] == head and built.manifest["git_ref"] == "refs/pull/1/head"
        assert docker_client.images.get(built.image).labels["vllm.commit"] == head
        assert built.manifest["inside"]["commit"] == head  # read inside the image, not taken from the script
        assert pinned_text(built) == f"image:{built.image}" and built.image.startswith("sha256:")
        # The same spec again: the tagged image is reused, the script does not run a second time.
        seen: list[str] = []
        again = ensure_build(spec, seen.append)
        assert again.image == built.image and not any(s.startswith("building") for s in seen)
        logs = list((home / "builds").glob("flagsearch-script-*.log"))
        assert len(logs) == 1 and f"building vLLM {head}" in logs[0].read_text()
    finally:
        for t in tags:
            docker_client.images.remove(t)
