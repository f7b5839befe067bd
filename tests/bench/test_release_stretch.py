"""bench/experiments/release_bisect/stretch.py, the wrapper that injects a load-independent slowdown into a real build
for the bisect over releases: it runs the build's own interpreter behind the stretch proxy, the
response passes through intact, and SIGTERM stops the server behind it (no engine; a second)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from bench.experiments.release_bisect import stretch as release_stretch

ROOT = Path(__file__).resolve().parents[2]
STRETCH = ROOT / "bench" / "experiments" / "release_bisect" / "stretch.py"

SERVER = """
import os, sys, http.server
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{sys.executable} {os.getpid()}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_throttle_argv() -> None:
    assert release_stretch.throttle_argv("/env/bin/python", 0.5, ["-m", "x", "--port", "9"]) == \
        ["0.5", "--stretch", "--", "/env/bin/python", "-m", "x", "--port", "9"]
    with pytest.raises(ValueError, match="fraction"):
        release_stretch.throttle_argv("/env/bin/python", 0.0, ["--port", "9"])
    with pytest.raises(ValueError, match="--port"):
        release_stretch.throttle_argv("/env/bin/python", 0.5, ["-m", "x"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_build_served_through_the_proxy(tmp_path: Path) -> None:
    """A `python:` build (the wrapper takes any build with an interpreter) serves on the proxied
    port: the body names the build's interpreter and a server process other than the wrapper."""
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(STRETCH), f"python:{sys.executable}",
                             "0.5", str(script), "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        body = ""
        for _ in range(100):
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
                break
            except OSError:
                time.sleep(0.1)
        python, pid = body.split()
        assert python == sys.executable
        assert int(pid) != proc.pid  # the server is the wrapper's child, on another (upstream) port
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        time.sleep(0.2)
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
    finally:
        if proc.poll() is None:
            proc.kill()
        assert proc.stdout is not None
        assert "stretched 50%" in proc.stdout.read()
