"""A real llama-server frozen for 2 s in the middle of a measured run: the run is flagged, left out
and measured again, so the stall sets no value (harness/measure/steady.py).

The server runs under harness/launch/throttle.py with no duty cycle and `--stall-s 2`: a SIGUSR1 to the
wrapper SIGSTOPs llama-server for 2 s, what a compile, a cache fill or a frozen neighbour does. The
signal is sent once the second measured run's request is in flight (the server's own
requests_processing gauge says so), so the stall lands inside that run. Both servers are started
and measured through the door (Session.run): the wrapper is the engine's command, llama-server's
arguments follow it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from harness import MeasureSettings, RunRequest, Session
from harness.launch.process import ProcessServer
from harness.measure.workloads import WorkloadSpec
from tests.conftest import llama_settings, smollm2_gguf

pytestmark = pytest.mark.e2e

THROTTLE = Path(__file__).resolve().parents[2] / "harness" / "launch" / "throttle.py"
FLAGS = {"ctx_size": 2048, "parallel": 1, "threads": 1}


def throttled(tmp: Path, *options: str) -> RunRequest:
    """llama-server (SmolLM2 Q4_1, one slot) under harness/launch/throttle.py with these options."""
    binary = llama_settings().command[0]
    settings = llama_settings(command=(sys.executable, str(THROTTLE), *options, "--", binary))
    return RunRequest(settings, smollm2_gguf(), FLAGS, {}, tmp)


STALL_S = 2.0  # the freeze injected into the second measured run


def stall_when_busy(server: ProcessServer, done: threading.Event) -> None:
    """SIGUSR1 to the wrapper as soon as the server is processing a request."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not done.is_set():
        try:
            text = httpx.get(server.spec.base_url + "/metrics", timeout=5).text
        except httpx.HTTPError:
            text = ""
        if any(line.startswith("llamacpp:requests_processing") and float(line.split()[-1]) > 0
               for line in text.splitlines()):
            os.kill(server.pid, signal.SIGUSR1)
            return
        time.sleep(0.01)


def test_a_frozen_server_mid_run_is_measured_again(tmp_path: Path) -> None:
    done = threading.Event()
    started: list[threading.Thread] = []

    def progress(label: str) -> None:
        if "measuring 2/" in label and not started:
            running = session.pool.running  # the wrapper the door started: the signal's target
            assert running is not None and isinstance(running.server, ProcessServer)
            started.append(threading.Thread(target=stall_when_busy, args=(running.server, done), daemon=True))
            started[0].start()

    spec = WorkloadSpec("w", ("qa",), max_tokens=32)
    try:
        with Session(progress=progress, keep_server=False) as session:
            measured = session.run(throttled(tmp_path, "0", "--stall-s", str(STALL_S)), [spec],
                                   MeasureSettings(repeats=3, warmup=True, request_timeout_s=120.0))
    finally:
        done.set()
    wm = measured.workloads["w"]
    assert started, "the second measured run never began"
    # The frozen run (the second measured) is out; on a busy machine a scheduling stall of its own
    # may take the other re-measurement, which is the rule working too.
    frozen = [s for s in wm.samples if s.repeat == 1]
    assert frozen and frozen[0].excluded and frozen[0].flags, [s.flags for s in wm.samples]
    assert len(wm.counted) == 3
    # The frozen run's time is in no counted value: every counted run's slowest token gap or first
    # token is well under the 2 s freeze.
    for s in wm.counted:
        worst = max([r.ttft_s or 0.0 for r in s.requests] + [g for r in s.requests for g in r.chunk_gaps_s])
        assert worst < 0.75 * STALL_S  # the injected freeze's length, not the host's speed


def test_a_stretched_server_streams_intact_through_the_proxy(tmp_path: Path) -> None:
    """harness/launch/throttle.py --stretch (the load-independent slowdown) serves the command's port as a
    proxy: readiness, the stream, its usage and the server's metrics all pass through it."""
    with Session(keep_server=False) as session:
        measured = session.run(throttled(tmp_path, "0.3", "--stretch"), [WorkloadSpec("w", ("qa",), max_tokens=16)],
                               MeasureSettings(repeats=2, warmup=True, request_timeout_s=120.0))
    wm = measured.workloads["w"]
    assert "throttle.py 0.3 --stretch --" in measured.command
    assert wm.errors == 0 and len(wm.counted) == 2
    assert all(r.output_tokens == 16 and r.ttft_s for s in wm.counted for r in s.requests)
    assert all(s.metrics_error is None and s.server.get("generation_tokens") == 16 for s in wm.counted)
