"""Space files: YAML -> validated Space -> Optuna distributions, conditions and constraints.

A space file is untrusted input: it is read by harness.files (safe YAML with bounded size, nesting
and alias expansion), every key is validated, unknown keys are errors, and every error is one line
that names the file, the key path and what was expected. Literal secrets in it (values of
secret-named keys and flags) are remembered by harness.secrets, so nothing written shows them.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import optuna
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness import secrets
from harness.engines import DIALECTS, EngineSettings, ModelChoice
from harness.files import InputError, load_yaml
from harness.launch.spec import Volume
from harness.quality import QualityModel
from harness.user_prompts import PromptSource
from harness.user_prompts import validate as validate_source
from harness.workloads import WorkloadSpec, catalogue

Scalar = str | int | float | bool | None

# Parameters that change only what the client sends: trials differing only in these reuse the
# running server. Each overrides the same field of every workload.
REQUEST_SIDE = ("concurrency", "rate", "max_tokens", "requests_per_stream")

if TYPE_CHECKING:  # the schema imports nothing of the measurement at run time
    from harness.steady import MeasurePolicy


class SpaceError(Exception):
    """A space file is invalid; the message names the file, the key path and the reason."""


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


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VolumeModel(Strict):
    host: str
    container: str
    read_only: bool = False


class ExpectModel(Strict):
    """What one trial of an engine costs here, as the user expects it before anything was measured
    (the time estimate of `search run --dry-run`; measured times replace these as trials finish)."""

    start_s: float | None = Field(default=None, gt=0)  # server start until ready
    decode_tok_s: float | None = Field(default=None, gt=0)  # one stream's output tokens per second
    prefill_tok_s: float | None = Field(default=None, gt=0)  # prompt tokens per second


class EngineModel(Strict):
    dialect: str | None = None
    launcher: Literal["process", "docker"] = "process"
    command: list[str] = Field(min_length=1)
    python: str | None = None
    env: dict[str, str] = {}
    args: dict[str, Scalar | dict[str, Any] | list[Any]] = {}
    host: str = "127.0.0.1"
    image: str | None = None
    volumes: list[VolumeModel] = []
    gpus: str | None = None
    shm_size: str | None = None
    ipc_host: bool = False
    privileged: bool = False
    ready_timeout_s: float = Field(default=900.0, gt=0)
    flag_map: dict[str, str] = {}
    expect: ExpectModel = ExpectModel()

    @field_validator("env", mode="before")
    @classmethod
    def _env_as_strings(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        return value


class DeviceModel(Strict):
    """What the target device offers, for the memory-fit check and the roofline."""

    name: str | None = None
    memory_gb: float | None = Field(default=None, gt=0)
    bandwidth_gbs: float | None = Field(default=None, gt=0)
    default_utilization: float = Field(default=0.9, gt=0, le=1)
    reserve_gb: float = Field(default=1.0, ge=0)  # activations, CUDA context, fragmentation
    # GPU memory shared with the OS and the page cache (DGX Spark / GB10): see search/memory_fit.py.
    unified_memory: bool = False
    os_reserve_gb: float = Field(default=8.0, ge=0)  # what the OS needs left over (unified memory only)


class ModelModel(Strict):
    name: str
    path: str
    format: str = "unknown"
    size_gb: float | None = Field(default=None, ge=0)
    kv_bytes_per_token: float | None = Field(default=None, gt=0)
    has_mtp: bool = False
    active_params_b: float | None = Field(default=None, gt=0)
    bytes_per_param: float | None = Field(default=None, gt=0)
    attrs: dict[str, Scalar] = {}


class ParamBase(Strict):
    when: dict[str, Scalar | list[Scalar]] = {}
    env: str | None = None  # set this environment variable instead of passing a flag
    side: Literal["launch", "request"] = "launch"  # request-side params never need a restart


class CategoricalParam(ParamBase):
    type: Literal["categorical"]
    choices: list[Scalar] = Field(min_length=1)
    default: Scalar = None

    @model_validator(mode="after")
    def _default_in_choices(self) -> CategoricalParam:
        if "default" in self.model_fields_set and self.default not in self.choices:
            raise ValueError(f"default {self.default!r} is not one of the choices {self.choices}")
        return self


class IntParam(ParamBase):
    type: Literal["int"]
    low: int
    high: int
    step: int = Field(default=1, ge=1)
    log: bool = False
    default: int | None = None

    @model_validator(mode="after")
    def _range(self) -> IntParam:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) is greater than high ({self.high})")
        if self.log and (self.low < 1 or self.step != 1):
            raise ValueError("log scale needs low >= 1 and step 1")
        if self.default is not None and not self.low <= self.default <= self.high:
            raise ValueError(f"default {self.default} is outside [{self.low}, {self.high}]")
        return self


class FloatParam(ParamBase):
    type: Literal["float"]
    low: float
    high: float
    step: float | None = Field(default=None, gt=0)
    log: bool = False
    default: float | None = None

    @model_validator(mode="after")
    def _range(self) -> FloatParam:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) is greater than high ({self.high})")
        if self.log and (self.low <= 0 or self.step is not None):
            raise ValueError("log scale needs low > 0 and no step")
        if self.default is not None and not self.low <= self.default <= self.high:
            raise ValueError(f"default {self.default} is outside [{self.low}, {self.high}]")
        return self


class BoolParam(ParamBase):
    type: Literal["bool"]
    default: bool = False


class FixedParam(ParamBase):
    type: Literal["fixed"]
    value: Scalar | dict[str, Any] | list[Any]


Param = Annotated[CategoricalParam | IntParam | FloatParam | BoolParam | FixedParam, Field(discriminator="type")]


class PromptSourceModel(Strict):
    """The user's own prompts (harness/user_prompts.py): a file, or a folder of documents."""

    path: str
    format: Literal["jsonl", "sharegpt", "documents"] = "jsonl"
    replay: bool = False
    time_scale: float = Field(default=1.0, gt=0)
    limit: int | None = Field(default=None, ge=1)
    context_tokens: int = Field(default=4096, ge=0)
    questions: list[str] = Field(default=["Using only the documents above, what are their three main topics?"],
                                 min_length=1)
    max_tokens: int = Field(default=256, ge=1)

    def to_source(self) -> PromptSource:
        source = PromptSource(**{**self.model_dump(), "questions": tuple(self.questions)})
        validate_source(source)  # a missing or unreadable file is a space error, before any trial
        return source


