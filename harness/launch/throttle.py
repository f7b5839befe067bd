"""Run a server with a controlled slowdown: freeze it for a set fraction of every short period.

    python harness/launch/throttle.py 0.10 -- llama-server -m model.gguf ...

A CPU quota without cgroups (the mechanism `cpulimit` uses): the child runs for (1 - f) of each
`--period-ms` and is stopped (SIGSTOP) for f of it, so a CPU-bound server loses a fraction f of its
wall time whatever else the machine is doing. That is a known, settable, real slowdown to calibrate
the regression gate against (5% and 10%), unlike `--threads 1` vs 2, whose size and even sign change
with the load other processes put on a 2-core machine.

**Under contention the freeze is not a slowdown**: a process stopped and continued every 100 ms is a
sleeper to the Linux scheduler, which favours it when it wakes, so on a busy machine it wins back
what the freeze cost (measured: docs/calibration.md). `--stretch` is the load-independent
alternative: the child gets another port and this wrapper serves the command's `--port` as a proxy
that delivers every response byte (1 / (1 - f)) times later than it arrived, counted from the
request: time to first token and every gap stretched, throughput x (1 - f), whatever the load.

With `--stall-s S`, each SIGUSR1 sent to this wrapper freezes the child once for S seconds: an
injected stall (a compile, a cache fill, a frozen neighbour) at a moment the caller chooses.

With `--stretch --swap OLD=NEW` (two strings of one length in UTF-8), the proxy also replaces OLD
with NEW in every response it delivers: a known, small change in the answers (e.g. `Tokyo=Kyoto`
fails exactly one quality check) on a real server, whose lengths stay valid.

With `--relay-cpus LIST` (a Linux cpu list), the wrapper moves itself, the proxy's relay and the duty
cycle, onto those CPUs once the child has started: a server pinned to its own cores (the engine option
`cpus`, which pins this wrapper before the child inherits it) then does not share them with the relay,
whose cost would otherwise add to the slowdown asked for.

SIGTERM/SIGINT are passed on (with SIGCONT, so a frozen child can act on them); the exit status is
the child's.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def stretch_proxy(listener: socket.socket, host: str, upstream: int, fraction: float,
                  swap: tuple[bytes, bytes] | None = None) -> None:
    """Serve the listener (the command's port), forward to host:upstream; responses delayed to
    t0 + (t - t0) / (1 - f), where t0 is when the client last sent bytes (a request) and t when the
    response bytes arrived. With `swap`, its first string is replaced by its second in what arrives
    (per read: an answer small enough for one read, as a non-streamed chat completion is, always has
    it replaced)."""
    scale = 1.0 / (1.0 - fraction)

    def connection(client: socket.socket) -> None:
        try:
            server = socket.create_connection((host, upstream))
        except OSError:
            client.close()
            return
        # Each streamed token is a small write: without TCP_NODELAY, Nagle's algorithm holds it until
        # the previous one is acknowledged, which the server's own socket (uvicorn sets it) never does.
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = [time.monotonic()]
        arrived: queue.Queue[tuple[float, bytes]] = queue.Queue()

        def upstream_reader() -> None:
            with contextlib.suppress(OSError):
                while data := server.recv(65536):
                    arrived.put((time.monotonic(), data.replace(*swap) if swap else data))
            arrived.put((time.monotonic(), b""))

        def client_writer() -> None:
            while True:
                t, data = arrived.get()
                time.sleep(max(0.0, t0[0] + (t - t0[0]) * scale - time.monotonic()))
                if not data:
                    break
                try:
                    client.sendall(data)
                except OSError:
                    break
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_WR)

        threading.Thread(target=upstream_reader, daemon=True).start()
        writer = threading.Thread(target=client_writer, daemon=True)
        writer.start()
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                t0[0] = time.monotonic()
                server.sendall(data)
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_WR)
        writer.join()
        client.close()
        server.close()

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=connection, args=(conn,), daemon=True).start()


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") < 1:
        print("usage: throttle.py FRACTION [--period-ms MS | --stretch [--swap OLD=NEW]] [--stall-s S] "
              "[--relay-cpus LIST] -- COMMAND ...",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    opts, command = argv[:split], argv[split + 1:]
    fraction = float(opts[0])
    period = float(opts[opts.index("--period-ms") + 1]) / 1000 if "--period-ms" in opts else 0.1
    stall_s = float(opts[opts.index("--stall-s") + 1]) if "--stall-s" in opts else 0.0
    if not 0 <= fraction < 1 or not command:
        print("throttle.py: FRACTION must be in [0, 1) and a command is needed", file=sys.stderr)
        return 2
    stretch = "--stretch" in opts
    relay_cpus = None
    if "--relay-cpus" in opts:
        from harness.launch.cpus import parse_cpu_list  # only here: the wrapper stays light without it

        try:
            relay_cpus = parse_cpu_list(opts[opts.index("--relay-cpus") + 1])
        except (IndexError, ValueError) as e:
            print(f"throttle.py: --relay-cpus: {e}", file=sys.stderr)
            return 2
    swap = None
    if "--swap" in opts:
        old, _, new = opts[opts.index("--swap") + 1].partition("=")
        swap = (old.encode(), new.encode())
        if not stretch or not old or len(swap[0]) != len(swap[1]):
            print("throttle.py: --swap OLD=NEW needs --stretch and two strings of one length", file=sys.stderr)
            return 2
    if stretch:
        if "--port" not in command:
            print("throttle.py: --stretch needs the command's --port", file=sys.stderr)
            return 2
        at = command.index("--port") + 1
        host = command[command.index("--host") + 1] if "--host" in command else "127.0.0.1"
        # The proxy holds the command's port before the child's port is picked: picked first, the kernel
        # can hand out the same (still free) port twice, and the child then cannot bind it (seen in CI).
        listener = socket.create_server((host, int(command[at])), reuse_port=False)
        upstream = free_port(host)
        command = [*command[:at], str(upstream), *command[at + 1:]]
    child = subprocess.Popen(command)
    if relay_cpus is not None:
        # After the child started (it keeps the wrapper's CPUs) and before any thread starts: a thread
        # inherits the CPUs of the thread that creates it, and this call sets the calling thread's.
        os.sched_setaffinity(0, relay_cpus)
    if stretch:
        threading.Thread(target=stretch_proxy, args=(listener, host, upstream, fraction, swap), daemon=True).start()
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
            if fraction == 0 or stretch or done.is_set():
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
