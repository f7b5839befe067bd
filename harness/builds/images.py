"""Image builds: a tag pulled and pinned to its digest, and images built by a script from a vLLM ref.

A rolling tag (``vllm/vllm-openai:nightly``) moves every night: testing whatever copy happens to be
on the disk would test the first night's image forever. So a tag is pulled every time and pinned to
``REPO@sha256:...``, the digest being what runs and what is recorded (with the platform, since the
same tag names an amd64 and an arm64 image). A digest is pulled only if absent. A locally built
image has no registry to pull from: it is used as it is and pinned to its image id.
"""

from __future__ import annotations

import hashlib
import shlex
import subprocess
from typing import Any

from harness.builds.cache import builds_dir, cache_key, locked, now_iso
from harness.builds.envs import BuildError, BuildNotFound, Progress, quiet, resolve_git_ref
from harness.builds.routes import fill_script, script_parts, vllm_repo
from harness.launch.heartbeat import Heartbeat, PullProgress


def _pull(client: Any, ref: str, progress: Progress) -> Any:
    """`docker pull ref` with a heartbeat (harness/launch/heartbeat.py): bytes and layers done, on one
    redrawn terminal line or a progress line every 30 s; an error event raises as the SDK's own pull does."""
    import docker.errors
    from docker.utils import parse_repository_tag

    repository, tag = parse_repository_tag(ref)
    seen = PullProgress()
    beat = Heartbeat(f"pulling {ref}", progress) if progress is not quiet else None
    try:
        for event in client.api.pull(repository, tag=tag or "latest", stream=True, decode=True):
            if event.get("error"):
                raise docker.errors.APIError(str(event["error"]))
            seen.add(event)
            if beat:
                beat.beat(seen.line())
    finally:
        if beat:
            beat.done()
    return client.images.get(ref if tag else f"{ref}:latest")


def resolve_image(ref: str, progress: Progress = quiet, pull: bool = True) -> tuple[str, dict[str, Any]]:
    """REPO:TAG -> REPO@sha256:... (the digest is what runs and what is recorded)."""
    import docker
    import docker.errors

    pulled = None
    try:
        client = docker.from_env(timeout=600)
        try:
            local = client.images.get(ref)
        except docker.errors.ImageNotFound:
            local = None
        by_digest = "@sha256:" in ref
        built_here = local is not None and not local.attrs.get("RepoDigests")
        image = local
        if pull and not built_here and not (by_digest and local is not None):
            progress(f"pulling {ref}" + (" (a tag is pulled every time: it may have moved)" if not by_digest else ""))
            try:
                image = _pull(client, ref, progress)
                pulled = now_iso()
            except docker.errors.NotFound as exc:
                raise BuildNotFound(f"image {ref}: not found ({exc.explanation or exc})") from None
            except docker.errors.APIError as exc:
                stale = (f"; the local copy ({(local.attrs.get('RepoDigests') or ['?'])[0]}) is not used, since "
                         "it may be an old night's image" if local is not None else "")
                raise BuildError(f"image {ref}: the pull failed ({exc.explanation or exc}){stale}") from None
        if image is None:
            raise BuildNotFound(f"image {ref}: not on this host, and not pulled")
    except docker.errors.DockerException as exc:
        raise BuildError(f"image {ref}: {exc}") from None
    repo = ref.split("@", 1)[0]
    repo = repo.rsplit(":", 1)[0] if ":" in repo.rsplit("/", 1)[-1] else repo
    digests = [d for d in image.attrs.get("RepoDigests") or [] if d.split("@", 1)[0] == repo]
    if digests:
        pinned = digests[0]
    elif "@sha256:" in ref:
        pinned = ref
    else:
        # A locally built image has no registry digest; its content id is the exact identity.
        pinned = image.id
    platform = f"{image.attrs.get('Os', '?')}/{image.attrs.get('Architecture', '?')}"
    return pinned, {"kind": "image", "image_ref": ref, "image_digest": pinned, "image_id": image.id,
                    "image_platform": platform, **({"pulled": pulled} if pulled else {})}


def image_commands(ref: str) -> list[str]:
    """What resolving an image does, for --dry-run."""
    return [f"docker pull {shlex.quote(ref)}   # then pinned to the digest it names"]


def script_plan(value: str) -> tuple[str, str, str, str]:
    """(ref, commit, tag, command) of an image-script build: the ref resolved on vLLM's repository."""
    ref, template = script_parts(value)
    commit = resolve_git_ref(vllm_repo(), ref)
    key = cache_key("script", template, commit)
    tag = f"flagsearch-script:{key}"
    return ref, commit, tag, fill_script(template, ref, commit, tag)


def script_image(value: str, progress: Progress = quiet) -> tuple[str, dict[str, Any]]:
    """Run a community image script once per (script, commit) and pin the image it tagged."""
    ref, commit, tag, command = script_plan(value)
    log = builds_dir() / f"{tag.replace(':', '-')}.log"
    with locked(builds_dir() / tag.replace(":", "-")):
        try:
            pinned, manifest = resolve_image(tag, progress, pull=False)
        except BuildNotFound:
            progress(f"building {tag} for {ref} ({commit[:12]}): {command} (log: {log})")
            with log.open("w") as fh:
                proc = subprocess.run(["bash", "-c", command], stdout=fh, stderr=subprocess.STDOUT, check=False)
            if proc.returncode != 0:
                tail = log.read_text(errors="replace").strip().splitlines()[-6:]
                raise BuildError(f"image script failed (exit {proc.returncode}); last lines of {log}:\n"
                                 + "\n".join(tail)) from None
            try:
                pinned, manifest = resolve_image(tag, progress, pull=False)
            except BuildNotFound:
                raise BuildError(f"the image script exited 0 but tagged no image {tag}: it must use {{tag}} "
                                 f"(log {log})") from None
    script_sha = hashlib.sha256(command.encode()).hexdigest()[:12]
    return pinned, {**manifest, "kind": "image", "script": command, "script_sha": script_sha, "git_ref": ref,
                    "git_commit": commit, "git_url": vllm_repo()}
