"""The build cache under FLAGSEARCH_HOME/builds: where builds live, one installer per folder at a time,
what is there, and removing what is no longer used."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import flagsearch_home

READY = ".flagsearch-build.json"  # the manifest; its presence means the build finished


def builds_dir() -> Path:
    return flagsearch_home.home() / "builds"


def cache_key(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """One installer per build directory at a time (two agents asking for the same build wait)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@dataclass
class CachedBuild:
    path: Path
    manifest: dict[str, Any]
    size_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "size_bytes": self.size_bytes,
                **{k: v for k, v in self.manifest.items() if k != "packages"}}


def _du(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total


def list_builds(sizes: bool = True) -> list[CachedBuild]:
    """Finished builds and bases under FLAGSEARCH_HOME/builds (unfinished ones are not listed)."""
    out = []
    for path in sorted(builds_dir().glob("*")):
        ready = path / READY
        if path.is_dir() and ready.exists():
            try:
                manifest = json.loads(ready.read_text())
            except ValueError:
                manifest = {"kind": "unreadable"}
            out.append(CachedBuild(path, manifest, _du(path) if sizes else 0))
    return out


def prune_builds(older_than_days: float | None = None, keep: set[str] | None = None,
                 dry_run: bool = False) -> list[Path]:
    """Remove builds not used for `older_than_days` (all builds when None) except `keep` (folder
    names), bases no remaining build uses, and half-finished folders. Returns what was (or would be)
    removed."""
    keep = keep or set()
    cutoff = None if older_than_days is None else time.time() - older_than_days * 86400
    removed: list[Path] = []
    cached = list_builds(sizes=False)
    kept_bases: set[str] = set()
    for b in cached:
        if b.manifest.get("kind") == "base":
            continue
        used = b.manifest.get("last_used") or b.manifest.get("created") or ""
        try:
            used_ts = dt.datetime.fromisoformat(used).timestamp()
        except ValueError:
            used_ts = 0.0
        if b.path.name in keep or (cutoff is not None and used_ts >= cutoff):
            kept_bases.add(str(b.manifest.get("base")))
            continue
        removed.append(b.path)
    removed += [b.path for b in cached if b.manifest.get("kind") == "base" and b.path.name not in kept_bases
                and b.path.name not in keep]
    finished = {b.path for b in cached}
    removed += [p for p in builds_dir().glob("*") if p.is_dir() and p not in finished and not _busy(p)]
    if not dry_run:
        for p in removed:
            with locked(p):
                shutil.rmtree(p, ignore_errors=True)
            with contextlib.suppress(OSError):
                Path(f"{p}.lock").unlink()
    return removed


def _busy(path: Path) -> bool:
    """An install holds the folder's lock: not half-finished, just not finished yet."""
    lock = Path(f"{path}.lock")
    if not lock.exists():
        return False
    with open(lock, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
    return False
