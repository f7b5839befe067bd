"""Start one config's server, measure workloads on it, stop it: the unit every command uses
(the search's trials, A/B runs, regression checks)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from harness.client import served_model_id
from harness.engines import Engine, EngineSettings, ModelChoice, StartupInfo, get_engine
from harness.fingerprint import fingerprint
from harness.launch import LaunchSpec, StartupError, get_launcher, log_tail, wait_ready
from harness.launch.base import Server
from harness.measure import WorkloadMeasurement, measure_workload
from harness.roofline import Roofline
from harness.workloads import WorkloadSpec

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


class LaunchFailed(Exception):
    """A config's server could not be started; `cause` is a short class (bad_flag, oom, timeout...)."""

    def __init__(self, cause: str, detail: str, log_tail: list[str], command: str):
        super().__init__(f"{cause}: {detail}")
        self.cause = cause
        self.detail = detail
        self.log_tail = log_tail
        self.command = command


@dataclass(frozen=True)
class MeasureSettings:
    repeats: int = 3
    warmup: bool = True
    request_timeout_s: float = 300.0


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

    @property
    def base_url(self) -> str:
        return self.spec.base_url

    @property
    def command(self) -> str:
        return self.spec.command_line()

    def alive(self) -> bool:
        return self.server.returncode() is None

    def log_text(self) -> str:
        return read_text(self.server.log_path)

    def crash_cause(self) -> tuple[str, str]:
        """(cause, deciding line) after the server died while in use."""
        found = self.engine.classify_failure(self.log_text())
        return "crashed_after_ready", (found.line if found else f"server exited with status "
                                       f"{self.server.returncode()}")

    def stop(self) -> None:
        self.server.stop()


def read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def classify_startup(engine: Engine, exc: StartupError, log_text: str) -> tuple[str, str]:
    """Refine the launcher's generic cause (exited/timeout) with what the engine's log says."""
    found = engine.classify_failure(log_text) if log_text else None
    if exc.cause == "exited" and found:
        return found.cause, found.line
    if exc.cause == "timeout" and found and found.cause != "crashed":
        # A fatal line (OOM, bad flag...) is the cause even when the process hung instead of exiting.
        return found.cause, f"{found.line} (then no exit and not ready: {exc.detail})"
    return exc.cause, exc.detail


def start_config(settings: EngineSettings, model: ModelChoice, flags: Mapping[str, Any], env: Mapping[str, str],
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
        raise LaunchFailed(exc.cause, exc.detail, exc.log_tail, command) from None
    try:
        progress("loading (waiting for ready)")
        ready_s = wait_ready(server, engine.ready_path, spec.ready_timeout_s)
    except StartupError as exc:
        server.stop()
        cause, detail = classify_startup(engine, exc, read_text(log_path))
        raise LaunchFailed(cause, detail, log_tail(log_path), command) from None
    except BaseException:
        server.stop()
        raise
    startup = engine.parse_startup(read_text(log_path))
    key = f"{settings.name}|{settings.python}|{settings.image}"
    cache = fingerprint_cache if fingerprint_cache is not None else {}
    if key not in cache:
        progress("fingerprinting the engine environment")
        cache[key] = fingerprint(spec, model.path, settings.python, startup.version)
    fp = {**cache[key], "command": command}
    return RunningConfig(engine, spec, server, ready_s, startup, fp, dict(flags))


def measure_running(running: RunningConfig, workloads: list[WorkloadSpec], settings: MeasureSettings,
                    progress: Progress = _quiet, roofline: Roofline | None = None) -> dict[str, WorkloadMeasurement]:
    """Measure every workload on a running server; stops early if the server dies."""
    expectations = running.engine.expected_features(running.flags)
    out: dict[str, WorkloadMeasurement] = {}

    async def go() -> None:
        async with httpx.AsyncClient() as client:
            model_id = await served_model_id(client, running.base_url)
        for spec in workloads:
            out[spec.name] = await measure_workload(running.engine, running.base_url, model_id, spec,
                                                    settings.repeats, settings.warmup, settings.request_timeout_s,
                                                    expectations, progress, roofline=roofline)
            if not running.alive():
                return

    try:
        asyncio.run(go())
    except httpx.HTTPError:
        if running.alive():
            raise
    return out


async def model_id_of(base_url: str) -> str:
    async with httpx.AsyncClient() as client:
        return await served_model_id(client, base_url)
