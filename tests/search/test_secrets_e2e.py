"""A literal secret written into a space reaches no file and no output, with a real llama-server
that demands it: a search, an A/B, a baseline save and every report format, then every byte under
results/ and baselines/ is searched for it. The server is started with `--api-key`, so the trial
only measures anything if the client sends the key (harness.measure.client.server_client)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from harness import flagsearch_home, secrets
from harness.engines import get_engine
from harness.launch import get_launcher, wait_ready
from search.store.results import read_record
from search.study.study import free_port
from tests.conftest import require, smollm2_gguf

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "sk-literal-in-space-5c1d9e7a"  # written in the space: known only by its key name
ENV_TOKEN = "hf_from_env_0a9b8c7d6e"  # from a secret-named environment variable

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def _forget_secrets() -> object:
    yield
    secrets.forget_all()


def space_doc(binary: Path, model: Path) -> dict[str, object]:
    return {
        "name": "secret-literal",
        "engines": {"llamacpp": {
            "dialect": "llamacpp", "command": [str(binary)],
            "env": {"UPSTREAM_TOKEN": "${HF_TOKEN}"},
            # The literal is the server's API key; the alias makes llama-server print it at start.
            "args": {"api_key": API_KEY, "alias": API_KEY, "ctx_size": 1024, "parallel": 1},
            "ready_timeout_s": 60}},
        "models": [{"name": "smollm2", "path": str(model)}],
        "params": {"threads": {"type": "categorical", "choices": [1], "default": 1}},
        "measure": {"repeats": 1, "warmup": False, "request_timeout_s": 60},
        "workloads": [{"name": "single", "streams": ["qa"], "max_tokens": 16}],
        "objectives": [{"metric": "single.output_tok_s"}],
        "quality": {"suite": None},
        "budget": {"trials": 1},
    }


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_TOKEN": ENV_TOKEN, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "search.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_literal_secret_in_a_space_is_in_no_file_and_no_output(tmp_path: Path) -> None:
    binary = require(flagsearch_home.llama_server(), "llama-server")
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(space_doc(binary, Path(smollm2_gguf().path)), sort_keys=False))
    outputs: dict[str, subprocess.CompletedProcess[str]] = {}
    outputs["run"] = cli("run", str(space), "--results", "results", "--study", "s", cwd=tmp_path)
    assert outputs["run"].returncode == 0, outputs["run"].stdout + outputs["run"].stderr
    record = read_record(tmp_path / "results" / "s" / "trials" / "0000" / "result.json")
    assert record.state == "complete" and record.metrics["single.output_tok_s"] > 0  # the key was sent
    outputs["ab"] = cli("ab", str(space), "--rounds", "2", "--out", "results/ab", "--quiet", cwd=tmp_path)
    assert outputs["ab"].returncode in (0, 1, 3), outputs["ab"].stderr  # 1/3: a verdict, not a crash
    assert (tmp_path / "results" / "ab" / "report.json").exists(), outputs["ab"].stderr
    outputs["baseline"] = cli("baseline", "save", "results/s", "--name", "secret-check", "--dir", "baselines",
                              cwd=tmp_path)
    assert outputs["baseline"].returncode == 0, outputs["baseline"].stderr
    outputs["report"] = cli("report", "results/s", "--html", "results/report.html", "--csv", "results/csv",
                            "--parquet", "results/parquet", cwd=tmp_path)
    assert outputs["report"].returncode == 0, outputs["report"].stderr
    outputs["show"] = cli("show", "results/s", cwd=tmp_path)

    written = [p for d in ("results", "baselines") for p in (tmp_path / d).rglob("*") if p.is_file()]
    names = {p.name for p in written}
    assert {"result.json", "server.log", "study.db", "report.html", "secret-check.json"} <= names, names
    assert any(p.suffix == ".csv" for p in written) and any(p.suffix == ".parquet" for p in written)
    leaks = [f"{p.relative_to(tmp_path)} has {s[:6]}..." for p in written for s in (API_KEY, ENV_TOKEN)
             if s.encode() in p.read_bytes()]
    leaks += [f"{name} output" for name, proc in outputs.items() for s in (API_KEY, ENV_TOKEN)
              if s in proc.stdout + proc.stderr]
    assert not leaks, leaks
    baseline = yaml.safe_load((tmp_path / "baselines" / "secret-check.json").read_text())
    assert baseline["config"]["engines"]["llamacpp"]["args"]["api_key"] == secrets.REDACTED


def test_server_log_is_scrubbed_while_the_server_runs(tmp_path: Path) -> None:
    """Not only at stop: what the server printed at start is already clean on disk while it serves,
    and the key it demands is sent by the tool's clients."""
    binary = require(flagsearch_home.llama_server(), "llama-server")
    engine = get_engine("llamacpp")
    from harness.engines import EngineSettings

    settings = EngineSettings(name="llamacpp", dialect="llamacpp", command=(str(binary),), ready_timeout_s=60)
    spec = engine.build_launch(settings, smollm2_gguf(), {"api_key": API_KEY, "alias": API_KEY, "ctx_size": 512,
                                                          "parallel": 1, "threads": 1}, {}, free_port())
    log = tmp_path / "server.log"
    server = get_launcher("process").start(spec, log)
    try:
        wait_ready(server, engine.ready_path, 60)
        deadline = time.monotonic() + 10
        while secrets.REDACTED.encode() not in log.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.2)
        text = log.read_bytes()
        assert server.returncode() is None  # still running: this is the log as written
        assert API_KEY.encode() not in text and secrets.REDACTED.encode() in text, text[-2000:]
        plain = httpx.get(spec.base_url + "/props", timeout=10)
        assert plain.status_code == 401  # the server really demands the key
    finally:
        server.stop()
    assert API_KEY.encode() not in log.read_bytes()
