"""Trial results as stored: one JSON document per trial, written atomically, read back strictly.

Everything written here is scrubbed of secrets first (harness.secrets): environment variables with
secret-looking names are redacted by name, and every known secret value (from such variables, and
literals written in the space under secret-named keys or flags) is redacted wherever it appears
(an argv, a log tail, an error message). Reads go through harness.files: bounded size and nesting,
one-line errors that name the file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from harness import secrets
from harness.failure import Failure
from harness.files import InputError, load_json


class TrialState(StrEnum):
    """A trial as flagsearch records it (Optuna's own state is derived from it when told).

    complete: measured. failed: no result (see its Failure). duplicate: the same config as an
    earlier trial, not launched again and not counted in the budget. skipped: never launched
    (a value the engine rejected before, or a config another worker is running). pruned:
    measured only until it was clearly worse than the incumbent."""

    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    DUPLICATE = "duplicate"
    SKIPPED = "skipped"
    PRUNED = "pruned"


STATES = tuple(s.value for s in TrialState)


# Stored formats carry a version ("name/N"); readers load every earlier version (migrating it)
# and refuse a newer one by name. Trial records: 1 = written before records were versioned (no
# `format` key; read as is: every field added since has a default); 2 = with `format`.
RECORD_FORMAT = "flagsearch-trial/2"


def format_version(value: object, name: str, current: int, where: str, missing: int | None = None) -> int:
    """The N of a `name/N` format marker, checked against what this release reads."""
    if value is None and missing is not None:
        return missing
    prefix = f"{name}/"
    if not isinstance(value, str) or not value.startswith(prefix) or not value[len(prefix):].isdigit():
        kind = name.removeprefix("flagsearch-")
        raise ResultsError(f"{where}: not a {kind} file (format {value!r}; expected {prefix}N)")
    version = int(value[len(prefix):])
    if version > current:
        raise ResultsError(f"{where}: written by a newer flagsearch ({value}); this one reads up to "
                           f"{prefix}{current}: upgrade flagsearch")
    return version


# The study's own user attributes (objectives, space_source, ...): `format` = STUDY_FORMAT, set when
# the study is created; studies without it are version 1 (0.1.0 wrote none). Version 2 added
# `confirmation`, `noise_probes`, `warm_start_from` and `interrupted.<n>` (a dead worker's record,
# kept on the study); every one is optional, so a version-1 study reads unchanged.
STUDY_FORMAT = "flagsearch-study/2"


def check_study_format(user_attrs: dict[str, Any], where: str) -> int:
    """The version of a study's user attributes; a study from a newer release is refused by name."""
    return format_version(user_attrs.get("format"), "flagsearch-study", 2, where, missing=1)


class ResultsError(Exception):
    """A results or baseline file is missing, partial, corrupted or cannot be written."""


def scrub(data: Any, known: list[str] | None = None) -> Any:
    """A copy of `data` with secret values replaced, and `env` mappings redacted by name."""
    return secrets.scrub(data, known)


def scrub_text(text: str) -> str:
    return secrets.scrub_text(text)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write then rename, so a crash or a full disk never leaves a partial file behind.

    The old file (if any) stays intact when writing fails; the error names the file and why."""
    try:
        text = json.dumps(scrub(data), indent=1, default=str)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ResultsError(f"{path}: cannot encode the results as JSON: {exc}") from None
    _write_atomic(path, text)


def _write_atomic(path: Path, text: str) -> None:
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        tmp = None
        _fsync_dir(path.parent)
    except OSError as exc:
        reason = "disk full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else (exc.strerror or str(exc))
        raise ResultsError(f"cannot write {path}: {reason}; the previous version (if any) is unchanged") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def read_json(path: Path) -> Any:
    """A stored JSON file, read with bounded cost (harness.files); errors name the file and why."""
    try:
        return load_json(path)
    except InputError as exc:
        raise ResultsError(str(exc)) from None


def write_text_atomic(path: Path, text: str) -> None:
    """Like write_json_atomic for a text file (a Markdown report, JUnit XML), scrubbed the same way."""
    _write_atomic(path, secrets.scrub_text(text))


def read_record(path: Path) -> TrialRecord:
    """One trial's result.json, checked field by field."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: expected a JSON object, got {type(data).__name__}")
    try:
        return TrialRecord.from_dict(data)
    except ResultsError as exc:
        raise ResultsError(f"{path}: {exc}") from None


@dataclass
class TrialRecord:
    """Everything one trial learned. Stored in the study (user attrs) and as a JSON file."""

    number: int
    state: TrialState
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
        """The compact part kept in the study storage (raw samples stay in the JSON file), scrubbed."""
        out = {"format": RECORD_FORMAT, **asdict(self)}
        out.pop("workloads")
        return scrub(out)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialRecord:
        if not isinstance(data, dict):
            raise ResultsError(f"trial record is a {type(data).__name__}, expected an object")
        data = dict(data)
        format_version(data.pop("format", None), "flagsearch-trial", 2, "trial record", missing=1)
        failure = data.pop("failure", None)
        data.setdefault("workloads", {})
        try:
            record = cls(failure=Failure(**failure) if failure else None, **data)
            record.state = TrialState(record.state) if record.state in STATES else record.state
        except TypeError as exc:  # repr: a key may hold any character, a newline included
            raise ResultsError(f"trial record does not match the expected fields: {str(exc)!r}") from None
        _check_record(record)
        return record


def _check_record(r: TrialRecord) -> None:
    """Types that a report relies on; a wrong one means the file was damaged or hand-edited."""
    problems = []
    if not isinstance(r.number, int) or isinstance(r.number, bool):
        problems.append(f"number is {r.number!r}")
    if r.state not in STATES:
        problems.append(f"state is {r.state!r} (expected one of {', '.join(STATES)})")
    if not isinstance(r.params, dict):
        problems.append("params is not an object")
    if not isinstance(r.metrics, dict) or not all(
            v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in r.metrics.values()):
        problems.append("metrics must map names to numbers")
    if r.objective_values is not None and (not isinstance(r.objective_values, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in r.objective_values)):
        problems.append("objective_values must be a list of numbers")
    if r.state in (TrialState.COMPLETE, TrialState.DUPLICATE) and r.objective_values is None:
        problems.append(f"state is {r.state!r} but objective_values is missing")
    if problems:
        raise ResultsError("trial record is damaged: " + "; ".join(problems))
