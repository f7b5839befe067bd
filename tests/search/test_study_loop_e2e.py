"""The study loop on a real llama-server: a value the engine rejected is never launched again, a
stall during one trial cannot crown a winner once the top configs are confirmed (and a slower
config is confirmed slower), a wall-time budget stops a real study, a warm start queues the
earlier study's best first, and every load point is measured at each start."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest

from search.commands.confirm import confirm_study
from search.sampling.sampler import launch_configs
from search.sampling.warmstart import WARM_ATTR, warm_start
from search.space.space import parse_space
from search.store.summary import load_view
from search.study.noise import noise_line
from search.study.study import StudyRunner, counted_trials, default_storage
from tests.conftest import llama_space_doc

pytestmark = pytest.mark.e2e


def study_doc(name: str, trials: int, **extra: Any) -> dict[str, Any]:
    """The test space (tests.conftest.llama_space_doc) with one slot, three params, two measured
    runs of 48 tokens, a budget of `trials` and confirmation of the top 2."""
    doc = llama_space_doc(
        # Decode at -t 1: the suite runs two tests at once on two cores, and -t 2 crawls then (2x to 8x
        # slower than -t 1 beside a busy process, docs/measurement.md); the searched thread count is the
        # prompt's (-tb), one step an answer.
        engine_args={"ctx_size": 1024, "parallel": 1, "threads": 1},
        name=name,
        params={
            "threads_batch": {"type": "categorical", "choices": [1, 2], "default": 1},
            "batch_size": {"type": "categorical", "choices": [2048, 512], "default": 2048},
            "cache_type_k": {"type": "categorical", "choices": ["f16", "q9_0"], "default": "f16"},
        },
        measure={"repeats": 2, "warmup": True, "max_warmups": 2, "request_timeout_s": 60},
        workloads=[{"name": "single", "streams": ["qa"], "max_tokens": 48}],
        objectives=[{"metric": "single.output_tok_s", "direction": "maximize"}],
        constraints=["errors == 0"],
        budget={"trials": trials},
        confirm={"top_k": 2, "max_rounds": 5},
    )
    doc.update(extra)
    return doc


class Events:
    """A reporter that records everything and can act at a phase of a given trial."""

    def __init__(self, on_phase: Any = None):
        self.on_phase = on_phase
        self.number = -1
        self.finished: list[Any] = []
        self.notes: list[str] = []
        self.phases: list[str] = []

    def trial_started(self, number: int, index: int, total: int, config: object) -> None:
        self.number = number

    def phase(self, text: str) -> None:
        self.phases.append(text)
        if self.on_phase:
            self.on_phase(self.number, text)

    def trial_finished(self, record: Any) -> None:
        self.finished.append(record)

    def note(self, text: str) -> None:
        self.notes.append(text)


def runner_for(tmp: Path, doc: dict[str, Any], events: Events, **kw: Any) -> StudyRunner:
    results = tmp / "results" / doc["name"]
    return StudyRunner(parse_space(doc, doc["name"]), default_storage(results), doc["name"], results, events, **kw)


def test_a_rejected_value_is_never_launched_again(tmp_path: Path) -> None:
    events = Events()
    runner = runner_for(tmp_path, study_doc("rejected", 3), events)
    # Two different configs share cache_type_k=q9_0, which this llama-server build refuses.
    runner.study.enqueue_trial({"threads_batch": 1, "batch_size": 2048, "cache_type_k": "q9_0"})
    runner.study.enqueue_trial({"threads_batch": 1, "batch_size": 512, "cache_type_k": "q9_0"})
    runner.study.enqueue_trial({"threads_batch": 1, "batch_size": 512, "cache_type_k": "f16"})
    runner.run(n_trials=3)
    recs = {r.number: r for r in events.finished}
    assert recs[1].state == "failed" and recs[1].failure.cause == "bad_flag", recs[1].failure
    assert recs[1].failure.param == "cache_type_k"
    assert recs[2].state == "skipped" and recs[2].failure.cause == "rejected_value", recs[2].failure
    assert recs[2].failure.duplicate_of == 1 and not recs[2].command
    assert recs[3].state == "complete"
    assert runner.starts == 3, "the second q9_0 config must not be started"
    assert counted_trials(runner.study) == 3  # the skip cost no budget


def stall_during(trial_number: int, runner_box: list[StudyRunner]) -> Any:
    """A phase hook that freezes the server 70 of every 100 ms while `trial_number` warms up and
    measures: ~0.3x, well below the throttled config's ~0.6x."""
    state: dict[str, Any] = {}

    def on_phase(number: int, text: str) -> None:
        # From the first warm-up on: stalling only the measured runs let an unstalled warm-up count as
        # the first measured run (warm-ups that agree end the warm-up), and the median then sat near
        # the throttled config's.
        if number != trial_number or not ("measuring" in text or "warming up" in text) or state:
            return
        server = runner_box[0].active
        assert server is not None
        pid = int(server.server.pid)  # type: ignore[attr-defined]
        stop = threading.Event()

        def duty() -> None:
            while not stop.is_set():
                try:
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(0.07)
                    os.kill(pid, signal.SIGCONT)
                    time.sleep(0.03)
                except ProcessLookupError:
                    return

        state["stop"] = stop
        threading.Thread(target=duty, daemon=True).start()

    def end() -> None:
        if "stop" in state:
            state["stop"].set()

    on_phase.end = end  # type: ignore[attr-defined]
    return on_phase


