"""Fault injection below the search: the client against a fault-injecting server, and the process
launcher against real engines (llama-server, and vLLM for the faults that are vLLM's own).

Every test checks the three promises: the fault is reported with the right cause (and the last
log lines), the caller can go on, and no process we started is left running (checked from the OS).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from harness import flagsearch_home
from harness.engines import get_engine
from harness.launch import LaunchSpec, StartupError, get_launcher, reaper, wait_ready
from harness.launch.process import ProcessServer
from harness.measure.client import ERROR_BODY_LIMIT, RequestResult, stream_chat
from search.study.study import free_port
from tests.conftest import smollm2_gguf, smollm2_hf, vllm_settings
from tests.fault_server import OUTCOMES, record_outcome, show_table

FAULT_SERVER = (Path(__file__).resolve().parents[1] / "fault_server.py")
ROOT = Path(__file__).resolve().parents[2]
PAYLOAD = {"model": "fault-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


# ---- helpers --------------------------------------------------------------------------------------
def assert_gone(server: ProcessServer) -> str:
    """Nothing of the server is left: its group, its descendants, anything carrying its tag."""
    left = server.owned_pids()
    tagged = [proc.pid for proc, _, sid in reaper.tagged_processes() if sid == server.server_id]
    assert not left and not tagged, f"processes left running: {left + tagged}"
    assert server not in reaper.running()
    return "0"


def start_fault_server(tmp: Path, *extra: str, ready_timeout_s: float = 30.0) -> ProcessServer:
    port = free_port()
    spec = LaunchSpec(engine="fault", argv=(sys.executable, str(FAULT_SERVER), "--port", str(port), *extra),
                      host="127.0.0.1", port=port, ready_timeout_s=ready_timeout_s)
    server = get_launcher("process").start(spec, tmp / f"fault-{port}.log")
    assert isinstance(server, ProcessServer)
    return server


def llama_spec(port: int, *flags: str, model: str | None = None) -> LaunchSpec:
    binary = flagsearch_home.llama_server()
    if not binary.exists():
        pytest.fail(f"llama-server is missing at {binary}: run `make setup` first", pytrace=False)
    model_path = model or smollm2_gguf().path
    return LaunchSpec(engine="llamacpp", argv=(str(binary), "-m", model_path, "--host", "127.0.0.1", "--port",
                                               str(port), "-c", "2048", "-np", "2", "-t", "1", *flags),
                      host="127.0.0.1", port=port, ready_timeout_s=60.0)


def start_llama(tmp: Path, *flags: str, model: str | None = None, wait: bool = True) -> ProcessServer:
    port = free_port()
    server = get_launcher("process").start(llama_spec(port, *flags, model=model), tmp / f"llama-{port}.log")
    assert isinstance(server, ProcessServer)
    if wait:
        try:
            wait_ready(server, "/health", 60.0)
        except BaseException:
            server.stop()
            raise
    return server


def llama_payload(max_tokens: int = 64) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "Count from 1 to 100."}],
            "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module", autouse=True)
def print_fault_table(request: pytest.FixtureRequest) -> Iterator[None]:
    first = len(OUTCOMES)
    yield
    rows = OUTCOMES[first:]
    if rows:
        show_table(request, Path(__file__).name, rows)


@pytest.fixture(scope="module")
def fault_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessServer]:
    server = start_fault_server(tmp_path_factory.mktemp("fault"))
    try:
        wait_ready(server, "/health", 30.0)
        yield server
    finally:
        server.stop()
    assert_gone(server)


def chat(base_url: str, timeout_s: float = 10.0, payload: dict[str, object] | None = None) -> RequestResult:
    async def go() -> RequestResult:
        async with httpx.AsyncClient() as client:
            return await stream_chat(client, base_url, payload or PAYLOAD, "fault", timeout_s)

    # The outer bound turns a client that hangs into a test failure instead of a hung suite.
    return asyncio.run(asyncio.wait_for(go(), timeout_s + 30.0))


# ---- the client against the fault server ------------------------------------------------------------
def test_well_formed_stream_is_ok(fault_server: ProcessServer) -> None:
    r = chat(fault_server.spec.base_url + "/f/ok:5")
    assert r.ok and r.error_kind is None
    assert r.output_tokens == 5 and r.finish_reason == "length"


@pytest.mark.parametrize("status", [500, 429])
def test_http_error_burst_counts_each_request(fault_server: ProcessServer, status: int) -> None:
    httpx.post(fault_server.spec.base_url + "/reset", timeout=5)
    base = f"{fault_server.spec.base_url}/f/http{status}:3"
    results = [chat(base) for _ in range(5)]
    kinds = [r.error_kind for r in results]
    assert kinds == [f"http_{status}"] * 3 + [None, None], kinds
    assert all(f"injected {status}" in (r.error_body or "") for r in results[:3])
    record_outcome(f"HTTP {status} burst", f"first 3 of 5 requests answer {status}", "fault server",
                   f"http_{status} x3, then ok x2", "each request counted")


@pytest.mark.parametrize("fault, kind", [("cut", "incomplete_stream"), ("reset", "incomplete_stream"),
                                         ("malformed", "malformed"), ("stream_error", "stream_error")])
def test_broken_streams_are_errors(fault_server: ProcessServer, fault: str, kind: str) -> None:
    r = chat(f"{fault_server.spec.base_url}/f/{fault}")
    assert not r.ok
    assert r.error_kind == kind, (r.error_kind, r.error_body)
    assert r.error_body
    how = {"cut": "body ends before finish_reason/usage/[DONE]", "reset": "connection dropped mid-chunk",
           "malformed": "a data: line that is not JSON", "stream_error": "an error event mid-stream"}[fault]
    record_outcome(f"stream {fault}", how, "fault server", kind, "request counted as error")


def test_huge_error_body_is_bounded(fault_server: ProcessServer) -> None:
    r = chat(f"{fault_server.spec.base_url}/f/huge500:16", timeout_s=60)
    assert r.error_kind == "http_500"
    assert r.error_body is not None and len(r.error_body) <= ERROR_BODY_LIMIT
    record_outcome("huge error body", "HTTP 500 with a 16 MB body", "fault server", "http_500",
                   f"kept {len(r.error_body)} chars")


def test_huge_streamed_answer_is_counted_from_usage(fault_server: ProcessServer) -> None:
    r = chat(f"{fault_server.spec.base_url}/f/huge:16", timeout_s=60)
    assert r.ok, r.error_body
    assert r.output_tokens == 1  # from usage, not from 16 MB of characters
    assert len(r.text) == 16 * 1024 * 1024
    record_outcome("huge answer", "one 16 MB content chunk", "fault server", "ok (tokens from usage)",
                   "not a crash, not miscounted")


def test_slow_loris_first_token_times_out(fault_server: ProcessServer) -> None:
    """Bytes keep flowing (SSE comments) but no token ever comes: only a whole-request deadline ends
    it; a per-read timeout would wait forever."""
    start = time.monotonic()
    r = chat(f"{fault_server.spec.base_url}/f/slowloris", timeout_s=2.0)
    took = time.monotonic() - start
    assert r.error_kind == "timeout", (r.error_kind, r.error_body)
    assert took < 10.0, f"the 2 s request deadline held only after {took:.1f} s"
    record_outcome("slow-loris first token", "keep-alive comments every 0.2 s, no token", "fault server",
                   "timeout", f"ended after {took:.1f} s (deadline 2 s)")


def test_hanging_answer_times_out(fault_server: ProcessServer) -> None:
    r = chat(f"{fault_server.spec.base_url}/f/hang", timeout_s=2.0)
    assert r.error_kind == "timeout"


def test_never_ready_is_a_timeout_and_stops(tmp_path: Path) -> None:
    server = start_fault_server(tmp_path, "--never-ready")
    start = time.monotonic()
    with pytest.raises(StartupError) as info:
        wait_ready(server, "/health", 3.0)
    took = time.monotonic() - start
    assert info.value.cause == "timeout"
    assert any("503" in line for line in info.value.log_tail), info.value.log_tail
    server.stop()
    leaked = assert_gone(server)
    record_outcome("never ready", "/health answers 503 forever", "fault server", "timeout (+ log tail)",
                   f"start given up after {took:.1f} s (limit 3 s), server stopped", leaked)


# ---- the launcher against real engines ---------------------------------------------------------------
@pytest.mark.e2e
def test_engine_sigkilled_mid_measurement(tmp_path: Path) -> None:
    server = start_llama(tmp_path)
    base = server.spec.base_url

    async def go() -> list[RequestResult]:
        async with httpx.AsyncClient() as client:
            tasks = [asyncio.create_task(stream_chat(client, base, llama_payload(2000), "kill", 60.0))
                     for _ in range(2)]
            await asyncio.sleep(1.5)  # mid-generation
            os.kill(server.pid, signal.SIGKILL)
            return await asyncio.gather(*tasks)

    results = asyncio.run(asyncio.wait_for(go(), 90))
    assert all(not r.ok for r in results)
    kinds = {r.error_kind for r in results}
    assert kinds <= {"incomplete_stream", "connect"}, kinds
    deadline = time.monotonic() + 5.0  # the sockets close as it dies; being reaped comes a moment later
    while server.returncode() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.returncode() == -signal.SIGKILL
    server.stop()
    leaked = assert_gone(server)
    record_outcome("engine SIGKILL mid-measurement", "kill -9 during 2 streaming requests", "llama-server",
                   ", ".join(sorted(kinds)), "requests counted as errors; exit status -9 seen", leaked)


@pytest.mark.e2e
def test_engine_frozen_requests_time_out_and_stop_still_works(tmp_path: Path) -> None:
    server = start_llama(tmp_path)
    base = server.spec.base_url
    os.kill(server.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        r = chat(base, timeout_s=3.0, payload=llama_payload(16))
        took = time.monotonic() - start
        assert r.error_kind == "timeout", (r.error_kind, r.error_body)
        assert took < 15
        with pytest.raises(StartupError) as info:
            wait_ready(server, "/health", 2.0)
        assert info.value.cause == "timeout"
    finally:
        t0 = time.monotonic()
        server.stop(timeout_s=10.0)
        stop_s = time.monotonic() - t0
    leaked = assert_gone(server)
    # SIGCONT after SIGTERM lets a frozen server act on SIGTERM at once, without the SIGKILL wait.
    assert stop_s < 5.0, f"stopping a frozen server took {stop_s:.1f} s"
    record_outcome("engine frozen (SIGSTOP)", "SIGSTOP the server, then send requests", "llama-server",
                   "timeout (client) / timeout (ready poll)", f"request ended after {took:.1f} s; stopped in "
                   f"{stop_s:.1f} s", leaked)


@pytest.mark.e2e
def test_engine_never_ready_real(tmp_path: Path) -> None:
    """A real engine that never becomes ready: llama-server blocked opening its model (a FIFO)."""
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    server = start_llama(tmp_path, model=str(fifo), wait=False)
    with pytest.raises(StartupError) as info:
        wait_ready(server, "/health", 3.0)
    assert info.value.cause == "timeout"
    server.stop(timeout_s=5.0)
    leaked = assert_gone(server)
    record_outcome("engine never ready", "llama-server's model is a FIFO nobody writes", "llama-server",
                   "timeout", "start given up at the ready deadline, server stopped", leaked)


@pytest.mark.e2e
def test_engine_exits_at_once_on_a_bad_flag(tmp_path: Path) -> None:
    server = start_llama(tmp_path, "--no-such-flag", wait=False)
    with pytest.raises(StartupError) as info:
        wait_ready(server, "/health", 30.0)
    assert info.value.cause == "exited"
    assert info.value.log_tail, "the last log lines must come with the failure"
    found = get_engine("llamacpp").classify_failure("\n".join(info.value.log_tail))
    assert found is not None and found.cause == "bad_flag", info.value.log_tail
    server.stop()
    leaked = assert_gone(server)
    record_outcome("engine exits at once", "--no-such-flag", "llama-server", f"exited -> {found.cause}",
                   f"log tail: {found.line[:60]}", leaked)


@pytest.mark.e2e
def test_port_already_taken(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(StartupError) as info:
            get_launcher("process").start(llama_spec(port), tmp_path / "taken.log")
        assert info.value.cause == "port_in_use"
        assert str(port) in info.value.detail
        # And when the engine itself meets the taken port (a race after our check): its own log says so.
        spec = llama_spec(port)
        with (tmp_path / "race.log").open("wb") as log:
            proc = subprocess.Popen(list(spec.argv), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        server = ProcessServer(spec, tmp_path / "race.log", proc, "race")
        with pytest.raises(StartupError) as race:
            wait_ready(server, "/health", 30.0)
        server.stop()
        found = get_engine("llamacpp").classify_failure("\n".join(race.value.log_tail))
        assert found is not None and found.cause == "port_in_use", race.value.log_tail
    record_outcome("port already taken", "a socket listens on the port first", "llama-server",
                   "port_in_use (checked before start; engine log agrees)", "nothing started", "0")


@pytest.mark.e2e
def test_llama_oom_at_start(tmp_path: Path) -> None:
    """Out of memory at start, the llama.cpp way: a KV cache (1M tokens, ~23 GB) that cannot be allocated.

    Bounded by an address-space limit (prlimit) and `--fit off`: without them this llama.cpp keeps
    probing and grows to many GB before giving up, which a shared machine must not suffer."""
    port = free_port()
    base = llama_spec(port, "-c", "1000000", "--fit", "off")
    spec = LaunchSpec(engine=base.engine, argv=("prlimit", "--as=2000000000", *base.argv), host=base.host,
                      port=port)
    server = get_launcher("process").start(spec, tmp_path / "oom.log")
    assert isinstance(server, ProcessServer)
    start = time.monotonic()
    with pytest.raises(StartupError) as info:
        wait_ready(server, "/health", 60.0)
    took = time.monotonic() - start
    server.stop()
    leaked = assert_gone(server)
    found = get_engine("llamacpp").classify_failure("\n".join(info.value.log_tail))
    assert info.value.cause == "exited"
    assert found is not None and found.cause == "oom", info.value.log_tail
    record_outcome("OOM at start (llama.cpp)", "-c 1000000 under a 2 GB address-space limit", "llama-server",
                   f"exited -> {found.cause}", f"failed in {took:.1f} s: {found.line[-50:]}", leaked)


def _vllm_fails(tmp_path: Path, flags: dict[str, object], env: dict[str, str]) -> tuple[str, str, float, str]:
    engine = get_engine("vllm")
    flags = {"max_model_len": 2048, "enforce_eager": True, **flags}
    spec = engine.build_launch(vllm_settings(), smollm2_hf(), flags, env, free_port())
    server = get_launcher("process").start(spec, tmp_path / "vllm.log")
    start = time.monotonic()
    try:
        with pytest.raises(StartupError) as info:
            wait_ready(server, engine.ready_path, 300.0)
    finally:
        server.stop()
    took = time.monotonic() - start
    leaked = assert_gone(server)
    found = engine.classify_failure((tmp_path / "vllm.log").read_text(errors="replace"))
    # "exited" normally (14-25 s); on a heavily loaded machine vLLM can still be tearing down its
    # workers at the deadline: then "timeout", and the log must still say why.
    assert info.value.cause in ("exited", "timeout"), info.value
    assert info.value.log_tail
    assert found is not None
    return f"{info.value.cause} -> {found.cause}", found.line, took, leaked


def _memory_for_vllm() -> None:
    if psutil.virtual_memory().available < 5 * 2**30:
        pytest.fail("less than 5 GiB of memory available: a vLLM server needs ~4 GiB", pytrace=False)


@pytest.mark.e2e
def test_vllm_oom_at_start(tmp_path: Path) -> None:
    _memory_for_vllm()
    cause, line, took, leaked = _vllm_fails(tmp_path, {}, {"VLLM_CPU_KVCACHE_SPACE": "64"})
    assert cause.endswith("-> oom"), line
    record_outcome("OOM at start (vLLM)", "VLLM_CPU_KVCACHE_SPACE=64 (GiB) on a 24 GiB machine", "vLLM-CPU",
                   cause, f"failed in {took:.0f} s: {line[:70]}", leaked)


@pytest.mark.e2e
def test_vllm_max_model_len_too_large(tmp_path: Path) -> None:
    _memory_for_vllm()
    cause, line, took, leaked = _vllm_fails(tmp_path, {"max_model_len": 100000}, {})
    assert cause.endswith("-> max_model_len"), line
    record_outcome("context too long (vLLM)", "--max-model-len 100000 (model: 8192)", "vLLM-CPU",
                   cause, f"failed in {took:.0f} s", leaked)


# ---- the tool itself dies: nothing of ours may outlive it ---------------------------------------------
_STARTER = """
import sys, time
from pathlib import Path
from harness.launch import LaunchSpec, get_launcher, wait_ready
import threading
spec = LaunchSpec(engine="llamacpp", argv=tuple(sys.argv[3:]), host="127.0.0.1", port=int(sys.argv[2]))
started = []
start = lambda: started.append(get_launcher("process").start(spec, Path(sys.argv[2] + ".log")))
if sys.argv[1] == "thread":  # no parent-death signal from a thread: only the watchdog is left
    t = threading.Thread(target=start)
    t.start()
    t.join()
