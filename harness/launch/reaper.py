"""Every server this process started, so that a signal or exit stops them all; and the servers a
killed search left behind, found by the tag in their environment and stopped on the next start."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import psutil

T = TypeVar("T")

OWNER_ENV = "FLAGSEARCH_OWNER"  # "<pid>:<create time>" of the tool process that started the server
SERVER_ENV = "FLAGSEARCH_SERVER"  # one id per started server

_lock = threading.Lock()
_running: list[Any] = []
_reaped = False


def remember(server: Any) -> None:
    with _lock:
        _running.append(server)


def forget(server: Any) -> None:
    with _lock, contextlib.suppress(ValueError):
        _running.remove(server)


def running() -> list[Any]:
    with _lock:
        return list(_running)


def stop_all() -> None:
    for server in running():
        with contextlib.suppress(Exception):
            server.stop()


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM/SIGHUP so that every `finally` runs, as for Ctrl-C."""


def _on_terminate(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum}")


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, except that a Ctrl-C or a SIGTERM that lands inside a task group (anyio's, under
    httpx's connect) is raised as itself: the signal handler raises in whatever frame runs, and a task
    group wraps what its tasks raise in a BaseExceptionGroup, which the callers' `except
    KeyboardInterrupt` (Terminated is one) would not catch: the tool would end in a traceback, exit 1."""
    try:
        return asyncio.run(coroutine)
    except BaseExceptionGroup as group:
        stops = group.subgroup(lambda e: isinstance(e, KeyboardInterrupt))
        if stops is None:
            raise
        first: BaseException = stops
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None


def install_signal_handlers() -> None:
    """SIGTERM (kill, systemd, CI cancel) and SIGHUP (terminal closed) stop the search like Ctrl-C."""
    signal.signal(signal.SIGTERM, _on_terminate)
    signal.signal(signal.SIGHUP, _on_terminate)


_DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold Ctrl-C/SIGTERM/SIGHUP while the body runs (stopping servers), then act on the first
    one that came. Only the main thread can change handlers; elsewhere the body just runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[tuple[int, Any]] = []
    previous = {sig: signal.getsignal(sig) for sig in _DEFERRED}

    def hold(signum: int, frame: Any) -> None:
        pending.append((signum, frame))

    for sig in _DEFERRED:
        signal.signal(sig, hold)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pending:
            signum, frame = pending[0]
            handler = previous[signal.Signals(signum)]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


# ---- ownership tags and orphans ---------------------------------------------------------------
def owner_tag(pid: int | None = None) -> str:
    proc = psutil.Process(pid or os.getpid())
    return f"{proc.pid}:{proc.create_time():.3f}"


def owner_alive(tag: str) -> bool:
    """Whether the tool process named by an owner tag still runs (same PID *and* start time)."""
    try:
        pid_text, created = tag.split(":", 1)
        proc = psutil.Process(int(pid_text))
        return f"{proc.create_time():.3f}" == created and proc.status() != psutil.STATUS_ZOMBIE
    except (ValueError, psutil.Error):
        return False


def tags(server_id: str) -> dict[str, str]:
    return {OWNER_ENV: owner_tag(), SERVER_ENV: server_id}


def _environ(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except (psutil.Error, OSError):
        return {}


def server_tag_of(proc: psutil.Process) -> str | None:
    return _environ(proc).get(SERVER_ENV)


def tagged_processes() -> list[tuple[psutil.Process, str, str]]:
    """(process, owner tag, server id) of every live process started by any flagsearch."""
    out = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        env = _environ(proc)
        if OWNER_ENV in env:
            out.append((proc, env[OWNER_ENV], env.get(SERVER_ENV, "")))
    return out


def reap_orphans(grace_s: float = 5.0) -> list[int]:
    """Stop servers whose owning tool process is gone (a search killed with SIGKILL or by the OOM
    killer). Only processes carrying our tag with a dead owner are touched. Returns their PIDs."""
    orphans = [proc for proc, owner, _ in tagged_processes() if not owner_alive(owner)]
    if not orphans:
        return []
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for proc in orphans:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_live(p) for p in orphans):
        time.sleep(0.05)
    for proc in orphans:
        if _live(proc):
            with contextlib.suppress(psutil.Error):
                proc.kill()
    psutil.wait_procs(orphans, timeout=2.0)
    return sorted(p.pid for p in orphans)


def reap_orphans_once() -> list[int]:
    """reap_orphans the first time this process starts a server."""
    global _reaped
    with _lock:
        if _reaped:
            return []
        _reaped = True
    return reap_orphans()


def _live(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


atexit.register(stop_all)


# ---- workers of a study ---------------------------------------------------------------------------
def worker_tag() -> str:
    """Who runs a trial: "<host>/<pid>:<start time>", stored with the trial so that a later run can
    tell a trial of a dead process (SIGKILL, OOM killer, power loss) from one still running."""
    return f"{socket.gethostname()}/{owner_tag()}"


def worker_dead(tag: str) -> bool:
    """True only when the worker ran on this host and its process is gone; a worker on another
    host is never declared dead here (the storage's heartbeat covers those)."""
    host, sep, owner = tag.partition("/")
    return bool(sep) and host == socket.gethostname() and not owner_alive(owner)
