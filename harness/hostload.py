"""How much of the host's CPU other programs used while we measured.

The load average counts our own server too (an engine on 2 cores makes it ~2), so it cannot
tell a calm machine from a contended one. This does: CPU time of the whole host minus the CPU
time of this process and its descendants (the tool and the servers it started), over a window.
A window must end while the server it measured is still running, so that its CPU is counted as
ours."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import psutil

# Foreign load above this share of the host's cores makes a verdict untrustworthy (measured: the
# demo's ranking flipped under a load average of 15-22 on 2 cores, and held beside one busy core).
CONTENDED_SHARE = 0.35


def _tree_cpu_s() -> dict[tuple[int, float], float]:
    """CPU seconds (user + system) of this process and each live descendant, keyed by (pid,
    create time) so that a reused pid is another process."""
    me = psutil.Process()
    out: dict[tuple[int, float], float] = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            with p.oneshot():
                t = p.cpu_times()
                out[(p.pid, p.create_time())] = t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def _host_busy_s() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


@dataclass(frozen=True)
class LoadWindow:
    wall_s: float
    foreign_cores: float  # cores' worth of CPU used by programs other than ours, on average
    cores: int
    loadavg_1m: float
    own_cores: float = 0.0  # cores' worth of CPU used by this process and what it started

    @property
    def contended(self) -> bool:
        return self.foreign_cores > CONTENDED_SHARE * self.cores

    def to_dict(self) -> dict[str, float | int | bool]:
        return {"wall_s": round(self.wall_s, 2), "foreign_cores": round(self.foreign_cores, 3), "cores": self.cores,
                "loadavg_1m": round(self.loadavg_1m, 2), "own_cores": round(self.own_cores, 3),
                "contended": self.contended}


class LoadMeter:
    """start() ... stop() -> LoadWindow.

    Our CPU is every process of our tree, polled every POLL_S: a server stopped inside the window
    (a fresh start per confirmation round) keeps the CPU it was last seen with. Reading only the
    processes alive at stop() counted a stopped server's CPU as foreign (its workers are not
    reaped by us, so it never reaches our children's times): 0.8-0.9 cores of "foreign" load on a
    calm machine, measured in the demo's confirmation."""

    POLL_S = 0.5

    def start(self) -> LoadMeter:
        self._t, self._host = time.monotonic(), _host_busy_s()
        self._first = _tree_cpu_s()  # what our processes had used before the window
        self._last = dict(self._first)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._done.wait(self.POLL_S):
            self._last.update(_tree_cpu_s())

    def stop(self) -> LoadWindow:
        self._done.set()
        self._thread.join()
        self._last.update(_tree_cpu_s())
        wall = max(1e-6, time.monotonic() - self._t)
        own = sum(cpu - self._first.get(key, 0.0) for key, cpu in self._last.items())
        foreign = (_host_busy_s() - self._host) - own
        return LoadWindow(wall, max(0.0, foreign / wall), psutil.cpu_count() or 1, os.getloadavg()[0], own / wall)
