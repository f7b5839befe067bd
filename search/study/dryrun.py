"""`search run --dry-run N`: what a study would launch and what it would cost, starting nothing.

Printed: the launch of each engine at its defaults (so every engine is seen, feasible or not), the
launches of the first N trials in the order a real run takes them (the default, the space's queued
known configs, then the sampler's space-filling design and guided picks), the choices no config can
use ("dead"), and the time estimate (search/study/estimate.py).
"""

from __future__ import annotations

import getpass
import os
import random
import shlex
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from harness import flagsearch_home
from harness.engines import get_engine
from search.sampling.sampler import (
    FAILED_KEY,
    FAILED_VIOLATION,
    QUEUED_ATTR,
    make_sampler,
    tell_failed_args,
    trial_origin,
)
from search.space.schema import BoolParam, CategoricalParam, FixedParam, FloatParam, IntParam
from search.space.space import Config, Space
from search.space.values import default_value
from search.store.results import TrialRecord
from search.study.estimate import Estimator
from search.study.memory_fit import FitEstimate, LocalMemory, estimate, free_at_start


@dataclass(frozen=True)
class Launch:
    config: Config
    command: str
    fit: FitEstimate | None

    @property
    def feasible(self) -> bool:
        return self.fit is None or self.fit.fits


def launch_of(space: Space, config: Config, port: int = 8000, free: LocalMemory | None = None) -> Launch:
    settings = space.engine_settings(config.engine)
    flags, env, _ = space.split(config)
    spec = get_engine(settings.dialect).build_launch(settings, space.model_choice(config.model), flags, env,
                                                     port=port)
    return Launch(config, spec.command_line(), estimate(space, config, free))


