"""Every server this process started, so that a signal or exit stops them all."""

from __future__ import annotations

import atexit
import contextlib
import signal
import threading
from typing import Any

_lock = threading.Lock()
_running: list[Any] = []


def remember(server: Any) -> None:
    with _lock:
        _running.append(server)


def forget(server: Any) -> None:
    with _lock:
        with contextlib.suppress(ValueError):
            _running.remove(server)


def stop_all() -> None:
    with _lock:
        servers = list(_running)
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop()


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM so that every `finally` runs, as for Ctrl-C."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum}")


def install_signal_handlers() -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)


atexit.register(stop_all)
