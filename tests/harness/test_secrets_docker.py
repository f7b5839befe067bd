"""Secrets in a container's log: scrubbed as the log is streamed, not only when it stops; and the
API key the containerised server demands is sent by the tool's clients. A REAL Docker engine
(scripts/dockerd.sh) runs the real llama-server binary in the local busybox image."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from harness import flagsearch_home, secrets
from harness.engines import EngineSettings, ModelChoice, get_engine
from harness.launch import Volume, get_launcher, wait_ready
from harness.measure.client import server_client
from search.study.study import free_port
from tests.conftest import TEST_IMAGE

pytestmark = pytest.mark.docker
IMAGE = TEST_IMAGE
API_KEY = "sk-docker-literal-77e3f0a1"


@pytest.mark.usefixtures("docker_client")  # the session's engine, with the image (DOCKER_HOST set)
def test_container_log_is_scrubbed_while_it_runs_and_the_key_is_sent(tmp_path: Path) -> None:
    binary, model = flagsearch_home.llama_server(), flagsearch_home.smollm2_gguf()
    settings = EngineSettings(
        name="llamacpp", dialect="llamacpp", command=("/opt/llama/bin/llama-server",), launcher="docker",
        image=IMAGE, ready_timeout_s=120.0,
        volumes=(Volume("/usr", "/usr", read_only=True), Volume(str(binary.parent), "/opt/llama/bin", read_only=True),
                 Volume(str(model.parent), "/models", read_only=True)))
    engine = get_engine("llamacpp")
    # The alias is the key too: llama-server prints its model alias at start.
    spec = engine.build_launch(settings, ModelChoice("smollm2", f"/models/{model.name}"),
                               {"api_key": API_KEY, "alias": API_KEY, "threads": 1, "parallel": 1, "ctx_size": 512},
                               {}, free_port())
    log = tmp_path / "server.log"
    server = get_launcher("docker").start(spec, log)
    try:
        wait_ready(server, engine.ready_path, 120)
        deadline = time.monotonic() + 10
        while secrets.REDACTED.encode() not in log.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.2)
        text = log.read_bytes()
        assert server.returncode() is None
        assert API_KEY.encode() not in text and secrets.REDACTED.encode() in text, text[-2000:]
        assert httpx.get(spec.base_url + "/props", timeout=10).status_code == 401

        async def with_key() -> int:
            async with server_client() as client:
                return (await client.get(spec.base_url + "/props", timeout=10)).status_code

        assert asyncio.run(with_key()) == 200
    finally:
        server.stop()
    assert API_KEY.encode() not in log.read_bytes()
