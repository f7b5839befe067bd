"""Loading a stored study for a report: the study view, each trial's result.json (raw samples),
and small facts about trials (ratios, notes, starts)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from search.store.results import ResultsError, TrialRecord, read_json
from search.store.summary import StudyView, load_view


@dataclass
class ReportInput:
    """Everything a report is made of: the study view, the study (importances) and raw results."""

    view: StudyView
    study: optuna.Study | None = None
    storage: str = ""
    results_dir: Path | None = None
    results: dict[int, dict[str, Any]] = field(default_factory=dict)  # trial number -> result.json
    problems: list[str] = field(default_factory=list)  # unreadable files, trials without a record


def find_results_dir(target: str, study_name: str, view: StudyView) -> Path | None:
    """Where the trials' result.json files are: the given folder, ./results/NAME, or (for a
    database storage) the folder the trials' server logs were written to on this host."""
    candidates = [Path(target), Path("results") / study_name]
    for r in view.records:
        if r.log_path:
            candidates.append(Path(r.log_path).parent.parent.parent)
    for c in candidates:
        if (c / "trials").is_dir():
            return c
    return None


def load_results(results_dir: Path, numbers: Iterable[int]) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """Read trials/NNNN/result.json for the given trials; a missing or corrupt file is a problem
    reported on the page and in the exports' absence, never a crash of the report."""
    out: dict[int, dict[str, Any]] = {}
    problems: list[str] = []
    for n in sorted(numbers):
        path = results_dir / "trials" / f"{n:04d}" / "result.json"
        if not path.exists():
            continue
        try:
            data = read_json(path)
        except ResultsError as exc:
            problems.append(str(exc))
            continue
        if not isinstance(data, dict):
            problems.append(f"{path}: expected a JSON object")
            continue
        out[n] = data
    return out, problems


def load_report_input(study: optuna.Study, storage: str, results_dir: Path | None = None,
                      target: str | None = None) -> ReportInput:
    """The study and its raw results. Without `results_dir`, look for them from `target` (the
    folder or name the user gave) with find_results_dir."""
    view = load_view(study)
    if results_dir is None and target is not None:
        results_dir = find_results_dir(target, study.study_name, view)
    inp = ReportInput(view=view, study=study, storage=storage, results_dir=results_dir)
    if results_dir is not None:
        inp.results, inp.problems = load_results(results_dir, (r.number for r in view.records))
    recorded = {r.number for r in view.records}
    for t in study.get_trials(deepcopy=False):
        if t.number in recorded:
            continue
        if t.state == TrialState.RUNNING:
            inp.problems.append(f"trial #{t.number} is still running (or its worker died and it was "
                                "not retried)")
        elif t.state != TrialState.WAITING:
            inp.problems.append(f"trial #{t.number} ({t.state.name.lower()}) has no flagsearch record")
    return inp


# ---- tables ---------------------------------------------------------------------------------------

def shown_params(records: Sequence[TrialRecord]) -> list[str]:
    """Parameter columns in first-seen order; engine/model only when they vary."""
    names: list[str] = []
    for r in records:
        for k in r.params:
            if k not in names:
                names.append(k)
    return [k for k in names if k not in ("engine", "model")
            or len({repr(r.params.get(k)) for r in records}) > 1]


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0 or not math.isfinite(base):
        return None
    return value / base


def starts_summary(view: StudyView) -> dict[str, int]:
    """Server starts made, starts saved by reusing a running server, identical configs not re-run."""
    return {
        "starts": sum(1 for r in view.records
                      if r.log_path and not r.reused_server and r.duplicate_of is None),
        "reused": sum(1 for r in view.records if r.reused_server),
        "duplicates": sum(1 for r in view.records if r.duplicate_of is not None),
    }


def trial_note(view: StudyView, r: TrialRecord) -> str:
    notes = []
    if r.number == view.baseline_number:
        notes.append("engine default")
    if r.failure:
        notes.append(f"{r.failure.cause}: {r.failure.detail}")
    elif r.duplicate_of is not None:
        notes.append(f"same config as #{r.duplicate_of}, not re-run")
    violated = [i for i, c in enumerate(r.constraint_values) if c > 0]
    if violated and not r.failure:
        notes.append(f"infeasible: constraint {', '.join(f'#{i + 1}' for i in violated)} violated")
    notes.extend(f"placebo? {p}" for p in r.placebo)
    return "; ".join(notes)


