"""Space files: YAML -> validated Space -> Optuna distributions, conditions and constraints.

A space file is untrusted input: it is read by harness.files (safe YAML with bounded size, nesting
and alias expansion), every key is validated (search/space/schema.py), unknown keys are errors, and
every error is one line that names the file, the key path and what was expected. Literal secrets in
it (values of secret-named keys and flags) are remembered by harness.secrets, so nothing written
shows them.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
from pydantic import BaseModel, ConfigDict, ValidationError

from harness import secrets
from harness.engines import EngineSettings, ModelChoice
from harness.files import InputError, load_yaml
from harness.launch.spec import Ulimit, Volume
from harness.measure.workloads import WorkloadSpec, catalogue
from harness.session import RunRequest
from search.space.schema import CONSTRAINT, FixedParam, FloatParam, SpaceError, SpaceModel
from search.space.values import check_value, default_value, distribution, request_values, rounded_float


def default_home() -> str:
    return os.environ.get("FLAGSEARCH_HOME", str(Path.home() / ".cache" / "flagsearch"))


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand(text: str, where: str) -> str:
    """${NAME} and ${NAME:-default} from the environment (FLAGSEARCH_HOME has a default)."""
    def sub(match: re.Match[str]) -> str:
        name, fallback = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if name == "FLAGSEARCH_HOME":
            return default_home()
        if fallback is not None:
            return fallback
        raise SpaceError(f"{where}: environment variable {name} is not set (write ${{{name}:-default}})")
    return _VAR.sub(sub, text)


def _expand_tree(node: Any, where: str) -> Any:
    if isinstance(node, str):
        return expand(node, where)
    if isinstance(node, list):
        return [_expand_tree(v, f"{where}[{i}]") for i, v in enumerate(node)]
    if isinstance(node, dict):
        return {k: _expand_tree(v, f"{where}.{k}") for k, v in node.items()}
    return node

def _format_loc(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in ("categorical", "int", "float", "bool", "fixed") and parts:
            continue  # the discriminator's branch name is noise for the user
        else:
            text = str(item)  # a key holding a newline or an escape is shown quoted: the error stays one line
            parts.append(("." if parts else "") + (text if text.isprintable() else repr(text)))
    return "".join(parts) or "(top level)"


def _one_line(errors: list[Any]) -> str:
    """Pydantic's errors as `key.path: reason; key.path: reason (and N more)`, on one line."""
    shown = [f"{_format_loc(e['loc'])}: {' '.join(str(e['msg']).split())}" for e in errors[:4]]
    more = f" (and {len(errors) - 4} more)" if len(errors) > 4 else ""
    return "; ".join(shown) + more


def _secret_params(model: SpaceModel, source: str) -> None:
    """A secret cannot be searched: Optuna would store every sampled value in the study, and every
    choice of a categorical parameter in its own distribution record (trial_params.distribution_json),
    which no scrubber of ours reaches."""
    known = secrets.known()
    for name, param in model.params.items():
        if secrets.is_secret_name(name) and not isinstance(param, FixedParam):
            raise SpaceError(f"{source}: params.{name}: a secret cannot be a searched parameter "
                             "(use `type: fixed`, or set it under engines.<name>.args)")
        for i, choice in enumerate(getattr(param, "choices", None) or []):
            text = str(choice)
            if secrets.inner_secrets(text) or secrets.argv_secrets(text.split()) or any(k in text for k in known):
                raise SpaceError(f"{source}: params.{name}.choices[{i}]: holds a secret, which Optuna would store "
                                 "in the study with every choice; give it as an engine arg or env (`${VAR}`)")


# The largest magnitude a number in a space may have: ranges are sampled and priced as floats, so
# 10**4000 (an OverflowError) or +-1e308 (a range whose width is inf) would crash the sampler, and
# 2**63 is past what an engine flag takes anyway.
MAX_MAGNITUDE = 1e18


