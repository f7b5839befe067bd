"""Baseline files: one config, pinned, with the raw samples it gave, meant to be reviewed and committed.

A baseline's `config` is a space document with exactly one point: the engine and model that
were chosen and every parameter `fixed` at its value. So it loads with the same validation as any
space file, and every command that measures a space can measure a baseline unchanged. Paths keep
their `${FLAGSEARCH_HOME}` form when the source space used it, so the file works on another host.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from harness.files import InputError, load_yaml
from search.space.schema import CAPACITY
from search.space.space import Config, Space, SpaceError, load_space, parse_space
from search.space.values import default_value, request_values
from search.store.results import ResultsError, TrialState, format_version, read_json, write_json_atomic

# Versioned: a reader loads every earlier version (migrating it) and refuses a newer one by name.
FORMAT_NAME = "flagsearch-baseline"
FORMAT_VERSION = 1
FORMAT = f"{FORMAT_NAME}/{FORMAT_VERSION}"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")  # never "..", a hidden file or a flag
# Per-run metrics worth keeping raw in a reviewed file (the rest are derivable or noise).
KEPT_METRICS = ("output_tok_s", "stream_tok_s", "req_s", "ttft_p50_s", "ttft_p90_s", "ttft_cold_p50_s",
                "tpot_p50_s", "tpot_p90_s", "e2e_p50_s", "itl_p50_s", "decode_steps_s", "decode_tok_s",
                "engine_decode_tok_s", "errors", "spec_mean_acceptance_length", "spec_acceptance_rate",
                "prefix_cache_hit_rate", "ready_s")


def kept(samples: dict[str, list[float]]) -> dict[str, list[float]]:
    """Only the metrics worth reviewing (see KEPT_METRICS), so that a baseline file stays small."""
    return {k: v for k, v in samples.items() if k.rsplit(".", 1)[-1] in KEPT_METRICS}


@dataclass
class Baseline:
    name: str
    config: dict[str, Any]  # a one-point space document
    params: dict[str, Any]  # engine, model and every parameter's value
    samples: dict[str, list[float]]  # "<workload>.<metric>" -> raw values, one per sample
    sample_unit: str  # "round" (one server start each) or "repeat" (repeats within one server start)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    startup: dict[str, Any] = field(default_factory=dict)
    quality: dict[str, Any] | None = None
    command: str = ""
    source: dict[str, Any] = field(default_factory=dict)
    gate: dict[str, Any] = field(default_factory=dict)  # metrics to gate, min_effect
    created: str = ""

    def space(self, where: str | None = None) -> Space:
        try:
            return parse_space(self.config, where or f"baseline {self.name}")
        except SpaceError as exc:
            raise ResultsError(str(exc)) from None

    def pinned_config(self) -> Config:
        return Config(engine=self.params["engine"], model=self.params["model"],
                      values={k: v for k, v in self.params.items() if k not in ("engine", "model")})

    def gated_metrics(self) -> list[str]:
        if self.gate.get("metrics"):
            return list(self.gate["metrics"])
        # A space's objective is {metric: ...} or a bare name (`capacity` stands for its metric).
        return [o["metric"] if isinstance(o, dict) else CAPACITY if o == "capacity" else str(o)
                for o in self.config.get("objectives", [])]

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "name": self.name, "created": self.created, "source": self.source,
                "params": self.params, "command": self.command, "config": self.config, "gate": self.gate,
                "sample_unit": self.sample_unit, "samples": self.samples, "quality": self.quality,
                "startup": self.startup, "fingerprint": self.fingerprint}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Baseline:
        if not isinstance(data, dict):
            raise ResultsError(f"{where}: not a baseline file (a JSON {type(data).__name__}, expected an object)")
        format_version(data.get("format"), FORMAT_NAME, FORMAT_VERSION, where)  # 1 is the only version yet
        missing = [k for k in ("name", "config", "params", "samples") if k not in data]
        if missing:
            raise ResultsError(f"{where}: baseline lacks {', '.join(missing)}")
        samples = data["samples"]
        if not isinstance(samples, dict) or not all(
                isinstance(v, list) and all(isinstance(x, (int, float)) for x in v) for v in samples.values()):
            raise ResultsError(f"{where}: `samples` must map metric names to lists of numbers")
        problems = [f"`{k}` must be an object" for k in ("config", "params") if not isinstance(data[k], dict)]
        if not isinstance(data["name"], str):
            problems.append("`name` must be text")
        if isinstance(data["params"], dict) and not all(isinstance(data["params"].get(k), str)
                                                        for k in ("engine", "model")):
            problems.append("`params` must name the engine and the model")
        for key in ("fingerprint", "startup", "source", "gate"):
            if not isinstance(data.get(key) or {}, dict):
                problems.append(f"`{key}` must be an object")
        if problems:
            raise ResultsError(f"{where}: damaged baseline: {'; '.join(problems)}")
        return cls(name=data["name"], config=data["config"], params=data["params"],
                   samples={k: [float(x) for x in v] for k, v in samples.items()},
                   sample_unit=data.get("sample_unit", "repeat"), fingerprint=data.get("fingerprint") or {},
                   startup=data.get("startup") or {}, quality=data.get("quality"), command=data.get("command", ""),
                   source=data.get("source") or {}, gate=data.get("gate") or {}, created=data.get("created", ""))


def baseline_path(directory: Path, name: str) -> Path:
    if not _NAME.match(name):
        raise ValueError(f"baseline name {name!r}: use letters, digits, '.', '_' and '-' only, not starting with "
                         "'.' or '-'")
    return directory / f"{name}.json"


def save_baseline(baseline: Baseline, directory: Path = Path("baselines"), overwrite: bool = False) -> Path:
    path = baseline_path(directory, baseline.name)
    if path.exists() and not overwrite:
        raise ValueError(f"{path} exists; pass --force to replace it (it is a reviewed file)")
    if not baseline.created:
        baseline.created = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
    baseline.space()  # refuse to write a config that would not load back
    baseline.samples = kept(baseline.samples)
    write_json_atomic(path, baseline.to_dict())
    return path


def load_baseline(path: str | Path) -> Baseline:
    p = Path(path)
    baseline = Baseline.from_dict(read_json(p), str(p))
    baseline.space(f"{p}: config")  # an error names the file
    return baseline


# ---- pinning a config ---------------------------------------------------------------------------

def raw_space_doc(path: str | Path) -> dict[str, Any]:
    """The space file as written (before ${VAR} expansion), after checking that it is valid."""
    load_space(path)
    try:
        doc = load_yaml(path)
    except InputError as exc:  # changed between the two reads
        raise SpaceError(str(exc)) from None
    if not isinstance(doc, dict):
        raise SpaceError(f"{path}: the space must be a mapping of keys")
    return doc


def pin(raw_doc: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A one-point space document: the chosen engine and model, every parameter fixed at its value."""
    engine, model = params["engine"], params["model"]
    if engine not in raw_doc.get("engines", {}):
        raise ValueError(f"engine {engine!r} is not in the space")
    models = [m for m in raw_doc.get("models", []) if m.get("name") == model]
    if not models:
        raise ValueError(f"model {model!r} is not in the space")
    engine_doc = dict(raw_doc["engines"][engine])
    if engine_doc.get("models") is not None:  # the checkpoints it loads: of those, only this model is kept
        if model not in engine_doc["models"]:
            raise ValueError(f"engine {engine!r} does not load model {model!r} (its models: "
                             f"{', '.join(engine_doc['models'])})")
        engine_doc["models"] = [model]
    doc: dict[str, Any] = {"name": raw_doc["name"], "engines": {engine: engine_doc}, "models": models, "params": {}}
    for key in ("description", "workloads", "measure", "quality", "objectives", "constraints", "slo"):
        if key in raw_doc:
            doc[key] = raw_doc[key]
    declared = raw_doc.get("params") or {}
    for name, value in params.items():
        if name in ("engine", "model"):
            continue
        if name not in declared:
            raise ValueError(f"parameter {name!r} is not declared in the space")
        fixed: dict[str, Any] = {"type": "fixed", "value": value}
        for key in ("env", "side"):
            if declared[name].get(key) is not None:
                fixed[key] = declared[name][key]
        doc["params"][name] = fixed
    return doc


