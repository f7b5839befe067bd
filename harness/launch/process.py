"""Local child processes: one process group per server, log streamed to a file, group-wide stop.

Only what we started is ever signalled, never a name pattern. A server is ours if it is
- in the process group we created for it (start_new_session), or
- a descendant of our child found through psutil, or
- tagged: every server gets FLAGSEARCH_OWNER (this process) and FLAGSEARCH_SERVER (one id per
  server) in its environment, which its children inherit, so that descendants that left the
  group and were re-parented are still found (and so that `reaper.reap_orphans` can stop the
  servers of a search that was killed with SIGKILL, the next time the tool starts).
If the tool itself dies (SIGKILL, the OOM killer), a watchdog started beside each server stops it:
the watchdog blocks on a pipe from us, wakes at end-of-file (which the kernel delivers when we die)
and stops every process carrying the server's tag: SIGTERM, then SIGKILL after a grace period.
The direct child also gets a parent-death SIGTERM; an engine may hang in its graceful shutdown
(llama-server did, with a request in flight), which is why the watchdog escalates.

The server's output reaches its log through a pipe and a thread that scrubs secrets line by line
as it writes (harness.secrets.LineScrubber): an engine that echoes its argv (`--api-key sk-...`)
never puts the key on disk, even for a moment, even if the tool is killed before the server stops.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from harness import secrets
from harness.launch import reaper
from harness.launch.base import StartupError, oom_kill_count
from harness.launch.cpus import check_cpus
from harness.launch.spec import LaunchSpec
from harness.measure.client import forget_api_key, register_api_key

_PR_SET_PDEATHSIG = 1
WATCHDOG_GRACE_S = 5.0
# Runs in its own interpreter and session (Ctrl-C at the terminal must not reach it). Standard
# library only, /proc only: it must work whatever state the tool was in when it died.
_WATCHDOG = r"""
import os, signal, sys, time
tag, grace = ("FLAGSEARCH_SERVER=" + sys.argv[1]).encode(), float(sys.argv[2])
sys.stdin.buffer.read()
def members():
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open("/proc/" + name + "/environ", "rb") as fh:
                    if tag in fh.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                pass
    return found
