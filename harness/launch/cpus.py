"""Pinning a server to CPUs: a Linux cpu list (`2-9`, `0,2,4-7`, as taskset -c and Docker's
--cpuset-cpus take it).

Why: a small model's decode on a GPU is launch- and CPU-bound, and the scheduler moving the
server's threads between cores (and onto the cores the client uses) made its start-to-start
spread ~2% on a GPU; pinned to 8 cores it was 0.8-1.35% (docs/calibration.md). The process
launcher applies the list in the child before exec (every thread and child the server makes
inherits it); the Docker launcher passes it as the container's cpuset. A list naming CPUs this
machine does not offer is refused before the start.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from harness.launch.base import StartupError

_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$")
MAX_CPU = 1 << 16  # far above any real machine: a typo like 2-99999 is an error, not a huge set


def parse_cpu_list(text: str) -> frozenset[int]:
    """`"2-9,12"` -> {2, ..., 9, 12}; ValueError naming what is wrong (empty, reversed, not a list)."""
    cpus: set[int] = set()
    items = [x.strip() for x in str(text).split(",")]
    if not any(items):
        raise ValueError("empty cpu list (write e.g. \"2-9\" or \"0,2,4-7\")")
    for item in items:
        match = _ITEM.match(item)
        if not match:
            raise ValueError(f"{item!r} in cpu list {text!r} is not a cpu number or a range like 2-9")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise ValueError(f"range {item!r} in cpu list {text!r} runs backwards")
        if high >= MAX_CPU:
            raise ValueError(f"cpu {high} in cpu list {text!r} is out of range")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The canonical short form: {2, 3, 4, 7} -> "2-4,7" (what the fingerprint records)."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def _read_list(path: Path) -> frozenset[int] | None:
    try:
        text = path.read_text().strip()
        return parse_cpu_list(text) if text else None
    except (OSError, ValueError):
        return None


def _cgroup_cpus() -> frozenset[int] | None:
    """The CPUs this process's cgroup may use (a container's cpuset), where the cgroup says."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":  # cgroup v2
            found = _read_list(Path("/sys/fs/cgroup") / parts[2].lstrip("/") / "cpuset.cpus.effective")
        elif "cpuset" in parts[1].split(","):  # cgroup v1
            found = _read_list(Path("/sys/fs/cgroup/cpuset") / parts[2].lstrip("/") / "cpuset.effective_cpus")
        else:
            continue
        if found:
            return found
    return None


def machine_cpus() -> frozenset[int]:
    """The CPUs a server started here can be pinned to: the online CPUs, narrowed to this process's
    cgroup cpuset where one is set. Not this process's own affinity: the tool may run pinned to
    other cores than the server (client on 0-1, server on 2-9) on purpose."""
    online = _read_list(Path("/sys/devices/system/cpu/online")) or frozenset(range(os.cpu_count() or 1))
    cgroup = _cgroup_cpus()
    return online & cgroup if cgroup and online & cgroup else online


def check_cpus(engine: str, cpus: str, available: Iterable[int] | None = None) -> frozenset[int]:
    """The set `cpus` names, or StartupError("bad_spec") before anything starts when the list is
    malformed or names CPUs that `available` (default: this machine's, see machine_cpus) lacks."""
    try:
        wanted = parse_cpu_list(cpus)
    except ValueError as exc:
        raise StartupError("bad_spec", f"engine {engine!r}: cpus: {exc}", []) from None
    have = frozenset(available) if available is not None else machine_cpus()
    missing = wanted - have
    if missing:
        raise StartupError("bad_spec", f"engine {engine!r}: cpus {cpus!r} names CPU(s) "
                           f"{format_cpu_list(missing)} that this machine does not offer (it has "
                           f"{format_cpu_list(have)})", [])
    return wanted


def physical_cores(cpus: Iterable[int], topology: Path = Path("/sys/devices/system/cpu")) -> list[frozenset[int]]:
    """`cpus` grouped by physical core (a core's SMT threads together, from the kernel's thread_siblings_list),
    ordered by each core's lowest CPU; a CPU whose topology cannot be read is a core of its own. Two servers
    meant to run apart must not share a core's threads: Linux often numbers the siblings n and n + cores."""
    wanted = frozenset(cpus)
    cores: dict[frozenset[int], set[int]] = {}
    for cpu in sorted(wanted):
        siblings = _read_list(topology / f"cpu{cpu}" / "topology" / "thread_siblings_list") or frozenset({cpu})
        cores.setdefault(siblings, set()).add(cpu)
    return sorted((frozenset(core) for core in cores.values()), key=min)