def only_workloads(doc: dict[str, Any], names: list[str], where: str) -> dict[str, Any]:
    """A pinned document with only the named workloads, and the objectives that read them (or no
    workload): what `baseline save --workload` records, so that every later regress or nightly of the
    baseline measures and prices those workloads alone."""
    known = [str(w.get("name")) for w in doc.get("workloads") or []]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{where}: --workload {unknown[0]!r}: not one of {', '.join(known)}")

    def reads_kept(objective: Any) -> bool:
        metric = objective.get("metric") if isinstance(objective, dict) else str(objective)
        head = str(metric).split(".", 1)[0].partition("@")[0]
        return head in names or head not in known

    objectives = [o for o in doc.get("objectives") or [] if reads_kept(o)]
    if not objectives:
        raise ValueError(f"{where}: no objective reads --workload {', '.join(names)}: name what to gate with "
                         f"--metric (e.g. --metric {names[0]}.decode_tok_s)")
    return {**doc, "workloads": [w for w in doc.get("workloads") or [] if w.get("name") in names],
            "objectives": objectives}


def workload_samples(samples: dict[str, list[float]], names: list[str],
                     all_workloads: list[str]) -> dict[str, list[float]]:
    """The samples of the named workloads (keys `NAME.metric`, `NAME@point.metric`) and those of no
    workload (startup, quality, kv)."""
    def head(key: str) -> str:
        return key.split(".", 1)[0].partition("@")[0]

    return {k: v for k, v in samples.items() if head(k) in names or head(k) not in all_workloads}


