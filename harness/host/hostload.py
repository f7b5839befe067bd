"""How much of the host's CPU (and GPU) other programs used while we measured.

The load average counts our own server too (an engine on 2 cores makes it ~2), so it cannot
tell a calm machine from a contended one. This does: CPU time of the cores our processes ran on
minus the CPU time of our processes (the tool, the servers it started and the containers its
Docker launcher started: `claim`), over a window. A window must end while the server it measured
is still running, so that its CPU is counted as ours.

Judged per core of the cores we use: on a 2-core machine that is the whole machine; on a 128-core
host running a 2-core engine it is the few cores the engine and client were seen on, so 45 busy
cores elsewhere do not hide behind a share of 128 (nor count against us when they are elsewhere).
On a GPU host, other processes on the device and its utilisation are recorded; another process on
the device makes the window contended (a shared accelerator decides a ranking as a shared CPU does).

What no process table shows: another tenant of the physical host (a VM whose core's SMT sibling,
or whose overcommitted host, is busy) slows every program here unevenly while this machine looks
idle. `speed_probe` times a fixed piece of CPU work; `host_speed_note` says when it varied between
the rounds of a comparison (on a shared VM with nothing else running, one loop can take 0.67-1.33 s,
and llama-server's decode rate move 60-84 tok/s from one start to the next).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psutil

# Foreign load above this share of the host's cores makes a verdict untrustworthy (measured: a
# search's ranking flipped under a load average of 15-22 on 2 cores, and held beside one busy core).
CONTENDED_SHARE = 0.35


_CLAIMED: set[int] = set()  # processes we started that are not our descendants (containers' init)


def claim(pid: int) -> None:
    """Count this process and its descendants as ours (a container our Docker launcher started)."""
    if pid > 0:
        _CLAIMED.add(pid)


def _ours() -> list[psutil.Process]:
    roots = [psutil.Process()]
    for pid in list(_CLAIMED):
        try:
            roots.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            _CLAIMED.discard(pid)
    out = []
    for root in roots:
        try:
            out += [root, *root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def _tree_cpu_s(cores: set[int] | None = None) -> dict[tuple[int, float], float]:
    """CPU seconds (user + system) of our processes, keyed by (pid, create time) so that a reused pid
    is another process; the core each runs on now is added to `cores`."""
    out: dict[tuple[int, float], float] = {}
    for p in _ours():
        try:
            with p.oneshot():
                t = p.cpu_times()
                out[(p.pid, p.create_time())] = t.user + t.system
                if cores is not None:
                    cores.add(p.cpu_num())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def _busy_per_core() -> list[float]:
    return [sum(t) - t.idle - getattr(t, "iowait", 0.0) for t in psutil.cpu_times(percpu=True)]


def _gpu_state() -> tuple[float | None, list[int]]:
    """(GPU utilisation %, pids of processes on the GPU) from nvidia-smi; (None, []) without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, []
    try:
        util = subprocess.run([smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=5).stdout.split()
        apps = subprocess.run([smi, "--query-compute-apps=pid", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=5).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None, []
    values = [float(u) for u in util if u.replace(".", "", 1).isdigit()]
    return (max(values) if values else None), [int(a) for a in apps if a.isdigit()]


# sum(range(N)) runs in C without allocating: a few ms of one core, the same work on every call.
PROBE_N = 300_000
# A fixed piece of work that took this many times longer at its slowest than at its fastest, with
# nothing of ours running beside it, says the host itself changed speed: a VM whose host was busy
# varied 1.5-1.8x, a calm one within ~1.2x (3.1-3.7 ms over an hour).
HOST_SPEED_RATIO = 1.3


def speed_probe() -> float:
    """Milliseconds a fixed piece of CPU work took now (the fastest of 3 tries, so that one
    scheduler tick does not count; a tenant's load lasts seconds)."""
    best = math.inf
    for _ in range(3):
        t = time.perf_counter()
        sum(range(PROBE_N))
        best = min(best, time.perf_counter() - t)
    return 1000.0 * best


# A GPU engine whose device was at least this busy (the median over the windows of each window's
# highest utilisation) is bound by the GPU, not by the CPU that feeds it: the CPU's speed is then not
# what its measurements vary with. A judgment, not a measured boundary: a decode loop that waits on
# the host shows the device idle between kernels, well under it.
GPU_BOUND_PCT = 70.0


def gpu_busy_pct(windows: Sequence[dict[str, Any]]) -> float | None:
    """The median of the windows' highest GPU utilisation; None when no window saw a GPU (a CPU engine)."""
    seen = sorted(float(w["gpu_util_pct"]) for w in windows if w.get("gpu_util_pct") is not None)
    return seen[len(seen) // 2] if seen else None


def host_speed_note(probes_ms: list[float], windows: Sequence[dict[str, Any]] = ()) -> str:
    """'' unless the probes taken between a comparison's starts varied by HOST_SPEED_RATIO or more, and the
    engine is one the CPU's speed moves: a CPU engine, or a GPU engine whose device waited (`windows`: the
    comparison's LoadWindow.to_dict() records; a busy GPU there means the CPU is not its bottleneck)."""
    probes = [p for p in probes_ms if p > 0 and math.isfinite(p)]
    if len(probes) < 4 or max(probes) < HOST_SPEED_RATIO * min(probes):
        return ""
    busy = gpu_busy_pct(windows)
    if busy is not None and busy >= GPU_BOUND_PCT:
        return ""
    why = (f" (the GPU was busy only {busy:.0f}% of the time: the CPU that feeds it may be what limits it)"
           if busy is not None else "")
    return (f"this machine's CPU speed varied between starts: a fixed piece of work took {min(probes):.1f}-"
            f"{max(probes):.1f} ms ({max(probes) / min(probes):.2f}x) before our starts{why}; other programs here, "
            "or another tenant of the physical host (a VM's shared core, which no process table shows), slow "
            "the measurements unevenly: expect wider intervals")


@dataclass(frozen=True)
class LoadWindow:
    wall_s: float
    foreign_cores: float  # cores' worth of CPU used by other programs on the cores we used, on average
    cores: int  # the cores we used (our processes were seen on them)
    loadavg_1m: float
    own_cores: float = 0.0  # cores' worth of CPU used by our processes
    host_cores: int = 0
    gpu_util_pct: float | None = None  # the device's highest utilisation seen
    gpu_foreign_pids: tuple[int, ...] = ()  # processes on the GPU that are not ours
    probe_ms: float = math.nan  # speed_probe() as the window opened

    @property
    def contended(self) -> bool:
        return self.foreign_cores > CONTENDED_SHARE * self.cores or bool(self.gpu_foreign_pids)

    @property
    def why(self) -> str:
        parts = []
        if self.foreign_cores > CONTENDED_SHARE * self.cores:
            parts.append(f"other programs used {self.foreign_cores:.2f} of the {self.cores} cores we ran on")
        if self.gpu_foreign_pids:
            parts.append(f"other processes on the GPU: {', '.join(map(str, self.gpu_foreign_pids))}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, object]:
        return {"wall_s": round(self.wall_s, 2), "foreign_cores": round(self.foreign_cores, 3), "cores": self.cores,
                "host_cores": self.host_cores, "loadavg_1m": round(self.loadavg_1m, 2),
                "own_cores": round(self.own_cores, 3), "gpu_util_pct": self.gpu_util_pct,
                "gpu_foreign_pids": list(self.gpu_foreign_pids), "contended": self.contended,
                "probe_ms": round(self.probe_ms, 3)}


def load_note(windows: Sequence[dict[str, Any]]) -> str:
    """A note when other programs took the engine's cores (or its GPU) in over a quarter of the
    turns' windows (LoadWindow.to_dict() each), as the confirmation's withheld verdict counts them:
    on the cores an engine uses in full, one other busy process slows it several-fold
    (docs/measurement.md), so the verdicts may be the load's."""
    hit = [w for w in windows if w.get("contended")]
    if not windows or len(hit) <= len(windows) / 4:
        return ""
    worst = max(hit, key=lambda w: float(w.get("foreign_cores") or 0.0))
    gpu = sorted({int(p) for w in hit for p in w.get("gpu_foreign_pids") or []})
    foreign = float(worst.get("foreign_cores") or 0.0)
    what = f"other programs used up to {foreign:.2f} of the {worst.get('cores')} cores we ran on"
    if gpu:
        what += f"; other processes were on the GPU ({', '.join(map(str, gpu))})"
    return (f"the machine was not quiet in {len(hit)} of {len(windows)} turns: {what}; these verdicts may be "
            "the load's: measure again on a quiet machine")


class LoadMeter:
    """start() ... stop() -> LoadWindow.

    Our CPU is every process of our tree, polled every POLL_S: a server stopped inside the window
    (a fresh start per confirmation round) keeps the CPU it was last seen with. Reading only the
    processes alive at stop() counted a stopped server's CPU as foreign (its workers are not
    reaped by us, so it never reaches our children's times): 0.8-0.9 cores of "foreign" load on a
    calm machine, over a confirmation's fresh starts."""

    POLL_S = 0.5

    def start(self) -> LoadMeter:
        self._probe = speed_probe()  # before the window: what it measures is not ours
        self._cores: set[int] = set()
        self._t, self._busy = time.monotonic(), _busy_per_core()
        self._first = _tree_cpu_s(self._cores)  # what our processes had used before the window
        self._last = dict(self._first)
        self._gpu_util: list[float] = []
        self._gpu_pids: set[int] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        polls = 0
        while not self._done.wait(self.POLL_S):
            self._last.update(_tree_cpu_s(self._cores))
            if polls % 4 == 0:  # nvidia-smi costs ~50 ms: every 2 s is enough
                util, pids = _gpu_state()
                if util is not None:
                    self._gpu_util.append(util)
                ours = {p.pid for p in _ours()}
                self._gpu_pids |= {pid for pid in pids if pid not in ours}
            polls += 1

    def stop(self) -> LoadWindow:
        self._done.set()
        self._thread.join()
        self._last.update(_tree_cpu_s(self._cores))
        wall = max(1e-6, time.monotonic() - self._t)
        own = sum(cpu - self._first.get(key, 0.0) for key, cpu in self._last.items())
        busy = [b - a for a, b in zip(self._busy, _busy_per_core(), strict=False)]
        cores = sorted(c for c in self._cores if 0 <= c < len(busy)) or list(range(len(busy)))
        foreign = sum(busy[c] for c in cores) - own
        return LoadWindow(wall, max(0.0, foreign / wall), len(cores), os.getloadavg()[0], own / wall,
                          psutil.cpu_count() or 1, max(self._gpu_util) if self._gpu_util else None,
                          tuple(sorted(self._gpu_pids)), self._probe)