def throttled_space(name: str) -> dict[str, Any]:
    """Two engines of the same llama-server build: `throttled` runs it under harness/launch/throttle.py,
    frozen 40% of every 100 ms: a real slowdown to ~0.6x whatever else the machine does (unlike
    thread counts, whose effect flips with the load on a 2-core machine)."""
    doc = study_doc(name, 3)
    plain = doc["engines"]["llamacpp"]
    throttle = Path(__file__).resolve().parents[2] / "harness" / "launch" / "throttle.py"
    doc["engines"]["throttled"] = {**plain, "dialect": "llamacpp",
                                   "command": [sys.executable, str(throttle), "0.4", "--", *plain["command"]]}
    doc["params"] = {"threads": {"type": "fixed", "value": 1},
                     "batch_size": {"type": "categorical", "choices": [2048, 512], "default": 2048}}
    return doc


@pytest.mark.slow  # statistical power on a real engine
@pytest.mark.serial
def test_confirmation_is_not_fooled_by_a_stall_and_confirms_a_slower_config(
        tmp_path: Path, record_branch: Callable[[str, str], None]) -> None:
    box: list[StudyRunner] = []
    hook = stall_during(0, box)
    events = Events(hook)
    runner = runner_for(tmp_path, throttled_space("confirm"), events)
    box.append(runner)
    # The default is frozen 70% of the time while it is measured (stall detection re-measures some of
    # it), so in the ranking the throttled config (~0.6x in truth) looks better than the default.
    runner.study.enqueue_trial({"engine": "throttled", "batch_size": 2048})
    try:
        runner.run(n_trials=2)
    finally:
        hook.end()
    view = load_view(runner.study)
    ranked = {r.number: view.ratio_to_default(r) for r in view.records}
    # The truly slower config must have looked better than the stalled default: the ranking is misled.
    assert ranked[1] is not None and ranked[1] > 1.0, f"the stall should have misled the ranking: {ranked}"

    # Up to 5 rounds: at 3 (2 degrees of freedom) a fresh-start spread of ~11% a round left the ~0.6x
    # config inconclusive in a calm fresh-clone run (0.64x, CI 0.19-2.19); the gate stops as soon as
    # it is settled. One claim (the ranking's best), so the whole budget is its own.
    result = confirm_study(runner.study, runner.space, tmp_path / "confirm", top_k=1, max_rounds=5,
                           progress=events.phase)
    assert result is not None
    verdicts = {k: v["verdict"] for k, v in result.verdicts.items()}
    assert set(verdicts) == {"1"}
    assert all(len(arm["runs"]) == result.rounds for arm in result.arms)  # fresh starts, every arm, every round
    assert "confirmation" in optuna.load_study(study_name="confirm", storage=runner.storage).user_attrs
    assert result.winner is None, result.answer  # the stall crowned no one
    if result.contended:  # other programs took the CPU: the tool says so rather than judge
        assert "withheld" in result.answer
        record_branch("fallback", "contended: verdict withheld")
        return
    if verdicts["1"] != "regressed":
        # Two fresh-clone runs saw this objective (end-to-end tok/s: a fresh start's first token included)
        # spread by up to +-50% between rounds: then the confirmation must say it could not tell, with the
        # change it could have seen, and still read the direction.
        assert verdicts["1"] == "inconclusive" and "could detect" in result.answer, result.answer
        assert result.verdicts["1"]["ratio"] < 0.9, result.answer
        record_branch("fallback", f"inconclusive at ratio {result.verdicts['1']['ratio']:.2f}")
        return
    assert "stays best" in result.answer or "distinguishable" in result.answer
    record_branch("detected", f"slower config confirmed regressed ({result.verdicts['1']['ratio']:.2f}x)")


def test_a_time_budget_stops_a_real_study(tmp_path: Path) -> None:
    events = Events()
    runner = runner_for(tmp_path, study_doc("budget", 6), events, budget_s=3600)
    runner.run(n_trials=1)  # one real trial teaches the estimator this engine's trial time
    per_trial = runner.estimator.trial_s("llamacpp")
    assert per_trial > 0
    again = runner_for(tmp_path, study_doc("budget", 6), Events(), budget_s=per_trial * 0.5)
    again.run(n_trials=6)
    assert again.stop_reason and "time budget" in again.stop_reason
    assert counted_trials(again.study) == 1, "no trial may start that cannot finish in the budget"


