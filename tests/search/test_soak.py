"""The soak under random faults (tests/soak/), short: 8 trials of a real llama-server study with
faults drawn from a fixed seed, the tool killed and resumed; then the audit's verdict. Also the
audit itself on hand-built studies, so that each of its findings is shown to fire."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from harness.failure import Failure
from search.store.results import TrialRecord, write_json_atomic
from search.store.results import TrialState as RecordState
from search.store.storage import BUDGET_ATTR
from search.store.trial_index import RECORD_ATTR
from tests.fault_server import print_past_capture
from tests.soak import driver as soak
from tests.soak.audit import Tally, audit_study, table


@pytest.mark.e2e
@pytest.mark.slow  # endurance: many faults over many trials; each fault has its own test in make test
def test_short_soak_loses_doubles_and_leaks_nothing(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # Seed 54 draws, over the first 9 trial starts: port, oom, oom, tool_term, engine_stop, -,
    # tool_kill, engine_kill (the draw order does not depend on timing; where each lands does).
    settings = soak.SoakSettings(trials=8, seed=54, rate=0.5, max_tokens=24, request_timeout_s=6.0,
                                 workdir=tmp_path)
    tally = soak.soak(settings)
    print_past_capture(request, f"\nsoak (8 trials, seed 54)\n{table(tally)}\n")
    assert tally.counted == tally.asked == 8
    assert not tally.lost, tally.lost
    assert not tally.doubled, tally.doubled
    assert not tally.uncaused, tally.uncaused
    assert not tally.leaked, f"processes left running: {tally.leaked}"
    assert not tally.problems, tally.problems
    assert all(f["cause"] for f in tally.failures)
    unexpected = [f for f in tally.faults if f.verdict.startswith("UNEXPECTED")]
    assert not unexpected, unexpected
    assert len([f for f in tally.faults if f.verdict == "as expected"]) >= 3, tally.faults
    tool = [f for f in tally.faults if f.kind in soak.TOOL_FAULTS]
    assert tool, "the seed draws tool faults: the resume path must run"
    assert tally.runs == 1 + len(tool), "each kill of the tool is followed by exactly one resume"


# ---- the audit on hand-built studies ------------------------------------------------------------
DIST = {"batch_size": CategoricalDistribution([128, 256, 512])}


def add(study: optuna.Study, trials_dir: Path, batch: int, state: TrialState = TrialState.COMPLETE,
        failure: Failure | None = None, record: bool = True, **attrs: Any) -> int:
    number = len(study.get_trials())
    rec = TrialRecord(number=number, state=RecordState.FAILED if failure else RecordState.COMPLETE,
                      params={"batch_size": batch}, engine="llamacpp", model="m", failure=failure,
                      metrics={"w.output_tok_s": 10.0, "errors": 0.0}, objective_values=None if failure else [10.0])
    if record:
        attrs[RECORD_ATTR] = rec.summary()
        write_json_atomic(trials_dir / f"{number:04d}" / "result.json", {**rec.summary(), "workloads": {}})
    study.add_trial(create_trial(state=state, params={"batch_size": batch}, distributions=DIST,
                                 values=[10.0] if state == TrialState.COMPLETE else None, user_attrs=attrs))
    return number


def audited(study: optuna.Study, trials_dir: Path, asked: int) -> Tally:
    tally = Tally(settings={}, asked=asked)
    audit_study(study, trials_dir, tally)
    return tally


def test_audit_passes_a_consistent_study_with_a_resumed_trial(tmp_path: Path) -> None:
    study = optuna.create_study(direction="maximize")
    add(study, tmp_path, 128)
    interrupted = add(study, tmp_path, 256, TrialState.FAIL, Failure("interrupted", "stopped"), interrupted=True)
    add(study, tmp_path, 256, resumed_from=interrupted)
    add(study, tmp_path, 128, **{BUDGET_ATTR: False})  # a duplicate: no budget, not measured again
    add(study, tmp_path, 512, failure=Failure("oom", "failed to allocate"))
    tally = audited(study, tmp_path, asked=3)
    assert (tally.lost, tally.doubled, tally.uncaused) == ([], [], [])
    assert tally.counted == 3 and tally.not_counted == {"interrupted": 1, "complete": 1}
    assert [f["cause"] for f in tally.failures] == ["interrupted", "oom"]


def test_audit_finds_lost_trials(tmp_path: Path) -> None:
    study = optuna.create_study(direction="maximize")
    add(study, tmp_path, 128)
    add(study, tmp_path, 256, TrialState.FAIL, Failure("interrupted", "stopped"), interrupted=True)
    add(study, tmp_path, 256, TrialState.WAITING, record=False, resumed_from=1)  # queued, never run
    add(study, tmp_path, 512, record=False)  # finished without a record
    tally = audited(study, tmp_path, asked=3)
    assert any("left WAITING" in x for x in tally.lost), tally.lost
    assert any("has no record" in x for x in tally.lost), tally.lost
    assert any("0 finished re-run" in x for x in tally.lost), tally.lost
    assert tally.counted == 2 and any("missing" in x for x in tally.lost)


def test_audit_finds_doubled_trials_and_causeless_failures(tmp_path: Path) -> None:
    study = optuna.create_study(direction="maximize")
    add(study, tmp_path, 128)
    add(study, tmp_path, 128)  # the same config measured twice
    add(study, tmp_path, 256, failure=Failure("", ""))
    add(study, tmp_path, 512, failure=Failure("internal_error", "KeyError: 'x'"))
    (tmp_path / "0000" / "result.json").unlink()
    tally = audited(study, tmp_path, asked=3)
    assert any("measured the config of #0 again" in x for x in tally.doubled), tally.doubled
    assert any("more than the 3 asked" in x for x in tally.doubled), tally.doubled
    assert len(tally.uncaused) == 2, tally.uncaused
    assert any("0000" in x and "unreadable" in x for x in tally.lost), tally.lost
