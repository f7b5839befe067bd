"""Running model-written code for quality checks: a separate, isolated Python with resource limits,
no network and a wall-clock timeout (never in-process)."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
from functools import cache

# ---- running model-written code ----------------------------------------------------------------

# Prepended to model code: no sockets even where a network namespace is unavailable.
_NO_NET = ("import socket as _socket\n"
           "def _no_network(*a, **k):\n    raise OSError('network is disabled in quality checks')\n"
           "_socket.socket = _no_network\n_socket.create_connection = _no_network\n"
           "_socket.getaddrinfo = _no_network\ndel _socket\n")


@cache
def _netns_prefix() -> tuple[str, ...]:
    """`unshare -rn` gives the child an empty network namespace (no interfaces but a down loopback)."""
    exe = shutil.which("unshare")
    if not exe:
        return ()
    try:
        ok = subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return (exe, "-rn") if ok else ()


def _limits(cpu_s: int) -> None:  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_code_test(code: str, test: str, timeout_s: float = 10.0) -> tuple[bool, str]:
    """Run model code + its test in a separate, isolated Python: `-I -S` (no site, no env vars, no
    cwd on the path), an empty environment, a scratch cwd, CPU/memory/file limits, no network
    namespace where the kernel allows it, and a wall-clock timeout. Pass = exit status 0."""
    if not code.strip():
        return False, "no code in the answer"
    with tempfile.TemporaryDirectory(prefix="flagsearch-code-") as tmp:
        path = os.path.join(tmp, "check.py")
        with open(path, "w") as fh:
            fh.write(_NO_NET + "\n" + code + "\n\n# ---- test ----\n" + test + "\n")
        argv = [*_netns_prefix(), sys.executable, "-I", "-S", path]
        try:
            proc = subprocess.run(argv, cwd=tmp, env={}, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=timeout_s, preexec_fn=lambda: _limits(max(1, int(timeout_s))),
                                  start_new_session=True)
        except subprocess.TimeoutExpired:
            return False, f"timed out after {timeout_s:g} s"
    if proc.returncode == 0:
        return True, "test passed"
    err = proc.stderr.decode(errors="replace").strip().splitlines()
    return False, f"test failed (exit {proc.returncode}): {err[-1][:200] if err else 'no output'}"
