"""The soak's audit (tests/soak/driver.py): a study checked against what was asked, and the tally table.

Rules (search/store/storage.py, search/study/recovery.py): the study holds exactly the trials asked that count
in the budget (duplicates, skips and interrupted trials do not), every trial has exactly one record
(on the trial, or on the study for a trial of a killed search) and its result file agrees, no trial
is left running or queued, no config is measured twice, each interrupted config is re-run exactly
once, and every failure or trial with request errors names its cause.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState as OptunaState

from search.store.results import read_record
from search.store.storage import BUDGET_ATTR, counted_trials
from search.store.trial_index import RECORD_ATTR, final_numbers, params_key
from search.study.recovery import interrupted_records


@dataclass
class Fault:
    kind: str
    event: int  # the n-th trial start of the soak (over every run) that drew it
    trial: int | None = None  # the trial it hit
    run: int = 0
    outcome: str = ""  # what the study recorded for it
    verdict: str = ""  # "as expected" | "missed: ..." | "UNEXPECTED: ..."


@dataclass
class Tally:
    settings: dict[str, Any]
    asked: int = 0
    counted: int = 0
    trials_in_study: int = 0
    not_counted: dict[str, int] = field(default_factory=dict)  # duplicates, skips
    runs: int = 0
    faults: list[Fault] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)  # every failed or erroring trial
    lost: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)
    uncaused: list[str] = field(default_factory=list)
    leaked: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # a run that ended in a way nobody asked for
    wall_s: float = 0.0
    loadavg: tuple[float, float] = (0.0, 0.0)  # 1-min load average at start and end

    @property
    def ok(self) -> bool:
        return not (self.lost or self.doubled or self.uncaused or self.leaked or self.problems
                    or any(f.verdict.startswith("UNEXPECTED") for f in self.faults))


def audit_study(study: optuna.Study, trials_dir: Path, t: Tally) -> dict[int, dict[str, Any]]:
    """Check the study against what was asked (t.asked); fill t's counts and findings; return the
    record of every trial by number."""
    trials = study.get_trials(deepcopy=False)
    by_number = {tr.number: tr for tr in trials}
    interrupted = interrupted_records(study)
    final = final_numbers(study)
    t.trials_in_study = len(trials)
    t.counted = counted_trials(study)
    if t.counted < t.asked:
        t.lost.append(f"{t.asked - t.counted} of the {t.asked} trials asked are missing")
    if t.counted > t.asked:
        t.doubled.append(f"{t.counted - t.asked} trials more than the {t.asked} asked")
    measured: dict[str, int] = {}
    records: dict[int, dict[str, Any]] = {}
    for tr in trials:
        if tr.state in (OptunaState.RUNNING, OptunaState.WAITING):
            t.lost.append(f"trial #{tr.number} left {tr.state.name}")
            continue
        attr = tr.user_attrs.get(RECORD_ATTR)
        kept = [r for r in (attr, interrupted[tr.number].summary() if tr.number in interrupted else None) if r]
        if tr.number in final:  # what a resume settled (recovered from its file, or given up) replaces the rest
            kept = [interrupted[tr.number].summary()]
        if not tr.user_attrs.get(BUDGET_ATTR, True) or tr.state == OptunaState.FAIL:
            why = "interrupted" if tr.state == OptunaState.FAIL and tr.user_attrs.get(BUDGET_ATTR, True) \
                else str(attr.get("state") if attr else "skipped")
            t.not_counted[why] = t.not_counted.get(why, 0) + 1
        if not kept:
            t.lost.append(f"trial #{tr.number} ({tr.state.name}) has no record")
            continue
        if len(kept) > 1:
            t.doubled.append(f"trial #{tr.number} has two records ({kept[0]['state']}, {kept[1]['state']})")
        record = records[tr.number] = kept[0]
        check_record(t, trials_dir, tr.number, record, attr is not None)
        cause = (record.get("failure") or {}).get("cause")
        if tr.user_attrs.get(BUDGET_ATTR, True) and cause != "interrupted" and record.get("duplicate_of") is None:
            key = params_key(tr.params)
            if key in measured:
                t.doubled.append(f"trial #{tr.number} measured the config of #{measured[key]} again")
            measured.setdefault(key, tr.number)
    # Each interrupted config is measured again exactly once, by a trial the resume queued (a
    # re-run interrupted in turn is queued again: the chain ends in one finished re-run).
    def cause(number: int) -> str:
        return str((records[number].get("failure") or {}).get("cause") or "")

    broken = {params_key(by_number[n].params) for n in records if cause(n) == "interrupted"}
    for key in sorted(broken):
        chain = [tr.number for tr in trials if params_key(tr.params) == key and tr.number in records]
        finished = [n for n in chain
                    if cause(n) != "interrupted" and by_number[n].user_attrs.get(BUDGET_ATTR, True)]
        if len(finished) != 1 or "resumed_from" not in by_number[finished[0]].user_attrs:
            where = t.lost if not finished else t.doubled
            where.append(f"interrupted config of trials {chain}: {len(finished)} finished re-run(s), expected 1")
    return records


def check_record(t: Tally, trials_dir: Path, number: int, record: dict[str, Any], in_trial: bool) -> None:
    """The trial's result file is whole and agrees with the study; a failure or a trial with request
    errors names its cause (the failure's, extended with the request error kinds)."""
    kinds: list[str] = []
    if in_trial:  # written by the loop with every record kept on the trial (not for a killed search's)
        path = trials_dir / f"{number:04d}" / "result.json"
        try:
            on_disk = read_record(path)
            if on_disk.number != number or on_disk.state != record["state"]:
                t.doubled.append(f"trial #{number}: {path.name} says #{on_disk.number} {on_disk.state}")
            kinds = sorted({k for w in on_disk.workloads.values()
                            for k in [*w.get("errors_by_kind", {}), *(k for s in w.get("samples", [])
                                                                      for k in s.get("errors_by_kind", {}))]})
        except Exception as exc:
            t.lost.append(f"trial #{number}: {path} unreadable ({exc})")
    failure = record.get("failure") or {}
    if not failure and not float((record.get("metrics") or {}).get("errors") or 0):
        return
    cause = "/".join(c for c in (failure.get("cause") or ("errors" if kinds else ""), "+".join(kinds)) if c)
    if not cause or not (failure.get("detail") or kinds) or cause.startswith("internal_error"):
        t.uncaused.append(f"trial #{number}: {record['state']} with cause {cause!r}: {failure.get('detail', '')}")
    t.failures.append({"trial": number, "state": record["state"], "cause": cause,
                       "detail": str(failure.get("detail") or "")[:100]})


def table(t: Tally) -> str:
    landed = Counter(f.kind for f in t.faults if f.verdict == "as expected")
    drawn = Counter(f.kind for f in t.faults)
    causes = Counter(f["cause"].split(":")[0] for f in t.failures)
    rows = [("trials asked / counted in the study", f"{t.asked} / {t.counted}"),
            ("trials in the study (not counted: interrupted, duplicates, skips)", f"{t.trials_in_study} "
             f"({', '.join(f'{k} {v}' for k, v in sorted(t.not_counted.items())) or 'none'})"),
            ("`search run` processes (1 + resumes)", str(t.runs))]
    rows += [(f"fault {k}: injected / hit a trial", f"{drawn[k]} / {landed[k]}") for k in sorted(drawn)]
    by_cause = ", ".join(f"{k} {v}" for k, v in sorted(causes.items())) or "0"
    rows += [("failures and erroring trials, by cause", by_cause),
             ("failures without a cause", str(len(t.uncaused))),
             ("lost trials", str(len(t.lost))), ("doubled trials", str(len(t.doubled))),
             ("leaked processes (tagged, any run's)", str(len(t.leaked))),
             ("wall time", f"{t.wall_s:.0f} s"), ("load average (1 min) at start / end", f"{t.loadavg[0]:.1f} / "
                                                  f"{t.loadavg[1]:.1f}")]
    lines = ["| | |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows), "",
             "| fault | start # | trial | recorded as | verdict |", "|---|---|---|---|---|"]
    lines += [f"| {f.kind} | {f.event} | {'#' + str(f.trial) if f.trial is not None else '-'} | {f.outcome or '-'} "
              f"| {f.verdict} |" for f in t.faults]
    lines += ["", "| trial | state | cause | detail |", "|---|---|---|---|"]
    lines += [f"| #{f['trial']} | {f['state']} | {f['cause']} | {f['detail'].replace('|', '/')} |" for f in t.failures]
    for name in ("lost", "doubled", "uncaused", "problems"):
        lines += [f"{name}: {x}" for x in getattr(t, name)]
    return "\n".join(lines)
