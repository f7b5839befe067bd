"""The Docker launcher against a REAL Docker engine (scripts/dockerd.sh start), running the real
llama-server binary inside a locally built busybox image with the host's /usr mounted read-only."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import psutil
import pytest

from harness import flagsearch_home
from harness.engines import EngineSettings, ModelChoice, get_engine
from harness.launch import StartupError, Volume, get_launcher, wait_ready
from harness.launch.docker import DockerLauncher, DockerServer, container_config, leftover_containers
from harness.launch.spec import LaunchSpec, Ulimit
from search.study.study import free_port
from tests.conftest import TEST_IMAGE, Quiet

pytestmark = pytest.mark.docker

IMAGE = TEST_IMAGE


@pytest.fixture(scope="module", autouse=True)
def nothing_left_behind(docker_client: docker.DockerClient) -> Iterator[None]:
    yield
    # Nothing of ours is left behind by any test of this module.
    assert leftover_containers(docker_client, owner_pid=str(os.getpid())) == []


def llama_settings(**overrides: object) -> EngineSettings:
    binary = flagsearch_home.llama_server()
    model_dir = flagsearch_home.smollm2_gguf().parent
    base = dict(name="llamacpp", dialect="llamacpp", command=("/opt/llama/bin/llama-server",), launcher="docker",
                image=IMAGE, ready_timeout_s=120.0,
                volumes=(Volume("/usr", "/usr", read_only=True),
                         Volume(str(binary.parent), "/opt/llama/bin", read_only=True),
                         Volume(str(model_dir), "/models", read_only=True)))
    base.update(overrides)
    return EngineSettings(**base)  # type: ignore[arg-type]


def llama_spec(**overrides: object) -> LaunchSpec:
    model = ModelChoice("smollm2", "/models/" + flagsearch_home.smollm2_gguf().name)
    return get_engine("llamacpp").build_launch(llama_settings(**overrides), model,
                                               {"threads": 2, "parallel": 1, "ctx_size": 2048}, {}, free_port())


def test_container_config_is_unprivileged_host_network_labelled(tmp_path: Path) -> None:
    spec = llama_spec(gpus="all", shm_size="1g", ipc_host=True)
    cfg = container_config(spec, tmp_path / "0007" / "server.log")
    assert cfg["network_mode"] == "host" and cfg["ipc_mode"] == "host" and cfg["shm_size"] == "1g"
    assert cfg["privileged"] is False and cfg["security_opt"] == ["no-new-privileges"] and cfg["init"] is True
    assert cfg["labels"]["flagsearch"] == "1" and cfg["labels"]["flagsearch.trial"] == "0007"
    assert cfg["volumes"]["/usr"] == {"bind": "/usr", "mode": "ro"}
    assert cfg["entrypoint"] == ["/opt/llama/bin/llama-server"] and "-m" in cfg["command"]
    (req,) = cfg["device_requests"]
    assert req["Count"] == -1 and req["Capabilities"] == [["gpu"]]
    kept = container_config(LaunchSpec("vllm", ("@entrypoint", "--model", "/m"), "127.0.0.1", 1, image="i"),
                            tmp_path / "server.log")
    assert "entrypoint" not in kept and kept["command"] == ["--model", "/m"] and kept["device_requests"] is None


# What the community images' `docker run` lines set (eugr's spark-vllm-docker: nofile 1048576; its
# unprivileged mode: IPC_LOCK, /dev/infiniband, --memory/--memory-swap, --pids-limit), scaled down.
RESOURCES = dict(ulimits=(Ulimit("nofile", 4096, 8192), Ulimit("memlock", -1, -1)), cap_add=("IPC_LOCK",),
                 devices=("/dev/null:/dev/flagsearch-null:rw",), mem_limit="256m", memswap_limit="256m",
                 pids_limit=64)


def test_resource_options_reach_the_sdk_and_the_pasteable_line(tmp_path: Path) -> None:
    spec = LaunchSpec("vllm", ("vllm", "serve", "/m"), "127.0.0.1", 8000, launcher="docker", image="i",
                      gpus="all", ipc_host=True, **RESOURCES)  # type: ignore[arg-type]
    cfg = container_config(spec, tmp_path / "server.log")
    assert [(u["Name"], u["Soft"], u["Hard"]) for u in cfg["ulimits"]] == [("nofile", 4096, 8192),
                                                                          ("memlock", -1, -1)]
    assert cfg["cap_add"] == ["IPC_LOCK"] and cfg["devices"] == ["/dev/null:/dev/flagsearch-null:rw"]
    assert (cfg["mem_limit"], cfg["memswap_limit"], cfg["pids_limit"]) == ("256m", "256m", 64)
    words = shlex.split(spec.command_line())
    for flag, value in (("--ulimit", "nofile=4096:8192"), ("--ulimit", "memlock=-1:-1"), ("--cap-add", "IPC_LOCK"),
                        ("--device", "/dev/null:/dev/flagsearch-null:rw"), ("--memory", "256m"),
                        ("--memory-swap", "256m"), ("--pids-limit", "64")):
        assert any(words[i] == flag and words[i + 1] == value for i in range(len(words) - 1)), (flag, value)
    assert words.index("--pids-limit") < words.index("i")  # docker options come before the image
    plain = container_config(LaunchSpec("e", ("x",), "127.0.0.1", 1, image="i"), tmp_path / "server.log")
    assert plain["ulimits"] is None and plain["cap_add"] is None and plain["devices"] is None


def test_a_real_container_gets_the_resource_options(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    """Started by the launcher, then read from inside: the limits are the container's own."""
    # No memlock here: this machine's dockerd may not raise it past its own limit (runc: "error setting
    # rlimit type 8: operation not permitted").
    resources = {**RESOURCES, "ulimits": (Ulimit("nofile", 4096, 8192),)}
    spec = LaunchSpec("box", ("sleep", "60"), "127.0.0.1", free_port(), launcher="docker", image=IMAGE,
                      **resources)  # type: ignore[arg-type]
    server = DockerLauncher(docker_client).start(spec, tmp_path / "0001" / "server.log")
    try:
        container = docker_client.containers.get(server.container_id)
        host = container.attrs["HostConfig"]
        assert (host["Memory"], host["MemorySwap"], host["PidsLimit"]) == (256 * 2**20, 256 * 2**20, 64)
        code, out = container.exec_run(["sh", "-c", "ulimit -n; ulimit -Hn; ls /dev/flagsearch-null; "
                                        "grep CapEff /proc/self/status"])
        lines = out.decode().split()
        assert code == 0 and lines[:3] == ["4096", "8192", "/dev/flagsearch-null"], out
        assert int(lines[-1], 16) & (1 << 14)  # CAP_IPC_LOCK is capability 14
    finally:
        server.stop(timeout_s=2)


