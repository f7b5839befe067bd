"""The host-load meter counts the CPU of servers we started as ours, even when they stop inside
the window (a fresh start per confirmation round). A server's workers are killed with it and
never reaped by us, so their CPU never reaches our children's times: only polling our process
tree sees it (reading the tree at the end called 0.8-0.9 cores of a calm machine "foreign")."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import psutil
import pytest

from harness.host.hostload import LoadMeter

# The meter judges the host's load: another test running beside it would be counted as foreign.
pytestmark = pytest.mark.serial

# A "server" whose worker burns CPU until killed; the server never waits for it.
SERVER = ("import subprocess, sys, time\n"
          "subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
          "time.sleep(120)")


def test_a_killed_servers_worker_counts_as_ours() -> None:
    meter = LoadMeter().start()
    server = subprocess.Popen([sys.executable, "-c", SERVER])
    try:
        deadline = time.monotonic() + 60
        worker = None
        while time.monotonic() < deadline:
            kids = psutil.Process(server.pid).children()
            if kids and kids[0].cpu_times().user >= 1.5:
                worker = kids[0]
                break
            time.sleep(0.1)
        assert worker is not None, "the worker never burned 1.5 s of CPU"
        worker.kill()  # the server does not reap it: its CPU reaches nobody's children times
    finally:
        server.kill()
        server.wait()
    window = meter.stop()
    own_cpu_s = window.own_cores * window.wall_s
    assert own_cpu_s >= 0.8, window  # the worker's CPU, seen by polling before it was killed
    assert window.to_dict()["own_cores"] == round(window.own_cores, 3)


def _orphan_busy_loop(seconds: float) -> int:
    """A CPU-burning process that is not our descendant (the shell that started it has exited), as a
    container's processes are dockerd's, not ours. It ends by itself after `seconds`."""
    loop = f"import time\nt = time.time() + {seconds}\nwhile time.time() < t: pass"
    out = subprocess.run(["sh", "-c", f"{sys.executable} -c '{loop}' >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_a_claimed_process_counts_as_ours_and_an_unclaimed_one_as_foreign() -> None:
    from harness.host import hostload

    # Our work and another program share core 0: that core's foreign load is what decides.
    ours = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time() + 6\nwhile time.time() < t: pass"])
    pid = _orphan_busy_loop(6)
    try:
        for p in (ours.pid, pid):
            psutil.Process(p).cpu_affinity([0])
        time.sleep(0.3)
        meter = LoadMeter().start()
        time.sleep(1.5)
        shared = meter.stop()
        assert shared.foreign_cores >= 0.3, shared  # not ours: another program's load on our core
        hostload.claim(pid)  # what the Docker launcher does with a container's init process
        meter = LoadMeter().start()
        time.sleep(1.5)
        claimed = meter.stop()
    finally:
        hostload._CLAIMED.discard(pid)
        ours.kill()
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    assert claimed.own_cores >= 0.7 and claimed.foreign_cores < 0.2, claimed


def test_another_process_on_the_gpu_makes_the_window_contended(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Fault injection: a stand-in nvidia-smi that reports 97% utilisation and a process that is not ours.
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$1\" in --query-gpu*) echo 97 ;; *) echo 999999 ;; esac\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    meter = LoadMeter().start()
    time.sleep(0.7)
    window = meter.stop()
    assert window.gpu_util_pct == 97.0 and window.gpu_foreign_pids == (999999,)
    assert window.contended and "other processes on the GPU: 999999" in window.why
