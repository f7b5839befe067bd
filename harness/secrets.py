"""Secrets: what counts as one, and scrubbing them out of everything the tool writes or prints.

A value is a secret when it came from
- an environment variable with a secret-looking name (ours, or one a space gives an engine), or
- a secret-named key anywhere in a space file (`api_key: sk-...` under `args`, `env`, a fixed
  parameter), or the value after a secret-named flag in a command (`--api-key sk-...`).
Loading a space remembers its literal secrets for the life of the process (`remember`), so that
code far from the space (result records, baselines, logs, reports, progress lines) scrubs them
without being handed them. Values shorter than MIN_SECRET_LEN are not scrubbed by value (they would
hit ordinary text such as "1"); they are still redacted in printed command lines (after their flag)
and in `env` mappings, but a 5-character key written in a space can reach a pinned baseline config.
A `${VAR}` reference as written in a space names a secret without holding it and is kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

# Whole name segments only: HF_TOKEN, --api-key, AWS_SECRET_ACCESS_KEY, GITHUB_PAT, NPM_AUTH,
# AUTHORIZATION are secrets, while --max-num-batched-tokens, TOKENIZER or PATH are not (a redacted flag
# value breaks the reproduce command). A password may also end a name without a separator (PGPASSWORD),
# and MYSQL_PWD's last segment is PWD (the shell's own PWD, the working directory, is not a secret).
_SECRET_NAME = re.compile(r"(?:^|[_\-.])(TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?|APIKEY|PAT|AUTH|AUTHORIZATION)"
                          r"(?:$|[_\-.])|PASSW(?:OR)?D$|.[_\-.]PWD$", re.IGNORECASE)
# A credential inside one argument: an HTTP header (`--header 'Authorization: Bearer ...'`, `-H
# 'X-Api-Key: ...'`). Group 1 is the secret.
_HEADER_SECRET = re.compile(r"(?i)\b(?:proxy-)?(?:authorization|x-api-key|api-key)\s*:\s*"
                            r"(?:(?:bearer|basic|token)\s+)?(\S+)")
REDACTED = "***"
MIN_SECRET_LEN = 6
_REFERENCE = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\}$")
# Flags whose value the server checks as a bearer key (llama-server, vLLM, SGLang all spell it so).
_API_KEY_FLAGS = ("--api-key",)
_API_KEY_ENVS = ("LLAMA_API_KEY", "VLLM_API_KEY")

_lock = threading.Lock()
_remembered: set[str] = set()


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def is_reference(value: Any) -> bool:
    """`${HF_TOKEN}` as written in a space: a pointer to a secret, not the secret."""
    return isinstance(value, str) and bool(_REFERENCE.match(value))


def remember(values: Iterable[Any]) -> None:
    """Scrub these values (as text) from everything written by this process from now on."""
    with _lock:
        _remembered.update(s for s in (str(v) for v in values if v is not None)
                           if len(s) >= MIN_SECRET_LEN and not is_reference(s) and s != REDACTED)


def forget_all() -> None:
    """For tests: drop the remembered literals."""
    with _lock:
        _remembered.clear()


def known(*envs: Mapping[str, str]) -> list[str]:
    """Every secret value known here: secret-named variables of `envs` and of our environment, and
    the literals remembered from spaces and commands; longest first (so a secret containing
    another is replaced whole)."""
    found = {v for env in (*envs, os.environ) for k, v in env.items()
             if is_secret_name(k) and v and len(v) >= MIN_SECRET_LEN}
    with _lock:
        found |= _remembered
    return sorted(found, key=len, reverse=True)


def scrub_text(text: str, secrets: Iterable[str] | None = None) -> str:
    """Replace every occurrence of a secret value (default: every known one)."""
    for value in known() if secrets is None else secrets:
        if value and value in text:
            text = text.replace(value, REDACTED)
    return text


def scrub(data: Any, secrets: list[str] | None = None) -> Any:
    """A copy of JSON-like `data` with every known secret value replaced, and `env` mappings
    redacted by name. Other keys are not judged by name: stored data has innocent fields such as
    `key` (a hash) or `kv_bytes_per_token`; literal secrets are known by value (see doc_secrets).
    References such as `${HF_TOKEN}` are kept: a pinned space still reads the token from the
    environment."""
    secrets = known() if secrets is None else secrets
    if isinstance(data, str):
        return scrub_text(data, secrets)
    if isinstance(data, dict):
        out = {}
        for key, value in data.items():
            if key == "env" and isinstance(value, dict):
                value = {k: (REDACTED if is_secret_name(str(k)) and not is_reference(v) else v)
                         for k, v in value.items()}
            out[scrub_text(key, secrets) if isinstance(key, str) else key] = scrub(value, secrets)
        return out
    if isinstance(data, (list, tuple)):
        return [scrub(v, secrets) for v in data]
    return data


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def inner_secrets(arg: str) -> list[str]:
    """Secrets inside one argument: a header's credential (`Authorization: Bearer X`), and the values
    under secret-named keys of a JSON object (`--hf-overrides '{"token": "hf_..."}'`)."""
    found = [m.group(1) for m in _HEADER_SECRET.finditer(arg)]
    text = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
    if text.lstrip().startswith(("{", "[")):
        with contextlib.suppress(ValueError, RecursionError):
            found += [v for v in doc_secrets(json.loads(text)) if isinstance(v, str)]
    return [v for v in found if v and v != REDACTED]


def redact_argv(argv: Iterable[str]) -> list[str]:
    """`--api-key X` / `--hf-token=X` -> the value replaced; a credential inside an argument (a
    header, a JSON object's secret-named key) replaced in place; other arguments unchanged."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if hidden := inner_secrets(arg):
            for value in sorted(hidden, key=len, reverse=True):
                arg = arg.replace(value, REDACTED)
            out.append(arg)
            continue
        if arg.startswith("-") and is_secret_name(_flag_name(arg)):
            if "=" in arg:
                out.append(_flag_name(arg) + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


def argv_secrets(argv: Iterable[str]) -> list[str]:
    """The values that redact_argv hides (those long enough to scrub by value)."""
    args = list(argv)
    out = []
    for original, shown in zip(args, redact_argv(args), strict=True):
        if original == shown:
            continue
        if hidden := inner_secrets(original):
            out += hidden
            continue
        out.append(original.split("=", 1)[1] if shown.endswith("=" + REDACTED) else original)
    return [v for v in out if len(v) >= MIN_SECRET_LEN]


def launch_secrets(argv: Iterable[str], env: Mapping[str, str]) -> list[str]:
    """What nothing about one server start may show: every known secret, its env's and its argv's."""
    return sorted({*known(env), *argv_secrets(argv)}, key=len, reverse=True)


def doc_secrets(node: Any, key: str = "") -> list[str]:
    """Literal secrets in a space document: text values under secret-named keys (at any depth), and
    the values after secret-named flags in command lists, and the `value` of a secret-named
    parameter. Numbers are not taken (a model's
    `kv_bytes_per_token` is a size, not a token)."""
    out: list[str] = []
    if isinstance(node, dict):
        if key and is_secret_name(key) and isinstance(node.get("value"), str):
            out.append(node["value"])  # a secret-named `fixed` parameter: params.api_key.value
        for k, v in node.items():
            out += doc_secrets(v, str(k))
    elif isinstance(node, list):
        if all(isinstance(v, str) for v in node):
            out += argv_secrets(node)
        for v in node:
            out += doc_secrets(v, key)
    elif key and is_secret_name(key) and isinstance(node, str):
        out.append(node)
    elif isinstance(node, str):
        out += inner_secrets(node)  # a header or a JSON object given as one value (an engine arg)
    return out


def api_key(argv: Iterable[str], env: Mapping[str, str]) -> str | None:
    """The bearer key a server started with this argv/env demands of its clients, if any."""
    args = list(argv)
    for i, arg in enumerate(args):
        if arg in _API_KEY_FLAGS and i + 1 < len(args):
            return args[i + 1]
        if _flag_name(arg) in _API_KEY_FLAGS and "=" in arg:
            return arg.split("=", 1)[1]
    return next((env[name] for name in _API_KEY_ENVS if env.get(name)), None)


class LineScrubber:
    """Scrubs a byte stream (a server's output) line by line as it is written to its log.

    Whole lines are scrubbed, so a secret split across two reads is still found; a partial line is
    held until its newline, or flushed by the caller when the stream goes quiet (progress dots) or
    when it grows past `max_pending`."""

    def __init__(self, secrets: list[str], max_pending: int = 1 << 16):
        self.secrets = [s.encode() for s in secrets if s]
        self.pending = b""
        self.max_pending = max_pending

    def feed(self, chunk: bytes) -> bytes:
        data = self.pending + chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) < self.max_pending:
            self.pending = data
            return b""
        if cut == 0:
            cut = len(data)
        self.pending = data[cut:]
        return self._scrub(data[:cut])

    def flush(self) -> bytes:
        data, self.pending = self.pending, b""
        return self._scrub(data)

    def _scrub(self, data: bytes) -> bytes:
        for secret in self.secrets:
            data = data.replace(secret, REDACTED.encode())
        return data


def url_secrets(url: str) -> list[str]:
    """The password of a storage URL (postgresql://user:PASSWORD@host/db), if it has one."""
    from urllib.parse import urlsplit

    try:
        password = urlsplit(url).password
    except ValueError:
        return []
    return [password] if password else []