def test_start_ready_serve_and_stop_a_real_llama_server(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    spec = llama_spec()
    server = get_launcher("docker").start(spec, tmp_path / "0001" / "server.log")
    assert isinstance(server, DockerServer)
    try:
        attrs = docker_client.containers.get(server.container_id).attrs
        assert attrs["HostConfig"]["NetworkMode"] == "host" and attrs["HostConfig"]["Privileged"] is False
        assert attrs["Config"]["Labels"]["flagsearch.trial"] == "0001"
        wait_ready(server, "/health", spec.ready_timeout_s, poll_s=0.2)
        pids = server.owned_pids()
        assert pids and all(psutil.pid_exists(p) for p in pids)
        assert any("llama-server" in " ".join(psutil.Process(p).cmdline()) for p in pids)

        async def ask() -> dict:
            async with httpx.AsyncClient(timeout=120) as http:
                resp = await http.post(spec.base_url + "/v1/chat/completions",
                                       json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
                                             "temperature": 0, "ignore_eos": True})
                resp.raise_for_status()
                return resp.json()

        body = asyncio.run(ask())
        assert body["usage"]["completion_tokens"] == 8
        info = get_engine("llamacpp").parse_startup(server.log_path.read_text())
        assert info.backends["weights"] == "CPU_Mapped" and info.phases_s["process_to_listening"] > 0
    finally:
        server.stop()
    assert server.returncode() is not None and server.owned_pids() == []
    assert all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE for p in pids)
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(server.container_id)
    assert leftover_containers(docker_client, trial="0001") == []


