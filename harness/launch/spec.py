"""What to start: the typed boundary between an engine dialect and a launcher."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# Names that look like credentials. Their values never reach results, reports or logs we write.
# Whole name segments only: HF_TOKEN, --api-key, AWS_SECRET_ACCESS_KEY are secrets, while
# --max-num-batched-tokens or TOKENIZER are not (a redacted flag value breaks the reproduce command).
_SECRET_NAME = re.compile(r"(?:^|[_\-.])(TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?)(?:$|[_\-.])", re.IGNORECASE)
REDACTED = "***"
# Values shorter than this are not scrubbed by value (too likely to hit ordinary text such as "1").
_MIN_SECRET_LEN = 6


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}


def secret_values(*envs: Mapping[str, str]) -> list[str]:
    """Values of secret-named variables in `envs` and in our own environment, longest first."""
    found = {v for env in (*envs, os.environ) for k, v in env.items()
             if is_secret_name(k) and v and len(v) >= _MIN_SECRET_LEN}
    return sorted(found, key=len, reverse=True)


def scrub_text(text: str, secrets: Iterable[str]) -> str:
    """Replace every occurrence of a secret value (e.g. an expanded ${HF_TOKEN} in an argv)."""
    for value in secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def redact_argv(argv: Iterable[str]) -> list[str]:
    """`--api-key X` / `--hf-token=X` -> the value replaced; other arguments unchanged."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-") and is_secret_name(arg.split("=", 1)[0]):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


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
        """The command a user can paste to start the same server (secrets redacted)."""
        secrets = secret_values(self.env)
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(redact_env(self.env).items()))
        cmd = shlex.join(redact_argv(self.argv))
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
            return scrub_text(" ".join([*flags, shlex.quote(self.image), cmd]), secrets)
        return scrub_text(f"{env} {cmd}".strip(), secrets)