def send(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
left = members()
if left:
    send(left, signal.SIGTERM)
    send(left, signal.SIGCONT)
    deadline = time.monotonic() + grace
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = members()
    send(left, signal.SIGKILL)
"""
_LIBC = ctypes.CDLL(None, use_errno=True)  # resolved here: the child between fork and exec only calls


def _set_parent_death_signal() -> None:
    """Runs in the child between fork and exec: SIGTERM it when the thread that forked it dies."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def _child_setup(parent_death: bool, cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """What the child runs between fork and exec: the parent-death signal (main thread only, see
    start) and the CPU pinning (inherited by every thread and process the server makes)."""
    if not parent_death and cpus is None:
        return None

    def setup() -> None:
        if parent_death:
            _set_parent_death_signal()
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
    return setup


class ProcessServer:
    def __init__(self, spec: LaunchSpec, log_path: Path, proc: subprocess.Popen[bytes], server_id: str,
                 watchdog: subprocess.Popen[bytes] | None = None, log_pump: threading.Thread | None = None):
        self.spec = spec
        self.log_path = log_path
        self.server_id = server_id
        self._proc = proc
        self._watchdog = watchdog
        self._log_pump = log_pump
        self._pgid = proc.pid  # start_new_session makes the child the leader of a new group
        self._known: set[int] = {proc.pid}
        self._stopped = False
        self._oom_kills_at_start = oom_kill_count()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def pgid(self) -> int:
        return self._pgid

    def returncode(self) -> int | None:
        rc = self._proc.poll()
        if rc is not None and self._log_pump is not None:
            # Its last words are still in the pipe: a caller that reads the log on seeing the exit
            # (wait_ready polls every 50 ms at first) found it empty before the pump wrote them.
            self._log_pump.join(timeout=2)
        return rc

    def exit_reason(self) -> str | None:
        """Why the process ended (a signal by name, or its status); None while it runs."""
        rc = self.returncode()
        if rc is None:
            return None
        if rc < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-rc).name}"
        return f"exit {rc}"

    def killed_for_memory(self) -> str | None:
        """A SIGKILL while the kernel's OOM kill count rose: the OOM killer's doing, as far as an
        unprivileged tool can tell (the kernel log that names the victim needs root). None otherwise."""
        if self.returncode() != -signal.SIGKILL or self._oom_kills_at_start is None:
            return None
        now = oom_kill_count()
        if now is None or now <= self._oom_kills_at_start:
            return None
        return (f"the kernel's OOM killer ran while it lived (/proc/vmstat oom_kill {self._oom_kills_at_start} -> "
                f"{now}): killed for memory")

    def owned_pids(self) -> list[int]:
        self._refresh_known()
        return sorted(p for p in self._known if _alive(p))

    def _refresh_known(self) -> None:
        try:
            for child in psutil.Process(self._proc.pid).children(recursive=True):
                self._known.add(child.pid)
        except psutil.NoSuchProcess:
            pass
        for proc in psutil.process_iter(["pid"]):
            pid = proc.info["pid"]
            if pid in self._known:
                continue
            try:
                if os.getpgid(pid) == self._pgid or reaper.server_tag_of(proc) == self.server_id:
                    self._known.add(pid)
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue

    def _signal_all(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._pgid, sig)
        for pid in list(self._known):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                self._known.discard(pid)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the whole server (SIGCONT too: a frozen server must be able to act on it), then
        SIGKILL what is left after `timeout_s`. Ctrl-C or SIGTERM arriving meanwhile is deferred
        until the server is gone, so a second Ctrl-C cannot leave it running."""
        with reaper.deferred_signals():
            self._stop(timeout_s)

    def _stop(self, timeout_s: float) -> None:
        self._refresh_known()
        if self.owned_pids():
            self._signal_all(signal.SIGTERM)
            self._signal_all(signal.SIGCONT)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and any(_alive(p) for p in self._known):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=0.05)
        if self.owned_pids():  # also catches children spawned while it was shutting down
            self._signal_all(signal.SIGKILL)
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and self.owned_pids():
                time.sleep(0.05)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=1.0)
        if self._log_pump is not None:
            self._log_pump.join(timeout=5)  # EOF once every process holding the pipe is gone
        if not self._stopped:
            self._stopped = True
            forget_api_key(self.spec.base_url)
            scrub_log(self.log_path, log_secrets(self.spec))  # backstop: a pump killed mid-line
        self._release_watchdog()
        reaper.forget(self)

    def _release_watchdog(self) -> None:
        """Close its pipe: with the server gone it finds nothing to stop and exits."""
        if self._watchdog is None:
            return
        with contextlib.suppress(OSError):
            if self._watchdog.stdin:
                self._watchdog.stdin.close()
        try:
            self._watchdog.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._watchdog.kill()
            self._watchdog.wait()
        self._watchdog = None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def log_secrets(spec: LaunchSpec) -> list[str]:
    """What a server's log must not contain: every known secret, its env's and its argv's."""
    return secrets.launch_secrets(spec.argv, spec.env)


def pump_log(fd: int, log_path: Path, known: list[str], idle_s: float = 0.25) -> None:
    """Copy the server's output (read end `fd` of its stdout/stderr pipe) to its log, scrubbed line
    by line; a partial line (progress dots) is written once the output pauses for `idle_s`.
    Returns at end-of-file, when every process holding the pipe's write end has exited."""
    scrubber = secrets.LineScrubber(known)
    try:
        with log_path.open("ab") as log:
            while True:
                ready, _, _ = select.select([fd], [], [], idle_s)
                if not ready:
                    if scrubber.pending:
                        log.write(scrubber.flush())
                        log.flush()
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                log.write(scrubber.feed(chunk))
                log.flush()
            log.write(scrubber.flush())
    except OSError:
        pass  # a full disk: the server keeps running; the trial notices through its own writes
    finally:
        os.close(fd)


def scrub_log(path: Path, known: list[str]) -> None:
    """Rewrite the server log without secret values (an engine may echo its argv, e.g. --api-key)."""
    if not known:
        return
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return
    clean = secrets.scrub_text(text, known)
    if clean != text:
        tmp = path.with_name(path.name + ".scrub")
        try:
            tmp.write_text(clean)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            path.unlink(missing_ok=True)  # better no log than a log with a secret in it