class WorkloadModel(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_\-]+$")
    profile: str | None = None
    streams: list[str] | None = None
    source: PromptSourceModel | None = None
    concurrency: int = Field(default=1, ge=1)  # streams of a `source` workload
    thinking: bool | None = None  # None: the chat template's default; mapped per engine
    requests_per_stream: int = Field(default=1, ge=1)
    scale: float = Field(default=1.0, gt=0)
    context_scale: float | None = Field(default=None, gt=0)
    output_scale: float | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, ge=1)
    warm: bool = False
    rate: float | None = Field(default=None, gt=0)
    seed: int = 0

    @model_validator(mode="after")
    def _streams(self) -> WorkloadModel:
        items, profiles = catalogue()
        if sum(x is not None for x in (self.profile, self.streams, self.source)) != 1:
            raise ValueError("give exactly one of `profile`, `streams` or `source`")
        if self.source is not None:
            self.source.to_source()
        if self.profile is not None and self.profile not in profiles:
            raise ValueError(f"unknown profile {self.profile!r} (known: {', '.join(profiles)})")
        for item in self.streams or []:
            if item not in items:
                raise ValueError(f"unknown workload item {item!r} (known: {', '.join(items)})")
        return self


class MeasureModel(Strict):
    """How each workload is measured; the steady-state and length settings are MeasurePolicy's
    (harness/steady.py says what each one does)."""

    repeats: int = Field(default=3, ge=1)  # counted runs at least (stalled runs are re-measured)
    warmup: bool = True
    request_timeout_s: float = Field(default=300.0, gt=0)
    max_warmups: int = Field(default=3, ge=1)  # warm up until two runs agree, at most this many
    warmup_tolerance: float = Field(default=0.10, gt=0, lt=1)
    stall_factor: float = Field(default=3.0, gt=1)
    max_remeasure: int = Field(default=2, ge=0)
    target_ci: float | None = Field(default=None, gt=0, lt=1)  # e.g. 0.02: until the CI is within +-2%
    max_repeats: int = Field(default=20, ge=1)
    time_cap_s: float = Field(default=300.0, gt=0)
    # Stop measuring a config's remaining load points once it is this much below the incumbent at a
    # point (start-to-start noise is ~7% on a shared CPU, ~1-5% on a GPU: twice that, at least 10%).
    prune_margin: float = Field(default=0.15, gt=0, lt=1)
    # Differences below this are noise (start-to-start): the study stops when no untried config can
    # plausibly beat the incumbent by more (search/stopping.py).
    noise_floor: float = Field(default=0.05, gt=0, lt=1)
    # Re-measure the default on a fresh start after every N counted trials (0: never): the study's
    # own start-to-start noise, reported with the results (search/noise.py).
    noise_every: int = Field(default=0, ge=0)

    def policy(self, metric: str = "output_tok_s") -> MeasurePolicy:
        """The measurement policy for one workload; `metric` is the per-run value it watches (the
        objective's leaf, e.g. output_tok_s)."""
        from harness.steady import MeasurePolicy  # here: the schema imports nothing of the measurement

        return MeasurePolicy(metric=metric, max_warmups=self.max_warmups, warmup_tolerance=self.warmup_tolerance,
                             stall_factor=self.stall_factor, max_remeasure=self.max_remeasure,
                             target_ci=self.target_ci, max_repeats=max(self.max_repeats, self.repeats),
                             time_cap_s=self.time_cap_s)


