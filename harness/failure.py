"""One failure type for everything that can go wrong with one config: the cause (a short class),
what decided it, and the last log lines. Launchers, engines and the session produce it; the study,
ab, regress and baseline record it unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Cause(StrEnum):
    """Causes the tool itself assigns. Engines add their own classes (bad_flag, oom,
    max_model_len, ...) through their failure patterns; those are plain strings."""

    EXITED = "exited"
    TIMEOUT = "timeout"
    PORT_IN_USE = "port_in_use"
    CRASHED_AFTER_READY = "crashed_after_ready"
    UNRESPONSIVE = "unresponsive"
    DEGENERATE_OUTPUT = "degenerate_output"
    OBJECTIVE_MISSING = "objective_missing"
    WONT_FIT = "wont_fit"
    INTERRUPTED = "interrupted"
    INTERNAL_ERROR = "internal_error"
    REJECTED_VALUE = "rejected_value"


@dataclass
class Failure:
    """Why a config produced no result. `flag`/`value`: the engine named the offending flag;
    `duplicate_of`: the same config already failed in that trial (not launched again)."""

    cause: str
    detail: str
    log_tail: list[str] = field(default_factory=list)
    flag: str | None = None
    value: str | None = None
    param: str | None = None  # the space param behind `flag`
    duplicate_of: int | None = None


class TrialFailed(Exception):
    """A config could not be measured. Carries the Failure, the command that was run (or would
    have been) and, where the server got that far, the partial measurement."""

    def __init__(self, failure: Failure, command: str = "", log_path: str | None = None,
                 partial: object | None = None):
        super().__init__(f"{failure.cause}: {failure.detail}")
        self.failure = failure
        self.command = command
        self.log_path = log_path
        self.partial = partial

    # The names older callers read.
    @property
    def cause(self) -> str:
        return self.failure.cause

    @property
    def detail(self) -> str:
        return self.failure.detail

    @property
    def log_tail(self) -> list[str]:
        return self.failure.log_tail
