"""The spaces that ship with flagsearch: the repository's spaces/, in the wheel as search/spaces (a link
in the source tree), so `search run smollm2-cpu` works from any folder after `pip install flagsearch`.

A name is looked up only when no file of that name exists: a user's own `spaces/x.yaml` always wins.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def shipped_dir() -> Path:
    return Path(str(resources.files("search").joinpath("spaces")))


def shipped_names() -> list[str]:
    folder = shipped_dir()
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def resolve_space(text: str) -> str:
    """`text` itself when it is a file; else the shipped space it names (`smollm2-cpu`,
    `smollm2-cpu.yaml` or `spaces/smollm2-cpu.yaml`); else `text` unchanged, for the loader's own
    "does not exist" error."""
    if Path(text).exists():
        return text
    given = Path(text)
    if given.parent not in (Path(), Path("spaces")):
        return text
    name = given.name.removesuffix(".yaml").removesuffix(".yml")
    candidate = shipped_dir() / f"{name}.yaml"
    return str(candidate) if candidate.is_file() else text