def pinned_space(raw_doc: dict[str, Any], params: dict[str, Any], source: str) -> tuple[Space, Config]:
    space = parse_space(pin(raw_doc, params), source)
    config = Config(engine=params["engine"], model=params["model"],
                    values={k: v for k, v in params.items() if k not in ("engine", "model")})
    return space, config


def parse_assignments(items: list[str] | None, what: str = "--set") -> dict[str, Any]:
    """['threads=1', 'flash_attn=on'] -> {'threads': 1, 'flash_attn': 'on'}."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what} {item!r}: write KEY=VALUE")
        out[key.strip()] = _scalar(value.strip())
    return out


def _scalar(text: str) -> Any:
    """JSON's reading of a value (numbers, true/false/null, objects), else the text itself: 'on' stays 'on'."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def config_params(space: Space, overrides: dict[str, Any]) -> dict[str, Any]:
    """The space's default config with overrides applied, resolved like a trial (conditions, fixed
    values, choices checked); a conditional parameter an override switches on takes its default."""
    for key in overrides:
        if key not in ("engine", "model") and key not in space.m.params:
            raise ValueError(f"--set {key}: not a parameter of {space.name} "
                             f"(known: {', '.join(space.m.params) or 'none'})")
    # A request-side parameter (`side: request`) is never sampled into a config (the study measures its load
    # ladder at every start); set here, it is the side's own value (its workloads', search/regress/shared_server.py).
    request = {k: v for k, v in overrides.items() if k in space.m.params and space.m.params[k].side == "request"}
    for key, value in request.items():
        if value not in (allowed := request_values(space.m.params[key])):
            raise ValueError(f"--set {key}={value!r}: not one of the values of {space.name}'s request-side "
                             f"parameter {key} ({', '.join(map(str, allowed))})")
    params = {**space.default_config(), **overrides}
    for _ in range(len(space.m.params) + 1):
        try:
            return {**space.sample(optuna.trial.FixedTrial(params)).as_params(), **request}
        except ValueError as exc:
            missing = re.search(r"parameter '([^']+)' is not found", str(exc))
            if not missing or missing.group(1) not in space.m.params or missing.group(1) in params:
                raise ValueError(f"config of {space.name}: {exc}") from None
            params[missing.group(1)] = default_value(space.m.params[missing.group(1)])
    raise ValueError(f"config of {space.name}: could not resolve the parameters")


