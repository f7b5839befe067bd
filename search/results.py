"""Trial results as stored: one JSON document per trial, written atomically, read back strictly."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


class ResultsError(Exception):
    """A results or baseline file is missing, partial or corrupted."""


def write_json_atomic(path: Path, data: Any) -> None:
    """Write then rename, so a crash or a full disk never leaves a partial file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path}: corrupted or partial JSON ({exc})") from None


@dataclass
class Failure:
    cause: str
    detail: str
    log_tail: list[str] = field(default_factory=list)


@dataclass
class TrialRecord:
    """Everything one trial learned. Stored in the study (user attrs) and as a JSON file."""

    number: int
    state: str  # complete | failed | duplicate | skipped
    params: dict[str, Any]
    engine: str
    model: str
    command: str = ""
    env: dict[str, str] = field(default_factory=dict)
    reused_server: bool = False
    ready_s: float | None = None
    startup: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # flat medians: "<workload>.<metric>"
    workloads: dict[str, Any] = field(default_factory=dict)  # full measurements with raw samples
    quality: dict[str, Any] | None = None
    placebo: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    failure: Failure | None = None
    objective_values: list[float] | None = None
    constraint_values: list[float] = field(default_factory=list)
    log_path: str | None = None
    duplicate_of: int | None = None
    wall_s: float | None = None

    def summary(self) -> dict[str, Any]:
        """The compact part kept in the study storage (raw samples stay in the JSON file)."""
        out = asdict(self)
        out.pop("workloads")
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialRecord:
        data = dict(data)
        failure = data.pop("failure", None)
        data.setdefault("workloads", {})
        try:
            return cls(failure=Failure(**failure) if failure else None, **data)
        except TypeError as exc:
            raise ResultsError(f"trial record does not match the expected fields: {exc}") from None
