"""Whether two sides of a comparison differ by the change alone: for engines in Docker, both sides must
run the same base image, or one be an overlay of the other's image. Two different images (the user's
community image against the stock vLLM image, say) differ in torch, CUDA and the kernels built into
them, so their A/B measures the images, not the change; the dry run and the report say so, with what
differs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.builds.builds import BuildSpec
from harness.builds.overlay import parse_overlay
from harness.engines import EngineSettings

STOCK_IMAGES = ("vllm/vllm-openai",)


@dataclass(frozen=True)
class Origin:
    """The image a side runs, as planned: its base image and how the side gets it."""

    base: str  # the image reference everything else is built on
    how: str  # "as configured" | "image" | "overlay" | "script"
    text: str  # in words, for the messages


def origin(spec: BuildSpec | None, settings: EngineSettings) -> Origin | None:
    """None for a side that does not run in Docker (or whose image a script makes from a recipe)."""
    if settings.launcher != "docker":
        return None
    if spec is None:
        return Origin(str(settings.image), "as configured", f"the space's image {settings.image}")
    if spec.kind == "image":
        return Origin(spec.value, "image", f"image {spec.value}")
    if spec.kind == "overlay":
        base, _, pip = parse_overlay(spec.value)
        return Origin(base, "overlay", f"{base} with {pip} installed")
    return None  # a script builds its own image from a recipe: its lineage is the script's


def confounded(a: Origin | None, b: Origin | None) -> str | None:
    """A sentence when the two sides run different base images; None when they differ by the change only."""
    if a is None or b is None or _repo_tag(a.base) == _repo_tag(b.base):
        return None
    stock = [o for o in (a, b) if _repo_tag(o.base).split(":", 1)[0] in STOCK_IMAGES]
    why = (f"; {stock[0].text} is the stock vLLM image, which lacks kernels a community image builds for its GPU"
           if len(stock) == 1 else "")
    user = a if a.how in ("as configured", "overlay") else b
    return (f"confounded: A runs {a.text} and B runs {b.text}, two different base images: they differ in far more "
            f"than the change under test (torch, CUDA, the kernels built in){why}. To test a wheel or a PR on one "
            f"image, install it there: --b-build 'overlay:{user.base} -- SPEC' (SPEC a release, a .whl, "
            "vllm-wheel:COMMIT or precompiled:pr:N@WHEEL_COMMIT)")


def inside_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What two images hold differently (their manifests' `inside`): engine, commit, torch, CUDA."""
    out = []
    for key, label in (("version", "vLLM"), ("commit", "vLLM commit"), ("torch", "torch"), ("torch_cuda", "CUDA")):
        if a.get(key) != b.get(key):
            out.append(f"{label} {a.get(key) or 'none'} on A, {b.get(key) or 'none'} on B")
    return out


def _repo_tag(ref: str) -> str:
    """'repo' and 'repo:latest' are one image; a digest stays as it is."""
    ref = ref.strip()
    if "@" in ref or ref.startswith("sha256:"):
        return ref
    return ref if ":" in ref.rsplit("/", 1)[-1] else f"{ref}:latest"


def side_image(build: Any, settings: EngineSettings) -> tuple[str, dict[str, Any], str] | None:
    """(image id, what it holds, its base image id) of a side in Docker after its build: the build's
    manifest, or, for a side that runs the space's image as configured, that image read now."""
    if settings.launcher != "docker":
        return None
    manifest = build.manifest if build is not None else {}
    if manifest.get("kind") == "image":
        image_id = str(manifest.get("image_id") or build.image)
        return image_id, dict(manifest.get("inside") or {}), str(manifest.get("base_image_id") or image_id)
    if build is None and settings.image:
        from harness.builds.provenance import try_read_inside

        try:
            import docker

            image_id = str(docker.from_env(timeout=60).images.get(settings.image).id)
        except Exception:
            return None
        inside, _ = try_read_inside(image_id)
        return image_id, inside.as_dict() if inside else {}, image_id
    return None


def report_lines(a: tuple[str, dict[str, Any], str] | None, b: tuple[str, dict[str, Any], str] | None) -> list[str]:
    """The report's sentences on the two sides' images: what each holds, and whether they share a base."""
    if a is None or b is None:
        return []

    def held(side: tuple[str, dict[str, Any], str]) -> str:
        inside = side[1]
        bits = [f"vLLM {inside.get('version') or '?'}"] + ([f"commit {str(inside['commit'])[:12]}"]
                                                           if inside.get("commit") else [])
        bits.append(f"torch {inside.get('torch') or 'absent'}" + (f" (CUDA {inside['torch_cuda']})"
                                                                  if inside.get("torch_cuda") else ""))
        return f"{side[0][:19]}: " + ", ".join(bits)

    lines = [f"inside the images: A {held(a)}; B {held(b)}"]
    if a[2] != b[2] and a[0] != b[2] and b[0] != a[2]:
        differs = inside_differences(a[1], b[1])
        lines.append("confounded: A and B run different base images (not one overlay apart)"
                     + (f": {'; '.join(differs)}" if differs else "") + ". The comparison measures the images, "
                     "not the change alone")
    return lines
