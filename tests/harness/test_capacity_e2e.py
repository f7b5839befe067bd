"""Capacity and stability on a real llama-server (SmolLM2 Q4_1), through the door: the load search
measures its steps on one kept server and reports a curve; a stability run reports its runs, errors
and drift, and a server killed mid-run as the run's failure with the classified cause."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from harness import MeasureSettings, Session
from harness.measure.capacity import Slo, find_capacity
from harness.measure.stability import MIN_RUNS, run_stability
from harness.measure.workloads import WorkloadSpec
from tests.conftest import llama_request

pytestmark = pytest.mark.e2e

CHAT = WorkloadSpec("chat", ("qa",), requests_per_stream=2, max_tokens=16)
SETTINGS = MeasureSettings(repeats=1, warmup=True, request_timeout_s=30.0)


def test_the_capacity_search_measures_a_curve_on_one_server(llama_session: Session, tmp_path: Path) -> None:
    starts = llama_session.starts
    slo = Slo({"ttft_p90_s": 30.0, "itl_p90_s": 5.0}, max_load=4)  # loose: every step meets it
    result = find_capacity(llama_session, llama_request(tmp_path), CHAT, slo, SETTINGS)
    assert result.capacity == 4 and result.limited_by == "max_load" and result.failure is None
    assert [s.concurrency for s in result.curve] == [1, 2, 4]
    assert all(s.requests == 2 * s.concurrency and s.errors == 0 and s.output_tok_s > 0 for s in result.curve)
    assert set(result.curve[0].latencies) == {"ttft_p90_s", "itl_p90_s"}
    assert llama_session.starts <= starts + 1  # every step on the same server
    tight = find_capacity(llama_session, llama_request(tmp_path), CHAT, Slo({"ttft_p90_s": 1e-4}), SETTINGS)
    assert tight.capacity == 0 and "ttft_p90_s" in tight.limited_by and len(tight.curve) == 1


def test_a_stability_run_reports_runs_errors_and_drift(llama_session: Session, tmp_path: Path) -> None:
    held = run_stability(llama_session, llama_request(tmp_path), CHAT, 2, 6.0, Slo({"ttft_p90_s": 30.0}), SETTINGS)
    assert held.failure is None and held.errors == 0 and held.slo_misses == 0
    assert len(held.samples) >= 3 and held.requests == 4 * len(held.samples)
    assert held.duration_s >= 6.0 and held.drift is not None
    assert held.drift.ci_low <= held.drift.pct_per_min <= held.drift.ci_high
    assert "no drift beyond noise" in held.summary() or "DRIFTS" in held.summary()


def test_a_run_longer_than_the_duration_still_measures_enough_runs_for_a_drift(llama_session: Session,
                                                                              tmp_path: Path) -> None:
    # A loaded machine once made one run of this workload last 10.7 s, beyond a 6-second stability run,
    # which then had one run and no drift. The run goes on until the drift can be fitted.
    held = run_stability(llama_session, llama_request(tmp_path), CHAT, 2, 0.0, Slo({"ttft_p90_s": 30.0}), SETTINGS)
    assert len(held.samples) == MIN_RUNS and held.drift is not None and held.failure is None


def test_a_server_killed_during_a_stability_run_is_its_failure(tmp_path: Path) -> None:
    with Session() as session:
        def kill() -> None:
            running = session.pool.running
            assert running is not None
            for pid in running.server.owned_pids():
                os.kill(pid, signal.SIGKILL)

        timer = threading.Timer(4.0, kill)
        timer.start()
        held = run_stability(session, llama_request(tmp_path, fresh=True), CHAT, 2, 60.0,
                             Slo({"ttft_p90_s": 30.0}), SETTINGS)
        timer.join()
    assert held.failure is not None and held.failure.startswith("crashed_after_ready"), held.failure
    assert held.duration_s < 30 and "FAILED: crashed_after_ready" in held.summary()
