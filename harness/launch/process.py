"""Local child processes: one process group per server, log streamed to a file, group-wide stop.

Only what we started is ever signalled: the process group we created and any descendants that
left it (found through psutil from our own child), never a name pattern.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from harness.launch import registry
from harness.launch.spec import LaunchSpec


class ProcessServer:
    def __init__(self, spec: LaunchSpec, log_path: Path, proc: subprocess.Popen[bytes]):
        self.spec = spec
        self.log_path = log_path
        self._proc = proc
        self._pgid = proc.pid  # start_new_session makes the child the leader of a new group
        self._known: set[int] = {proc.pid}

    @property
    def pid(self) -> int:
        return self._proc.pid

    def returncode(self) -> int | None:
        return self._proc.poll()

    def owned_pids(self) -> list[int]:
        self._refresh_known()
        return sorted(p for p in self._known if psutil.pid_exists(p) and not _is_zombie(p))

    def _refresh_known(self) -> None:
        try:
            for child in psutil.Process(self._proc.pid).children(recursive=True):
                self._known.add(child.pid)
        except psutil.NoSuchProcess:
            pass
        for proc in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(proc.pid) == self._pgid:
                    self._known.add(proc.pid)
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue

    def _signal_all(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self._pgid, sig)
        except ProcessLookupError:
            pass
        for pid in list(self._known):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                self._known.discard(pid)

    def stop(self, timeout_s: float = 15.0) -> None:
        self._refresh_known()
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.owned_pids():
            try:
                self._proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        if self.owned_pids():
            self._signal_all(signal.SIGKILL)
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        registry.forget(self)


def _is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class ProcessLauncher:
    def start(self, spec: LaunchSpec, log_path: Path) -> ProcessServer:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **spec.env}
        with log_path.open("ab") as log:
            try:
                proc = subprocess.Popen(  # noqa: S603 - argv list, never a shell
                    list(spec.argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=env, start_new_session=True,
                )
            except FileNotFoundError as exc:
                from harness.launch.base import StartupError

                raise StartupError("bad_command", f"cannot execute {spec.argv[0]!r}: {exc}", []) from exc
        server = ProcessServer(spec, log_path, proc)
        registry.remember(server)
        return server
