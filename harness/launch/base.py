"""The launcher contract: start a LaunchSpec, wait until it serves, stop it and everything it spawned."""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import httpx

from harness.launch.heartbeat import Heartbeat
from harness.launch.spec import LaunchSpec
from harness.measure.client import tls_context


class StartupError(Exception):
    """The server did not become ready. `cause` is a short machine-readable class."""

    def __init__(self, cause: str, detail: str, log_tail: list[str]):
        super().__init__(f"{cause}: {detail}")
        self.cause = cause
        self.detail = detail
        self.log_tail = log_tail


class Server(Protocol):
    spec: LaunchSpec
    log_path: Path

    def returncode(self) -> int | None:
        """None while running; the exit status once it has stopped."""

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the server and everything it started; idempotent."""

    def owned_pids(self) -> list[int]:
        """Host PIDs that belong to this server (for leak checks)."""


OOM_KILLED = "oom"  # the cause of a server the kernel's or Docker's OOM killer stopped (the engines' oom class)
DAEMON_LOST = "docker_daemon_lost"  # the Docker daemon stopped answering mid-run


def oom_kill_count() -> int | None:
    """The kernel's count of OOM kills since boot (/proc/vmstat `oom_kill`, Linux 4.13 and later);
    None where it cannot be read."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def killed_for_memory(server: Server) -> str | None:
    """Why the server was killed for memory, as the launcher can tell (Docker's OOMKilled; a process
    SIGKILLed while the kernel's OOM kill count rose), or None: not killed, or not for memory."""
    tell = getattr(server, "killed_for_memory", None)
    return tell() if callable(tell) else None


def exit_text(server: Server) -> str:
    """How the server ended, in words: the launcher's exit reason where it has one."""
    reason = getattr(server, "exit_reason", None)
    said = reason() if callable(reason) else None
    rc = server.returncode()
    return f"server exited with status {rc}" + (f" ({said})" if said and said != f"exit {rc}" else "")


class Launcher(Protocol):
    def start(self, spec: LaunchSpec, log_path: Path) -> Server: ...


def log_tail(path: Path, lines: int = 40) -> list[str]:
    try:
        with path.open(errors="replace") as fh:
            return [line.rstrip("\n") for line in deque(fh, maxlen=lines)]
    except FileNotFoundError:
        return []


def wait_ready(server: Server, ready_path: str, timeout_s: float, poll_s: float = 0.5,
               progress: Callable[[str], None] | None = None) -> float:
    """Poll the engine's readiness endpoint until it answers 200; return seconds waited.

    The first polls come 50 ms apart and the gap grows to `poll_s`: a llama-server that is ready in
    0.3 s was reported (and waited for) at 0.55 s, the second poll of a fixed 0.5 s grid, so its
    `startup.ready_s` measured the grid; a 30-second vLLM start is polled every 0.5 s as before.

    Raises StartupError("exited") if the process dies first and StartupError("timeout") if the
    deadline passes; the caller classifies the cause further from the log. With `progress`, the wait
    shows life (harness/launch/heartbeat.py: elapsed time and the engine's last log line).
    """
    start = time.monotonic()
    gap = min(0.05, poll_s)
    url = server.spec.base_url + ready_path
    heartbeat = Heartbeat("loading", progress, server.log_path) if progress else None
    with httpx.Client(verify=tls_context()) as client, heartbeat or contextlib.nullcontext():
        while True:
            if heartbeat:
                heartbeat.beat()
            rc = server.returncode()
            if rc is not None:
                raise StartupError("exited", f"server exited with status {rc} before ready",
                                   log_tail(server.log_path))
            # A frozen server accepts the connection and never answers: bound each poll so the
            # deadline holds.
            left = timeout_s - (time.monotonic() - start)
            try:
                if client.get(url, timeout=max(0.5, min(5.0, left))).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            if time.monotonic() - start > timeout_s:
                raise StartupError("timeout", f"not ready after {timeout_s:.0f} s",
                                   log_tail(server.log_path))
            time.sleep(gap)
            gap = min(poll_s, gap * 1.5)
