"""Preflight: before any server start, check what a 12-minute start would otherwise find out.

- every engine's image (Docker engines): present locally, or pullable from its registry;
- every engine's executable (process engines): exists;
- every checkpoint path an engine may load: exists on this machine (for a Docker engine: through
  the volume that mounts it into the container; a path no volume mounts is a problem too); one
  declared `has_mtp` maps MTP tensors in its weight index (a hybrid build drops them: a placebo);
- every flag name any config can put on an engine's command line: known to that engine build, as
  its own `--help` prints them. The help text is read once per build (the image id, or the
  executable and its installed packages) and cached under FLAGSEARCH_HOME/preflight;
- every environment variable with the engine's prefix (vLLM: VLLM_*) that an engine's `env:` or a
  param's `env:` sets: known to that build, as its own source lists them (vLLM: the keys of
  `environment_variables` in the build's vllm/envs.py, read from the image or the environment, not
  imported), cached the same way. An unknown one is a warning naming it, not a problem: vLLM itself
  only warns and ignores it.

Each problem is one line naming the space file, the key, what is wrong and the fix. Nothing is
started but each engine's `--help` (the space's own command, run on this machine as this user, or a
container that prints its help and is removed), which the CLI names, so a failed preflight costs
seconds, not a start. `search run SPACE --preflight` runs only this; `search run` runs it
first and stops on any problem.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import flagsearch_home
from harness.engines import EngineSettings, get_engine
from harness.engines.base import flag_name
from harness.launch.spec import KEEP_ENTRYPOINT
from search.space.schema import IntParam
from search.space.space import Config, Space
from search.study.dryrun import config_with, container_warnings, trust_warnings, value_choices

HELP_TIMEOUT_S = 300.0  # vLLM imports torch before it prints its help: tens of seconds on 2 cores
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_.\-]*)")
_MIN_FLAGS = 5  # fewer in a help text means it was not a help text


@dataclass(frozen=True)
class Problem:
    key: str  # the space key at fault, e.g. params.max_num_seq
    what: str
    fix: str

    def line(self, source: str) -> str:
        return f"{source}: {self.key}: {self.what}; fix: {self.fix}"


def preflight(space: Space, progress: Callable[[str], None] = lambda _: None,
              warn: Callable[[str], None] | None = None, ran: list[str] | None = None) -> list[str]:
    """Every problem as one line (none: every image, checkpoint path and flag name is fine).
    Warnings (an environment variable the build does not know; what the space can reach beyond its
    server, dryrun.trust_warnings) go to `warn` (default: progress). `ran` gets each command preflight
    ran (an engine's `--help`, on this machine or in a container): the space's own command, run."""
    warn = warn or progress
    for line in trust_warnings(space):
        warn(line)
    for line in container_warnings(space):
        warn(line)
    problems: list[Problem] = []
    problems += check_models(space)
    for engine in space.m.engines:
        settings = space.engine_settings(engine)
        found = check_runnable(settings)
        problems += found
        if found:
            continue  # no image or executable: its flags cannot be read
        progress(f"preflight: reading the flags of {engine} ({help_label(settings)})")
        known, why_not = known_flags(settings)
        if why_not != "cached" and ran is not None:
            ran.append(help_label(settings))
        if known is None:  # a build whose help cannot be read is not a wrong config: said, not fatal
            progress(f"preflight: flag names of {engine} not checked: {why_not}")
        else:
            problems += check_flags(space, engine, known)
        for line in env_warnings(space, engine, progress):
            warn(line)
    return [p.line(space.source) for p in problems]


# ---- images and executables -----------------------------------------------------------------
def docker_client(timeout: int = 20) -> Any:
    import docker

    client = docker.from_env(timeout=timeout)
    client.ping()
    return client


def image_state(client: Any, name: str) -> str | None:
    """None when the image is local or its registry knows it; else why not."""
    import docker.errors

    try:
        client.images.get(name)
        return None
    except docker.errors.ImageNotFound:
        pass
    try:
        client.images.get_registry_data(name)
        return None
    except docker.errors.DockerException as exc:
        why = getattr(exc, "explanation", None) or str(exc)  # the daemon's words, without the HTTP wrapping
        return f"not on this machine and not pullable ({' '.join(str(why).split())[:120]})"


def check_runnable(settings: EngineSettings) -> list[Problem]:
    key = f"engines.{settings.name}"
    if settings.launcher == "docker":
        import docker.errors

        try:
            client = docker_client()
        except docker.errors.DockerException as exc:
            where = os.environ.get("DOCKER_HOST", "the default socket")
            return [Problem(f"{key}.image", f"no Docker engine answers at {where} ({exc.__class__.__name__})",
                            "start dockerd, or export DOCKER_HOST")]
        state = image_state(client, settings.image or "")
        client.close()
        if state is not None:
            return [Problem(f"{key}.image", f"image {settings.image!r} is {state}",
                            f"build or `docker pull {settings.image}`, or correct the name")]
        return []
    exe = settings.command[0]
    if shutil.which(exe) is None:
        return [Problem(f"{key}.command[0]", f"{exe!r} is not an executable file here",
                        "install the engine there (make setup), or correct the path")]
    return []


# ---- checkpoint paths -----------------------------------------------------------------------
def _local_path(path: str) -> bool:
    """A filesystem path (else a Hugging Face repo id the engine may download: not checked)."""
    return path.startswith(("/", "./", "../", "~"))


def host_path(settings: EngineSettings, path: str) -> str | None:
    """Where a path the engine sees lies on this machine: itself for a process, through the volume
    that mounts it for a container (None: no volume mounts it)."""
    if settings.launcher != "docker":
        return os.path.expanduser(path)
    best = None
    for volume in settings.volumes:
        inside = volume.container_path.rstrip("/")
        if (path == inside or path.startswith(inside + "/")) and (best is None or len(inside) > len(best[0])):
            best = (inside, volume.host_path.rstrip("/"))
    return None if best is None else best[1] + path[len(best[0]):]


def check_models(space: Space) -> list[Problem]:
    out = []
    for i, model in enumerate(space.m.models):
        if not _local_path(model.path):
            continue
        for engine in space.m.engines:
            if not space.loads(engine, model.name):
                continue
            settings = space.engine_settings(engine)
            host = host_path(settings, model.path)
            if host is None:
                out.append(Problem(f"models[{i}].path", f"{model.path} ({model.name}) is not inside any volume of "
                                   f"engine {engine}", f"add a volume to engines.{engine}.volumes that mounts it"))
            elif not Path(host).exists():
                out.append(Problem(f"models[{i}].path", f"{host} ({model.name}) does not exist",
                                   "put the checkpoint there, or correct the path"))
                break  # one line per checkpoint
            elif model.has_mtp and not mtp_in_index(Path(host)):
                out.append(Problem(f"models[{i}].has_mtp", f"{model.name}'s weight index names no MTP tensor "
                                   f"({host}/{INDEX}): MTP would be a placebo or fail to load",
                                   "add the MTP weights to the checkpoint and its index (e.g. the INT4-AutoRound "
                                   "recipe's add-mtp-weights.py for a hybrid build), or set has_mtp: false"))
                break
    return out


INDEX = "model.safetensors.index.json"


def mtp_in_index(folder: Path) -> bool:
    """Whether a Hugging Face checkpoint carries MTP weights: its weight index maps an MTP tensor,
    or a separate weights file for them is there (Sehyo's extra_weights.safetensors, Intel's
    model_extra_tensors.safetensors). A hybrid build drops both. True where there is no index to
    read (a single file, a GGUF): nothing to judge."""
    index = folder / INDEX
    if not index.is_file():
        return True
    try:
        weights = json.loads(index.read_text()).get("weight_map", {})
    except (OSError, ValueError, AttributeError):
        return True
    if any(".mtp." in name or name.startswith("mtp.") for name in weights):
        return True
    return any(re.search(r"mtp|extra", f.name, re.I) for f in folder.glob("*.safetensors"))


# ---- flag names -------------------------------------------------------------------------------
def _prefix(settings: EngineSettings) -> list[str]:
    """The command elements before the engine's own flags: the program and its subcommand."""
    if settings.dialect != "command":
        return list(settings.command)
    out: list[str] = []
    for element in settings.command:
        if out and (element.startswith("-") or "{" in element):
            break
        out.append(element)
    return out


def help_argv(settings: EngineSettings) -> list[str]:
    return _prefix(settings) + list(get_engine(settings.dialect).help_args())


def help_label(settings: EngineSettings) -> str:
    argv = help_argv(settings)
    if settings.launcher == "docker":
        return f"{settings.image} " + " ".join(argv[1:] if argv[0] == KEEP_ENTRYPOINT else argv)
    return " ".join(argv)


def _identity(settings: EngineSettings) -> str | None:
    """What changes when the engine build changes: the image id, or the executable and (for a
    Python environment) its installed packages."""
    if settings.launcher == "docker":
        client = docker_client()
        try:
            return str(client.images.get(settings.image).id)
        finally:
            client.close()
    exe = Path(shutil.which(settings.command[0]) or settings.command[0])
    parts = [str(exe), str(exe.resolve().stat().st_mtime_ns), str(exe.resolve().stat().st_size)]
    parts += [f"{p}:{p.stat().st_mtime_ns}" for p in sorted(exe.parent.parent.glob("lib/python*/site-packages"))]
    return "|".join(parts)


def _run_help(settings: EngineSettings, argv: list[str]) -> str:
    if settings.launcher == "docker":
        client = docker_client(timeout=int(HELP_TIMEOUT_S))
        entry = {"command": argv[1:]} if argv[0] == KEEP_ENTRYPOINT else {"entrypoint": argv[:1], "command": argv[1:]}
        try:
            container = client.containers.create(
                settings.image, network_mode="none", environment=dict(settings.env),
                volumes={v.host_path: {"bind": v.container_path, "mode": "ro"} for v in settings.volumes},
                labels={"flagsearch": "1", "flagsearch.preflight": "1"}, **entry)
            try:  # started inside: a start that fails (no such program in the image) is removed too
                container.start()
                container.wait(timeout=HELP_TIMEOUT_S)
                return container.logs(stdout=True, stderr=True).decode(errors="replace")
            finally:
                container.remove(force=True)
        finally:
            client.close()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=HELP_TIMEOUT_S,
                          env={**os.environ, **settings.env}, stdin=subprocess.DEVNULL)
    return done.stdout + done.stderr


