"""The one door to run a config: `Session.run(request, workloads, measure, quality)` starts (or
reuses) the config's server, measures the workloads, checks quality and returns a Measurement, or
raises TrialFailed with the classified cause. The study, A/B, regress, baseline, confirmation and
bisect runs all go through it; its ServerPool owns server reuse and teardown."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from harness.engines import Engine, EngineSettings, FailureCause, ModelChoice, StartupInfo, get_engine
from harness.failure import Cause, Failure, TrialFailed
from harness.host.fingerprint import fingerprint
from harness.launch import LaunchSpec, StartupError, get_launcher, log_tail, wait_ready
from harness.launch.base import DAEMON_LOST, OOM_KILLED, Server, exit_text, killed_for_memory
from harness.launch.reaper import run_async
from harness.measure.client import served_model_id, tls_context
from harness.measure.measure import WorkloadMeasurement, measure_workload
from harness.measure.roofline import Roofline
from harness.measure.steady import MeasurePolicy
from harness.measure.workloads import WorkloadSpec

if TYPE_CHECKING:  # types only: the quality modules are imported where they are used
    from harness.quality.quality import QualityModel, QualityResult
    from harness.quality.reference import ReferenceAnswers, ReferenceSpec

Progress = Callable[[str], None]
# Request errors that mean the connection broke (the server may be dying), and how long a dying
# server is given to be seen exited before it is called alive (a 2 s wait, only after such errors).
CONNECTION_ERRORS = frozenset({"incomplete_stream", "connect"})
EXIT_SEEN_S = 2.0
PORT_ATTEMPTS = 3  # starts of one config that may fail only because its port was taken meanwhile


def _quiet(_: str) -> None:
    return None


class LaunchFailed(TrialFailed):
    """The server could not be started (or never became ready)."""

    def __init__(self, cause: str, detail: str, log_tail: list[str], command: str, flag: str | None = None,
                 value: str | None = None, log_path: str | None = None):
        super().__init__(Failure(cause, detail, log_tail, flag=flag, value=value), command, log_path)


@dataclass(frozen=True)
class MeasureSettings:
    repeats: int = 3
    warmup: bool = True
    request_timeout_s: float = 300.0
    policy: MeasurePolicy | None = None  # steady state, stalls, adaptive length (harness/measure/steady.py)


@dataclass
class RunningConfig:
    """A started, ready server and what its startup told us."""

    engine: Engine
    spec: LaunchSpec
    server: Server
    ready_s: float
    startup: StartupInfo
    fingerprint: dict[str, Any] = field(default_factory=dict)
    flags: Mapping[str, Any] = field(default_factory=dict)
    measurements: int = 0  # workload measurements made on this server: the next one's prompt epoch

    @property
    def base_url(self) -> str:
        return self.spec.base_url

    @property
    def command(self) -> str:
        # The launcher's spec: it carries what only the start learns (a Docker image's digest).
        return self.server.spec.command_line()

    def alive(self) -> bool:
        return self.server.returncode() is None

    def log_text(self) -> str:
        return read_text(self.server.log_path)

    def crash_cause(self) -> tuple[str, str]:
        """(cause, deciding line) after the server died while in use: the engine's own line, else a
        kill for memory (the OOM killer leaves nothing in the engine's log), else how it exited."""
        found = self.engine.classify_failure(self.log_text())
        if found:
            return "crashed_after_ready", found.line
        if memory := killed_for_memory(self.server):
            return OOM_KILLED, f"{exit_text(self.server)}: {memory}"
        return "crashed_after_ready", exit_text(self.server)

    def stop(self) -> None:
        self.server.stop()


def read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def classify_startup(engine: Engine, exc: StartupError, log_text: str) -> FailureCause:
    """Refine the launcher's generic cause (exited/timeout) with what the engine's log says."""
    found = engine.classify_failure(log_text) if log_text else None
    if exc.cause == Cause.EXITED and found:
        return found
    if exc.cause == Cause.TIMEOUT and found and found.cause != "crashed":
        # A fatal line (OOM, bad flag...) is the cause even when the process hung instead of exiting.
        return replace(found, line=f"{found.line} (then no exit and not ready: {exc.detail})")
    return FailureCause(exc.cause, exc.detail)


def _start_config(settings: EngineSettings, model: ModelChoice, flags: Mapping[str, Any], env: Mapping[str, str],
                 port: int, log_path: Path, progress: Progress = _quiet,
                 fingerprint_cache: dict[str, dict[str, Any]] | None = None) -> RunningConfig:
    """Start the server for one config and wait until it is ready; raise LaunchFailed with the cause."""
    engine = get_engine(settings.dialect)
    spec = engine.build_launch(settings, model, flags, env, port)
    command = spec.command_line()
    progress(f"starting {settings.name}: {command}")
    try:
        server = get_launcher(spec.launcher).start(spec, log_path)
    except StartupError as exc:
        raise LaunchFailed(exc.cause, exc.detail, exc.log_tail, command, log_path=str(log_path)) from None
    try:
        progress("loading (waiting for ready)")
        ready_s = wait_ready(server, engine.ready_path, spec.ready_timeout_s,
                             progress=None if progress is _quiet else progress)  # a heartbeat
    except StartupError as exc:
        memory = killed_for_memory(server) if exc.cause == Cause.EXITED else None
        server.stop()
        found = classify_startup(engine, exc, read_text(log_path))
        if memory and found.cause == Cause.EXITED:  # nothing in its log: the OOM killer's doing
            found = FailureCause(OOM_KILLED, f"{exc.detail}: {memory}")
        exc_out = LaunchFailed(found.cause, found.line, log_tail(log_path), command, flag=found.flag,
                               value=found.value, log_path=str(log_path))
        if found.flag:
            exc_out.failure.param = engine.param_for_flag(found.flag, flags)
        raise exc_out from None
    except BaseException:
        server.stop()
        raise
    startup = engine.parse_startup(read_text(log_path))
    key = f"{settings.name}|{settings.python}|{settings.image}"
    cache = fingerprint_cache if fingerprint_cache is not None else {}
    if key not in cache:
        progress("fingerprinting the engine environment")
        cache[key] = fingerprint(spec, model.path, settings.python, startup.version)
    fp = {**cache[key], **_server_info(engine, spec.base_url), "command": command}
    return RunningConfig(engine, spec, server, ready_s, startup, fp, dict(flags))


def _server_info(engine: Engine, base_url: str) -> dict[str, str]:
    """What the running server says of its own build (vLLM /version, llama.cpp /props), per start:
    the build that answered, not only the one installed."""
    async def ask() -> dict[str, str]:
        async with httpx.AsyncClient(timeout=10.0, verify=tls_context()) as client:
            return await engine.server_info(client, base_url)
    try:
        return run_async(ask())
    except (httpx.HTTPError, ValueError):
        return {}


def _measure_running(running: RunningConfig, workloads: list[WorkloadSpec], settings: MeasureSettings,
                    progress: Progress = _quiet, roofline: Roofline | None = None) -> dict[str, WorkloadMeasurement]:
    """Measure every workload on a running server; stops early if the server dies."""
    expectations = running.engine.expected_features(running.flags)
    out: dict[str, WorkloadMeasurement] = {}

    async def go() -> None:
        async with httpx.AsyncClient(verify=tls_context()) as client:
            model_id = await served_model_id(client, running.base_url, min(10.0, settings.request_timeout_s))
        for spec in workloads:
            out[spec.name] = await measure_workload(running.engine, running.base_url, model_id, spec,
                                                    settings.repeats, settings.warmup, settings.request_timeout_s,
                                                    expectations, progress, roofline=roofline,
                                                    policy=settings.policy, alive=running.alive,
                                                    epoch=running.measurements)
            running.measurements += 1
            if not running.alive():
                return

    try:
        run_async(go())
    except httpx.HTTPError:
        if running.alive():
            raise
    return out


async def _model_id_of(base_url: str) -> str:
    async with httpx.AsyncClient(verify=tls_context()) as client:
        return await served_model_id(client, base_url)


# ---- the one door ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRequest:
    """One config to run: how to start its server, and whether a fresh start is required."""

    settings: EngineSettings
    model: ModelChoice
    flags: Mapping[str, Any]
    env: Mapping[str, str]
    log_dir: Path
    fresh: bool = False  # never reuse a running server (A/B rounds, confirmation starts)

    @property
    def launch_key(self) -> str:
        """Identity of the server: equal keys can share one running server."""
        s = self.settings
        return repr((s.name, s.command, s.image, s.python, self.model.name, sorted(self.flags.items(), key=str),
                     sorted(self.env.items())))


@dataclass(frozen=True)
class QualityPlan:
    """What the space's `quality:` section asks of every run, with the reference answers."""

    spec: QualityModel
    reference: ReferenceAnswers | None = None
    timeout_s: float = 120.0


@dataclass
class Measurement:
    """Everything one run of a config produced."""

    command: str
    env: dict[str, str]
    log_path: str
    ready_s: float
    reused_server: bool
    startup: StartupInfo
    fingerprint: dict[str, Any]
    workloads: dict[str, WorkloadMeasurement] = field(default_factory=dict)
    quality: QualityResult | None = None
    dialect: str = ""
    # Where the server answers; it stays there while the session keeps it (keep_server), so that a
    # caller can point another client at the very server it measured (bench.external).
    base_url: str = ""


class ServerPool:
    """Keeps at most one server running (memory on one box allows one big model), reuses it for
    an equal launch key, and stops it on close, whatever happened."""

    def __init__(self, progress: Progress = _quiet):
        self.progress = progress
        self._key: str | None = None
        self._running: RunningConfig | None = None
        self._fingerprints: dict[str, dict[str, Any]] = {}
        self.starts = 0  # every attempted start costs its startup time, failed or not
        self.reuses = 0

    @property
    def running(self) -> RunningConfig | None:
        return self._running

    def acquire(self, request: RunRequest) -> tuple[RunningConfig, bool]:
        """(a ready server for the request, whether it was reused); raises LaunchFailed."""
        kept = self._running
        if not request.fresh and kept is not None and self._key == request.launch_key and _alive(kept):
            self.reuses += 1
            return kept, True
        self.release()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.starts += 1
            try:
                running = _start_config(request.settings, request.model, request.flags, request.env,
                                       free_port(request.settings.host), request.log_dir / "server.log",
                                       self.progress, self._fingerprints)
                break
            except LaunchFailed as exc:
                # A free port is only free until someone binds it: another program (or an outgoing
                # connection's ephemeral port) can take it between our pick and the server's bind.
                # That says nothing about the config, so it is started again on another port.
                if exc.failure.cause != Cause.PORT_IN_USE or attempt == PORT_ATTEMPTS:
                    raise
                self.progress(f"the port was taken before the server bound it ({exc.failure.detail}); "
                              "starting again on another port")
        self._key, self._running = request.launch_key, running
        return running, False

    def release(self) -> None:
        """Stop the server kept running, if any."""
        if self._running is not None:
            self.progress("stopping the server")
            running, self._running, self._key = self._running, None, None
            running.stop()

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


class Session:
    """Runs configs one at a time through one ServerPool. Use as a context manager (or call
    close()) so that no server outlives the command."""

    def __init__(self, progress: Progress = _quiet, keep_server: bool = True):
        self.progress = progress
        self.pool = ServerPool(progress)
        self.keep_server = keep_server  # False: stop the server after every run

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.pool.release()

    @property
    def starts(self) -> int:
        """Server starts attempted so far (failed ones too: each costs its startup time)."""
        return self.pool.starts

    @property
    def reuses(self) -> int:
        return self.pool.reuses

    def capture_reference(self, request: RunRequest, spec: ReferenceSpec, model: str, params: Mapping[str, Any],
                          timeout_s: float) -> ReferenceAnswers:
        """Start (or reuse) the reference config's server and record its answers to the reference
        prompts: the door's other verb, used once per study. Raises LaunchFailed."""
        from harness.quality.reference import capture_reference

        running, _ = self.pool.acquire(request)

        async def capture() -> ReferenceAnswers:
            return await capture_reference(running.base_url, await _model_id_of(running.base_url),
                                           running.engine.dialect, spec, model, params, timeout_s)

        try:
            return run_async(capture())
        finally:
            if not self.keep_server:
                self.pool.release()

    def run(self, request: RunRequest, workloads: list[WorkloadSpec], measure: MeasureSettings,
            quality: QualityPlan | None = None, roofline: Roofline | None = None,
            ready: Callable[[], None] | None = None) -> Measurement:
        """Start or reuse the server, measure every workload, check quality. Raises TrialFailed. `ready` is
        called once the server is up, before anything is measured (a side-by-side A/B waits there for the other
        side's server, so that both measure the same seconds); what it raises ends the run, the server stopped
        unless kept."""
        running, reused = self.pool.acquire(request)
        result = Measurement(command=running.command, env=dict(running.spec.env), log_path=str(running.server.log_path),
                             ready_s=0.0 if reused else running.ready_s, reused_server=reused,
                             startup=running.startup, fingerprint=running.fingerprint,
                             dialect=running.engine.dialect, base_url=running.base_url)
        try:
            if ready is not None:
                ready()
            result.workloads = self._measure(running, workloads, measure, roofline, result)
            self._check(running, quality, result)
        except TrialFailed as exc:
            if exc.failure.cause == DAEMON_LOST:  # nothing to reuse: the daemon no longer answers for it
                self.pool.release()
            exc.partial = exc.partial or result
            raise
        finally:
            if not self.keep_server:
                self.pool.release()
        return result

    def _check(self, running: RunningConfig, quality: QualityPlan | None, result: Measurement) -> None:
        """Quality, then whether the server lived through the measurement; raises TrialFailed."""
        if quality is not None and running.alive():
            self.progress(f"checking quality ({getattr(quality.spec, 'suite', None) or 'reference agreement'})")
            result.quality = run_async(_assess(running, quality))
            if result.quality.fatal:  # garbage never wins, whatever its speed
                raise TrialFailed(Failure(Cause.DEGENERATE_OUTPUT, result.quality.fatal), result.command,
                                  result.log_path, result)
        broken = any(k in CONNECTION_ERRORS for wm in result.workloads.values() for k in wm.errors_by_kind)
        if not running.alive() or (broken and _exits_within(running, EXIT_SEEN_S)):
            cause, detail = running.crash_cause()
            self.pool.release()
            raise TrialFailed(Failure(cause, detail, log_tail(running.server.log_path)), result.command,
                              result.log_path, result)

    def _measure(self, running: RunningConfig, workloads: list[WorkloadSpec], measure: MeasureSettings,
                 roofline: Roofline | None, result: Measurement) -> dict[str, WorkloadMeasurement]:
        try:
            return _measure_running(running, workloads, measure, self.progress, roofline)
        except httpx.HTTPError as exc:
            if not _exits_within(running, EXIT_SEEN_S):  # alive but not answering (frozen, deadlocked)
                tail = log_tail(running.server.log_path)
                self.pool.release()
                raise TrialFailed(Failure(Cause.UNRESPONSIVE, f"the server stopped answering ({type(exc).__name__})",
                                          tail), result.command, result.log_path, result) from None
            return {}  # it died: the caller sees a dead server and records the crash


def _alive(running: RunningConfig) -> bool:
    """Whether a kept server can be reused; not when its launcher lost track of it (the Docker daemon
    stopped answering): then it is released and the next start says why."""
    try:
        return running.alive()
    except TrialFailed:
        return False


def _exits_within(running: RunningConfig, seconds: float) -> bool:
    """Whether the server is seen exited within `seconds`. A killed server closes its sockets while
    it exits, so its clients see a broken stream a moment before its exit status exists."""
    deadline = time.monotonic() + seconds
    while running.alive():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


async def _assess(running: RunningConfig, plan: QualityPlan) -> QualityResult:
    from harness.quality.quality import assess

    return await assess(running.base_url, await _model_id_of(running.base_url), running.engine.dialect,
                        plan.spec, plan.reference, plan.timeout_s)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host not in ("0.0.0.0", "") else "127.0.0.1", 0))
        return int(s.getsockname()[1])
