"""How much of the host's CPU other programs used while we measured.

The load average counts our own server too (an engine on 2 cores makes it ~2), so it cannot
tell a calm machine from a contended one. This does: CPU time of the whole host minus the CPU
time of this process and its descendants (the tool and the servers it started), over a window.
A window must end while the server it measured is still running, so that its CPU is counted as
ours."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

# Foreign load above this share of the host's cores makes a verdict untrustworthy (measured: the
# demo's ranking flipped under a load average of 15-22 on 2 cores, and held beside one busy core).
CONTENDED_SHARE = 0.35


def _own_cpu_s() -> float:
    me = psutil.Process()
    mine = me.cpu_times()
    total = mine.children_user + mine.children_system  # children that exited and were reaped
    for p in [me, *me.children(recursive=True)]:  # and everything still running
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total


def _host_busy_s() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


@dataclass(frozen=True)
class LoadWindow:
    wall_s: float
    foreign_cores: float  # cores' worth of CPU used by programs other than ours, on average
    cores: int
    loadavg_1m: float

    @property
    def contended(self) -> bool:
        return self.foreign_cores > CONTENDED_SHARE * self.cores

    def to_dict(self) -> dict[str, float | int | bool]:
        return {"wall_s": round(self.wall_s, 2), "foreign_cores": round(self.foreign_cores, 3), "cores": self.cores,
                "loadavg_1m": round(self.loadavg_1m, 2), "contended": self.contended}


class LoadMeter:
    """start() ... stop() -> LoadWindow."""

    def start(self) -> LoadMeter:
        self._t, self._host, self._own = time.monotonic(), _host_busy_s(), _own_cpu_s()
        return self

    def stop(self) -> LoadWindow:
        wall = max(1e-6, time.monotonic() - self._t)
        foreign = (_host_busy_s() - self._host) - (_own_cpu_s() - self._own)
        return LoadWindow(wall, max(0.0, foreign / wall), psutil.cpu_count() or 1, os.getloadavg()[0])
