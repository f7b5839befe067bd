"""A pure-Python package with an in-tree PEP 517 backend, and a git helper: builds from a local
repository (file://, no network) for the build and PR tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

BACKEND = '''
"""A minimal in-tree PEP 517 backend: a pure-Python wheel of one module, no dependencies. The
build's environment (what a vLLM build reads: VLLM_USE_PRECOMPILED, TORCH_CUDA_ARCH_LIST, ...) is
baked into the module as BUILD_ENV, so a test can see what the install ran with."""
import base64, hashlib, os, pathlib, zipfile

SEEN = ("VLLM_USE_PRECOMPILED", "VLLM_PRECOMPILED_WHEEL_COMMIT", "TORCH_CUDA_ARCH_LIST")

NAME, MODULE = "fakeengine", "fakeengine.py"


def _version():
    return pathlib.Path("VERSION").read_text().strip()


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    dist = f"{NAME}-{version}.dist-info"
    env = {k: os.environ[k] for k in SEEN if k in os.environ}
    files = {MODULE: pathlib.Path(MODULE).read_bytes() + f"\\nBUILD_ENV = {env!r}\\n".encode(),
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


def engine_repo(root: Path, module: str, name: str = "engine-src") -> tuple[Path, str]:
    """A git repository of the package `fakeengine` (module text `module`) on branch main, one
    commit: (path, commit)."""
    repo = root / name
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                         'backend-path = ["."]\n[project]\nname = "fakeengine"\n'
                                         'dynamic = ["version"]\n')
    (repo / "backend.py").write_text(BACKEND)
    (repo / "VERSION").write_text("1.0\n")
    (repo / "fakeengine.py").write_text(module)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "base")
    return repo, git(repo, "rev-parse", "HEAD")


def add_pull_request(repo: Path, module: str) -> str:
    """A branch `feature/x` whose module text is `module`, its head published as refs/pull/1/head as
    a forge does for PR #1; main checked out again. Returns the PR head's commit."""
    git(repo, "checkout", "-q", "-b", "feature/x")
    (repo / "fakeengine.py").write_text(module)
    git(repo, "commit", "-qam", "the PR")
    head = git(repo, "rev-parse", "HEAD")
    git(repo, "update-ref", "refs/pull/1/head", head)
    git(repo, "checkout", "-q", "main")
    return head


def pull_request_repo(root: Path, number: int, branch: str = "pr") -> tuple[Path, str]:
    """A git repository at `root` with a main commit and one more published as refs/pull/NUMBER/head
    (as a host publishes a pull request); (the repository, the PR head's commit)."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    (root / "README").write_text("base\n")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "base")
    git(root, "checkout", "-q", "-b", branch)
    (root / "README").write_text("the PR\n")
    git(root, "commit", "-qam", "the PR")
    head = git(root, "rev-parse", "HEAD")
    git(root, "update-ref", f"refs/pull/{number}/head", head)
    return root, head