def check_port_free(host: str, port: int) -> None:
    """Raise StartupError('port_in_use') if something already listens on host:port.

    Checked before starting, so the cause is named the same way for every engine instead of
    depending on how (and whether) each one logs a failed bind."""
    bind_host = "0.0.0.0" if host in ("", "0.0.0.0") else host
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is fine
        try:
            sock.bind((bind_host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StartupError("port_in_use", f"{bind_host}:{port} is already in use by another process",
                                   []) from None
            raise StartupError("bad_host", f"cannot bind {bind_host}:{port}: {exc.strerror}", []) from None


# What an engine gets of the tool's environment (engine_environment): the basics of any program, the
# locale, and the variables of the GPU stacks, model hubs, compilers and thread pools that the engines
# read. Everything else (database URLs, cloud credentials, CI tokens, FLAGSEARCH_PG_URL) stays with the
# tool; a variable an engine needs beyond these is named in the space (`env: {NAME: ${NAME}}`).
ENGINE_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "TERM", "TZ", "LANG", "LANGUAGE", "TMPDIR", "TMP", "TEMP",
    "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CC", "CXX", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
    "PYTHONWARNINGS", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
})
ENGINE_ENV_PREFIXES = ("LC_", "XDG_", "CUDA", "NVIDIA_", "NV_", "NCCL_", "CUBLAS", "CUDNN", "ROCM_", "HIP_", "HSA_",
                       "HF_", "HUGGING_FACE_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH", "TRITON_", "VLLM_",
                       "SGLANG_", "LLAMA_", "GGML_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO", "ONEDNN_",
                       "DNNL_", "FLASHINFER_", "MAX_JOBS")


def engine_environment(spec_env: Mapping[str, str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a local engine starts with: the allowed part of ours (ENGINE_ENV_NAMES and
    ENGINE_ENV_PREFIXES), then what the space and the engine module name (`spec_env`), which wins."""
    ours = os.environ if base is None else base
    kept = {k: v for k, v in ours.items() if k in ENGINE_ENV_NAMES or k.startswith(ENGINE_ENV_PREFIXES)}
    return {**kept, **spec_env}


class ProcessLauncher:
    def start(self, spec: LaunchSpec, log_path: Path) -> ProcessServer:
        cpus = check_cpus(spec.engine, spec.cpus) if spec.cpus else None  # before anything starts
        reaper.reap_orphans_once()
        check_port_free(spec.host, spec.port)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        server_id = uuid.uuid4().hex
        env = {**engine_environment(spec.env), **reaper.tags(server_id)}
        # The parent-death signal follows the *thread* that forks; only the main thread lives as
        # long as the search. Other threads rely on reaper.stop_all and reap_orphans.
        in_main = threading.current_thread() is threading.main_thread()
        log_path.touch()
        read_fd, write_fd = os.pipe()
        try:
            proc = subprocess.Popen(  # an argv list: never a shell
                list(spec.argv), stdout=write_fd, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True, preexec_fn=_child_setup(in_main, cpus),
            )
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            os.close(read_fd)
            raise StartupError("bad_command", f"cannot execute {spec.argv[0]!r}: {exc.strerror or exc}",
                               []) from None
        except subprocess.SubprocessError as exc:  # the kernel refused the affinity in the child
            os.close(read_fd)
            raise StartupError("bad_spec", f"engine {spec.engine!r}: cannot pin to cpus {spec.cpus!r}: {exc}",
                               []) from None
        finally:
            os.close(write_fd)  # the server holds the only write end: EOF when it (and its children) exit
        pump = threading.Thread(target=pump_log, args=(read_fd, log_path, log_secrets(spec)),
                                name=f"log-{spec.engine}-{spec.port}", daemon=True)
        pump.start()
        key = secrets.api_key(spec.argv, spec.env)
        if key:
            register_api_key(spec.base_url, key)
        server = ProcessServer(spec, log_path, proc, server_id, start_watchdog(server_id), pump)
        reaper.remember(server)
        return server


def start_watchdog(server_id: str) -> subprocess.Popen[bytes]:
    """A process that stops the server tagged `server_id` when our end of its stdin pipe closes."""
    env = {k: v for k, v in os.environ.items() if k not in (reaper.OWNER_ENV, reaper.SERVER_ENV)}
    return subprocess.Popen(  # an argv list: never a shell
        [sys.executable, "-I", "-c", _WATCHDOG, server_id, str(WATCHDOG_GRACE_S)], stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True, close_fds=True)
