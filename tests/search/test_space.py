"""Space files: validation errors name the key, sampling respects conditions, launches are built right."""

from __future__ import annotations

import copy
from pathlib import Path

import optuna
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.engines import get_engine
from search.space.space import Config, SpaceError, constraint_value, load_space, parse_space

ROOT = Path(__file__).resolve().parents[2]

BASE = {
    "name": "t",
    "engines": {"vllm": {"command": ["python", "-m", "vllm.entrypoints.openai.api_server"]}},
    "models": [{"name": "m", "path": "/models/m", "has_mtp": True},
               {"name": "n", "path": "/models/n", "has_mtp": False}],
    "params": {
        "enforce_eager": {"type": "bool"},
        "speculative_method": {"type": "categorical", "choices": ["none", "mtp"], "default": "none",
                               "when": {"model.has_mtp": True}},
        "num_speculative_tokens": {"type": "int", "low": 1, "high": 3, "when": {"speculative_method": "mtp"}},
        "gpu_memory_utilization": {"type": "float", "low": 0.8, "high": 0.95, "step": 0.05},
        "bind": {"type": "categorical", "choices": ["auto", "0-1"], "env": "VLLM_CPU_OMP_THREADS_BIND"},
        "concurrency": {"type": "categorical", "choices": [1, 4], "side": "request"},
    },
    "workloads": [{"name": "w", "profile": "single"}],
    "objectives": [{"metric": "w.output_tok_s"}],
}


def doc(**changes: object) -> dict:
    d = copy.deepcopy(BASE)
    d.update(changes)
    return d


def error_of(data: object) -> str:
    with pytest.raises(SpaceError) as info:
        parse_space(data, "x.yaml")
    return str(info.value)


def test_shipped_spaces_load() -> None:
    for path in sorted((ROOT / "spaces").glob("*.yaml")):
        space = load_space(path)
        assert space.workload_specs(), path


def test_unknown_key_is_an_error_naming_the_path() -> None:
    d = doc()
    d["engines"]["vllm"]["comand"] = ["x"]
    msg = error_of(d)
    assert "x.yaml" in msg and "engines.vllm.comand" in msg and "Extra inputs" in msg


def test_bad_values_name_the_key_and_reason() -> None:
    d = doc()
    d["params"]["gpu_memory_utilization"]["low"] = 2.0
    assert "params.gpu_memory_utilization" in error_of(d)
    d = doc()
    d["params"]["enforce_eager"] = {"type": "categorical", "choices": [1, 2], "default": 3}
    assert "default 3 is not one of the choices" in error_of(d)
    assert "unknown workload item 'nope'" in error_of(doc(workloads=[{"name": "w", "streams": ["nope"]}]))
    assert "cannot read 'tok/s > 5'" in error_of(doc(constraints=["tok/s > 5"]))
    assert "unknown dialect" in error_of(doc(engines={"atlas": {"command": ["atlas"]}}))


def test_condition_must_refer_to_an_earlier_param() -> None:
    d = doc()
    d["params"]["enforce_eager"]["when"] = {"num_speculative_tokens": 2}
    assert "must be declared before" in error_of(d)


def test_request_side_params_are_limited() -> None:
    d = doc()
    d["params"]["dtype"] = {"type": "categorical", "choices": ["bfloat16"], "side": "request"}
    assert "request-side parameters are" in error_of(d)


def test_missing_env_var_is_reported() -> None:
    d = doc()
    d["models"][0]["path"] = "${FLAGSEARCH_TEST_UNSET_VAR}/m"
    assert "FLAGSEARCH_TEST_UNSET_VAR is not set" in error_of(d)


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(SpaceError, match="cannot read"):
        load_space(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpaceError, match="not valid YAML"):
        load_space(bad)
    bad.write_text("!!python/object/apply:os.system ['true']\n")
    with pytest.raises(SpaceError):  # safe_load refuses python tags
        load_space(bad)


def test_sampling_respects_conditions() -> None:
    space = parse_space(doc())
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen_models = set()
    for _ in range(60):
        trial = study.ask()
        config = space.sample(trial)
        seen_models.add(config.model)
        if config.model == "n":
            assert "speculative_method" not in config.values
            assert "num_speculative_tokens" not in config.values
        if config.values.get("speculative_method") == "mtp":
            assert 1 <= config.values["num_speculative_tokens"] <= 3
        else:
            assert "num_speculative_tokens" not in config.values
        study.tell(trial, 0.0)
    assert seen_models == {"m", "n"}