# ---- from a study ---------------------------------------------------------------------------------

def samples_from_workloads(workloads: dict[str, Any]) -> dict[str, list[float]]:
    """Raw per-run values of the kept metrics from a trial's stored workload measurements."""
    out: dict[str, list[float]] = {}
    for wname, wm in workloads.items():
        for sample in wm.get("samples", []):
            for metric, value in (sample.get("metrics") or {}).items():
                if metric in KEPT_METRICS and isinstance(value, (int, float)):
                    out.setdefault(f"{wname}.{metric}", []).append(float(value))
    return out


def baseline_from_study(results_dir: Path, name: str, trial: int | None = None,
                        storage: str | None = None) -> Baseline:
    """The study's best feasible trial (or `trial`), with the raw samples from its result.json."""
    from search.store.summary import load_view
    from search.study.study import default_storage

    if storage is None and not (results_dir / "study.db").exists():
        raise ResultsError(f"{results_dir}: no study.db (give the study's results folder)")
    url = storage or default_storage(results_dir)
    try:
        study = optuna.load_study(study_name=results_dir.name, storage=url)
    except KeyError:
        raise ResultsError(f"{results_dir}: no study named {results_dir.name!r} in {url}") from None
    view = load_view(study)
    if trial is None:
        best = view.best()
        if not best:
            raise ResultsError(f"{results_dir}: no feasible trial to make a baseline of")
        record = best[0]
    else:
        found = next((r for r in view.records if r.number == trial), None)
        if found is None or found.state not in (TrialState.COMPLETE, TrialState.DUPLICATE):
            raise ResultsError(f"{results_dir}: trial {trial} is not a completed trial")
        record = found
    number = record.duplicate_of if record.duplicate_of is not None else record.number
    stored = read_json(results_dir / "trials" / f"{number:04d}" / "result.json")
    source_space = study.user_attrs.get("space_source")
    if not source_space or not Path(source_space).exists():
        raise ResultsError(f"{results_dir}: the study's space file {source_space!r} is not readable here")
    space_doc = raw_space_doc(source_space)
    baseline = Baseline(name=name, config=pin(space_doc, record.params), params=dict(record.params),
                        samples=samples_from_workloads(stored.get("workloads") or {}), sample_unit="repeat",
                        fingerprint=stored.get("fingerprint") or {}, startup=stored.get("startup") or {},
                        quality=stored.get("quality"), command=stored.get("command", ""),
                        source={"kind": "study", "results": str(results_dir), "trial": number,
                                "space": source_space})
    if not baseline.samples:
        raise ResultsError(f"{results_dir}: trial {number} has no raw samples in its result.json")
    return baseline


# Host fields a baseline must share with this machine to be re-measured here (engine fields may differ:
# that is what a regression check is about).
HOST_MATCH = ("cpu_model", "cpu_count", "gpu_name", "gpu_compute_capability", "gpu_count")


def matching_baselines(directory: Path, host: dict[str, Any]) -> tuple[list[Path], list[str], list[tuple[Path, str]]]:
    """Baselines recorded on hardware like this host's, why each other one was left out, and the
    files that could not be read (damaged, or written by a newer flagsearch): those are failures,
    never a skip, or a nightly would pass naming only the good ones."""
    keep, skipped, unreadable = [], [], []
    for path in sorted(directory.glob("*.json")):
        try:
            baseline = load_baseline(path)
        except (ResultsError, ValueError) as exc:
            unreadable.append((path, " ".join(str(exc).split())))
            continue
        diff = [f"{k}: {baseline.fingerprint.get(k)!r} != {host.get(k)!r}" for k in HOST_MATCH
                if baseline.fingerprint.get(k) != host.get(k)]
        if diff:
            skipped.append(f"{path}: other hardware ({'; '.join(diff)})")
        else:
            keep.append(path)
    return keep, skipped, unreadable
