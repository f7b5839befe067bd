"""Docker containers through the Docker SDK: one container per server, removed when it stops.

Every container carries the label `flagsearch=1` (plus the trial, engine and port), runs with the
host network, unprivileged (no-new-privileges) unless the spec asks, with `init` so that the
engine gets SIGTERM forwarded and children reaped. Images are never pulled: a missing image is a
startup failure naming the `docker pull` to run. The daemon is the one DOCKER_HOST names
(scripts/dockerd.sh starts a private one).

`argv[0] == "@entrypoint"` keeps the image's own entrypoint (e.g. vllm/vllm-openai's `vllm serve`)
and passes the rest as its arguments; otherwise argv runs as given (entrypoint = argv[0]).

The container's output is written to the trial's log with secrets scrubbed line by line as it
arrives (harness.secrets.LineScrubber), as for local processes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import threading
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests
from docker.types import DeviceRequest, Ulimit

from harness import secrets
from harness.failure import Failure, TrialFailed
from harness.host import hostload
from harness.launch import reaper
from harness.launch.base import DAEMON_LOST, StartupError
from harness.launch.cpus import check_cpus
from harness.launch.spec import KEEP_ENTRYPOINT, LaunchSpec
from harness.measure.client import forget_api_key, register_api_key

LABEL = "flagsearch"


def client_from_env() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except docker.errors.DockerException as exc:
        where = os.environ.get("DOCKER_HOST", "the default socket")
        raise StartupError("docker_unavailable", f"no Docker engine answers at {where}: {exc} "
                           "(start one with scripts/dockerd.sh start; then export DOCKER_HOST)", []) from None
    return client


def device_requests(gpus: str | None) -> list[DeviceRequest]:
    """'all' -> every GPU; '0,1' -> those devices; None/'' -> no GPU (GPUs are opt-in)."""
    if not gpus:
        return []
    if gpus.strip() == "all":
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return [DeviceRequest(device_ids=[d.strip() for d in gpus.split(",") if d.strip()], capabilities=[["gpu"]])]


def repo_digest(image: Any, name: str) -> str | None:
    """The registry digest (sha256:...) of a pulled image, matching `name`'s repository where it has
    several; None for an image built or imported locally (it has no registry digest)."""
    digests = list((image.attrs or {}).get("RepoDigests") or [])
    repo = name.split("@", 1)[0]
    repo = repo.rsplit(":", 1)[0] if ":" in repo.rsplit("/", 1)[-1] else repo
    for entry in digests:
        if entry.split("@", 1)[0] == repo:
            return entry.split("@", 1)[1]
    return digests[0].split("@", 1)[1] if digests else None


def container_config(spec: LaunchSpec, log_path: Path) -> dict[str, Any]:
    """The keyword arguments of containers.create for a spec (kept separate so it reads as a table)."""
    argv = list(spec.argv)
    entry: dict[str, Any]
    if argv and argv[0] == KEEP_ENTRYPOINT:
        entry = {"command": argv[1:]}
    else:
        entry = {"entrypoint": argv[:1], "command": argv[1:]}
    trial = log_path.parent.name
    labels = {LABEL: "1", f"{LABEL}.trial": trial, f"{LABEL}.engine": spec.engine,
              f"{LABEL}.port": str(spec.port), f"{LABEL}.owner_pid": str(os.getpid())}
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", f"flagsearch-{spec.engine}-{spec.port}-{uuid.uuid4().hex[:8]}")
    return dict(
        image=spec.image, name=name, labels=labels, environment=dict(spec.env),
        volumes={v.host_path: {"bind": v.container_path, "mode": "ro" if v.read_only else "rw"}
                 for v in spec.volumes},
        network_mode="host", ipc_mode="host" if spec.ipc_host else None, shm_size=spec.shm_size,
        device_requests=device_requests(spec.gpus) or None, privileged=spec.privileged,
        cpuset_cpus=spec.cpus or None,
        ulimits=[Ulimit(name=u.name, soft=u.soft, hard=u.hard) for u in spec.ulimits] or None,
        cap_add=list(spec.cap_add) or None, devices=list(spec.devices) or None, mem_limit=spec.mem_limit,
        memswap_limit=spec.memswap_limit, pids_limit=spec.pids_limit,
        security_opt=None if spec.privileged else ["no-new-privileges"], init=True, detach=True,
        **entry,
    )


# What a lost daemon raises through the SDK: requests' ConnectionError (an OSError, not a
# DockerException) when the socket is gone, a DockerException when the SDK wraps it.
DAEMON_ERRORS = (requests.exceptions.RequestException, docker.errors.DockerException)
STOP_ERRORS = (TrialFailed, requests.exceptions.RequestException, docker.errors.DockerException)


def daemon_lost(exc: BaseException, spec: LaunchSpec) -> TrialFailed:
    where = os.environ.get("DOCKER_HOST") or "the default socket"
    return TrialFailed(Failure(DAEMON_LOST, f"the Docker daemon ({where}) stopped answering "
                               f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}): the container's "
                               "state is unknown; it is removed as an orphan once the daemon is back"),
                       spec.command_line())


class DockerServer:
    def __init__(self, spec: LaunchSpec, log_path: Path, container: Any):
        self.spec = spec
        self.log_path = log_path
        self.container = container
        self.container_id: str = container.id
        self._state: dict[str, Any] = {}
        self._removed = False
        self._log_thread = threading.Thread(target=self._stream_logs, name=f"logs-{container.name}",
                                            daemon=True)
        self._log_thread.start()

    def _stream_logs(self) -> None:
        scrubber = secrets.LineScrubber(secrets.launch_secrets(self.spec.argv, self.spec.env))
        with self.log_path.open("ab") as log, contextlib.suppress(docker.errors.DockerException, OSError):
            try:
                for chunk in self.container.logs(stream=True, follow=True, stdout=True, stderr=True):
                    log.write(scrubber.feed(chunk))
                    log.flush()
            finally:
                log.write(scrubber.flush())

    def _refresh(self) -> dict[str, Any]:
        if not self._removed:
            try:
                self.container.reload()
                self._state = dict(self.container.attrs.get("State") or {})
            except docker.errors.NotFound:
                self._state = {**self._state, "Status": "removed"}
                if "ExitCode" not in self._state:
                    self._state["ExitCode"] = -1
            except DAEMON_ERRORS as exc:  # the daemon is gone: a typed failure, not a traceback
                raise daemon_lost(exc, self.spec) from None
        return self._state

    def returncode(self) -> int | None:
        state = self._refresh()
        if state.get("Status") in ("exited", "dead", "removed"):
            return int(state.get("ExitCode", -1))
        return None

    def killed_for_memory(self) -> str | None:
        """Docker's word that the kernel killed the container for memory (State.OOMKilled)."""
        rc = self.returncode()
        if rc is not None and self._state.get("OOMKilled"):
            return f"Docker reports the container OOMKilled (exit {rc}): killed for memory"
        return None

    def exit_reason(self) -> str | None:
        """Why the container stopped, as Docker tells it (OOM kill, SIGKILL, exit status); None if running."""
        rc = self.returncode()
        if rc is None:
            return None
        if self._state.get("OOMKilled"):
            return f"OOMKilled (exit {rc})"
        if self._state.get("Status") == "removed":
            return "container removed"
        if rc == 137:
            return "killed (SIGKILL, exit 137)"
        if rc == 143:
            return "terminated (SIGTERM, exit 143)"
        return f"exit {rc}" + (f": {self._state['Error']}" if self._state.get("Error") else "")

    def owned_pids(self) -> list[int]:
        """Host PIDs of the container's processes (Docker's `top` reports host PIDs)."""
        if self.returncode() is not None:
            return []
        try:
            top = self.container.top()
        except (docker.errors.APIError, *DAEMON_ERRORS):
            return []
        titles = top.get("Titles") or []
        column = titles.index("PID") if "PID" in titles else 1
        return sorted(int(row[column]) for row in top.get("Processes") or [])

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (forwarded by init), SIGKILL after the timeout, then remove the container."""
        if not self._removed:
            try:
                with contextlib.suppress(docker.errors.NotFound):
                    self._refresh()
                    if self._state.get("Status") == "running":
                        self.container.stop(timeout=max(1, int(timeout_s)))
                    self._refresh()
                    self.container.remove(force=True)
            except STOP_ERRORS:
                # No daemon to ask: the container (labelled with this process) is removed as an orphan
                # by the next start once the daemon is back (reap_orphans).
                pass
            self._removed = True
        self._log_thread.join(timeout=5)
        forget_api_key(self.spec.base_url)
        reaper.forget(self)


def _check_port(host: str, port: int) -> None:
    bind_host = "0.0.0.0" if host in ("", "0.0.0.0") else host
    with socket.socket(socket.AF_INET6 if ":" in bind_host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((bind_host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StartupError("port_in_use", f"{bind_host}:{port} is already in use (host network)",
                                   []) from None


def reap_orphans(client: docker.DockerClient) -> list[str]:
    """Remove our containers whose owning flagsearch process is gone (it was SIGKILLed, or the
    machine's flagsearch crashed): the Docker counterpart of the process launcher's watchdog.
    Containers of a live flagsearch process are left alone. Returns the names reaped, by this call or
    by another process's reaper that was removing them at the same time (two workers starting together)."""
    import psutil

    removed = []
    for container in leftover_containers(client):
        owner = (container.labels or {}).get(f"{LABEL}.owner_pid", "")
        if owner.isdigit() and psutil.pid_exists(int(owner)):
            continue
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass  # another flagsearch process reaped it between our listing and our removal
        except docker.errors.APIError as e:
            # 409 "removal ... is already in progress": another flagsearch process is reaping it.
            if e.status_code != 409:
                continue
        except docker.errors.DockerException:
            continue
        removed.append(container.name)
    return removed


class DockerLauncher:
    def __init__(self, client: docker.DockerClient | None = None):
        self._client = client
        self._reaped = False

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = client_from_env()
        return self._client

    def start(self, spec: LaunchSpec, log_path: Path) -> DockerServer:
        try:
            return self._start(spec, log_path)
        except StartupError:
            raise
        except DAEMON_ERRORS as exc:  # no daemon to talk to: one typed startup failure, not a traceback
            raise StartupError(DAEMON_LOST, daemon_lost(exc, spec).detail, []) from None

    def _start(self, spec: LaunchSpec, log_path: Path) -> DockerServer:
        if not spec.image:
            raise StartupError("bad_spec", f"engine {spec.engine!r}: the docker launcher needs an `image`", [])
        try:
            image = self.client.images.get(spec.image)
        except docker.errors.ImageNotFound:
            raise StartupError("image_not_found", f"image {spec.image!r} is not present on this Docker engine; "
                               f"flagsearch never pulls: run `docker pull {spec.image}` first", []) from None
        if spec.cpus:  # the daemon's machine, which may not be this one (a remote DOCKER_HOST)
            check_cpus(spec.engine, spec.cpus, range(int(self.client.info().get("NCPU") or 0)))
        if not self._reaped:
            reap_orphans(self.client)  # before the port check: an orphan may hold the port
            self._reaped = True
        _check_port(spec.host, spec.port)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            container = self.client.containers.create(**container_config(spec, log_path))
        except docker.errors.APIError as exc:
            raise StartupError("docker_error", f"cannot create the container: {exc.explanation or exc}", []) from None
        try:
            container.start()
        except docker.errors.APIError as exc:
            with contextlib.suppress(docker.errors.DockerException):
                container.remove(force=True)  # a failed start leaves a Created container behind
            text = str(exc.explanation or exc)
            cause = "gpu_unavailable" if "device driver" in text or "gpu" in text.lower() else "docker_error"
            raise StartupError(cause, f"cannot start the container: {text}", []) from None
        with contextlib.suppress(docker.errors.DockerException):
            container.reload()  # its processes are dockerd's children, not ours: the load meter is told
            hostload.claim(int((container.attrs.get("State") or {}).get("Pid") or 0))
        # The server's spec names the exact image that ran (server.spec.command_line() pins it).
        key = secrets.api_key(spec.argv, spec.env)
        if key:
            register_api_key(spec.base_url, key)
        server = DockerServer(replace(spec, image_digest=repo_digest(image, spec.image)), log_path, container)
        reaper.remember(server)
        return server


def leftover_containers(client: docker.DockerClient, **labels: str) -> list[Any]:
    """Containers (running or not) that carry our label and the given extra labels."""
    filters = [f"{LABEL}=1", *(f"{LABEL}.{k}={v}" for k, v in labels.items())]
    return list(client.containers.list(all=True, filters={"label": filters}))
