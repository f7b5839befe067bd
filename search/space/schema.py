"""The schema of a space file: pydantic models that validate every key (unknown keys are errors).

search/space/space.py reads a file into these models (environment expansion, one-line errors, secrets)
and wraps the result in a Space; search/space/values.py turns a param model into values.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.engines import DIALECTS
from harness.launch.cpus import parse_cpu_list
from harness.measure.user_prompts import PromptSource
from harness.measure.user_prompts import validate as validate_source
from harness.measure.workloads import catalogue
from harness.quality.quality import QualityModel

Scalar = str | int | float | bool | None

# Parameters that change only what the client sends: trials differing only in these reuse the
# running server. Each overrides the same field of every workload.
REQUEST_SIDE = ("concurrency", "rate", "max_tokens", "requests_per_stream")

if TYPE_CHECKING:  # the schema imports nothing of the measurement at run time
    from harness.measure.steady import MeasurePolicy


class SpaceError(Exception):
    """A space file is invalid; the message names the file, the key path and the reason."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VolumeModel(Strict):
    host: str
    container: str
    read_only: bool = True  # a container writes to a host folder only where the space says read_only: false


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
    cpus: str | None = None  # pin the server to these CPUs: a Linux cpu list ("2-9"); harness/launch/cpus.py
    # Docker only, as the images' own `docker run` lines set them: `ulimits: {nofile: 1048576}` (soft =
    # hard) or `{memlock: [-1, -1]}` (soft, hard; -1 unlimited), `cap_add: [IPC_LOCK]`,
    # `devices: [/dev/infiniband]`, `mem_limit: 110g`, `memswap_limit: 120g`, `pids_limit: 4096`.
    ulimits: dict[str, tuple[int, int]] = {}  # name -> (soft, hard); a bare number is both
    cap_add: list[str] = []
    devices: list[str] = []
    mem_limit: str | None = None
    memswap_limit: str | None = None
    pids_limit: int | None = Field(default=None, ge=-1)
    flag_map: dict[str, str] = {}
    expect: ExpectModel = ExpectModel()
    # The checkpoints this engine can load (None: all). An image patched for one checkpoint family
    # (e.g. INT4 AutoRound) has no business with the others: such pairs cost no start and no trial.
    models: list[str] | None = None

    @field_validator("env", mode="before")
    @classmethod
    def _env_as_strings(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _docker_options_need_docker(self) -> EngineModel:
        docker_only = [k for k in ("ulimits", "cap_add", "devices", "mem_limit", "memswap_limit", "pids_limit",
                                   "shm_size") if getattr(self, k) not in (None, {}, [])]
        if docker_only and self.launcher != "docker":
            raise ValueError(f"{', '.join(docker_only)}: options of a container; set launcher: docker, or "
                             "remove them")
        return self

    @field_validator("ulimits", mode="before")
    @classmethod
    def _ulimit_pairs(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out = {}
        for name, limit in value.items():
            pair = (limit, limit) if isinstance(limit, int) and not isinstance(limit, bool) else limit
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2
                    and all(isinstance(x, int) and not isinstance(x, bool) and x >= -1 for x in pair)):
                raise ValueError(f"ulimits.{name}: {limit!r} is not a number or [soft, hard] (-1: unlimited)")
            out[str(name)] = (int(pair[0]), int(pair[1]))
        return out

    @field_validator("cpus", mode="before")
    @classmethod
    def _cpu_list(cls, value: Any) -> Any:
        if value is None or isinstance(value, bool):
            return value
        text = str(value)  # `cpus: 3` in YAML is an int
        parse_cpu_list(text)  # a malformed list is a load error, not a failed start
        return text


class DeviceModel(Strict):
    """What the target device offers, for the memory-fit check and the roofline."""

    name: str | None = None
    memory_gb: float | None = Field(default=None, gt=0)
    bandwidth_gbs: float | None = Field(default=None, gt=0)
    default_utilization: float = Field(default=0.9, gt=0, le=1)
    reserve_gb: float = Field(default=1.0, ge=0)  # activations, CUDA context, fragmentation
    # GPU memory shared with the OS and the page cache (DGX Spark / GB10): see search/study/memory_fit.py.
    unified_memory: bool = False
    os_reserve_gb: float = Field(default=8.0, ge=0)  # what the OS needs left over (unified memory only)
    # The command that drops the page cache before a start whose share it holds (unified memory only);
    # None: never, unless `search run --drop-page-cache` (search/study/unified_memory.py).
    drop_page_cache: list[str] | None = None


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
    """The user's own prompts (harness/measure/user_prompts.py): a file, or a folder of documents."""

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
    (harness/measure/steady.py says what each one does)."""

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
    # plausibly beat the incumbent by more (search/sampling/stopping.py).
    noise_floor: float = Field(default=0.05, gt=0, lt=1)
    # Re-measure the default on a fresh start after every N counted trials (0: never): the study's
    # own start-to-start noise, reported with the results (search/study/noise.py).
    noise_every: int = Field(default=0, ge=0)
    # kv.sequences: how many sequences of this many tokens the KV cache holds at once (startup log).
    kv_context_tokens: int | None = Field(default=None, ge=1)

    def policy(self, metric: str = "decode_tok_s") -> MeasurePolicy:
        """The measurement policy for one workload; `metric` is the per-run value it watches (the
        objective's leaf, e.g. output_tok_s)."""
        from harness.measure.steady import MeasurePolicy  # here: the schema imports nothing of the measurement

        return MeasurePolicy(metric=metric, max_warmups=self.max_warmups, warmup_tolerance=self.warmup_tolerance,
                             stall_factor=self.stall_factor, max_remeasure=self.max_remeasure,
                             target_ci=self.target_ci, max_repeats=max(self.max_repeats, self.repeats),
                             time_cap_s=self.time_cap_s)


class SloModel(Strict):
    """The latency target of the `capacity` objective (harness/measure/capacity.py): the highest concurrency
    whose latency percentiles stay within these limits, found per config by doubling then bisecting
    the load on its running server. Metrics: capacity.concurrency (the objective `capacity`),
    capacity.output_tok_s and capacity.<limit> at that load; the curve is in the trial's result.json."""

    workload: str | None = None  # the workload whose load is searched (default: the first)
    ttft_p50_s: float | None = Field(default=None, gt=0)
    ttft_p90_s: float | None = Field(default=None, gt=0)
    ttft_p99_s: float | None = Field(default=None, gt=0)
    itl_p50_s: float | None = Field(default=None, gt=0)
    itl_p90_s: float | None = Field(default=None, gt=0)
    itl_p99_s: float | None = Field(default=None, gt=0)
    tpot_p90_s: float | None = Field(default=None, gt=0)
    e2e_p90_s: float | None = Field(default=None, gt=0)
    max_error_rate: float = Field(default=0.0, ge=0, lt=1)  # failed requests a step may have
    start_concurrency: int = Field(default=1, ge=1)
    max_concurrency: int = Field(default=64, ge=1)
    resolution: float = Field(default=0.1, ge=0, lt=1)  # bisect until the gap is this share of the load
    max_steps: int = Field(default=10, ge=2, le=30)

    def limits(self) -> dict[str, float]:
        return {k: v for k, v in self.model_dump().items() if k.endswith("_s") and v is not None}

    @model_validator(mode="after")
    def _some_limit(self) -> SloModel:
        if not self.limits():
            raise ValueError("give at least one latency limit, e.g. ttft_p90_s: 2.0")
        if self.start_concurrency > self.max_concurrency:
            raise ValueError(f"start_concurrency ({self.start_concurrency}) > max_concurrency "
                             f"({self.max_concurrency})")
        return self


CAPACITY = "capacity.concurrency"  # the objective `capacity` stands for this metric


class ObjectiveModel(Strict):
    metric: str
    direction: Literal["maximize", "minimize"] = "maximize"


class ConfirmModel(Strict):
    """Re-measure the top configs beside the default at the end of `search run` (fresh starts,
    interleaved, stopped when settled): the study's answer is the confirmed one."""

    top_k: int = Field(default=1, ge=0)  # 0: no confirmation
    max_rounds: int = Field(default=5, ge=3)
    # Measured runs per confirmation start (None: the space's measure.repeats). A run costs a few
    # seconds, a start tens: where a run's spread dominates a start's (a host whose speed changes
    # within seconds), more runs per start narrow a round's difference for little time.
    repeats: int | None = Field(default=None, ge=1)
    # Positive controls: configs known to be worse than the default, confirmed beside the others;
    # one not found worse shows that the confirmation lacked the power to see a real difference,
    # and the answer says so. Each is parameter overrides of the default and/or `slowdown: F`: the
    # default served behind harness/launch/throttle.py --stretch (every response byte (1/(1-F)) x later,
    # throughput x (1-F) whatever the machine's load), a known slowdown on any hardware.
    controls: list[dict[str, Any]] = Field(default_factory=list, max_length=4)


class QueuedModel(Strict):
    """A known config run before anything is sampled (after the default): the documents' known-good
    setups, so that the study starts from the best known results. Unnamed params take their defaults."""

    label: str = Field(min_length=1)  # where it comes from, shown in progress lines and the dry run
    engine: str
    model: str
    params: dict[str, Scalar | dict[str, Any] | list[Any]] = {}


class BudgetModel(Strict):
    trials: int = Field(default=10, ge=1)
    timeout_s: float | None = Field(default=None, gt=0)


CONSTRAINT = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(<=|>=|==|<|>)\s*(-?[0-9.eE+\-]+)\s*$")


# A name that becomes a file or folder name (the space's: results/NAME; an engine key: its preflight
# cache): letters, digits, '_', '.', '-', not starting with '.' or '-' (so never '..', a hidden file or a flag).
PATH_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$"


class SpaceModel(Strict):
    name: str = Field(pattern=PATH_NAME, max_length=120)
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
    queue: list[QueuedModel] = []
    device: DeviceModel | None = None
    slo: SloModel | None = None
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _objective_names(cls, data: Any) -> Any:
        """`objectives: [capacity, w.decode_tok_s]`: a bare name is {metric: name}, maximized."""
        if isinstance(data, dict) and isinstance(data.get("objectives"), list):
            data = {**data, "objectives": [{"metric": CAPACITY if o == "capacity" else o} if isinstance(o, str)
                                           else o for o in data["objectives"]]}
        return data

    @model_validator(mode="after")
    def _cross_checks(self) -> SpaceModel:
        for name, engine in self.engines.items():
            if not re.match(PATH_NAME, name) or len(name) > 120:  # it names files (the preflight cache)
                raise ValueError(f"engines.{name!r}: an engine key is letters, digits, '_', '.' and '-', not "
                                 "starting with '.' or '-'")
            dialect = engine.dialect or name
            if dialect not in DIALECTS:
                raise ValueError(f"engines.{name}: unknown dialect {dialect!r} (known: {', '.join(DIALECTS)}); "
                                 "set `dialect:`")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError("models: names must be unique")
        for name, engine in self.engines.items():
            unknown_models = sorted(set(engine.models or []) - set(names))
            if unknown_models:
                raise ValueError(f"engines.{name}.models: unknown checkpoint(s) {', '.join(unknown_models)} "
                                 f"(known: {', '.join(names)})")
        reserved = {"engine", "model"}
        for i, control in enumerate(self.confirm.controls):
            unknown = sorted(set(control) - set(self.params) - reserved - {"slowdown"})
            if unknown or not control:
                raise ValueError(f"confirm.controls[{i}]: give parameter overrides of the default and/or "
                                 "`slowdown: F`" + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
            slowdown = control.get("slowdown")
            if slowdown is not None and (isinstance(slowdown, bool) or not isinstance(slowdown, int | float)
                                         or not 0 < slowdown < 1):
                raise ValueError(f"confirm.controls[{i}].slowdown: a fraction between 0 and 1, e.g. 0.2")
            runs_on = self.engines.get(str(control.get("engine", next(iter(self.engines), ""))))
            if slowdown is not None and runs_on is not None and runs_on.launcher != "process":
                raise ValueError(f"confirm.controls[{i}].slowdown: only for engines run as local processes")
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
            if not CONSTRAINT.match(expr):
                raise ValueError(f"constraints: cannot read {expr!r}; write 'metric <= number' "
                                 "(operators <=, <, >=, >, ==)")
        uses = [o.metric for o in self.objectives] + [e for e in self.constraints]
        if self.slo is None and any(u.strip().startswith("capacity.") for u in uses):
            raise ValueError("the capacity objective needs an `slo:` block (e.g. slo: {ttft_p90_s: 2.0})")
        if self.slo is not None and self.slo.workload is not None and self.slo.workload not in wnames:
            raise ValueError(f"slo.workload: {self.slo.workload!r} is not a workload ({', '.join(wnames)})")
        return self



def json_schema() -> dict[str, Any]:
    """The space file's JSON Schema, from these models (`search schema`; committed as
    spaces/space.schema.json, which editors find through the `# yaml-language-server: $schema=` line
    of each shipped space). The loader's shorthands, which its "before" validators accept and the
    models' types do not show, are allowed too: a bare objective name (`objectives: [capacity]`), a bare
    number for a ulimit's soft and hard limit (`ulimits: {nofile: 1048576}`)."""
    schema = SpaceModel.model_json_schema()
    objectives = schema["properties"]["objectives"]
    objectives["items"] = {"anyOf": [{"type": "string"}, objectives["items"]]}
    ulimits = schema["$defs"]["EngineModel"]["properties"]["ulimits"]
    ulimits["additionalProperties"] = {"anyOf": [{"type": "integer"}, ulimits["additionalProperties"]]}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "flagsearch space", **{
        k: v for k, v in schema.items() if k != "title"}}
