"""The host-load meter counts the CPU of servers we started as ours, even when they stop inside
the window (a fresh start per confirmation round). A server's workers are killed with it and
never reaped by us, so their CPU never reaches our children's times: only polling our process
tree sees it (reading the tree at the end called 0.8-0.9 cores of a calm machine "foreign")."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from harness.hostload import LoadMeter

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
