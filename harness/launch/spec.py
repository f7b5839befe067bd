"""What to start: the typed boundary between an engine dialect and a launcher."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from harness.secrets import REDACTED, is_secret_name, known, launch_secrets, redact_argv, redact_env, scrub_text

# The secret rules live in harness.secrets; re-exported here for the launchers and older imports.
__all__ = ["REDACTED", "LaunchSpec", "Ulimit", "Volume", "is_secret_name", "redact_argv", "redact_env", "scrub_text",
           "secret_values"]


def secret_values(*envs: Mapping[str, str]) -> list[str]:
    """Every known secret value (see harness.secrets.known), including those of `envs`."""
    return known(*envs)


# argv[0] that keeps a Docker image's own entrypoint (the rest are its arguments).
KEEP_ENTRYPOINT = "@entrypoint"


@dataclass(frozen=True)
class Volume:
    host_path: str
    container_path: str
    read_only: bool = True  # read-only unless the space says read_only: false


@dataclass(frozen=True)
class Ulimit:
    """A container resource limit (`docker run --ulimit name=soft:hard`); -1 is unlimited."""

    name: str  # nofile, memlock, stack, ...
    soft: int
    hard: int


@dataclass(frozen=True)
class LaunchSpec:
    """One server start, fully resolved: argv, env and (for containers) image and mounts."""

    engine: str
    argv: tuple[str, ...]
    host: str
    port: int
    env: Mapping[str, str] = field(default_factory=dict)
    launcher: str = "process"
    image: str | None = None
    volumes: tuple[Volume, ...] = ()
    gpus: str | None = None  # docker: "all" or a device list; None = no GPU request
    shm_size: str | None = None
    ipc_host: bool = False
    privileged: bool = False
    ready_timeout_s: float = 900.0
    image_digest: str | None = None  # docker: the image's repository digest (sha256:...), where known
    cpus: str | None = None  # a Linux cpu list ("2-9"): the server runs on these CPUs only (launch/cpus.py)
    # docker only: what the images' own `docker run` lines set (eugr's spark-vllm-docker: --ulimit
    # nofile=1048576:1048576; unprivileged: --cap-add IPC_LOCK, --device /dev/infiniband, --memory,
    # --memory-swap, --pids-limit).
    ulimits: tuple[Ulimit, ...] = ()
    cap_add: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()  # host[:container[:permissions]], as `docker run --device`
    mem_limit: str | None = None  # "110g": the container's memory limit (--memory)
    memswap_limit: str | None = None  # memory + swap (--memory-swap)
    pids_limit: int | None = None

    def __post_init__(self) -> None:
        # Arguments go to exec() as a list, never through a shell; reject what exec cannot take
        # rather than letting it fail obscurely (or be reinterpreted) later.
        if not self.argv:
            raise ValueError(f"{self.engine}: empty command")
        for arg in self.argv:
            if not isinstance(arg, str):
                raise ValueError(f"{self.engine}: argument {arg!r} is not a string")
            if "\x00" in arg:
                raise ValueError(f"{self.engine}: argument {arg!r} contains a NUL byte")
        for name, value in self.env.items():
            if not isinstance(value, str) or "\x00" in value or "=" in name or not name:
                raise ValueError(f"{self.engine}: bad environment entry {name!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"{self.engine}: port {self.port} is out of range")

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def command_line(self) -> str:
        """The command a user can paste into a shell to start the same server (secrets redacted).

        Docker: the `docker run` line that makes the container the Docker launcher makes (host
        network, init, no-new-privileges unless privileged, GPUs, IPC, shm, ulimits, capabilities,
        devices, memory and pids limits, env, volumes, the
        entrypoint: argv[0] becomes --entrypoint unless it is "@entrypoint", which keeps the image's
        own), pinned to the image's digest where the launcher learned it. A pinned process server
        reads `taskset -c <cpus> ...`: the launcher sets the same affinity itself, without taskset."""
        secrets = launch_secrets(self.argv, self.env)
        if self.launcher == "docker" and self.image:
            return scrub_text(shlex.join(self.docker_run_argv()), secrets)
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(redact_env(self.env).items()))
        cmd = shlex.join(redact_argv(self.argv))
        if self.cpus:
            cmd = f"taskset -c {shlex.quote(self.cpus)} {cmd}"
        return scrub_text(f"{env} {cmd}".strip(), secrets)

    def docker_run_argv(self) -> list[str]:
        """`docker run ...` as an argv (values redacted as in command_line)."""
        assert self.image, "docker_run_argv needs an image"
        out = ["docker", "run", "--rm", "--network", "host", "--init"]
        if self.gpus:
            gpus = self.gpus.strip()
            # The CLI's syntax for a device list is --gpus '"device=0,1"'.
            out += ["--gpus", gpus if gpus == "all" or "=" in gpus else f'"device={gpus}"']
        if self.ipc_host:
            out += ["--ipc", "host"]
        if self.shm_size:
            out += ["--shm-size", self.shm_size]
        if self.cpus:
            out += ["--cpuset-cpus", self.cpus]
        for limit in self.ulimits:
            out += ["--ulimit", f"{limit.name}={limit.soft}:{limit.hard}"]
        for cap in self.cap_add:
            out += ["--cap-add", cap]
        for device in self.devices:
            out += ["--device", device]
        if self.mem_limit:
            out += ["--memory", self.mem_limit]
        if self.memswap_limit:
            out += ["--memory-swap", self.memswap_limit]
        if self.pids_limit is not None:
            out += ["--pids-limit", str(self.pids_limit)]
        out += ["--privileged"] if self.privileged else ["--security-opt", "no-new-privileges"]
        for k, v in sorted(redact_env(self.env).items()):
            out += ["-e", f"{k}={v}"]
        for vol in self.volumes:
            out += ["-v", f"{vol.host_path}:{vol.container_path}{':ro' if vol.read_only else ''}"]
        argv = redact_argv(self.argv)
        keep_entrypoint = argv[0] == KEEP_ENTRYPOINT
        if not keep_entrypoint:
            out += ["--entrypoint", argv[0]]
        # name:tag@digest runs the digest (the tag stays for the reader).
        image = f"{self.image}@{self.image_digest}" if self.image_digest and "@" not in self.image else self.image
        return [*out, image, *argv[1:]]
