"""Reading a study back: feasible trials, the best config(s), ratios against the default."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna

from search.store.results import TrialRecord, TrialState, check_study_format
from search.store.trial_index import RECORD_ATTR, final_numbers, study_records

GUIDE_ATTR = "guided_by"  # study user attr: what guided its workers' proposals (search/sampling/sampler.py writes it)


@dataclass
class StudyView:
    name: str
    objectives: list[tuple[str, str]]  # (metric, direction)
    records: list[TrialRecord]
    baseline_number: int | None
    confirmation: dict[str, Any] | None = None  # search.confirm.confirm.Confirmation, as stored in the study
    study: optuna.Study | None = None

    @staticmethod
    def is_feasible(r: TrialRecord) -> bool:
        """Measured and within every constraint. A duplicate carries its original's values and is
        not another result: counting it made per-load tables name "#8 best, next #7" for two
        copies of #6."""
        return (r.state == TrialState.COMPLETE and r.objective_values is not None
                and all(c <= 0 for c in r.constraint_values))

    @property
    def feasible(self) -> list[TrialRecord]:
        return [r for r in self.records if self.is_feasible(r)]

    @property
    def baseline(self) -> TrialRecord | None:
        return next((r for r in self.records if r.number == self.baseline_number), None)

    def best(self) -> list[TrialRecord]:
        """The best feasible trial (one objective) or the feasible Pareto front (several)."""
        feas = [r for r in self.feasible if r.state == TrialState.COMPLETE]
        if not feas:
            return []
        signs = [1.0 if d == "maximize" else -1.0 for _, d in self.objectives]

        def key(r: TrialRecord) -> list[float]:
            return [s * v for s, v in zip(signs, r.objective_values or [], strict=True)]

        if len(self.objectives) == 1:
            return [max(feas, key=key)]
        front = []
        for r in feas:
            kr = key(r)
            dominated = any(all(a >= b for a, b in zip(key(o), kr, strict=True)) and key(o) != kr for o in feas)
            if not dominated:
                front.append(r)
        return sorted(front, key=key, reverse=True)

    @property
    def guided_by(self) -> list[str]:
        """What guided the study's proposals after the design (search.sampling.sampler.GUIDE_ATTR: one entry per
        kind of worker; empty for a study from before it was recorded)."""
        attr = self.study.user_attrs.get(GUIDE_ATTR) if self.study is not None else None
        return [str(g) for g in attr] if isinstance(attr, list) else []

    def guide_line(self) -> str | None:
        """`search show`'s and the report's line on the guided phase; None where the study did not record it."""
        if not self.guided_by:
            return None
        return (f"guided phase (after the space-filling design): {'; then '.join(self.guided_by)}; the stop rule's "
                "model: flagsearch's own GP")

    def verdict(self) -> str:
        """The confirmed answer, or a plain statement that the ranking is unconfirmed."""
        c = self.confirmation
        if c is None:
            return ("unconfirmed ranking: run `search confirm` to re-measure the top configs beside the default "
                    "with fresh starts")
        return f"{c['answer']} ({c['rounds']} confirmation rounds, {c['wall_s']} s)"

    def ratio_to_default(self, record: TrialRecord) -> float | None:
        base = self.baseline
        if not base or not base.objective_values or not record.objective_values:
            return None
        if not base.objective_values[0]:
            return None
        return record.objective_values[0] / base.objective_values[0]


def load_view(study: optuna.Study) -> StudyView:
    check_study_format(study.user_attrs, f"study {study.study_name}")  # refuses a newer release's study
    records, baseline = [], None
    kept = study_records(study)  # trials of dead workers, recovered or given-up ones, recorded on the study
    final = final_numbers(study)
    for t in study.get_trials(deepcopy=False):
        data = t.user_attrs.get(RECORD_ATTR)
        if t.user_attrs.get("baseline") and baseline is None:
            baseline = t.number
        if t.number in final or (not data and t.number in kept):
            records.append(kept[t.number])
        elif data:
            records.append(TrialRecord.from_dict(data))
    metrics = study.user_attrs.get("objectives") or [[f"objective_{i}", d.name.lower()]
                                                     for i, d in enumerate(study.directions)]
    confirmation = study.user_attrs.get("confirmation")
    return StudyView(study.study_name, [tuple(m) for m in metrics], records, baseline,
                     confirmation if isinstance(confirmation, dict) else None, study)
