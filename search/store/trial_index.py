"""What the study already knows about configs, indexed by their params: finished results (so an
identical config is never launched twice), values an engine rejected (never proposed again), and
configs other workers are running now. Refreshed incrementally: each stored record is read once."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState as OptunaState

from harness.failure import Cause
from search.store.results import TrialRecord, TrialState

RECORD_ATTR = "flagsearch_record"
# Records a finished trial's own attributes cannot hold (the public API cannot write them once it is
# finished), kept as study attributes "<prefix>.<number>": INTERRUPTED_ATTR for a trial of a dead
# worker (search/study/recovery.py); FINAL_ATTR for what a resume settled, which overrides the rest:
# a record recovered from its result.json after the storage write failed, or a config given up
# after its second interruption.
INTERRUPTED_ATTR = "interrupted"
FINAL_ATTR = "final"


def study_records(study: optuna.Study) -> dict[int, TrialRecord]:
    """The records kept as study attributes, FINAL_ATTR over INTERRUPTED_ATTR, by trial number."""
    out: dict[int, TrialRecord] = {}
    for prefix in (INTERRUPTED_ATTR, FINAL_ATTR):
        for key, data in study.user_attrs.items():
            if key.startswith(prefix + ".") and isinstance(data, dict):
                record = TrialRecord.from_dict(data)
                out[record.number] = record
    return out


def final_numbers(study: optuna.Study) -> set[int]:
    return {int(k.split(".", 1)[1]) for k in study.user_attrs if k.startswith(FINAL_ATTR + ".")}


def params_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


@dataclass
class TrialIndex:
    """Finished records by params; rejected (param, value) pairs; in-flight params of others."""

    finished: dict[str, TrialRecord] = field(default_factory=dict)
    rejected: dict[tuple[str, str], int] = field(default_factory=dict)  # (param, value) -> trial number
    running: dict[str, int] = field(default_factory=dict)
    _seen: set[int] = field(default_factory=set)

    def refresh(self, study: optuna.Study, own: int | None = None) -> None:
        """Read records of trials not seen before; rebuild the in-flight set (cheap: params only)."""
        self.running = {}
        kept: dict[int, TrialRecord] | None = None  # study_records, read once a refresh if needed
        for t in study.get_trials(deepcopy=False):
            if t.state == OptunaState.RUNNING and t.number != own:
                self.running[params_key(t.params)] = t.number
            if t.number in self._seen or t.state in (OptunaState.RUNNING, OptunaState.WAITING):
                continue
            self._seen.add(t.number)
            if t.state == OptunaState.FAIL:  # a resume may have settled its record on the study
                kept = study_records(study) if kept is None else kept
                if t.number in kept:
                    self.add(kept[t.number])
                    continue
            data = t.user_attrs.get(RECORD_ATTR)
            if data:
                self.add(TrialRecord.from_dict(data))

    def add(self, record: TrialRecord) -> None:
        failure = record.failure
        if failure is not None and failure.cause == Cause.INTERRUPTED:
            return  # an interrupted trial is re-run, not reused
        if failure is not None and failure.param in record.params and failure.duplicate_of is None:
            param = str(failure.param)
            self.rejected.setdefault((param, _text(record.params[param])), record.number)
        if record.state in (TrialState.COMPLETE, TrialState.FAILED) and failure_is_final(record):
            self.finished.setdefault(params_key(record.params), record)

    def identical(self, params: dict[str, Any]) -> TrialRecord | None:
        return self.finished.get(params_key(params))

    def in_flight(self, params: dict[str, Any]) -> int | None:
        return self.running.get(params_key(params))

    def rejected_value(self, params: dict[str, Any]) -> tuple[str, Any, int] | None:
        """(param, value, trial that showed it) when the config holds a value an engine rejected."""
        for name, value in params.items():
            number = self.rejected.get((name, _text(value)))
            if number is not None:
                return name, value, number
        return None


def failure_is_final(record: TrialRecord) -> bool:
    """A failure that the same config would meet again (not an interruption or a skip)."""
    f = record.failure
    return f is None or (f.cause not in (Cause.INTERRUPTED, Cause.REJECTED_VALUE) and f.duplicate_of is None)


def _text(value: Any) -> str:
    return json.dumps(value, default=str)
