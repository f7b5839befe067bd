"""What a local engine inherits of the tool's environment: the basics, the GPU/hub/thread-pool
variables engines read, and what the space names; never a database URL or a cloud credential."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from harness.launch.process import ProcessLauncher, engine_environment
from harness.launch.spec import LaunchSpec
from search.study.study import free_port

LEAKS = {"DATABASE_URL": "postgresql://u:pw@db/x", "FLAGSEARCH_PG_URL": "postgresql://u:pw@127.0.0.1/t",
         "AWS_SECRET_ACCESS_KEY": "aws-secret-value-1", "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
         "GITHUB_TOKEN": "ghp_example_123456", "GOOGLE_APPLICATION_CREDENTIALS": "/home/u/gcp.json",
         "KUBECONFIG": "/home/u/.kube/config", "SOME_UNRELATED_VAR": "x"}
NEEDED = {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "CUDA_VISIBLE_DEVICES": "0",
          "NVIDIA_VISIBLE_DEVICES": "all", "HF_HOME": "/hf", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
          "OMP_NUM_THREADS": "2", "LC_ALL": "C.UTF-8", "TORCHINDUCTOR_CACHE_DIR": "/t", "TRITON_CACHE_DIR": "/tr"}


def test_the_allowed_base_set_and_what_the_space_names() -> None:
    env = engine_environment({"MY_LICENSE": "from-the-space", "OMP_NUM_THREADS": "1"}, {**LEAKS, **NEEDED})
    assert not set(LEAKS) & set(env), sorted(set(LEAKS) & set(env))
    assert {k: env[k] for k in NEEDED if k != "OMP_NUM_THREADS"} == {k: v for k, v in NEEDED.items()
                                                                   if k != "OMP_NUM_THREADS"}
    assert env["MY_LICENSE"] == "from-the-space" and env["OMP_NUM_THREADS"] == "1"  # the space wins


def test_a_real_engine_process_does_not_inherit_the_tools_credentials(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in LEAKS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    dump = tmp_path / "env.json"
    code = f"import json, os; open({str(dump)!r}, 'w').write(json.dumps(sorted(os.environ)))"
    spec = LaunchSpec("probe", (sys.executable, "-c", code), "127.0.0.1", free_port(), env={"NAMED": "yes"})
    server = ProcessLauncher().start(spec, tmp_path / "server.log")
    try:
        deadline = time.monotonic() + 30
        while server.returncode() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.stop()
    names = set(json.loads(dump.read_text()))
    assert not set(LEAKS) & names, sorted(set(LEAKS) & names)
    assert {"PATH", "OMP_NUM_THREADS", "NAMED", "FLAGSEARCH_OWNER", "FLAGSEARCH_SERVER"} <= names