def known_flags(settings: EngineSettings) -> tuple[set[str] | None, str]:
    """The flags this engine build's own --help prints (cached per build), or why there are none."""
    argv = help_argv(settings)
    key = hashlib.sha256(json.dumps([_identity(settings), argv]).encode()).hexdigest()[:20]
    cache = flagsearch_home.home() / "preflight" / f"help-{settings.name}-{key}.json"
    if cache.is_file():
        return set(json.loads(cache.read_text())["flags"]), "cached"
    try:
        text = _run_help(settings, argv)
    except Exception as exc:  # any help run that cannot finish is said, never fatal
        return None, f"`{help_label(settings)}` did not finish ({exc.__class__.__name__}: " \
            f"{' '.join(str(exc).split())[:160]})"
    flags = set(_FLAG.findall(text))
    if len(flags) < _MIN_FLAGS:
        return None, f"`{help_label(settings)}` printed no flag list ({' '.join(text.split())[:160]!r})"
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"help": help_label(settings), "flags": sorted(flags)}))
    return flags, "read"


def _configs(space: Space, engine: str) -> Iterator[Config]:
    """Each value of each param at the others' defaults, on every checkpoint the engine loads: every
    flag any config of this engine can put on its command line appears in one of these."""
    for model in space.m.models:
        if not space.loads(engine, model.name):
            continue
        base = {"engine": engine, "model": model.name}
        yield config_with(space, base)
        for name, param in space.m.params.items():
            values = value_choices(param) or ([param.low, param.high] if isinstance(param, IntParam) else [])
            for value in values:
                yield config_with(space, {**base, name: value})


