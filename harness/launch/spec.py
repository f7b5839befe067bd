"""What to start: the typed boundary between an engine dialect and a launcher."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

# Names that look like credentials. Their values never reach results, reports or logs we write.
_SECRET_NAME = re.compile(r"(TOKEN|KEY|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)
REDACTED = "***"


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}


@dataclass(frozen=True)
class Volume:
    host_path: str
    container_path: str
    read_only: bool = False


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

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def command_line(self) -> str:
        """The command a user can paste to start the same server (secrets redacted)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(redact_env(self.env).items()))
        cmd = shlex.join(self.argv)
        if self.launcher == "docker" and self.image:
            flags = ["docker run --rm --network host"]
            if self.gpus:
                flags.append(f"--gpus {shlex.quote(self.gpus)}")
            if self.ipc_host:
                flags.append("--ipc host")
            if self.shm_size:
                flags.append(f"--shm-size {self.shm_size}")
            if self.privileged:
                flags.append("--privileged")
            flags += [f"-e {k}={shlex.quote(v)}" for k, v in sorted(redact_env(self.env).items())]
            flags += [
                f"-v {shlex.quote(v.host_path)}:{shlex.quote(v.container_path)}{':ro' if v.read_only else ''}"
                for v in self.volumes
            ]
            return " ".join([*flags, shlex.quote(self.image), cmd])
        return f"{env} {cmd}".strip()
