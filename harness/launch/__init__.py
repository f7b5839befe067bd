"""Launchers: where a LaunchSpec runs (a local process group or a Docker container)."""

from __future__ import annotations

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


__all__ = ["LaunchSpec", "Launcher", "Server", "StartupError", "Volume", "get_launcher", "log_tail",
           "wait_ready"]
