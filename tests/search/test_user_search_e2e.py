"""The user's own prompt file and quality checks drive a real search: llama-server, 2 trials."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness import flagsearch_home
from search.space.space import parse_space
from search.store.summary import load_view
from search.study.study import StudyRunner, default_storage
from tests.conftest import Quiet

pytestmark = pytest.mark.e2e
DATA = Path(__file__).resolve().parents[1] / "data" / "user"


def test_a_user_prompt_file_drives_a_search(tmp_path: Path) -> None:
    doc = {
        "name": "user-prompts",
        "engines": {"llamacpp": {"command": [str(flagsearch_home.llama_server())],
                                 "args": {"ctx_size": 2048, "threads": 1}, "ready_timeout_s": 60}},
        "models": [{"name": "smollm2", "path": str(flagsearch_home.smollm2_gguf())}],
        "params": {"parallel": {"type": "categorical", "choices": [1, 2, 4]}},
        "measure": {"repeats": 1, "warmup": False, "request_timeout_s": 60},
        "workloads": [{"name": "mine", "source": {"path": str(DATA / "prompts.jsonl")}, "concurrency": 2,
                       "max_tokens": 8}],
        "quality": {"suite": str(DATA / "checks.yaml"), "min_score": None, "max_lost": 0},
        "objectives": [{"metric": "mine.output_tok_s"}],
    }
    space = parse_space(yaml.safe_load(yaml.safe_dump(doc, sort_keys=False)))
    runner = StudyRunner(space, default_storage(tmp_path), "u", tmp_path, Quiet())
    runner.study.enqueue_trial({"parallel": 2})  # trial 0 is the default config (parallel 1)
    runner.run(n_trials=2)

    records = load_view(runner.study).records
    assert sorted(r.params["parallel"] for r in records) == [1, 2]
    for r in records:
        assert r.state == "complete", (r.state, r.failure if hasattr(r, "failure") else None)
        assert r.metrics["mine.output_tokens"] == 16  # 2 streams x 1 request x 8 tokens, from usage
        assert r.metrics["mine.prompt_tokens"] > 40  # the file's prompts, counted by the server
        assert r.metrics["quality.lost"] == 0 and r.metrics["quality.score"] == 1.0, r.quality
    # The user's checks were answered once on the reference config and kept beside the study.
    ref = yaml.safe_load(next(tmp_path.glob("reference-*.json")).read_text())
    assert [c["name"] for c in ref["checks"]] == ["my_capital_france", "my_days_in_week"]
