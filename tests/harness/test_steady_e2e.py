"""A real llama-server frozen for 2 s in the middle of a measured run: the run is flagged, left out
and measured again, so the stall sets no value (harness/steady.py).

The server runs under harness/throttle.py with no duty cycle and `--stall-s 2`: a SIGUSR1 to the
wrapper SIGSTOPs llama-server for 2 s, what a compile, a cache fill or a frozen neighbour does. The
signal is sent once the second measured run's request is in flight (the server's own
requests_processing gauge says so), so the stall lands inside that run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness import setup_paths
from harness.engines import get_engine
from harness.launch import LaunchSpec, get_launcher, wait_ready
from harness.launch.process import ProcessServer
from harness.measure import measure_workload
from harness.workloads import WorkloadSpec
from search.study import free_port
from tests.conftest import smollm2_gguf

pytestmark = pytest.mark.e2e

THROTTLE = Path(__file__).resolve().parents[2] / "harness" / "throttle.py"


@pytest.fixture()
def frozen_llama(tmp_path: Path) -> Iterator[ProcessServer]:
    binary = setup_paths.llama_server()
    if not binary.exists():
        pytest.fail(f"llama-server is missing at {binary}: run `make setup` first", pytrace=False)
    port = free_port()
    argv = (sys.executable, str(THROTTLE), "0", "--stall-s", "2", "--", str(binary), "-m", smollm2_gguf().path,
            "--host", "127.0.0.1", "--port", str(port), "-c", "2048", "-np", "1", "-t", "1", "--metrics")
    server = get_launcher("process").start(LaunchSpec(engine="llamacpp", argv=argv, host="127.0.0.1", port=port,
                                                      ready_timeout_s=60.0), tmp_path / "llama.log")
    assert isinstance(server, ProcessServer)
    try:
        wait_ready(server, "/health", 60.0)
        yield server
    finally:
        server.stop()


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


def test_a_frozen_server_mid_run_is_measured_again(frozen_llama: ProcessServer) -> None:
    done = threading.Event()
    started: list[threading.Thread] = []

    def progress(label: str) -> None:
        if "measuring 2/" in label and not started:
            started.append(threading.Thread(target=stall_when_busy, args=(frozen_llama, done), daemon=True))
            started[0].start()

    spec = WorkloadSpec("w", ("qa",), max_tokens=32)
    try:
        wm = asyncio.run(measure_workload(get_engine("llamacpp"), frozen_llama.spec.base_url, "m", spec, 3, True,
                                          120.0, [], progress))
    finally:
        done.set()
    # The frozen run (the second measured) is out; on a busy machine a scheduling stall of its own
    # may take the other re-measurement, which is the rule working too.
    frozen = [s for s in wm.samples if s.repeat == 1]
    assert frozen and frozen[0].excluded and frozen[0].flags, [s.flags for s in wm.samples]
    assert len(wm.counted) == 3
    # The frozen run's time is in no counted value: every counted run's slowest token gap or first
    # token is well under the 2 s freeze.
    for s in wm.counted:
        worst = max([r.ttft_s or 0.0 for r in s.requests] + [g for r in s.requests for g in r.chunk_gaps_s])
        assert worst < 1.5


def test_a_stretched_server_streams_intact_through_the_proxy(tmp_path: Path) -> None:
    """harness/throttle.py --stretch (the load-independent slowdown) serves the command's port as a
    proxy: readiness, the stream, its usage and the server's metrics all pass through it."""
    binary = setup_paths.llama_server()
    port = free_port()
    argv = (sys.executable, str(THROTTLE), "0.3", "--stretch", "--", str(binary), "-m", smollm2_gguf().path,
            "--host", "127.0.0.1", "--port", str(port), "-c", "2048", "-np", "1", "-t", "1", "--metrics")
    server = get_launcher("process").start(LaunchSpec(engine="llamacpp", argv=argv, host="127.0.0.1", port=port,
                                                      ready_timeout_s=60.0), tmp_path / "llama.log")
    try:
        wait_ready(server, "/health", 60.0)
        wm = asyncio.run(measure_workload(get_engine("llamacpp"), server.spec.base_url, "m",
                                          WorkloadSpec("w", ("qa",), max_tokens=16), 2, True, 120.0, [],
                                          lambda _: None))
    finally:
        server.stop()
    assert wm.errors == 0 and len(wm.counted) == 2
    assert all(r.output_tokens == 16 and r.ttft_s for s in wm.counted for r in s.requests)
    assert all(s.metrics_error is None and s.server.get("generation_tokens") == 16 for s in wm.counted)
