"""`search ab` with a B side that a real llama-server refuses to start: B is reported as failed, with
its command, the engine's classified cause and the deciding log line; no fingerprint or log
comparison against the empty fingerprint of a server that never ran."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import flagsearch_home
from search.cli import main
from tests.conftest import require

pytestmark = pytest.mark.e2e


def _space(tmp: Path) -> Path:
    server = require(flagsearch_home.llama_server(), "llama-server")
    model = require(flagsearch_home.smollm2_gguf(), "the SmolLM2 GGUF")
    doc: dict[str, Any] = {
        "name": "smollm2-ab-failed-side",
        "engines": {"llamacpp": {"dialect": "llamacpp", "command": [str(server)],
                                 "args": {"ctx_size": 1024, "parallel": 1, "threads": 1}, "ready_timeout_s": 60}},
        "models": [{"name": "smollm2-135m-q4_1", "path": str(model)}],
        # q9_0 is no cache type of this build: a space written for another build may list one.
        "params": {"cache_type_k": {"type": "categorical", "choices": ["f16", "q9_0"], "default": "f16"}},
        "workloads": [{"name": "single", "streams": ["qa"], "max_tokens": 8}],
        "measure": {"repeats": 1, "warmup": False, "request_timeout_s": 60},
        "quality": {"suite": None},
        "objectives": [{"metric": "single.output_tok_s", "direction": "maximize"}],
    }
    path = tmp / "space.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_side_that_fails_to_start_is_reported_as_failed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(["ab", str(_space(tmp_path)), "--b-set", "cache_type_k=q9_0", "--rounds", "2",
                 "--claim", "+10% tok/s", "--out", str(out), "--quiet"])
    report = json.loads((out / "report.json").read_text())
    assert code == 7 and report["exit_code"] == 7  # failed to measure (search/exit_codes.py)
    [failed] = report["failed_sides"]
    assert failed["side"] == "B" and failed["round"] == 1
    assert failed["cause"] == "bad_flag", failed
    assert "--cache-type-k q9_0" in failed["command"]
    assert "q9_0" in failed["line"] and "exited" not in failed["cause"]
    assert report["fingerprint_differences"] == [] and report["log_diff"] == []
    md = (out / "report.md").read_text()
    assert f"B = `{failed['command']}`" in md  # B is labelled by its command, not the space name
    assert md.splitlines()[0].startswith("## ab: **ERROR: B (bad_flag) FAILED TO START** (exit 7)")
    assert "cpu_model" not in md and "None" not in md
    assert "**CLAIM" not in md.splitlines()[0]  # no claim verdict on a comparison that never ran
