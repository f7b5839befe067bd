"""Quality inside the search: a damaged checkpoint is measured like any other config, and loses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import flagsearch_home
from search.space.space import parse_space
from search.store.summary import load_view
from search.study.study import StudyRunner, default_storage
from tests.conftest import Quiet

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def test_damaged_checkpoint_never_wins(tmp_path: Path) -> None:
    good = flagsearch_home.smollm2_gguf()
    damaged = tmp_path / "smollm2-damaged.gguf"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "damage_model.py"), str(good), str(damaged),
                    "--tensor", "blk.15.ffn_down.weight", "--zero"], check=True, timeout=300)
    doc = {
        "name": "quality-e2e",
        "engines": {"llamacpp": {"command": [str(flagsearch_home.llama_server())],
                                 "args": {"ctx_size": 2048, "parallel": 1, "threads": 1}, "ready_timeout_s": 60}},
        "models": [{"name": "good", "path": str(good)}, {"name": "damaged", "path": str(damaged)}],
        "measure": {"repeats": 1, "warmup": False, "request_timeout_s": 60},
        "workloads": [{"name": "w", "streams": ["qa"], "max_tokens": 16}],
        # Four smoke checks (tests/data/quality_quick.yaml): what is tested is the search's use of the verdict.
        "quality": {"suite": str(ROOT / "tests" / "data" / "quality_quick.yaml"), "min_score": 0.8, "reference": {},
                    "max_kl": 0.05},
        "objectives": [{"metric": "w.output_tok_s"}],
    }
    space = parse_space(yaml.safe_load(yaml.safe_dump(doc, sort_keys=False)))
    runner = StudyRunner(space, default_storage(tmp_path), "q", tmp_path, Quiet())
    runner.study.enqueue_trial({"model": "damaged"})
    runner.run(n_trials=2)

    view = load_view(runner.study)
    records = {r.params["model"]: r for r in view.records}
    assert records["good"].state == "complete"
    assert all(c <= 0 for c in records["good"].constraint_values), records["good"].quality
    assert records["good"].metrics["quality.kl"] == pytest.approx(0.0, abs=1e-6)  # the reference itself
    bad = records["damaged"]
    # Whatever its speed, the damaged model is either failed outright (garbage) or infeasible.
    assert bad.state == "failed" or any(c > 0 for c in bad.constraint_values), bad.quality
    assert bad.metrics.get("quality.kl", 1.0) > 0.05 or bad.state == "failed"
    assert [r.params["model"] for r in view.best()] == ["good"]
    # The reference was captured once and cached beside the study.
    assert len(list(tmp_path.glob("reference-*.json"))) == 1