else:
    start()
server = started[0]
wait_ready(server, "/health", 60)
print(server.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.e2e
@pytest.mark.parametrize("started_from", ["main", "thread"])
def test_tool_sigkilled_its_server_is_stopped(tmp_path: Path, started_from: str) -> None:
    port = free_port()
    spec = llama_spec(port)
    tool = subprocess.Popen([sys.executable, "-c", _STARTER, started_from, str(port), *spec.argv], cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert tool.stdout is not None
        server_pid = int(tool.stdout.readline())
        requests = threading.Thread(target=chat, args=(spec.base_url, 30.0, llama_payload(400)), daemon=True)
        requests.start()  # a request in flight: llama-server's graceful shutdown then hangs
        time.sleep(1.0)
        tool.kill()
        tool.wait(10)
        start = time.monotonic()
        while psutil.pid_exists(server_pid) and time.monotonic() - start < 15:
            with contextlib.suppress(psutil.Error):
                if psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE:
                    break
            time.sleep(0.1)
        took = time.monotonic() - start
        alive = psutil.pid_exists(server_pid) and psutil.Process(server_pid).status() != psutil.STATUS_ZOMBIE
    finally:
        tool.kill()
    if alive:
        os.kill(server_pid, signal.SIGKILL)
    assert not alive, "the server outlived the SIGKILLed tool by 15 s"
    assert not [p for p, owner, _ in reaper.tagged_processes() if owner.startswith(f"{tool.pid}:")]
    how = "parent-death signal, watchdog as backstop" if started_from == "main" else "watchdog alone"
    where = "the main thread" if started_from == "main" else "a worker thread"
    record_outcome(f"tool SIGKILLed (server started from {where})", "kill -9 the process that started the "
                   "server, request in flight", "llama-server", "owner gone", f"server stopped in {took:.1f} s "
                   f"({how})", "0")


def test_orphans_of_a_dead_tool_are_reaped() -> None:
    """A server whose owner is gone (tag in its environment, owner PID dead) is stopped on the next start."""
    dead_owner = f"{2**22 - 1}:1.000"
    orphan = subprocess.Popen(["sleep", "120"], start_new_session=True,
                              env={**os.environ, reaper.OWNER_ENV: dead_owner, reaper.SERVER_ENV: "orphan"})
    mine = subprocess.Popen(["sleep", "120"], start_new_session=True,
                            env={**os.environ, reaper.OWNER_ENV: reaper.owner_tag(), reaper.SERVER_ENV: "mine"})
    try:
        reaped = reaper.reap_orphans(grace_s=2.0)
        assert orphan.pid in reaped
        assert orphan.wait(5) is not None
        assert mine.poll() is None, "a server whose owner is alive must not be touched"
        assert mine.pid not in reaped
    finally:
        for proc in (orphan, mine):
            proc.kill()
            proc.wait()
    record_outcome("orphan of a dead tool", "a tagged process whose owner PID is gone", "sleep",
                   "reaped on next start", "live owners' servers untouched", "0")