def test_split_and_launch_key_separate_launch_from_request_side() -> None:
    space = parse_space(doc())
    study = optuna.create_study()
    study.enqueue_trial({"model": "m", "enforce_eager": True, "speculative_method": "mtp",
                         "num_speculative_tokens": 2, "gpu_memory_utilization": 0.9, "bind": "0-1",
                         "concurrency": 4})
    study.enqueue_trial({"model": "m", "enforce_eager": True, "speculative_method": "mtp",
                         "num_speculative_tokens": 2, "gpu_memory_utilization": 0.9, "bind": "0-1",
                         "concurrency": 1})
    a, b = space.sample(study.ask()), space.sample(study.ask())
    flags, env, request = space.split(a)
    # Request-side params are not sampled: every start is measured at each point of the ladder.
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "0-1"} and request == {} and "concurrency" not in a.values
    assert space.launch_key(a) == space.launch_key(b)
    assert space.load_points() == [{"concurrency": 1}, {"concurrency": 4}]
    curve = space.curve_specs()
    assert [(w.name, w.concurrency) for w in curve] == [(f"{w.name}@concurrency=1", 1) for w in space.m.workloads] + [
        (f"{w.name}@concurrency=4", 4) for w in space.m.workloads]
    spec = get_engine("vllm").build_launch(space.engine_settings("vllm"), space.model_choice("m"), flags, env, 8123)
    argv = list(spec.argv)
    assert argv[argv.index("--speculative-config") + 1] == '{"method":"mtp","num_speculative_tokens":2}'
    assert "--enforce-eager" in argv and argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.9"
    assert spec.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"


def test_a_null_environment_choice_leaves_the_variable_unset() -> None:
    d = doc()
    d["params"]["bind"] = {"type": "categorical", "choices": [None, "0-1"], "env": "VLLM_CPU_OMP_THREADS_BIND"}
    space = parse_space(d)
    unset = Config(engine="vllm", model="m", values={"bind": None})
    assert space.split(unset)[1] == {}  # not VLLM_CPU_OMP_THREADS_BIND=None
    assert space.split(Config(engine="vllm", model="m", values={"bind": "0-1"}))[1] == \
        {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}


def test_default_config_is_the_baseline() -> None:
    space = parse_space(doc())
    assert space.default_config() == {"engine": "vllm", "model": "m", "enforce_eager": False,
                                      "speculative_method": "none", "gpu_memory_utilization": 0.8,
                                      "bind": "auto"}


def test_constraint_values_follow_optuna_convention() -> None:
    assert constraint_value(1.0, "<=", 2.0) <= 0 < constraint_value(3.0, "<=", 2.0)
    assert constraint_value(3.0, ">=", 2.0) <= 0 < constraint_value(1.0, ">=", 2.0)
    assert constraint_value(0.0, "==", 0.0) == 0 < constraint_value(1.0, "==", 0.0)


# Arbitrary documents, and small mutations of a valid one: the loader accepts them or raises
# SpaceError with a message, never another exception.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_arbitrary_documents_never_crash_the_loader(data: object) -> None:
    try:
        parse_space(data, "h.yaml")
    except SpaceError as exc:
        assert str(exc).startswith("h.yaml")


KEYS = ["name", "engines", "models", "params", "workloads", "objectives", "constraints", "budget", "measure"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(KEYS), json_values)
def test_mutated_documents_never_crash_the_loader(key: str, value: object) -> None:
    data = doc()
    data[key] = value
    try:
        space = parse_space(data, "h.yaml")
    except SpaceError as exc:
        assert str(exc).startswith("h.yaml")
    else:
        space.default_config()


def test_space_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc(), sort_keys=False))
    assert load_space(path).name == "t"


def test_reproduce_command_keeps_ordinary_token_flags_and_hides_secrets() -> None:
    d = doc()
    d["engines"]["vllm"]["env"] = {"HF_TOKEN": "hf_abcdefghijkl"}
    d["engines"]["vllm"]["args"] = {"max_num_batched_tokens": 4096, "api_key": "sk-secret-value"}
    space = parse_space(d)
    study = optuna.create_study()
    study.enqueue_trial(space.default_config())
    config = space.sample(study.ask())
    flags, env, _ = space.split(config)
    spec = get_engine("vllm").build_launch(space.engine_settings("vllm"), space.model_choice("m"), flags, env, 8000)
    line = spec.command_line()
    assert "--max-num-batched-tokens 4096" in line
    assert "hf_abcdefghijkl" not in line and "sk-secret-value" not in line