def _argv_flags(argv: list[str], skip: int) -> Iterator[str]:
    for word in argv[skip:]:
        if re.match(r"^--?[A-Za-z]", word):
            yield word.split("=", 1)[0]


def _key_for(space: Space, engine: str, flag: str, flags: dict[str, Any]) -> str:
    e = space.m.engines[engine]
    for key in e.args:
        if flag in (flag_name(key), "--no-" + key.replace("_", "-")):
            return f"engines.{engine}.args.{key}"
    for param, mapped in e.flag_map.items():
        if mapped.rstrip("=") == flag:
            return f"params.{param} (engines.{engine}.flag_map.{param})"
    if flag in e.command:
        return f"engines.{engine}.command"
    settings = space.engine_settings(engine)
    named = get_engine(settings.dialect).param_for_flag(flag, flags)
    if named is not None and named in space.m.params:
        return f"params.{named}"
    return f"engines.{engine} (a flag its {settings.dialect} module adds)"


def check_flags(space: Space, engine: str, known: set[str]) -> list[Problem]:
    settings = space.engine_settings(engine)
    dialect = get_engine(settings.dialect)
    skip = len(_prefix(settings))
    out: dict[str, Problem] = {}
    for config in _configs(space, engine):
        flags, env, _ = space.split(config)
        spec = dialect.build_launch(settings, space.model_choice(config.model), flags, env, port=8000)
        for flag in _argv_flags(list(spec.argv), skip):
            if flag in known or flag in out:
                continue
            near = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.75)
            fix = f"did you mean {near[0]}? (spelled as `{help_label(settings)}` prints it)" if near else \
                f"remove it; `{help_label(settings)}` does not list it"
            key = _key_for(space, engine, flag, flags)
            out[flag] = Problem(key, f"{flag} is not a flag of engine {engine}", fix)
    return list(out.values())


# ---- environment variables ------------------------------------------------------------------------
# Prints one file of a package without importing the package (find_spec of a top-level name does not
# run it): `python -c PROBE MODULE FILE`.
_SOURCE_PROBE = ("import importlib.util, os, sys; spec = importlib.util.find_spec(sys.argv[1]); "
                 "print(open(os.path.join(os.path.dirname(spec.origin), sys.argv[2])).read())")


