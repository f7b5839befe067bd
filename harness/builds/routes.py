"""Shorthand build specs for the routes people take to test a vLLM change without a full CUDA compile,
expanded into ordinary pip or image specs (harness/builds/builds.py) before anything is resolved:

- ``pr:N`` -> ``vllm @ git+REPO@refs/pull/N/head``: a source build (a full C++/CUDA compile).
- ``precompiled:REF@WHEEL_COMMIT`` -> ``VLLM_USE_PRECOMPILED=1 VLLM_PRECOMPILED_WHEEL_COMMIT=WHEEL_COMMIT
  vllm @ git+REPO@REF``: a pip install, the change's Python over the compiled kernels of WHEEL_COMMIT.
- ``vllm-wheel:COMMIT`` -> ``PIP_EXTRA_INDEX_URL=INDEX/COMMIT PIP_PRE=1 vllm``: vLLM's per-commit wheel.
- ``vllm-image:COMMIT`` -> ``image:vllm/vllm-openai:nightly-COMMIT``: a per-commit image (a pull).
- ``image-script:REF -- CMD``: CMD (a community image script) run once per commit with {commit},
  {ref} and {tag} filled in; the image it tagged as {tag}.
- ``overlay:IMAGE -- [--deps] SPEC``: IMAGE (the user's own engine image) with the pip SPEC installed
  inside it, `--no-deps` unless --deps (harness/builds/overlay.py); SPEC may be any route above that
  ends as a pip spec (``overlay:vllm-node -- precompiled:pr:44700@WHEEL_COMMIT``).

REF is a branch, a tag, a commit, ``refs/pull/N/head`` or ``pr:N``. ``KEY=VALUE`` words in front of a
pip spec are the build's environment (``TORCH_CUDA_ARCH_LIST=12.1a pr:44700`` compiles for the
GB10 only); they are part of the build's identity and cache key. The repository, image and wheel
index are vLLM's unless FLAGSEARCH_VLLM_REPO, FLAGSEARCH_VLLM_IMAGE, FLAGSEARCH_VLLM_PACKAGE or
FLAGSEARCH_VLLM_WHEEL_INDEX say otherwise (a fork, a mirror; the tests use a file:// repository).
The wheel index has no default here: take the per-commit URL from vLLM's installation docs.
"""

from __future__ import annotations

import os
import re
import shlex

VLLM_REPO = "https://github.com/vllm-project/vllm"
VLLM_IMAGE = "vllm/vllm-openai"

_ASSIGN = re.compile(r"^([A-Z_][A-Z0-9_]*)=(\"[^\"]*\"|'[^']*'|\S*)\s+")


def vllm_repo() -> str:
    return os.environ.get("FLAGSEARCH_VLLM_REPO") or VLLM_REPO


def vllm_package() -> str:
    return os.environ.get("FLAGSEARCH_VLLM_PACKAGE") or "vllm"


def git_ref(ref: str) -> str:
    """'pr:44700' -> 'refs/pull/44700/head'; anything else as given."""
    m = re.fullmatch(r"pr:(\d+)", ref.strip())
    return f"refs/pull/{m.group(1)}/head" if m else ref.strip()


def split_env(text: str) -> tuple[dict[str, str], str]:
    """Leading KEY=VALUE words (shell style) and the rest of the spec."""
    env: dict[str, str] = {}
    rest = text.strip()
    while m := _ASSIGN.match(rest):
        env[m.group(1)] = shlex.split(m.group(2))[0] if m.group(2) else ""
        rest = rest[m.end():].lstrip()
    return env, rest


def join_env(env: dict[str, str], rest: str) -> str:
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), rest])


def _vllm_git(ref: str) -> str:
    return f"{vllm_package()} @ git+{vllm_repo()}@{git_ref(ref)}"


def expand(prefix: str, rest: str) -> tuple[str, str] | None:
    """(kind, value) for a shorthand prefix, or None when `prefix` is not one."""
    rest = rest.strip()
    if prefix == "pr":
        if not re.fullmatch(r"\d+", rest):
            raise ValueError(f"pr:{rest}: write pr:N with N the pull request number")
        return "pip", _vllm_git(f"pr:{rest}")
    if prefix == "precompiled":
        ref, sep, wheel = rest.rpartition("@")
        if not sep or not ref or not wheel:
            raise ValueError(f"precompiled:{rest}: write precompiled:REF@WHEEL_COMMIT, WHEEL_COMMIT being the vLLM "
                             "commit whose compiled kernels the change runs on (its merge base with main, or "
                             "'nightly'); without it vLLM takes main's newest wheel, which may not match the "
                             "source (undefined symbols at import)")
        return "pip", join_env({"VLLM_USE_PRECOMPILED": "1", "VLLM_PRECOMPILED_WHEEL_COMMIT": wheel}, _vllm_git(ref))
    if prefix == "vllm-wheel":
        index = os.environ.get("FLAGSEARCH_VLLM_WHEEL_INDEX")
        if not re.fullmatch(r"[0-9a-f]{7,40}", rest):
            raise ValueError(f"vllm-wheel:{rest}: write vllm-wheel:COMMIT (a vLLM commit on main)")
        if not index:
            raise ValueError("vllm-wheel:COMMIT needs FLAGSEARCH_VLLM_WHEEL_INDEX: the base URL of vLLM's "
                             "per-commit wheel index, from vLLM's installation docs (the commit is appended)")
        return "pip", join_env({"PIP_EXTRA_INDEX_URL": f"{index.rstrip('/')}/{rest}", "PIP_PRE": "1"},
                               vllm_package())
    if prefix == "vllm-image":
        if not re.fullmatch(r"[0-9a-f]{7,40}", rest):
            raise ValueError(f"vllm-image:{rest}: write vllm-image:COMMIT (a vLLM commit on main)")
        return "image", f"{os.environ.get('FLAGSEARCH_VLLM_IMAGE') or VLLM_IMAGE}:nightly-{rest}"
    if prefix == "overlay":
        if " -- " not in rest or not rest.partition(" -- ")[0].strip():
            raise ValueError(f"overlay:{rest}: write overlay:BASE_IMAGE -- [--deps] SPEC")
        return "overlay", rest
    if prefix == "image-script":
        ref, sep, cmd = rest.partition(" -- ")
        if not sep or not ref.strip() or not cmd.strip():
            raise ValueError(f"image-script:{rest}: write image-script:REF -- COMMAND (COMMAND may use {{commit}}, "
                             "{ref} and {tag}; it must tag the image it builds as {tag})")
        return "script", f"{ref.strip()} -- {cmd.strip()}"
    return None


def script_parts(value: str) -> tuple[str, str]:
    """An image-script value: (the vLLM ref, the command template)."""
    ref, _, cmd = value.partition(" -- ")
    return git_ref(ref), cmd


def fill_script(template: str, ref: str, commit: str, tag: str) -> str:
    """The command with {commit}, {ref} and {tag} filled in, each quoted for the shell."""
    return (template.replace("{commit}", shlex.quote(commit)).replace("{ref}", shlex.quote(ref))
            .replace("{tag}", shlex.quote(tag)))
