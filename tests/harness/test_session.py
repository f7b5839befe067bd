"""The one door, harness.Session.run, driven directly on a real llama-server (SmolLM2 Q4_1, about a
second to start): a kept server is reused for an equal request, `fresh` always starts anew, a server
that dies or freezes while it is measured is a classified TrialFailed (and the next run starts a new
one), and a start that fails is LaunchFailed with the engine's cause. Faults are injected with
signals to the real server process (the pool's handle on it is the only way to reach it)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from harness import Cause, LaunchFailed, MeasureSettings, Session, TrialFailed
from harness.flagsearch_home import llama_server
from harness.measure.workloads import WorkloadSpec
from tests.conftest import llama_request

pytestmark = pytest.mark.e2e

SHORT = [WorkloadSpec("w", ("qa",), max_tokens=8)]
ONE = MeasureSettings(repeats=1, warmup=False, request_timeout_s=30.0)
REPO = Path(__file__).resolve().parents[2]


def test_an_equal_request_reuses_the_kept_server(llama_session: Session, tmp_path: Path) -> None:
    starts = llama_session.starts
    first = llama_session.run(llama_request(tmp_path), SHORT, ONE)
    again = llama_session.run(llama_request(tmp_path), SHORT, ONE)
    assert again.reused_server and again.ready_s == 0.0
    assert again.base_url == first.base_url and again.command == first.command
    assert llama_session.starts <= starts + 1  # the first may itself reuse an earlier test's server
    assert again.workloads["w"].summary["output_tok_s"].median > 0
    other = llama_session.run(llama_request(tmp_path, threads=2), SHORT, ONE)  # another config: a new start
    assert not other.reused_server and other.base_url != first.base_url and other.ready_s > 0


def test_fresh_always_starts_anew(llama_session: Session, tmp_path: Path) -> None:
    llama_session.run(llama_request(tmp_path), SHORT, ONE)
    starts = llama_session.starts
    fresh = llama_session.run(llama_request(tmp_path, fresh=True), SHORT, ONE)
    assert not fresh.reused_server and fresh.ready_s > 0 and llama_session.starts == starts + 1
    assert " -t 1 " in fresh.command and fresh.fingerprint
    # The running server's own word on its build (llama.cpp /props), read at every start.
    assert fresh.fingerprint["server_build_info"]


class SignalWhenMeasuring:
    """A Session's progress callback that, once armed with the kept server, sends it a signal 0.5 s
    after the next measured run begins (not after a fixed delay: on a loaded machine that can
    land before the run reuses the server, which then starts a new one)."""

    def __init__(self, sig: signal.Signals):
        self.sig = sig
        self.pids: list[int] = []
        self.timer: threading.Timer | None = None

    def arm(self, session: Session) -> None:
        running = session.pool.running
        assert running is not None
        self.pids = running.server.owned_pids()
        assert self.pids

    def __call__(self, message: str) -> None:
        if self.pids and self.timer is None and ": measuring" in message:
            self.timer = threading.Timer(0.5, lambda: [os.kill(pid, self.sig) for pid in self.pids])
            self.timer.start()

    def join(self) -> None:
        assert self.timer is not None, "the measured run never began"
        self.timer.join()


def test_a_server_that_dies_while_measured_is_a_classified_crash(tmp_path: Path) -> None:
    long = [WorkloadSpec("w", ("qa",) * 2, max_tokens=2000)]
    kill = SignalWhenMeasuring(signal.SIGKILL)
    with Session(progress=kill) as session:
        session.run(llama_request(tmp_path / "a"), SHORT, ONE)  # started and kept
        kill.arm(session)
        with pytest.raises(TrialFailed) as info:
            session.run(llama_request(tmp_path / "a"), long, ONE)
        kill.join()
        assert info.value.failure.cause == Cause.CRASHED_AFTER_READY, info.value.failure
        assert session.pool.running is None  # the dead server is not kept
        after = session.run(llama_request(tmp_path / "a"), SHORT, ONE)  # the next run starts a new one
        assert not after.reused_server and after.workloads["w"].errors == 0


def test_a_frozen_server_is_unresponsive_and_stopped(tmp_path: Path) -> None:
    """Frozen mid-run, the run's request times out and is counted as an error (never a clean
    result); a kept server that no longer answers at all is UNRESPONSIVE, stopped, not reused."""
    frozen = MeasureSettings(repeats=1, warmup=False, request_timeout_s=2.0)
    long = [WorkloadSpec("w", ("qa",), max_tokens=2000)]
    freeze = SignalWhenMeasuring(signal.SIGSTOP)
    with Session(progress=freeze) as session:
        session.run(llama_request(tmp_path / "f"), SHORT, ONE)
        freeze.arm(session)
        measured = session.run(llama_request(tmp_path / "f"), long, frozen)
        freeze.join()
        assert measured.workloads["w"].errors_by_kind.get("timeout") == 1
        running = session.pool.running
        assert running is not None and running.alive()  # still frozen, still kept
        with pytest.raises(TrialFailed) as info:
            session.run(llama_request(tmp_path / "f"), SHORT, frozen)
        assert info.value.failure.cause == Cause.UNRESPONSIVE, info.value.failure
        assert session.pool.running is None and not running.alive()  # stopped, not left frozen


def test_a_start_that_fails_is_launch_failed_with_the_engines_cause(tmp_path: Path) -> None:
    with Session() as session, pytest.raises(LaunchFailed) as info:
        # a quantized V cache without flash attention: llama-server refuses to start
        session.run(llama_request(tmp_path, flash_attn="off", cache_type_v="q8_0"), SHORT, ONE)
    assert info.value.cause == "bad_flag" and "flash_attn" in info.value.detail
    assert session.starts == 1 and session.pool.running is None


def test_a_port_taken_before_the_server_binds_it_is_started_again_on_another(tmp_path: Path) -> None:
    """Another program takes the picked port between our pick and the engine's bind (the soak's fault
    engine listens on it, then execs the real llama-server, whose own log says it could not bind): the
    config is not at fault, so the door starts it again on a new port and the run completes."""
    faults = tmp_path / "faults"
    faults.mkdir()
    (faults / "port").touch()  # taken by the first start only
    wrapper = (sys.executable, str(REPO / "tests" / "soak" / "engine.py"), str(faults), str(llama_server()))
    request = llama_request(tmp_path)
    request = replace(request, settings=replace(request.settings, command=wrapper))
    said: list[str] = []
    with Session(progress=said.append) as session:
        measured = session.run(request, SHORT, ONE)
        assert session.starts == 2 and measured.workloads["w"].errors == 0
    assert any("port was taken before the server bound it" in line and "couldn't bind" in line for line in said), said
    assert not (faults / "port").exists()
