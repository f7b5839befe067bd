"""Pinning a server to CPUs (the engine option `cpus`): parsing, the spec, both launchers, the
fingerprint, and one real llama-server whose every thread runs on the CPU it was pinned to."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from harness import flagsearch_home
from harness.engines import get_engine
from harness.host.fingerprint import MATERIAL, fingerprint, material_differences
from harness.launch.base import StartupError, wait_ready
from harness.launch.cpus import check_cpus, format_cpu_list, machine_cpus, parse_cpu_list
from harness.launch.docker import container_config
from harness.launch.process import ProcessLauncher
from harness.launch.spec import LaunchSpec
from harness.session import free_port
from search.space.schema import SpaceError
from search.space.space import parse_space
from tests.conftest import llama_settings, llama_space_doc, smollm2_gguf


def spec(cpus: str | None, **kw: object) -> LaunchSpec:
    return LaunchSpec("llamacpp", ("/bin/llama-server", "-m", "/m.gguf"), "127.0.0.1", 8080, cpus=cpus, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "cpus"), [
    ("2-9", set(range(2, 10))), ("0", {0}), ("0,2,4-6", {0, 2, 4, 5, 6}), (" 3 , 1-2 ", {1, 2, 3}), ("5-5", {5}),
])
def test_cpu_lists_parse_as_taskset_writes_them(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["", ",", "a", "2-", "-2", "9-2", "1.5", "0x3", "2-9:2", "99999999"])
def test_malformed_cpu_lists_are_refused_with_a_reason(text: str) -> None:
    with pytest.raises(ValueError, match="cpu"):
        parse_cpu_list(text)


def test_the_canonical_form_is_short_ranges() -> None:
    assert format_cpu_list({2, 3, 4, 7, 9, 10}) == "2-4,7,9-10"
    assert format_cpu_list(parse_cpu_list("9,8,7,2")) == "2,7-9"


def test_cpus_the_machine_lacks_are_a_bad_spec_before_the_start() -> None:
    assert check_cpus("e", "1-2", available={0, 1, 2, 3}) == {1, 2}
    with pytest.raises(StartupError) as info:
        check_cpus("e", "2-9", available={0, 1, 2, 3})
    assert info.value.cause == "bad_spec" and "4-9" in info.value.detail and "0-3" in info.value.detail
    with pytest.raises(StartupError, match="bad_spec: engine 'e': cpus: "):
        check_cpus("e", "two", available={0})
    assert machine_cpus() >= os.sched_getaffinity(0)  # the online CPUs include ours


def test_the_space_takes_cpus_and_refuses_a_malformed_list() -> None:
    doc = llama_space_doc()
    doc["engines"]["llamacpp"]["cpus"] = 1  # YAML `cpus: 1` is an int
    assert parse_space(doc).engine_settings("llamacpp").cpus == "1"
    doc["engines"]["llamacpp"]["cpus"] = "3-1"
    with pytest.raises(SpaceError, match=r"engines\.llamacpp\.cpus.*runs backwards"):
        parse_space(doc)


def test_the_engine_passes_cpus_to_the_launch_and_the_command_shows_it() -> None:
    launch = get_engine("llamacpp").build_launch(llama_settings(cpus="0"), smollm2_gguf(), {}, {}, 8080)
    assert launch.cpus == "0"
    assert launch.command_line().startswith("taskset -c 0 ")
    assert not spec(None).command_line().startswith("taskset")


def test_docker_gets_the_cpuset() -> None:
    docker_spec = spec("2-9", launcher="docker", image="img")
    assert container_config(docker_spec, Path("/tmp/x/0001/server.log"))["cpuset_cpus"] == "2-9"
    assert container_config(spec(None, launcher="docker", image="img"),
                            Path("/tmp/x/0001/server.log"))["cpuset_cpus"] is None
    argv = docker_spec.docker_run_argv()
    assert argv[argv.index("--cpuset-cpus") + 1] == "2-9"


def test_the_fingerprint_records_pinning_as_material() -> None:
    assert "cpus" in MATERIAL
    pinned = fingerprint(spec("9,2-8"), "/nowhere", engine_python=None)
    free = fingerprint(spec(None), "/nowhere", engine_python=None)
    assert pinned["cpus"] == "2-9" and free["cpus"] is None
    assert material_differences(free, pinned) == ["cpus: None != '2-9'"]


def test_a_pinned_process_runs_only_on_its_cpus(tmp_path: Path) -> None:
    cpu = max(os.sched_getaffinity(0))
    pinned = LaunchSpec("t", ("sleep", "30"), "127.0.0.1", free_port(), cpus=str(cpu))
    server = ProcessLauncher().start(pinned, tmp_path / "server.log")
    try:
        assert os.sched_getaffinity(server.pid) == {cpu}
    finally:
        server.stop()


def test_a_pinned_throttled_server_keeps_its_cpu_and_the_relay_moves_to_another(tmp_path: Path) -> None:
    """harness/launch/throttle.py pinned like a server (the launcher pins the wrapper, the child inherits it) with
    `--relay-cpus`: the wrapper's threads (the relay, the duty cycle) leave the server's CPU once the child runs,
    and the child keeps it. Without the option the relay's cost lands on the server's core."""
    server_cpu, relay_cpu = max(os.sched_getaffinity(0)), min(os.sched_getaffinity(0))
    command = (sys.executable, "-m", "harness.launch.throttle", "0.05", "--relay-cpus", str(relay_cpu), "--",
               "sleep", "30")
    wrapper = ProcessLauncher().start(LaunchSpec("t", command, "127.0.0.1", free_port(), cpus=str(server_cpu)),
                                      tmp_path / "server.log")
    try:
        children = Path(f"/proc/{wrapper.pid}/task/{wrapper.pid}/children")
        deadline = time.monotonic() + 30
        while not children.read_text().split() and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(children.read_text().split()[0])
        time.sleep(0.2)  # the wrapper sets its CPUs right after the child started
        threads = [int(t.name) for t in Path(f"/proc/{wrapper.pid}/task").iterdir()]
        assert len(threads) > 1  # the main thread and the duty cycle's
        assert {t: os.sched_getaffinity(t) for t in threads} == {t: {relay_cpu} for t in threads}
        assert os.sched_getaffinity(child) == {server_cpu}
    finally:
        wrapper.stop()


def test_a_cpu_list_this_machine_lacks_starts_nothing(tmp_path: Path) -> None:
    beyond = max(machine_cpus()) + 1
    with pytest.raises(StartupError) as info:
        ProcessLauncher().start(LaunchSpec("t", ("sleep", "30"), "127.0.0.1", free_port(), cpus=f"0,{beyond}"),
                                tmp_path / "server.log")
    assert info.value.cause == "bad_spec" and str(beyond) in info.value.detail
    assert not (tmp_path / "server.log").exists()  # refused before the start


@pytest.mark.e2e
def test_every_thread_of_a_real_llama_server_runs_on_its_cpu(tmp_path: Path) -> None:
    assert flagsearch_home.llama_server().exists()
    cpu = max(os.sched_getaffinity(0))
    engine = get_engine("llamacpp")
    launch = engine.build_launch(llama_settings(cpus=str(cpu)), smollm2_gguf(),
                                 {"ctx_size": 2048, "threads": 2, "alias": "smollm2"}, {}, free_port())
    server = ProcessLauncher().start(launch, tmp_path / "server.log")
    try:
        wait_ready(server, engine.ready_path, launch.ready_timeout_s)
        threads = list(Path(f"/proc/{server.pid}/task").iterdir())
        assert len(threads) > 1  # llama-server's HTTP and compute threads, all inherited the mask
        assert {t.name: os.sched_getaffinity(int(t.name)) for t in threads} == {t.name: {cpu} for t in threads}
    finally:
        server.stop()
