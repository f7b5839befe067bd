"""Launchers: where a LaunchSpec runs (a local process group or a Docker container)."""

from __future__ import annotations

from pathlib import Path

from harness.launch.base import Launcher, Server, StartupError, log_tail, wait_ready
from harness.launch.spec import LaunchSpec, Volume


def get_launcher(kind: str) -> Launcher:
    if kind == "process":
        from harness.launch.process import ProcessLauncher

        return ProcessLauncher()
    if kind == "docker":
        from harness.launch.docker import DockerLauncher

        return DockerLauncher()
    raise ValueError(f"unknown launcher {kind!r} (expected 'process' or 'docker')")


def start_ready(spec: LaunchSpec, log_path: Path, ready_path: str, poll_s: float = 0.5) -> Server:
    """Start a server with its spec's launcher and wait until `ready_path` answers; one that never
    gets ready is stopped before the error propagates. The caller stops a ready one."""
    server = get_launcher(spec.launcher).start(spec, log_path)
    try:
        wait_ready(server, ready_path, spec.ready_timeout_s, poll_s)
    except BaseException:
        server.stop()
        raise
    return server


__all__ = ["LaunchSpec", "Launcher", "Server", "StartupError", "Volume", "get_launcher", "log_tail",
           "start_ready", "wait_ready"]