class ObjectiveModel(Strict):
    metric: str
    direction: Literal["maximize", "minimize"] = "maximize"


class ConfirmModel(Strict):
    """Re-measure the top configs beside the default at the end of `search run` (fresh starts,
    interleaved, stopped when settled): the study's answer is the confirmed one."""

    top_k: int = Field(default=1, ge=0)  # 0: no confirmation
    max_rounds: int = Field(default=5, ge=3)
    # Positive controls: parameter overrides of the default that make a config known to be worse
    # (eager fp32, a throttle). They are confirmed beside the others; one not found worse shows that
    # the confirmation lacked the power to see a real difference, and the answer says so.
    controls: list[dict[str, Any]] = Field(default_factory=list, max_length=4)


class BudgetModel(Strict):
    trials: int = Field(default=10, ge=1)
    timeout_s: float | None = Field(default=None, gt=0)


_CONSTRAINT = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(<=|>=|==|<|>)\s*(-?[0-9.eE+\-]+)\s*$")


class SpaceModel(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str = ""
    engines: dict[str, EngineModel] = Field(min_length=1)
    models: list[ModelModel] = Field(min_length=1)
    params: dict[str, Param] = {}
    workloads: list[WorkloadModel] = Field(min_length=1)
    measure: MeasureModel = MeasureModel()
    quality: QualityModel = QualityModel()
    objectives: list[ObjectiveModel] = Field(min_length=1)
    constraints: list[str] = []
    budget: BudgetModel = BudgetModel()
    confirm: ConfirmModel = ConfirmModel()
    device: DeviceModel | None = None
    seed: int = 0

    @model_validator(mode="after")
    def _cross_checks(self) -> SpaceModel:
        for name, engine in self.engines.items():
            dialect = engine.dialect or name
            if dialect not in DIALECTS:
                raise ValueError(f"engines.{name}: unknown dialect {dialect!r} (known: {', '.join(DIALECTS)}); "
                                 "set `dialect:`")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError("models: names must be unique")
        reserved = {"engine", "model"}
        for i, control in enumerate(self.confirm.controls):
            unknown = sorted(set(control) - set(self.params) - reserved)
            if unknown or not control:
                raise ValueError(f"confirm.controls[{i}]: give parameter overrides of the default"
                                 + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
        for pname, param in self.params.items():
            if param.side == "request" and pname not in REQUEST_SIDE:
                raise ValueError(f"params.{pname}: request-side parameters are {', '.join(REQUEST_SIDE)}")
            if param.side == "request" and isinstance(param, (FloatParam, BoolParam)):
                raise ValueError(f"params.{pname}: a request-side parameter is a load ladder: give `choices` "
                                 "(categorical) or an int range")
            if param.side == "request" and param.env:
                raise ValueError(f"params.{pname}: a request-side parameter cannot set an environment variable")
            if pname in reserved:
                raise ValueError(f"params.{pname}: '{pname}' is reserved (the engine and model choices)")
            for key in param.when:
                root = key.split(".", 1)[0]
                if root not in reserved and root not in self.params:
                    raise ValueError(f"params.{pname}.when: {key!r} is neither engine, model, model.<attr> "
                                     "nor a parameter")
                if root in self.params and list(self.params).index(root) >= list(self.params).index(pname):
                    raise ValueError(f"params.{pname}.when: {key!r} must be declared before {pname}")
        wnames = [w.name for w in self.workloads]
        if len(set(wnames)) != len(wnames):
            raise ValueError("workloads: names must be unique")
        for expr in self.constraints:
            if not _CONSTRAINT.match(expr):
                raise ValueError(f"constraints: cannot read {expr!r}; write 'metric <= number' "
                                 "(operators <=, <, >=, >, ==)")
        return self


def _format_loc(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in ("categorical", "int", "float", "bool", "fixed") and parts:
            continue  # the discriminator's branch name is noise for the user
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def _one_line(errors: list[Any]) -> str:
    """Pydantic's errors as `key.path: reason; key.path: reason (and N more)`, on one line."""
    shown = [f"{_format_loc(e['loc'])}: {' '.join(str(e['msg']).split())}" for e in errors[:4]]
    more = f" (and {len(errors) - 4} more)" if len(errors) > 4 else ""
    return "; ".join(shown) + more


def _secret_params(model: SpaceModel, source: str) -> None:
    """A secret cannot be searched: Optuna would store every sampled value in the study."""
    for name, param in model.params.items():
        if secrets.is_secret_name(name) and not isinstance(param, FixedParam):
            raise SpaceError(f"{source}: params.{name}: a secret cannot be a searched parameter "
                             "(use `type: fixed`, or set it under engines.<name>.args)")


def parse_space(data: Any, source: str = "<space>") -> Space:
    if not isinstance(data, dict):
        raise SpaceError(f"{source}: the space must be a mapping of keys, got {type(data).__name__}")
    try:
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
    return Space(model, source)


def load_space(path: str | Path) -> Space:
    try:
        data = load_yaml(path)
    except InputError as exc:
        raise SpaceError(str(exc)) from None
    return parse_space(data, str(path))


def _distribution(param: Any) -> optuna.distributions.BaseDistribution | None:
    if isinstance(param, CategoricalParam):
        return optuna.distributions.CategoricalDistribution(param.choices)
    if isinstance(param, BoolParam):
        return optuna.distributions.CategoricalDistribution([False, True])
    if isinstance(param, IntParam):
        return optuna.distributions.IntDistribution(param.low, param.high, log=param.log, step=param.step)
    if isinstance(param, FloatParam):
        return optuna.distributions.FloatDistribution(param.low, param.high, log=param.log, step=param.step)
    return None  # fixed


def _default_value(param: Any) -> Any:
    if isinstance(param, FixedParam):
        return param.value
    if isinstance(param, CategoricalParam):
        return param.default if "default" in param.model_fields_set else param.choices[0]
    if isinstance(param, BoolParam):
        return param.default
    return param.default if param.default is not None else param.low


FLOAT_DIGITS = 4  # significant digits of a sampled float without a step


def _decimals(x: float) -> int:
    """Decimal places of a number as written: 0.05 -> 2, 1e-05 -> 5, 2.0 -> 0."""
    exponent = Decimal(repr(float(x))).normalize().as_tuple().exponent
    return max(0, -int(exponent))


def rounded_float(value: float, param: FloatParam) -> float:
    """A sampled float as the config, the launch command and every display carry it: on the param's
    step grid (counted from low, as Optuna counts it) with no binary residue, else FLOAT_DIGITS
    significant digits; clamped into [low, high]. (Optuna keeps its own unrounded copy for the
    sampler; the config is what runs and what is shown.)"""
    if param.step:
        steps = round((value - param.low) / param.step)
        out = round(param.low + steps * param.step, max(_decimals(param.step), _decimals(param.low)))
    else:
        out = float(f"{value:.{FLOAT_DIGITS}g}")
    return min(max(out, param.low), param.high)


def request_values(param: Any) -> list[Any]:
    """The values a request-side param takes on the load ladder (finite by validation)."""
    if isinstance(param, CategoricalParam):
        return list(param.choices)
    if isinstance(param, IntParam):
        return list(range(param.low, param.high + 1, param.step or 1))
    if isinstance(param, FixedParam):
        return [param.value]
    raise SpaceError(f"request-side parameter of type {type(param).__name__} has no finite set of values")


class Config(BaseModel):
    """One sampled configuration: engine, model and the values of the active params."""

    model_config = ConfigDict(frozen=True)
    engine: str
    model: str
    values: dict[str, Any]

    def as_params(self) -> dict[str, Any]:
        return {"engine": self.engine, "model": self.model, **self.values}


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
            ready_timeout_s=e.ready_timeout_s, flag_map=dict(e.flag_map), python=python)

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
        has request-side params (see search/curves.py for how they are read back)."""
        points = self.load_points()
        if points == [{}]:
            return self.workload_specs()
        out = []
        for point in points:
            label = ",".join(f"{k}={v}" for k, v in point.items())
            out += [replace(spec, name=f"{spec.name}@{label}") for spec in self.workload_specs(point)]
        return out

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
            dist = _distribution(param)
            if dist is None:
                value = _default_value(param)
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

    def default_config(self) -> dict[str, Any]:
        """Params for the baseline trial: first engine and model, every param at its default."""
        chosen: dict[str, Any] = {"engine": next(iter(self.m.engines)), "model": self.m.models[0].name}
        for name, param in self.m.params.items():
            if self._active(param.when, chosen) and not isinstance(param, FixedParam) and param.side != "request":
                chosen[name] = _default_value(param)
        return chosen

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
            match = _CONSTRAINT.match(expr)
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
