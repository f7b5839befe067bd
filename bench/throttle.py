"""Run a server with a controlled slowdown: freeze it for a set fraction of every short period.

    python bench/throttle.py 0.10 -- llama-server -m model.gguf ...

A CPU quota without cgroups (the mechanism `cpulimit` uses): the child runs for (1 - f) of each
`--period-ms` and is stopped (SIGSTOP) for f of it, so a CPU-bound server loses a fraction f of its
wall time whatever else the machine is doing. That is a known, settable, real slowdown to calibrate
the regression gate against (5% and 10%), unlike `--threads 1` vs 2, whose size and even sign change
with the load other processes put on a 2-core machine.

With `--stall-s S`, each SIGUSR1 sent to this wrapper freezes the child once for S seconds: an
injected stall (a compile, a cache fill, a frozen neighbour) at a moment the caller chooses.

SIGTERM/SIGINT are passed on (with SIGCONT, so a frozen child can act on them); the exit status is
the child's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") < 1:
        print("usage: throttle.py FRACTION [--period-ms MS] [--stall-s S] -- COMMAND ...", file=sys.stderr)
        return 2
    split = argv.index("--")
    opts, command = argv[:split], argv[split + 1:]
    fraction = float(opts[0])
    period = float(opts[opts.index("--period-ms") + 1]) / 1000 if "--period-ms" in opts else 0.1
    stall_s = float(opts[opts.index("--stall-s") + 1]) if "--stall-s" in opts else 0.0
    if not 0 <= fraction < 1 or not command:
        print("throttle.py: FRACTION must be in [0, 1) and a command is needed", file=sys.stderr)
        return 2
    child = subprocess.Popen(command)
    done = threading.Event()

    def forward(signum: int, _frame: object) -> None:
        done.set()
        for sig in (signal.SIGCONT, signum):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    freeze = threading.Lock()  # the duty cycle must not SIGCONT the child in the middle of a stall

    def stall() -> None:
        with freeze:
            try:
                os.kill(child.pid, signal.SIGSTOP)
                time.sleep(stall_s)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGCONT)

    if stall_s > 0:
        signal.signal(signal.SIGUSR1, lambda _s, _f: threading.Thread(target=stall, daemon=True).start())

    def duty_cycle() -> None:
        while not done.is_set() and child.poll() is None:
            time.sleep(period * (1 - fraction))
            if fraction == 0 or done.is_set():
                continue
            with freeze:
                try:
                    os.kill(child.pid, signal.SIGSTOP)
                    time.sleep(period * fraction)
                finally:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.pid, signal.SIGCONT)

    threading.Thread(target=duty_cycle, daemon=True).start()
    code = child.wait()
    done.set()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
