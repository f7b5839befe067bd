"""Resume after a crash (search/study/recovery.py) on a real Optuna study: an interrupted config is
queued again once per resume, and one cut short twice (a Ctrl-C aside) is failed with its cause
instead of being retried first in line forever."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import sqlalchemy.exc
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState as OptunaState

from harness.failure import Cause, Failure
from search.space.space import parse_space
from search.store.results import TrialRecord, TrialState, read_record
from search.store.storage import counted_trials, default_storage
from search.store.summary import load_view
from search.store.trial_index import RECORD_ATTR, TrialIndex
from search.study.recovery import BY_CTRL_C, INTERRUPTED_BY, INTERRUPTED_TWICE, jsonable, requeue_interrupted
from search.study.study import StudyRunner
from tests.conftest import Quiet, llama_space_doc

SPACE = {"engine": CategoricalDistribution(["llamacpp"]), "model": CategoricalDistribution(["m"]),
         "threads": CategoricalDistribution([1, 2])}


def interrupt_next(study: optuna.Study, detail: str, ctrl_c: bool = False) -> int:
    """Run the next queued trial and interrupt it as study.py does (its record on the trial)."""
    trial = study.ask(SPACE)
    record = TrialRecord(number=trial.number, state=TrialState.FAILED, params=dict(trial.params), engine="llamacpp",
                         model="m", failure=Failure(Cause.INTERRUPTED, detail))
    trial.set_user_attr(RECORD_ATTR, jsonable(record.summary()))
    trial.set_user_attr("interrupted", True)
    if ctrl_c:
        trial.set_user_attr(INTERRUPTED_BY, BY_CTRL_C)
    study.tell(trial, state=OptunaState.FAIL)
    return trial.number


def waiting(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(OptunaState.WAITING,)))


def test_a_config_interrupted_twice_is_failed_with_its_cause_not_queued_again() -> None:
    study = optuna.create_study()
    study.enqueue_trial({"engine": "llamacpp", "model": "m", "threads": 2})
    first = interrupt_next(study, "the search process running it (vm/1:2) died")
    assert requeue_interrupted(study) == [] and waiting(study) == 1  # once: queued again
    second = interrupt_next(study, "the search was terminated (SIGTERM) during this trial")
    assert requeue_interrupted(study) == [second] and waiting(study) == 0
    index = TrialIndex()
    index.refresh(study)
    final = index.identical({"engine": "llamacpp", "model": "m", "threads": 2})
    assert final is not None and final.number == second and final.state == TrialState.FAILED
    assert final.failure is not None and final.failure.cause == INTERRUPTED_TWICE
    assert f"#{first}: the search process running it (vm/1:2) died" in final.failure.detail
    assert "SIGTERM" in final.failure.detail
    assert counted_trials(study) == 1  # it counts like any failed trial
    # A later resume leaves it alone: its first interruption does not queue it again.
    assert requeue_interrupted(study) == [] and waiting(study) == 0


def test_a_ctrl_c_does_not_count_towards_giving_a_config_up() -> None:
    study = optuna.create_study()
    study.enqueue_trial({"engine": "llamacpp", "model": "m", "threads": 1})
    interrupt_next(study, "the search was interrupted (Ctrl-C) during this trial", ctrl_c=True)
    assert requeue_interrupted(study) == [] and waiting(study) == 1
    interrupt_next(study, "the search process running it (vm/1:2) died")
    assert requeue_interrupted(study) == [] and waiting(study) == 1  # one that counts: queued again


@pytest.mark.e2e
def test_a_trial_whose_storage_write_failed_is_kept_in_its_file_and_recovered_on_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The study storage fails (a lasting database outage) just as trial 1's record is stored, on a
    real llama-server: its result.json was written first and keeps it; the resume recovers the
    measurement from the file (no new start) and the study counts it."""
    doc = llama_space_doc(engine_args={"ctx_size": 512, "parallel": 1, "threads": 1}, name="outage",
                          measure={"repeats": 1, "warmup": False, "request_timeout_s": 60}, budget={"trials": 2})
    space = parse_space(doc, "outage")
    folder = tmp_path / "outage"
    storage = default_storage(folder)
    real = optuna.trial.Trial.set_user_attr

    def outage(self: optuna.trial.Trial, key: str, value: object) -> None:
        if key == RECORD_ATTR and self.number == 1:
            raise sqlalchemy.exc.OperationalError("UPDATE trial_user_attributes", {}, Exception("server closed"))
        real(self, key, value)

    monkeypatch.setattr(optuna.trial.Trial, "set_user_attr", outage)
    runner = StudyRunner(space, storage, "outage", folder, Quiet())
    runner.study.enqueue_trial({"threads": 2})
    with pytest.raises(sqlalchemy.exc.OperationalError):
        runner.run(n_trials=2)
    monkeypatch.setattr(optuna.trial.Trial, "set_user_attr", real)
    kept = read_record(folder / "trials" / "0001" / "result.json")
    assert kept.state == TrialState.COMPLETE and kept.params["threads"] == 2 and kept.objective_values

    again = StudyRunner(space, storage, "outage", folder, Quiet())
    again.run(n_trials=2)
    assert again.starts == 0, "the recovered trial must not be measured again"
    view = load_view(again.study)
    recovered = next(r for r in view.records if r.number == 1)
    assert recovered.state == TrialState.COMPLETE and recovered.metrics == kept.metrics
    assert counted_trials(again.study) == 2