def engine_python(settings: EngineSettings) -> str | None:
    """A process engine's interpreter: the space's `python`, else the `python` beside its executable
    (a virtual environment's bin/); None when neither is there."""
    if settings.python:
        return settings.python
    exe = shutil.which(settings.command[0])
    sibling = Path(exe).parent / "python" if exe else None
    return str(sibling) if sibling is not None and sibling.exists() else None


def _read_package_file(settings: EngineSettings, module: str, file: str) -> str:
    code = ["-c", _SOURCE_PROBE, module, file]
    if settings.launcher == "docker":
        client = docker_client(timeout=int(HELP_TIMEOUT_S))
        try:
            # Created, then started inside the try: an image without python3 fails the start, and
            # the container it leaves behind is removed too.
            container = client.containers.create(
                settings.image, entrypoint=["python3"], command=code, network_mode="none",
                labels={"flagsearch": "1", "flagsearch.preflight": "1"})
            try:
                container.start()
                status = container.wait(timeout=HELP_TIMEOUT_S)
                out = container.logs(stdout=True, stderr=False).decode(errors="replace")
                if int(status.get("StatusCode", 1)) != 0:
                    err = container.logs(stdout=False, stderr=True).decode(errors="replace")
                    raise RuntimeError(" ".join(err.split())[-160:] or f"exit {status.get('StatusCode')}")
                return out
            finally:
                container.remove(force=True)
        finally:
            client.close()
    python = engine_python(settings)
    if python is None:
        raise FileNotFoundError(f"no Python interpreter beside {settings.command[0]} (set engines.{settings.name}"
                                ".python)")
    done = subprocess.run([python, *code], capture_output=True, text=True, timeout=HELP_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(" ".join(done.stderr.split())[-160:])
    return done.stdout


def dict_keys(source: str, table: str) -> set[str]:
    """The string keys of the module-level dict literal `table` (`NAME = {...}` or `NAME: T = {...}`)."""
    for node in ast.parse(source).body:
        target: ast.expr
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == table and isinstance(value, ast.Dict):
            return {k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    raise ValueError(f"it has no dict literal {table}")


def known_env_vars(settings: EngineSettings) -> tuple[set[str] | None, str]:
    """The environment variables this engine build lists (cached per build), or why there are none."""
    known = get_engine(settings.dialect).known_env
    if known is None:
        return None, f"the {settings.dialect} module names no list of its variables"
    where = f"{known.module}/{known.file} {known.table}"
    try:
        key = hashlib.sha256(json.dumps([_identity(settings), where]).encode()).hexdigest()[:20]
        cache = flagsearch_home.home() / "preflight" / f"env-{settings.name}-{key}.json"
        if cache.is_file():
            return set(json.loads(cache.read_text())["variables"]), where
        names = dict_keys(_read_package_file(settings, known.module, known.file), known.table)
    except Exception as exc:  # a build whose list cannot be read is said, never fatal
        return None, f"{where} could not be read ({exc.__class__.__name__}: {' '.join(str(exc).split())[:160]})"
    if not names:
        return None, f"{where} is empty"
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"source": where, "variables": sorted(names)}))
    return names, where


def env_settings(space: Space, engine: str) -> dict[str, str]:
    """Every environment variable a config of this engine can set -> the space key that sets it."""
    out = {name: f"engines.{engine}.env.{name}" for name in space.m.engines[engine].env}
    by_var = {param.env: name for name, param in space.m.params.items() if param.env}
    for config in _configs(space, engine):
        for name in space.split(config)[1]:
            out.setdefault(name, f"params.{by_var.get(name, name)} (env {name})")
    return out


def env_warnings(space: Space, engine: str, progress: Callable[[str], None] = lambda _: None) -> list[str]:
    """One line per variable with the engine's prefix that its build does not list."""
    settings = space.engine_settings(engine)
    spec = get_engine(settings.dialect).known_env
    if spec is None:
        return []
    wanted = {k: v for k, v in env_settings(space, engine).items() if k.startswith(spec.prefix)}
    if not wanted:
        return []
    progress(f"preflight: reading the environment variables {engine}'s build knows")
    known, where = known_env_vars(settings)
    if known is None:
        progress(f"preflight: environment variables of {engine} not checked: {where}")
        return []
    out = []
    for name, key in sorted(wanted.items()):
        if name in known:
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
        hint = f"did you mean {near[0]}?" if near else "remove it"
        out.append(f"{space.source}: {key}: {name} is not an environment variable of engine {engine}'s build "
                   f"({where} lacks it: the engine warns and ignores it); {hint}")
    return out
