"""The capacity objective in a space: `objectives: [capacity]` with an `slo:` block, the errors a
wrong one gets, the measurement policy a non-workload objective watches, the stability load and
the duration `search confirm --stability` reads (no engine started)."""

from __future__ import annotations

import argparse
import copy

import pytest

from search.commands.confirm import duration_s
from search.confirm.confirm import stability_load
from search.space.space import SpaceError, parse_space
from search.store.results import TrialRecord, TrialState
from search.study.scoring import measure_settings, slo_of

BASE = {
    "name": "t",
    "engines": {"llamacpp": {"command": ["llama-server"]}},
    "models": [{"name": "m", "path": "/models/m.gguf"}],
    "params": {"parallel": {"type": "categorical", "choices": [1, 4], "default": 1}},
    "workloads": [{"name": "w", "streams": ["qa"], "max_tokens": 16},
                  {"name": "chat", "streams": ["qa", "code"], "max_tokens": 16}],
    "slo": {"workload": "chat", "ttft_p90_s": 1.0, "itl_p90_s": 0.1, "max_concurrency": 16},
    "objectives": ["capacity"],
}


def doc(**changes: object) -> dict:
    d = copy.deepcopy(BASE)
    d.update(changes)
    return {k: v for k, v in d.items() if v is not None}


def test_capacity_objective_and_slo_block() -> None:
    space = parse_space(doc(), "x.yaml")
    assert [(o.metric, o.direction) for o in space.m.objectives] == [("capacity.concurrency", "maximize")]
    slo = slo_of(space)
    assert slo is not None and slo.limits == {"ttft_p90_s": 1.0, "itl_p90_s": 0.1} and slo.max_load == 16
    # Capacity is no workload's per-run value: each workload's measurement watches decode_tok_s.
    policy = measure_settings(space).policy
    assert policy is not None and policy.metric == "decode_tok_s"
    mixed = parse_space(doc(objectives=["capacity", {"metric": "w.output_tok_s"}],
                            constraints=["capacity.ttft_p90_s <= 0.8"]), "x.yaml")
    assert [o.metric for o in mixed.m.objectives] == ["capacity.concurrency", "w.output_tok_s"]


@pytest.mark.parametrize("changes, message", [
    ({"slo": None}, "needs an `slo:` block"),
    ({"slo": {"max_concurrency": 8}}, "at least one latency limit"),
    ({"slo": {"ttft_p90_s": 1.0, "workload": "nope"}}, "slo.workload: 'nope' is not a workload"),
    ({"slo": {"ttft_p90_s": 1.0, "start_concurrency": 8, "max_concurrency": 4}}, "start_concurrency"),
    ({"slo": {"ttft_p90_s": -1.0}}, "slo.ttft_p90_s"),
    ({"slo": {"ttft_p95_s": 1.0}}, "slo.ttft_p95_s"),
])
def test_a_wrong_slo_is_a_one_line_error(changes: dict, message: str) -> None:
    with pytest.raises(SpaceError) as info:
        parse_space(doc(**changes), "x.yaml")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_stability_load_is_the_configs_capacity() -> None:
    space = parse_space(doc(), "x.yaml")
    record = TrialRecord(3, TrialState.COMPLETE, {"parallel": 4}, "llamacpp", "m",
                         metrics={"capacity.concurrency": 5.0})
    assert stability_load(space, record) == ("chat", 5)
    record.metrics["capacity.concurrency"] = 0.0  # not even one stream met the SLO: the workload's own
    assert stability_load(space, record) == ("chat", 2)
    plain = parse_space(doc(slo=None, objectives=[{"metric": "w.decode_tok_s"}]), "x.yaml")
    assert stability_load(plain, record) == ("w", 1)


def test_durations() -> None:
    assert [duration_s(t) for t in ("30m", "90s", "1h", "45", "0.5m")] == [1800, 90, 3600, 45, 30]
    for bad in ("", "10x", "-5m", "0"):
        with pytest.raises(argparse.ArgumentTypeError):
            duration_s(bad)