def _check_numbers(node: Any, source: str, path: str = "") -> None:
    """Every number in a space is finite and of sane size: `.nan` or `.inf` as a time would never
    time out, as a choice or a range bound it breaks the sampler. An error names the key."""
    if isinstance(node, dict):
        for k, v in node.items():
            _check_numbers(v, source, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _check_numbers(v, source, f"{path}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        raise SpaceError(f"{source}: {path or '(top level)'}: {node} is not a finite number")
    elif isinstance(node, int | float) and not isinstance(node, bool) and abs(node) > MAX_MAGNITUDE:
        digits = int(node.bit_length() * 0.30103) + 1 if isinstance(node, int) else 0  # str() refuses 4300+ digits
        shown = f"{node:.3g}" if isinstance(node, float) else f"an integer of about {digits} digits"
        raise SpaceError(f"{source}: {path or '(top level)'}: {shown} is out of range (at most 1e18 in size)")


def parse_space(data: Any, source: str = "<space>") -> Space:
    if not isinstance(data, dict):
        raise SpaceError(f"{source}: the space must be a mapping of keys, got {type(data).__name__}")
    try:
        _check_numbers(data, source)
        data = _expand_tree(data, source)
        secrets.remember(secrets.doc_secrets(data))  # before validation: an error message may quote one
        model = SpaceModel.model_validate(data)
    except SpaceError:
        raise
    except ValidationError as exc:
        raise SpaceError(secrets.scrub_text(f"{source}: {_one_line(exc.errors())}")) from None
    except (TypeError, ValueError, RecursionError) as exc:  # odd documents that trip the validators
        raise SpaceError(secrets.scrub_text(f"{source}: invalid space: {' '.join(str(exc).split())}")) from None
    _secret_params(model, source)
    space = Space(model, source)
    space.queued_configs()  # each queued config must be one the space can sample: an error here names it
    return space


def load_space(path: str | Path) -> Space:
    try:
        data = load_yaml(path)
    except InputError as exc:
        raise SpaceError(str(exc)) from None
    return parse_space(data, str(path))


class Config(BaseModel):
    """One sampled configuration: engine, model and the values of the active params."""

    model_config = ConfigDict(frozen=True)
    engine: str
    model: str
    values: dict[str, Any]

    def as_params(self) -> dict[str, Any]:
        return {"engine": self.engine, "model": self.model, **self.values}


@dataclass(frozen=True)
class Resolved:
    """A config turned into what starts its server (`Space.resolve`, once per trial or side): the engine's
    settings, the model, the engine flags and env vars (the engine's fixed args included) and the
    request-side fields the workloads take. Every RunRequest of a config is made by `run_request`."""

    config: Config
    settings: EngineSettings
    model: ModelChoice
    flags: Mapping[str, Any]
    env: Mapping[str, str]
    request: Mapping[str, Any]  # request-side params (REQUEST_SIDE): applied to the workloads, not the engine

    def run_request(self, log_dir: Path, fresh: bool = False) -> RunRequest:
        return RunRequest(self.settings, self.model, self.flags, self.env, log_dir, fresh=fresh)


class Space:
    """A validated space and the operations the study needs from it."""

    def __init__(self, model: SpaceModel, source: str):
        self.m = model
        self.source = source

    @property
    def name(self) -> str:
        return self.m.name

    def engine_settings(self, engine: str) -> EngineSettings:
        e = self.m.engines[engine]
        python = e.python
        if python is None and Path(e.command[0]).name.startswith("python"):
            python = e.command[0]
        return EngineSettings(
            name=engine, dialect=e.dialect or engine, command=tuple(e.command), env=dict(e.env),
            launcher=e.launcher, image=e.image, host=e.host,
            volumes=tuple(Volume(v.host, v.container, v.read_only) for v in e.volumes), gpus=e.gpus,
            shm_size=e.shm_size, ipc_host=e.ipc_host, privileged=e.privileged,
            ready_timeout_s=e.ready_timeout_s, flag_map=dict(e.flag_map), python=python,
            cpus=e.cpus, ulimits=tuple(Ulimit(name, soft, hard) for name, (soft, hard) in e.ulimits.items()),
            cap_add=tuple(e.cap_add), devices=tuple(e.devices), mem_limit=e.mem_limit,
            memswap_limit=e.memswap_limit, pids_limit=e.pids_limit)

    def model_choice(self, name: str) -> ModelChoice:
        m = next(m for m in self.m.models if m.name == name)
        return ModelChoice(name=m.name, path=m.path, format=m.format, size_gb=m.size_gb, has_mtp=m.has_mtp,
                           active_params_b=m.active_params_b, bytes_per_param=m.bytes_per_param,
                           attrs={**m.attrs, **({"kv_bytes_per_token": m.kv_bytes_per_token}
                                                if m.kv_bytes_per_token else {})})

    def workload_specs(self, request: dict[str, Any] | None = None) -> list[WorkloadSpec]:
        """The space's workloads, with request-side parameters (see REQUEST_SIDE) applied."""
        _, profiles = catalogue()
        request = request or {}
        out = []
        for w in self.m.workloads:
            streams = tuple(w.streams or (profiles[w.profile] if w.profile else ("source",) * w.concurrency))
            if request.get("concurrency"):
                n = int(request["concurrency"])
                streams = tuple(streams[i % len(streams)] for i in range(n))
            out.append(WorkloadSpec(
                name=w.name, streams=streams,
                requests_per_stream=int(request.get("requests_per_stream") or w.requests_per_stream),
                scale=w.scale, context_scale=w.context_scale, output_scale=w.output_scale,
                max_tokens=request.get("max_tokens") or w.max_tokens, warm=w.warm,
                rate=request.get("rate") or w.rate, seed=w.seed, thinking=w.thinking,
                source=w.source.to_source() if w.source else None))
        return out

    def load_points(self) -> list[dict[str, Any]]:
        """Every combination of the request-side params' values: the load ladder each server
        start is measured at (one point, {}, when the space declares none)."""
        ladder = {name: request_values(p) for name, p in self.m.params.items() if p.side == "request"}
        return [dict(zip(ladder, combo, strict=True)) for combo in itertools.product(*ladder.values())]

    def curve_specs(self) -> list[WorkloadSpec]:
        """The workloads at every load point, named `<workload>@<param>=<value>` where the space
        has request-side params (see search/study/curves.py for how they are read back)."""
        points = self.load_points()
        if points == [{}]:
            return self.workload_specs()
        out = []
        for point in points:
            label = ",".join(f"{k}={v}" for k, v in point.items())
            out += [replace(spec, name=f"{spec.name}@{label}") for spec in self.workload_specs(point)]
        return out

    def applies(self, name: str, chosen: dict[str, Any]) -> bool:
        """Whether param `name` is sampled, given the values chosen so far (engine, model and the params
        declared before it): its `when` holds."""
        return self._active(self.m.params[name].when, chosen)

    def _active(self, when: dict[str, Any], chosen: dict[str, Any]) -> bool:
        for key, expected in when.items():
            if key.startswith("model."):
                model = self.model_choice(chosen["model"])
                attr = key.split(".", 1)[1]
                actual = getattr(model, attr, None) if hasattr(model, attr) else model.attrs.get(attr)
            else:
                if key not in chosen:
                    return False
                actual = chosen[key]
            allowed = expected if isinstance(expected, list) else [expected]
            if actual not in allowed:
                return False
        return True

    def sample(self, trial: optuna.trial.BaseTrial) -> Config:
        """Draw one config; inactive conditional params are not sampled at all."""
        engines = list(self.m.engines)
        models = [m.name for m in self.m.models]
        chosen: dict[str, Any] = {
            "engine": trial.suggest_categorical("engine", engines) if len(engines) > 1 else engines[0],
            "model": trial.suggest_categorical("model", models) if len(models) > 1 else models[0],
        }
        values: dict[str, Any] = {}
        for name, param in self.m.params.items():
            if param.side == "request" or not self._active(param.when, chosen):
                continue  # request-side params are a load ladder measured at every start (curve_specs)
            dist = distribution(param)
            if dist is None:
                value = default_value(param)
            elif isinstance(dist, optuna.distributions.CategoricalDistribution):
                value = trial.suggest_categorical(name, list(dist.choices))
            elif isinstance(dist, optuna.distributions.IntDistribution):
                value = trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
            else:
                assert isinstance(dist, optuna.distributions.FloatDistribution) and isinstance(param, FloatParam)
                value = rounded_float(trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log),
                                      param)
            chosen[name] = value
            values[name] = value
        return Config(engine=chosen["engine"], model=chosen["model"], values=values)

    def loads(self, engine: str, model: str) -> bool:
        """Whether `engine` can load checkpoint `model` (engines.<name>.models; unset: every one)."""
        allowed = self.m.engines[engine].models
        return allowed is None or model in allowed

    def queued_configs(self) -> list[tuple[str, dict[str, Any]]]:
        """(label, params) of each `queue:` entry, in order: every active param at its default unless
        the entry names it, as default_config() spells a config. A value the space could not sample
        (an inactive param, a value outside its choices or range, a pair the engine cannot load) is
        a SpaceError naming the entry."""
        out = []
        for i, q in enumerate(self.m.queue):
            where = f"{self.source}: queue[{i}] ({q.label})"
            if q.engine not in self.m.engines:
                raise SpaceError(f"{where}: engine {q.engine!r} is not in engines ({', '.join(self.m.engines)})")
            if q.model not in {m.name for m in self.m.models}:
                raise SpaceError(f"{where}: model {q.model!r} is not in models")
            if not self.loads(q.engine, q.model):
                raise SpaceError(f"{where}: engines.{q.engine}.models does not list {q.model!r}")
            chosen: dict[str, Any] = {"engine": q.engine, "model": q.model}
            config: dict[str, Any] = dict(chosen)
            for name, param in self.m.params.items():
                if param.side == "request" or not self._active(param.when, chosen):
                    continue
                value = q.params.get(name, default_value(param))
                problem = check_value(param, value)
                if problem:
                    raise SpaceError(f"{where}: params.{name}: {problem}")
                chosen[name] = value
                if not isinstance(param, FixedParam):
                    config[name] = value
            inactive = sorted(set(q.params) - set(chosen))
            if inactive:
                raise SpaceError(f"{where}: {', '.join(inactive)}: not a parameter of this engine and model "
                                 "(unknown, or its `when:` excludes them)")
            out.append((q.label, config))
        return out

    def default_config(self) -> dict[str, Any]:
        """Params for the baseline trial: first engine and model, every param at its default."""
        chosen: dict[str, Any] = {"engine": next(iter(self.m.engines)), "model": self.m.models[0].name}
        for name, param in self.m.params.items():
            if self._active(param.when, chosen) and not isinstance(param, FixedParam) and param.side != "request":
                chosen[name] = default_value(param)
        return chosen

    def resolve(self, config: Config | Resolved) -> Resolved:
        """The config's engine settings, model, flags, env and request-side fields (a Resolved one as it is)."""
        if isinstance(config, Resolved):
            return config
        flags, env, request = self.split(config)
        return Resolved(config, self.engine_settings(config.engine), self.model_choice(config.model), flags, env,
                        request)

    def request(self, config: Config, log_dir: Path, fresh: bool = False) -> RunRequest:
        """The RunRequest that starts `config`'s server, logging under `log_dir`; `fresh`: never reuse one."""
        return self.resolve(config).run_request(log_dir, fresh)

    def split(self, config: Config) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
        """(engine flags, env vars, request-side fields) of a config, fixed args included."""
        flags: dict[str, Any] = dict(self.m.engines[config.engine].args)
        env: dict[str, str] = {}
        request: dict[str, Any] = {}
        for name, value in config.values.items():
            param = self.m.params[name]
            if param.side == "request":
                request[name] = value
            elif param.env:
                if value is not None:  # null: the variable is not set (the engine's default), as for a flag
                    env[param.env] = str(value).lower() if isinstance(value, bool) else str(value)
            else:
                flags[name] = value
        return flags, env, request

    def launch_key(self, config: Config) -> str:
        """Identity of the server a config needs: equal keys can share one running server."""
        flags, env, _ = self.split(config)
        return repr((config.engine, config.model, sorted(flags.items(), key=str), sorted(env.items())))

    def constraint_exprs(self) -> list[tuple[str, str, float]]:
        out = []
        for expr in self.m.constraints:
            match = CONSTRAINT.match(expr)
            assert match  # validated on load
            out.append((match.group(1), match.group(2), float(match.group(3))))
        return out


def constraint_value(metric_value: float, op: str, threshold: float) -> float:
    """Optuna's convention: <= 0 means satisfied."""
    if op in ("<=", "<"):
        return metric_value - threshold + (1e-12 if op == "<" else 0.0)
    if op in (">=", ">"):
        return threshold - metric_value + (1e-12 if op == ">" else 0.0)
    return abs(metric_value - threshold)