def quick_doc(name: str, trials: int) -> dict[str, Any]:
    """study_doc without warm-ups and with 24-token runs: for tests of the loop's bookkeeping."""
    doc = study_doc(name, trials)
    doc["measure"]["warmup"] = False
    doc["workloads"][0]["max_tokens"] = 24
    return doc


def test_warm_start_queues_the_earlier_best_and_informs_the_sampler(tmp_path: Path) -> None:
    first = runner_for(tmp_path, quick_doc("old-build", 3), Events())
    first.study.enqueue_trial({"threads_batch": 1, "batch_size": 512, "cache_type_k": "f16"})
    first.study.enqueue_trial({"threads_batch": 2, "batch_size": 2048, "cache_type_k": "f16"})
    first.run(n_trials=3)
    view = load_view(first.study)
    best = max((r for r in view.feasible if r.number != view.baseline_number), key=lambda r: r.objective_values[0])

    events = Events()
    second = runner_for(tmp_path, quick_doc("new-build", 2), events)
    queued, added = warm_start(second.study, first.study, top_k=1)
    assert (queued, added) == (1, 3)
    second.run(n_trials=2)
    own = events.finished
    assert own[0].number == 0 and own[0].params == second.space.default_config()
    assert {k: own[1].params[k] for k in ("threads_batch", "batch_size")} == {k: best.params[k]
                                                                        for k in ("threads_batch", "batch_size")}
    warm = [t for t in second.study.trials if t.user_attrs.get(WARM_ATTR)]
    assert len(warm) >= 3 and counted_trials(second.study) == 2
    assert len(load_view(second.study).records) == 2  # the earlier build's trials are not this study's results


def test_every_start_is_measured_at_every_load_point(tmp_path: Path) -> None:
    doc = study_doc("ladder", 1)
    doc["params"]["concurrency"] = {"type": "categorical", "choices": [1, 2], "side": "request"}
    doc["engines"]["llamacpp"]["args"]["parallel"] = 2
    events = Events()
    runner = runner_for(tmp_path, doc, events)
    runner.run(n_trials=1)
    (record,) = events.finished
    assert record.state == "complete", record.failure
    one, two = record.metrics["single@concurrency=1.output_tok_s"], record.metrics["single@concurrency=2.output_tok_s"]
    assert record.metrics["single.output_tok_s"] == pytest.approx((one * two) ** 0.5)
    assert runner.starts == 1


def test_the_default_is_re_measured_for_the_noise_floor(tmp_path: Path) -> None:
    doc = study_doc("noise", 2)
    doc["measure"]["noise_every"] = 1
    events = Events()
    runner = runner_for(tmp_path, doc, events)
    runner.run(n_trials=2)
    probes = runner.study.user_attrs.get("noise_probes")
    assert probes and len(probes) == 1 and probes[0]["value"] > 0 and probes[0]["runs"]
    assert runner.starts == 2 + 1  # two trials and one fresh start of the default
    line = noise_line(load_view(runner.study))
    assert line and "between 2 fresh starts" in line


def test_a_budget_of_8_over_24_configs_starts_8_distinct_configs(tmp_path: Path) -> None:
    """The H200 search that gave up: a conditional V cache type made measured configs look untried, the
    guided phase proposed them again and again (duplicates start nothing) and the study ended "exhausted"
    with most of the space untried. Here, 24 configs (the V cache type only where flash attention is on):
    every proposal starts a config not measured before, and a budget of 8 starts 8 of them. The stated
    noise floor is small so that the stop rule does not end the study first (it is tested on its own)."""
    doc = quick_doc("budget-distinct", 8)
    doc["params"] = {
        "threads_batch": {"type": "categorical", "choices": [1, 2], "default": 1},
        "batch_size": {"type": "categorical", "choices": [2048, 512], "default": 2048},
        "ubatch_size": {"type": "categorical", "choices": [512, 128], "default": 512},
        "flash_attn": {"type": "categorical", "choices": ["on", "off"], "default": "on"},
        "cache_type_v": {"type": "categorical", "choices": ["f16", "q8_0"], "default": "f16",
                         "when": {"flash_attn": "on"}},
    }
    doc["measure"] = {**doc["measure"], "repeats": 1, "noise_floor": 0.001}
    events = Events()
    runner = runner_for(tmp_path, doc, events)
    assert len(launch_configs(runner.space) or []) == 24
    runner.run(n_trials=8)
    assert runner.stop_reason is None, runner.stop_reason
    configs = [tuple(sorted(r.params.items())) for r in events.finished]
    assert len(events.finished) == 8 and len(set(configs)) == 8, configs  # no proposal repeated a config
    assert all(r.duplicate_of is None for r in events.finished)
    assert runner.starts == 8 and counted_trials(runner.study) == 8
