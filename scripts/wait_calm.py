"""Wait until the machine is calm before the serial tests, which measure small timing differences.

The end of the parallel part leaves work behind for some seconds (servers and xdist workers exiting,
containers removed, files written back); a serial test that started into it measured its first
server start 25% slow (53 against 70-71 tok/s) and missed a 10% slowdown. Waits until the CPU is at
most MAX_BUSY busy over two consecutive SAMPLE_S samples, at most LIMIT_S; prints what it waited and,
when it gave up, the busiest processes.
"""

from __future__ import annotations

import contextlib
import sys
import time

import psutil

MAX_BUSY = 15.0  # percent of all cores
SAMPLE_S = 2.0
LIMIT_S = 90.0


def main() -> int:
    start = time.monotonic()
    calm = 0
    busy = 100.0
    while time.monotonic() - start < LIMIT_S:
        busy = psutil.cpu_percent(interval=SAMPLE_S)
        calm = calm + 1 if busy <= MAX_BUSY else 0
        if calm >= 2:
            print(f"calm after {time.monotonic() - start:.0f} s (CPU {busy:.0f}% busy)", flush=True)
            return 0
    procs = list(psutil.process_iter(["pid", "name"]))
    for p in procs:  # a process's first cpu_percent is 0: this one starts its interval
        with contextlib.suppress(psutil.Error):
            p.cpu_percent()
    time.sleep(1.0)
    load: list[tuple[float, str]] = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            load.append((p.cpu_percent(), f"{p.info['name']}[{p.info['pid']}]"))
    top = ", ".join(f"{name} {pct:.0f}%" for pct, name in sorted(load, reverse=True)[:5])
    print(f"not calm after {LIMIT_S:.0f} s (CPU {busy:.0f}% busy; busiest: {top}): the serial tests start anyway",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
