"""Is harness/launch/throttle.py --stretch exact? In front of a fake server that writes a small chunk every
30 ms (128 of them, the first after 100 ms) to each of four connections at once, the client-side gap
between chunks and the first chunk's time: direct, through the proxy with no delay, and with FRACTION.

    python -m bench.experiments.control_size.exact [FRACTION]

A server process is this module run with `--serve --port N`."""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

THROTTLE = Path(__file__).resolve().parents[3] / "harness" / "launch" / "throttle.py"
PORT = 18777
CHUNKS, GAP_S, FIRST_S = 128, 0.03, 0.1


def serve(port: int) -> None:
    listener = socket.create_server(("127.0.0.1", port))

    def answer(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.recv(65536)
        t0 = time.monotonic()
        for k in range(CHUNKS):
            time.sleep(max(0.0, t0 + FIRST_S + GAP_S * k - time.monotonic()))
            conn.sendall(b'data: {"tok": %d}\n\n' % k)
        conn.close()

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=answer, args=(conn,), daemon=True).start()


def stream(out: list[list[float]]) -> None:
    conn = socket.create_connection(("127.0.0.1", PORT))
    t0 = time.monotonic()
    conn.sendall(b"GET / HTTP/1.1\r\n\r\n")
    times: list[float] = []
    while data := conn.recv(65536):
        times += [time.monotonic() - t0] * data.count(b"\n\n")
    out.append(times)


def measure(fraction: str) -> tuple[float, float]:
    command = [sys.executable, "-m", "bench.experiments.control_size.exact", "--serve", "--port", str(PORT)]
    if fraction != "direct":
        command = [sys.executable, str(THROTTLE), fraction, "--stretch", "--", *command]
    server = subprocess.Popen(command)
    time.sleep(1.5)
    gaps, firsts = [], []
    try:
        for _ in range(3):
            outs: list[list[float]] = []
            threads = [threading.Thread(target=stream, args=(outs,)) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            gaps += [(t[-1] - t[0]) / (len(t) - 1) for t in outs]
            firsts += [t[0] for t in outs]
    finally:
        server.terminate()
        server.wait()
    return 1000 * statistics.median(gaps), 1000 * statistics.median(firsts)


if __name__ == "__main__":
    if "--serve" in sys.argv:
        serve(int(sys.argv[sys.argv.index("--port") + 1]))
    else:
        for arm in ("direct", "1e-9", sys.argv[1] if len(sys.argv) > 1 else "0.1"):
            gap, first = measure(arm)
            print(f"{arm}: gap {gap:.3f} ms, first chunk {first:.1f} ms")
