"""A Docker trial's printed command is a `docker run` line that starts the same server.

The real test pastes the printed line into a shell (bash -c, the docker CLI, the private dockerd of
scripts/dockerd.sh) and checks that the container it makes is configured like the launcher's own
(entrypoint, arguments, mounts, env, network, IPC, init, security) and that the server answers."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker
import httpx
import pytest

from harness import flagsearch_home
from harness.engines import EngineSettings, ModelChoice, get_engine
from harness.launch import Volume, get_launcher, wait_ready
from harness.launch.docker import repo_digest
from harness.launch.spec import LaunchSpec
from harness.session import free_port
from search.space.space import parse_space
from search.study.study import StudyRunner, default_storage
from tests.conftest import TEST_IMAGE, Quiet

IMAGE = TEST_IMAGE


def vllm_like(argv0: tuple[str, ...], **kw: object) -> LaunchSpec:
    return LaunchSpec("vllm", (*argv0, "--model", "/models/m", "--port", "8000"), "127.0.0.1", 8000,
                      env={"HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_secret_value_123"}, launcher="docker",
                      image="vllm/vllm-openai:cu130-nightly", gpus="all", ipc_host=True,
                      volumes=(Volume("/data/models", "/models", read_only=True),), **kw)  # type: ignore[arg-type]


def test_the_image_entrypoint_is_represented_once() -> None:
    # The space's `command: [vllm, serve]` runs vllm as the entrypoint: never `vllm serve vllm serve`.
    words = shlex.split(vllm_like(("vllm", "serve")).command_line())
    image_at = words.index("vllm/vllm-openai:cu130-nightly")
    assert words[words.index("--entrypoint") + 1] == "vllm"
    assert words[image_at + 1:image_at + 4] == ["serve", "--model", "/models/m"]
    assert " ".join(words).count("vllm serve") == 0
    # "@entrypoint" keeps the image's own (vllm/vllm-openai: `vllm serve`): only its arguments follow.
    kept = shlex.split(vllm_like(("@entrypoint",)).command_line())
    assert "--entrypoint" not in kept and kept[kept.index("vllm/vllm-openai:cu130-nightly") + 1] == "--model"
    for line in (words, kept):
        assert line[:6] == ["docker", "run", "--rm", "--network", "host", "--init"]
        assert line[line.index("--gpus"):line.index("--gpus") + 2] == ["--gpus", "all"]
        assert "-v" in line and "/data/models:/models:ro" in line and "HF_HUB_OFFLINE=1" in line
        assert "hf_secret_value_123" not in " ".join(line) and "HF_TOKEN=***" in line


def test_a_digest_pins_the_image_and_device_lists_use_the_cli_syntax() -> None:
    spec = vllm_like(("vllm", "serve"), image_digest="sha256:" + "ab" * 32)
    words = shlex.split(spec.command_line())
    assert "vllm/vllm-openai:cu130-nightly@sha256:" + "ab" * 32 in words
    two = shlex.split(replace(spec, gpus="0,1").command_line())
    assert two[two.index("--gpus") + 1] == '"device=0,1"'


def test_repo_digest_prefers_the_named_repository() -> None:
    pulled = SimpleNamespace(attrs={"RepoDigests": ["mirror/x@sha256:111", "vllm/vllm-openai@sha256:222"]})
    assert repo_digest(pulled, "vllm/vllm-openai:cu130-nightly") == "sha256:222"
    assert repo_digest(pulled, "other:1") == "sha256:111"
    # Built or imported locally: no registry digest.
    assert repo_digest(SimpleNamespace(attrs={"RepoDigests": []}), "vllm-node") is None


# ---- the real daemon ------------------------------------------------------------------------------

def _essentials(attrs: dict) -> dict:
    """What makes two containers start the same server (names, labels and ids differ by design)."""
    cfg, host = attrs["Config"], attrs["HostConfig"]
    binds = sorted(host.get("Binds") or [])
    return {"image": cfg["Image"], "entrypoint": cfg["Entrypoint"], "cmd": cfg["Cmd"],
            "env": sorted(e for e in cfg["Env"] if not e.startswith("PATH=")), "binds": binds,
            "network": host["NetworkMode"], "ipc": host["IpcMode"], "init": host.get("Init"),
            "security": host.get("SecurityOpt"), "privileged": host["Privileged"]}


@pytest.fixture
def docker_env(docker_client: docker.DockerClient) -> tuple[docker.DockerClient, dict[str, str]]:
    """The session's Docker engine, and the environment a user's shell would have (DOCKER_HOST set)."""
    return docker_client, dict(os.environ)


def llama_docker_settings() -> EngineSettings:
    binary, gguf = flagsearch_home.llama_server(), flagsearch_home.smollm2_gguf()
    return EngineSettings(
        name="llamacpp", dialect="llamacpp", command=("/opt/llama/bin/llama-server",), launcher="docker",
        image=IMAGE, ready_timeout_s=120.0, env={"LLAMA_ARG_N_PREDICT": "64"},
        volumes=(Volume("/usr", "/usr", read_only=True), Volume(str(binary.parent), "/opt/llama/bin", read_only=True),
                 Volume(str(gguf.parent), "/models", read_only=True)))


@contextlib.contextmanager
def pasted(line: str, port: int, client: docker.DockerClient, env: dict[str, str]) -> Iterator[Any]:
    """Run `line` in a shell as a user would; yield its container once its server answers; then
    Ctrl-C it (the CLI forwards the signal, init stops the server, --rm removes the container)."""
    shell = subprocess.Popen(["bash", "-c", line], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    found = None
    try:
        deadline = time.monotonic() + 120
        while found is None and time.monotonic() < deadline:
            assert shell.poll() is None, shell.stderr.read() if shell.stderr else ""
            mine = [c for c in client.containers.list(filters={"ancestor": IMAGE})
                    if f"--port {port}" in " ".join(c.attrs["Args"]) and "flagsearch" not in c.labels]
            found = mine[0] if mine else None
            time.sleep(0.2)
        assert found is not None, "the pasted command made no container"
        with httpx.Client(timeout=120) as http:
            while time.monotonic() < deadline:
                try:
                    if http.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            body = http.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
                                   "temperature": 0, "ignore_eos": True}).json()
        assert body["usage"]["completion_tokens"] == 8
        yield found
    finally:
        os.killpg(shell.pid, signal.SIGINT)
        try:
            shell.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait(timeout=10)
        if found is not None:
            for _ in range(50):
                try:
                    client.containers.get(found.id)
                except docker.errors.NotFound:
                    break
                time.sleep(0.2)
            else:
                client.containers.get(found.id).remove(force=True)
                pytest.fail("the pasted container outlived its docker run (--rm did not remove it)")


@pytest.mark.docker
def test_the_printed_command_pasted_into_a_shell_starts_the_same_server(
        docker_env: tuple[docker.DockerClient, dict[str, str]], tmp_path: Path) -> None:
    client, env = docker_env
    gguf = flagsearch_home.smollm2_gguf()
    spec = get_engine("llamacpp").build_launch(llama_docker_settings(), ModelChoice("smollm2", "/models/" + gguf.name),
                                               {"threads": 1, "parallel": 1, "ctx_size": 1024}, {}, free_port())
    # 1. The launcher's own container, for reference.
    server = get_launcher("docker").start(spec, tmp_path / "0001" / "server.log")
    try:
        wait_ready(server, "/health", spec.ready_timeout_s, poll_s=0.2)
        reference = _essentials(client.containers.get(server.container_id).attrs)
        line = server.spec.command_line()  # what a trial stores and `search best` prints
    finally:
        server.stop()
    # 2. The printed line, pasted into a shell as a user would: the same container, answering.
    assert line.startswith("docker run ") and "--entrypoint /opt/llama/bin/llama-server" in line
    with pasted(line, spec.port, client, env) as container:
        assert _essentials(container.attrs) == reference


@pytest.mark.docker
def test_search_best_prints_a_docker_run_line_that_starts_the_winner(
        docker_env: tuple[docker.DockerClient, dict[str, str]], tmp_path: Path) -> None:
    client, env = docker_env
    settings = llama_docker_settings()
    gguf = flagsearch_home.smollm2_gguf()
    space = {
        "name": "docker-best",
        "engines": {"llamacpp": {"dialect": "llamacpp", "launcher": "docker", "image": IMAGE,
                                 "command": list(settings.command), "env": dict(settings.env),
                                 "volumes": [{"host": v.host_path, "container": v.container_path, "read_only": True}
                                             for v in settings.volumes],
                                 "args": {"ctx_size": 1024, "parallel": 1}, "ready_timeout_s": 120}},
        "models": [{"name": "smollm2", "path": "/models/" + gguf.name}],
        "params": {"threads": {"type": "categorical", "choices": [1], "default": 1}},
        "workloads": [{"name": "single", "streams": ["qa"], "max_tokens": 8}],
        "measure": {"repeats": 1, "warmup": False, "request_timeout_s": 60},
        "quality": {"suite": None},
        "objectives": [{"metric": "single.output_tok_s"}],
        "budget": {"trials": 1},
        "confirm": {"top_k": 0},
    }
    results = tmp_path / "docker-best"
    StudyRunner(parse_space(space, "docker-best"), default_storage(results), "docker-best", results, Quiet()).run(1)
    best = subprocess.run([sys.executable, "-m", "search.cli", "best", str(results)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=Path(__file__).resolve().parents[2])
    assert best.returncode == 0, best.stdout[-2000:] + best.stderr[-2000:]
    (line,) = [ln for ln in best.stdout.splitlines() if ln.strip()]
    assert line.startswith("docker run ") and "llama-server llama-server" not in line
    words = shlex.split(line)
    assert words[words.index("--entrypoint") + 1] == "/opt/llama/bin/llama-server"
    port = int(words[words.index("--port") + 1])
    with pasted(line, port, client, env) as container:
        assert container.attrs["Config"]["Entrypoint"] == ["/opt/llama/bin/llama-server"]
        assert container.attrs["HostConfig"]["NetworkMode"] == "host" and container.attrs["HostConfig"]["Init"]
