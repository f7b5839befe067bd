"""The capacity search's logic (doubling, then bisection, over concurrency), a load step's SLO
verdict from its requests, the stability run's drift, and the KV capacity an engine's startup log
gives: no engine started (harness/measure/capacity.py, harness/measure/stability.py, Engine.kv_sequences)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engines import get_engine
from harness.measure.capacity import LoadStep, Slo, search, step_of
from harness.measure.client import RequestResult
from harness.measure.measure import WorkloadMeasurement
from harness.measure.sample import RunSample
from harness.measure.stability import StabilitySample, drift
from harness.measure.stats import summarize

DATA = Path(__file__).resolve().parent.parent / "data"


def fake(capacity: int, log: list[int]) -> object:
    """A server whose latency meets the SLO up to `capacity` streams."""
    def measure(c: int) -> LoadStep:
        log.append(c)
        meets = c <= capacity
        return LoadStep(c, 2 * c, 0, {"ttft_p90_s": 0.1 * c}, 10.0 * min(c, capacity), None, meets,
                        "" if meets else "ttft_p90_s too high")
    return measure


@pytest.mark.parametrize("capacity, expected_steps",
                         [(1, [1, 2]), (5, [1, 2, 4, 8, 6, 5]), (13, [1, 2, 4, 8, 16, 12, 14, 13])])
def test_doubling_then_bisection_finds_the_highest_load_within_the_slo(capacity: int,
                                                                        expected_steps: list[int]) -> None:
    log: list[int] = []
    result = search(fake(capacity, log), Slo({"ttft_p90_s": 1.0}, max_load=64, resolution=0.0))  # type: ignore[arg-type]
    assert result.capacity == capacity
    assert log == expected_steps
    assert [s.concurrency for s in result.curve] == sorted(expected_steps)
    assert result.limited_by == "ttft_p90_s too high"
    assert result.metrics()["capacity.concurrency"] == capacity
    assert result.metrics()["capacity.ttft_p90_s"] == pytest.approx(0.1 * capacity)


def test_the_search_stops_at_max_load_and_at_the_resolution() -> None:
    log: list[int] = []
    top = search(fake(100, log), Slo({"ttft_p90_s": 1.0}, max_load=12))  # type: ignore[arg-type]
    assert top.capacity == 12 and top.limited_by == "max_load" and log == [1, 2, 4, 8, 12]
    log.clear()
    coarse = search(fake(37, log), Slo({"ttft_p90_s": 1.0}, resolution=0.25))  # type: ignore[arg-type]
    # Stops once the gap between the last good and the first bad load is within 25% of the good one.
    assert coarse.capacity == 32 and log == [1, 2, 4, 8, 16, 32, 64, 48, 40]


def test_zero_capacity_when_the_first_load_misses() -> None:
    result = search(fake(0, []), Slo({"ttft_p90_s": 1.0}))  # type: ignore[arg-type]
    assert result.capacity == 0 and result.at_capacity is None
    assert result.metrics() == {"capacity.concurrency": 0.0, "capacity.steps": 1.0}


def test_a_failed_step_ends_the_search_with_its_cause() -> None:
    def measure(c: int) -> LoadStep:
        if c == 4:
            return LoadStep(c, 0, 0, {}, 0.0, None, False, "failed: crashed_after_ready: out of memory")
        return LoadStep(c, c, 0, {"ttft_p90_s": 0.1}, 5.0, None, True)
    result = search(measure, Slo({"ttft_p90_s": 1.0}))
    assert result.capacity == 2 and result.failure == "failed: crashed_after_ready: out of memory"


def test_slo_limits_are_named_percentiles() -> None:
    with pytest.raises(ValueError, match="ttft"):
        Slo({"ttft_s": 1.0})
    with pytest.raises(ValueError, match="start"):
        Slo({"ttft_p90_s": 1.0}, start=8, max_load=4)


def _request(ttft: float, gaps: list[float], ok: bool = True) -> RequestResult:
    return RequestResult("w", ok, 200 if ok else 500, 0.0, ttft + sum(gaps), ttft_s=ttft if ok else None,
                         chunk_gaps_s=gaps if ok else [], output_tokens=len(gaps) + 1 if ok else None)


def _measured(requests: list[RequestResult]) -> WorkloadMeasurement:
    sample = RunSample(0, 1.0, requests, {}, {"output_tok_s": 40.0}, {})
    stat = summarize([40.0])
    assert stat is not None
    return WorkloadMeasurement("w", len(requests), [sample], {"output_tok_s": stat})


def test_a_step_is_judged_on_the_percentiles_of_all_its_requests() -> None:
    slo = Slo({"ttft_p90_s": 0.5, "itl_p90_s": 0.05})
    fast = step_of(_measured([_request(0.1, [0.02] * 5)] * 9 + [_request(0.3, [0.02] * 5)]), slo, 10, 1.0)
    assert fast.meets and fast.latencies["ttft_p90_s"] == pytest.approx(0.12) and fast.output_tok_s == 40.0
    slow = step_of(_measured([_request(0.1, [0.02] * 5)] * 5 + [_request(0.9, [0.2] * 5)] * 5), slo, 10, 1.0)
    assert not slow.meets and "ttft_p90_s 0.9 > 0.5" in slow.why and "itl_p90_s" in slow.why
    failing = step_of(_measured([_request(0.1, [0.02] * 5), _request(0.1, [], ok=False)]), slo, 2, 1.0)
    assert not failing.meets and failing.errors == 1 and "1 of 2 requests failed" in failing.why
    tolerant = Slo({"ttft_p90_s": 0.5}, max_error_rate=0.5)
    assert step_of(_measured([_request(0.1, [0.02]), _request(0.1, [], ok=False)]), tolerant, 2, 1.0).meets


def _samples(values: list[float], every_s: float = 10.0) -> list[StabilitySample]:
    return [StabilitySample(i * every_s, v, 4, 0, {}, True) for i, v in enumerate(values)]


def test_drift_is_a_slope_with_an_interval() -> None:
    flat = drift(_samples([50.0, 51.0, 49.0, 50.5, 49.5, 50.0, 50.2, 49.8]), 80.0)
    assert flat is not None and not flat.significant and flat.ci_low < 0 < flat.ci_high
    falling = drift(_samples([50.0 - i for i in range(12)]), 120.0)  # -1 tok/s every 10 s: -6 tok/s a minute
    assert falling is not None and falling.significant and falling.ci_high < 0
    assert falling.pct_per_min == pytest.approx(-6 * 100 / 44.5, rel=1e-3)
    assert falling.total_pct == pytest.approx(2 * falling.pct_per_min, rel=1e-2)
    assert drift(_samples([50.0, 49.0]), 20.0) is None


def test_kv_capacity_from_the_startup_logs() -> None:
    llama = get_engine("llamacpp")
    info = llama.parse_startup((DATA / "llamacpp_cpu_ready.log").read_text())
    assert (info.kv_cache_tokens, info.facts["slots"], info.facts["slot_ctx_tokens"]) == (4096, "2", "2048")
    assert info.facts["kv_unified"] == "false"
    assert llama.kv_sequences(info, 2048) == 2.0  # one per slot, each slot 2048 cells
    assert llama.kv_sequences(info, 2049) == 0.0  # longer than a slot: none fits
    info.facts["kv_unified"] = "true"
    assert llama.kv_sequences(info, 1024) == 2.0 and llama.kv_sequences(info, 3000) == 1.0
    vllm = get_engine("vllm")
    paged = vllm.parse_startup((DATA / "vllm_cpu_ready.log").read_text())
    assert paged.kv_cache_tokens == 46592 and paged.max_concurrency == 22.75
    assert vllm.kv_sequences(paged, 2048) == 22.0 and vllm.kv_sequences(paged, 512) == 91.0