def test_a_killed_container_is_reported(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    spec = llama_spec()
    server = get_launcher("docker").start(spec, tmp_path / "0002" / "server.log")
    try:
        wait_ready(server, "/health", spec.ready_timeout_s, poll_s=0.2)
        assert server.returncode() is None and server.exit_reason() is None
        docker_client.containers.get(server.container_id).kill()  # what an OOM killer or a crash looks like
        docker_client.containers.get(server.container_id).wait(timeout=30)
        assert server.returncode() == 137
        assert server.exit_reason() == "killed (SIGKILL, exit 137)"
        assert server.owned_pids() == []
    finally:
        server.stop()
    assert leftover_containers(docker_client, trial="0002") == []


def test_a_server_that_exits_before_ready_is_classified(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    spec = llama_spec()
    spec = LaunchSpec(**{**spec.__dict__, "argv": (*spec.argv, "-fa", "maybe")})
    server = get_launcher("docker").start(spec, tmp_path / "0003" / "server.log")
    try:
        with pytest.raises(StartupError) as info:
            wait_ready(server, "/health", 60, poll_s=0.2)
        assert info.value.cause == "exited"
    finally:
        server.stop()
    found = get_engine("llamacpp").classify_failure(server.log_path.read_text())
    assert found is not None and found.cause == "bad_flag" and "flash-attn" in found.line


def test_missing_image_is_never_pulled(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    spec = llama_spec(image="flagsearch/not-here:0")
    with pytest.raises(StartupError) as info:
        DockerLauncher(docker_client).start(spec, tmp_path / "0004" / "server.log")
    assert info.value.cause == "image_not_found" and "docker pull" in info.value.detail
    assert leftover_containers(docker_client, trial="0004") == []


def test_gpu_request_on_a_daemon_without_gpus_fails_cleanly(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    spec = llama_spec(gpus="all")
    with pytest.raises(StartupError) as info:
        DockerLauncher(docker_client).start(spec, tmp_path / "0005" / "server.log")
    assert info.value.cause == "gpu_unavailable"
    assert leftover_containers(docker_client, trial="0005") == []  # the Created container was removed


def test_a_search_trial_through_the_docker_launcher(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    """The study's whole path with `launcher: docker`: start, ready, measure, store, stop."""
    from search.space.space import parse_space
    from search.store.summary import load_view
    from search.study.study import StudyRunner, default_storage

    model_dir = flagsearch_home.smollm2_gguf().parent
    space = parse_space({
        "name": "docker-llamacpp",
        "engines": {"llamacpp": {
            "dialect": "llamacpp", "launcher": "docker", "image": IMAGE,
            "command": ["/opt/llama/bin/llama-server"],
            "volumes": [{"host": "/usr", "container": "/usr", "read_only": True},
                        {"host": str(flagsearch_home.llama_server().parent), "container": "/opt/llama/bin",
                         "read_only": True},
                        {"host": str(model_dir), "container": "/models", "read_only": True}],
            "args": {"ctx_size": 2048, "parallel": 1, "threads": 1}, "ready_timeout_s": 120}},
        "models": [{"name": "smollm2", "path": "/models/" + flagsearch_home.smollm2_gguf().name}],
        "measure": {"repeats": 1, "warmup": False, "request_timeout_s": 300},
        "workloads": [{"name": "short", "streams": ["qa"], "max_tokens": 8}],
        "quality": {"suite": None},
        "objectives": [{"metric": "short.output_tok_s"}],
    }, "docker-space")
    results = tmp_path / "results"

    StudyRunner(space, default_storage(results), "docker", results, Quiet()).run(n_trials=1)
    (record,) = load_view(StudyRunner(space, default_storage(results), "docker", results, Quiet()).study).records
    assert record.state == "complete", record.failure
    assert record.command.startswith("docker run --rm --network host") and ":/models:ro" in record.command
    assert record.metrics["short.output_tok_s"] > 0 and record.metrics["errors"] == 0
    assert record.startup["backends"]["weights"] == "CPU_Mapped"
    # This worker's containers only: another test worker may be running a trial 0000 of its own.
    assert leftover_containers(docker_client, trial="0000", owner_pid=str(os.getpid())) == []


def test_orphans_of_a_dead_flagsearch_are_reaped(docker_client: docker.DockerClient) -> None:
    """A container left by a SIGKILLed flagsearch (its owner PID is gone) is removed; ours is not."""
    import subprocess

    from harness.launch.docker import reap_orphans

    # The orphan's owner lives until just before the reap: another worker's launcher reaps orphans
    # when it starts. Should it still reach this orphan first (a fresh-clone run met that race twice),
    # the orphan is gone all the same, which is what is asserted.
    owner = subprocess.Popen(["sleep", "300"])
    orphan = docker_client.containers.run(IMAGE, ["/bin/sleep", "300"], detach=True, init=True, network_mode="host",
                                   labels={"flagsearch": "1", "flagsearch.owner_pid": str(owner.pid),
                                           "flagsearch.trial": "orphan"})
    alive = docker_client.containers.run(IMAGE, ["/bin/sleep", "300"], detach=True, init=True, network_mode="host",
                                  labels={"flagsearch": "1", "flagsearch.owner_pid": str(os.getpid()),
                                          "flagsearch.trial": "alive"})
    try:
        owner.kill()
        owner.wait()
        assert not psutil.pid_exists(owner.pid)
        removed = reap_orphans(docker_client)
        assert alive.name not in removed
        assert _gone(docker_client, trial="orphan")
        assert len(leftover_containers(docker_client, trial="alive")) == 1
    finally:
        owner.kill()
        for c in (orphan, alive):
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                c.remove(force=True)


def _gone(client: docker.DockerClient, trial: str, timeout_s: float = 20.0) -> bool:
    """Whether the trial's containers are gone within the timeout (a concurrent removal finishes)."""
    import time

    deadline = time.monotonic() + timeout_s
    while leftover_containers(client, trial=trial):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_sigterm_of_flagsearch_removes_its_containers(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    """flagsearch gets SIGTERM while a container serves: the registry stops and removes it."""
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "hold.py"
    script.write_text(f"""
import sys, time
from pathlib import Path
from harness.launch import get_launcher
from harness.launch.reaper import install_signal_handlers
from tests.harness.test_docker_launcher import llama_spec
install_signal_handlers()
server = get_launcher("docker").start(llama_spec(), Path({str(tmp_path)!r}) / "sig" / "server.log")
print(server.container_id, flush=True)
try:
    while True:
        time.sleep(0.2)
finally:
    server.stop()
""")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        container_id = (proc.stdout.readline() if proc.stdout else "").strip()
        assert container_id, "the child did not start a container"
        assert docker_client.containers.get(container_id).status in ("created", "running")
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(container_id)
    assert leftover_containers(docker_client, trial="sig") == []


def test_an_oom_killed_container_is_classified_as_oom(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    """A real OOM kill: a container under a 16 MB memory limit reads /dev/zero into memory. Docker's
    State.OOMKilled reaches the cause the session records ("oom"), not "server exited with status 137"."""
    from harness.engines import StartupInfo
    from harness.session import RunningConfig

    spec = llama_spec()
    log_path = tmp_path / "0009" / "server.log"
    log_path.parent.mkdir(parents=True)
    log_path.write_text("")
    container = docker_client.containers.run(
        IMAGE, ["/usr/bin/tail", "/dev/zero"], detach=True, mem_limit="16m", memswap_limit="16m",
        volumes={p: {"bind": p, "mode": "ro"} for p in ("/usr", "/lib", "/lib64") if Path(p).is_dir()},
        labels={"flagsearch": "1", "flagsearch.trial": "0009", "flagsearch.owner_pid": str(os.getpid())})
    server = DockerServer(spec, log_path, container)
    try:
        container.wait(timeout=60)
        assert server.returncode() == 137
        memory = server.killed_for_memory()
        assert memory is not None and "OOMKilled" in memory, server.exit_reason()
        cause, detail = RunningConfig(get_engine("llamacpp"), spec, server, 0.0, StartupInfo()).crash_cause()
        assert cause == "oom" and "OOMKilled" in detail and "status 137" in detail, detail
    finally:
        server.stop()
    assert leftover_containers(docker_client, trial="0009") == []


class SocketProxy:
    """A unix-socket proxy in front of the Docker daemon's socket; kill() drops it and every
    connection through it, which to its clients is the daemon gone (fault injection only)."""

    def __init__(self, target: str, path: Path):
        import socket
        import threading

        self.target, self.path = target, path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(16)
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.target)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: object, b: object) -> None:
        import socket

        assert isinstance(a, socket.socket) and isinstance(b, socket.socket)
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)

    def kill(self) -> None:
        import socket

        self.listener.close()
        self.path.unlink(missing_ok=True)
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


def test_a_lost_daemon_mid_trial_is_a_typed_failure_with_the_record_kept(
        docker_client: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Docker daemon stops answering while a trial measures (the tool reaches it through a proxy
    that is dropped): the trial is failed as docker_daemon_lost with its record and command kept, the
    next trial's start fails the same way in one line, and the search ends normally, no traceback."""
    import harness.launch.docker as docker_launch
    from search.space.space import parse_space
    from search.store.summary import load_view
    from search.study.study import StudyRunner, default_storage

    base = docker_client.api.base_url
    real_socket = (os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock").removeprefix("unix://")
    assert base.startswith("http+docker://") and Path(real_socket).is_socket()
    proxy = SocketProxy(real_socket, tmp_path / "docker.sock")
    monkeypatch.setattr(docker_launch, "client_from_env",
                        lambda: docker.DockerClient(base_url=f"unix://{proxy.path}", timeout=10))
    model_dir = flagsearch_home.smollm2_gguf().parent
    space = parse_space({
        "name": "docker-lost",
        "engines": {"llamacpp": {
            "dialect": "llamacpp", "launcher": "docker", "image": IMAGE, "command": ["/opt/llama/bin/llama-server"],
            "volumes": [{"host": "/usr", "container": "/usr", "read_only": True},
                        {"host": str(flagsearch_home.llama_server().parent), "container": "/opt/llama/bin",
                         "read_only": True},
                        {"host": str(model_dir), "container": "/models", "read_only": True}],
            "args": {"ctx_size": 512, "parallel": 1, "threads": 1}, "ready_timeout_s": 120}},
        "models": [{"name": "smollm2", "path": "/models/" + flagsearch_home.smollm2_gguf().name}],
        "params": {"batch_size": {"type": "categorical", "choices": [2048, 512], "default": 2048}},
        "measure": {"repeats": 1, "warmup": False, "request_timeout_s": 120},
        "workloads": [{"name": "short", "streams": ["qa"], "max_tokens": 8}],
        "quality": {"suite": None},
        "objectives": [{"metric": "short.output_tok_s"}],
    }, "docker-space")

    class DropAtMeasuring(Quiet):
        def phase(self, text: str) -> None:
            if "measuring" in text and proxy.path.exists():
                proxy.kill()

    results = tmp_path / "results"
    runner = StudyRunner(space, default_storage(results), "lost", results, DropAtMeasuring())
    runner.study.enqueue_trial({"batch_size": 512})
    try:
        runner.run(n_trials=2)
        records = {r.number: r for r in load_view(runner.study).records}
    finally:
        for container in leftover_containers(docker_client, owner_pid=str(os.getpid())):
            container.remove(force=True)  # the dropped daemon could not remove it
    lost, after = records[0], records[1]
    assert lost.state == "failed" and lost.failure is not None and lost.failure.cause == "docker_daemon_lost"
    assert "stopped answering" in lost.failure.detail and lost.command.startswith("docker run")
    assert after.state == "failed" and after.failure is not None and after.failure.cause == "docker_daemon_lost"