def planned_trials(space: Space, n: int, free: LocalMemory | None = None) -> list[tuple[str, Launch]]:
    """The first n trials in the order a real run takes them: the default, the space's queued known
    configs, then the sampler's own (the study's sampler with the study's design seed: the same
    space-filling rows a real run draws). Guided picks depend on measured results: they are shown as
    the sampler picks them with every result equal, so only their kind is certain. A config that
    cannot fit is told as a failure, as the real loop tells it."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = make_sampler(space, design_seed=space.m.seed, noise_floor=space.m.measure.noise_floor)
    study = optuna.create_study(sampler=sampler, directions=[o.direction for o in space.m.objectives])
    study.enqueue_trial(space.default_config(), user_attrs={"baseline": True})
    for label, params in space.queued_configs():
        study.enqueue_trial(params, user_attrs={QUEUED_ATTR: label})
    out = []
    for i in range(n):
        trial = study.ask()
        config = space.sample(trial)
        origin = "default" if i == 0 else trial_origin(study, trial)
        if origin.startswith("guided"):
            origin += " (depends on the results: shown as picked with none yet)"
        launch = launch_of(space, config, free=free)
        out.append((origin, launch))
        if launch.feasible:
            trial.set_constraint(FAILED_KEY, 0.0)
            study.tell(trial, [1.0] * len(space.m.objectives))
        else:
            trial.set_constraint(FAILED_KEY, FAILED_VIOLATION)
            study.tell(trial, **tell_failed_args(study.directions))
    return out


def value_choices(param: Any) -> list[Any]:
    if isinstance(param, CategoricalParam):
        return list(param.choices)
    return [False, True] if isinstance(param, BoolParam) else []


def config_with(space: Space, fixed: dict[str, Any]) -> Config:
    """A config with every param at its default except those in `fixed` (engine and model included).
    A FixedTrial, not a study: thousands of these are cheap."""
    defaults = {name: default_value(p) for name, p in space.m.params.items() if not isinstance(p, FixedParam)}
    return space.sample(optuna.trial.FixedTrial({**defaults, **fixed}))


def _random_config(space: Space, rng: random.Random) -> Config:
    values: dict[str, Any] = {"engine": rng.choice(list(space.m.engines)),
                              "model": rng.choice([m.name for m in space.m.models])}
    for name, param in space.m.params.items():
        if isinstance(param, (CategoricalParam, BoolParam)):
            values[name] = rng.choice(value_choices(param))
        elif isinstance(param, IntParam):
            values[name] = rng.randrange(param.low, param.high + 1, param.step)
        elif isinstance(param, FloatParam):
            values[name] = rng.uniform(param.low, param.high)
    return space.sample(optuna.trial.FixedTrial(values))


def engine_defaults(space: Space, free: LocalMemory | None = None) -> list[Launch]:
    """Per engine, its launch at the defaults with the first model that fits (else the first model)."""
    out = []
    for engine in space.m.engines:
        launches = [launch_of(space, config_with(space, {"engine": engine, "model": m.name}), free=free)
                    for m in space.m.models]
        out.append(next((launch for launch in launches if launch.feasible), launches[0]))
    return out


def _candidates(space: Space, samples: int) -> Iterator[Config]:
    """Each choice of each param at the other params' defaults, on every engine and model; then
    `samples` random configs (combinations the one-at-a-time pass cannot reach)."""
    for engine in space.m.engines:
        for model in space.m.models:
            base = {"engine": engine, "model": model.name}
            yield config_with(space, base)
            for name, param in space.m.params.items():
                for value in value_choices(param):
                    yield config_with(space, {**base, name: value})
    rng = random.Random(space.m.seed)
    for _ in range(samples):
        yield _random_config(space, rng)


def dead_choices(space: Space, samples: int = 300, free: LocalMemory | None = None) -> list[str]:
    """Engines, models and categorical/bool values that no feasible config uses (each a sentence).
    A value counts as used where it is set in a config that passes the fit check (memory and
    context length against the workloads)."""
    alive: dict[str, set[Any]] = {"engine": set(), "model": set()}
    why: dict[tuple[str, str], str] = {}
    for config in _candidates(space, samples):
        fit = estimate(space, config, free)
        if fit is not None and not fit.fits:
            for name, value in config.values.items():
                why.setdefault((name, repr(value)), fit.detail)
            why.setdefault(("engine", repr(config.engine)), fit.detail)
            continue
        alive["engine"].add(config.engine)
        alive["model"].add(config.model)
        for name, value in config.values.items():
            alive.setdefault(name, set()).add(repr(value))
    dead = [f"engine {e!r}: no config fits (e.g. {why.get(('engine', repr(e)), '?')})"
            for e in space.m.engines if e not in alive["engine"]]
    dead += [f"model {m.name!r}: no config fits" for m in space.m.models if m.name not in alive["model"]]
    for name, param in space.m.params.items():
        for value in value_choices(param):
            if repr(value) not in alive.get(name, set()):
                reason = why.get((name, repr(value)), "never active, or active only in configs that do not fit")
                dead.append(f"{name}={value!r}: no feasible config uses it (e.g. {reason})")
    return dead


def _describe(launch: Launch, header: str) -> list[str]:
    lines = [header]
    if launch.fit is not None and not launch.fit.fits:
        lines.append(f"# not launched: cannot fit ({launch.fit.detail})")
    elif launch.fit is not None and launch.fit.warning:
        lines.append(f"# warning: {launch.fit.warning}")
    lines.append(launch.command)
    return lines


def previous_records(results_dir: Path, storage: str | None = None) -> list[TrialRecord]:
    """The finished trials of the study a run would resume (its measured times feed the estimate);
    none when there is no such study yet. Creates nothing."""
    from search.study.study import stored_records

    if storage is None:
        db = results_dir / "study.db"
        if not db.is_file():
            return []
        storage = f"sqlite:///{db.resolve()}"
    try:
        study = optuna.load_study(study_name=results_dir.name, storage=storage)
    except (KeyError, ValueError, optuna.exceptions.OptunaError):
        return []
    return [r for r in stored_records(study) if r.wall_s is not None]


def container_warnings(space: Space) -> list[str]:
    """What a Docker engine lacks that its image needs: a GPU container with neither `ipc_host` nor
    `shm_size` gets Docker's 64 MB /dev/shm, where PyTorch's workers and NCCL keep shared memory
    (the images' own `docker run` lines say --ipc=host, or --shm-size 64g where unprivileged)."""
    out = []
    for name, e in space.m.engines.items():
        if e.launcher == "docker" and e.gpus and not e.ipc_host and not e.shm_size:
            out.append(f"{space.source}: engines.{name}: a GPU container with neither ipc_host nor shm_size runs "
                       "with Docker's 64 MB /dev/shm (PyTorch and NCCL keep shared memory there); set "
                       "ipc_host: true, or shm_size: 64g")
    return out


def trust_warnings(space: Space) -> list[str]:
    """What in a space can reach beyond the server it starts (docs/security.md): a privileged
    container, a writable mount of /, of the Docker socket or of $HOME, a server listening beyond this
    machine, and a command that is not under FLAGSEARCH_HOME (the space runs it as this user)."""
    home = Path.home().resolve()
    tool_homes = (Path(os.path.abspath(flagsearch_home.home())), flagsearch_home.home().resolve())
    out = []
    for name, e in space.m.engines.items():
        where = f"{space.source}: engines.{name}"
        if e.launcher == "docker" and e.privileged:
            out.append(f"{where}: privileged: true gives the container root on this machine")
        for v in e.volumes if e.launcher == "docker" else []:
            host = Path(v.host).resolve() if v.host.startswith("/") else None
            sock = v.host.endswith("docker.sock")
            if (host is not None and (host == Path("/") or host == home)) or sock:
                kind = "the Docker socket (root on this machine)" if sock else "/" if host == Path("/") else "$HOME"
                out.append(f"{where}.volumes: {v.host} is {kind}, mounted "
                           + ("read-only" if v.read_only else "WRITABLE (read_only: false)"))
        if e.host not in ("127.0.0.1", "localhost", "::1"):
            out.append(f"{where}: host {e.host} lets other machines reach the server (and its API key, if any)")
        command = e.command[0] if e.command else ""
        if e.launcher == "process" and command:
            # Not resolved: a venv's python is a link to the system's, and the venv is what the tool built.
            path = Path(os.path.abspath(command if "/" in command else (shutil.which(command) or command)))
            if not any(path.is_relative_to(h) for h in tool_homes):
                out.append(f"{where}: runs {path} (outside FLAGSEARCH_HOME {tool_homes[0]}) as {getpass.getuser()}, "
                           "with this user's files: trust the space as you would a script")
    if space.m.device is not None and space.m.device.drop_page_cache:
        out.append(f"{space.source}: device.drop_page_cache: runs {shlex.join(space.m.device.drop_page_cache)} "
                   "before starts")
    return out


def dry_run(space: Space, n: int, records: Iterable[TrialRecord] = (), confirm: bool = True) -> list[str]:
    free = free_at_start(space)  # the device's free memory, where this machine is the device
    lines: list[str] = []
    trust = trust_warnings(space)
    if trust:  # first, before anything the user might skim past
        lines.append("# WARNING: this space reaches beyond the server it starts (docs/security.md):")
        lines += [f"#   {w}" for w in trust]
    if free is not None:
        lines.append(f"# unified memory: {free.available_gb:.1f} of {free.total_gb:.1f} GB free now on this machine "
                     "(caps every engine's share below)")
    lines.append("# each engine at its defaults:")
    for launch in engine_defaults(space, free):
        state = "feasible" if launch.feasible else "NOT feasible"
        lines += _describe(launch, f"# engine {launch.config.engine} / {launch.config.model} ({state})")
    lines += [f"# warning: {w}" for w in container_warnings(space)]
    lines.append(f"# the first {n} trials, in the order a run takes them:")
    estimator = Estimator(space, records, confirm)
    sampled_s = 0.0
    for i, (origin, launch) in enumerate(planned_trials(space, n, free)):
        config = launch.config
        _, _, request = space.split(config)
        header = (f"# trial {i} ({origin}): {config.engine} / {config.model}"
                  + (f"; request-side: {request}" if request else ""))
        lines += _describe(launch, header)
        sampled_s += estimator.trial_s(config.engine) if launch.feasible else 0.0
    dead = dead_choices(space, free=free)
    lines += ["# dead choices (no feasible config uses them; remove or fix them):"] + [f"#   {d}" for d in dead] \
        if dead else ["# dead choices: none"]
    lines += estimator.lines(space.m.budget.trials)
    lines.append(f"# the {n} trials above: ~{sampled_s / 3600:.1f} h (those not launched cost nothing)")
    return lines
