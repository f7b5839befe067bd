"""A real study whose objective is capacity under a latency SLO (llama-server, SmolLM2 Q4_1): each
config's capacity is measured by a load search on its own server and the study picks the config
that carries more streams; `search confirm --stability` then holds the winner at its capacity."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from search.cli import main
from search.confirm.confirm import STABILITY_ATTR
from search.store.storage import storage_for
from search.store.summary import load_view
from tests.conftest import SpaceFactory

pytestmark = pytest.mark.e2e


@pytest.mark.serial  # an absolute latency target: another test beside it would move the capacity
def test_a_study_picks_the_config_with_the_highest_capacity(space_doc: SpaceFactory, tmp_path: Path) -> None:
    # One slot queues one of the two streams behind a whole 160-token answer: 160 tokens at one
    # thread's decode rate (65 tok/s on the older 2-core machines, 81 on newer ones: 2.0-2.5 s) plus a
    # prefill; measured 2.25-2.38 s on a noisy host (2026-11-28). Four slots serve both at once: TTFT
    # p90 0.48-0.56 s calm (older CPU), 0.55-0.69 s on that noisy host. 1.5 s lies between with room
    # on both sides. (A 32-token
    # answer and 0.7 s held on the older CPU, 0.87-0.90 s, and not on the newer: 0.6 s.) Every step's
    # prompts are fresh; before, a kept server's steps resent the same prompts and their prefix-cache
    # hits made four slots look like 0.3 s.
    doc = space_doc(name="capacity-e2e",
                    params={"parallel": {"type": "categorical", "choices": [1, 4], "default": 1},
                            "threads": {"type": "fixed", "value": 1}},
                    workloads=[{"name": "chat", "streams": ["qa"], "max_tokens": 160}],
                    measure={"repeats": 1, "warmup": False, "request_timeout_s": 30, "kv_context_tokens": 512},
                    slo={"ttft_p90_s": 1.5, "max_concurrency": 2},
                    objectives=["capacity"], budget={"trials": 2})
    space = tmp_path / "capacity.yaml"
    space.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"
    assert main(["run", str(space), "--results", str(results), "--no-confirm", "--quiet", "--no-preflight"]) == 0
    storage, name = storage_for(str(results / "capacity-e2e"), None)
    study = optuna.load_study(study_name=name, storage=storage)
    view = load_view(study)
    by_slots = {r.params["parallel"]: r for r in view.records}
    one, four = by_slots[1], by_slots[4]
    assert one.metrics["capacity.concurrency"] == 1 and four.metrics["capacity.concurrency"] == 2
    assert four.metrics["kv.cache_tokens"] == 2048 and four.metrics["kv.sequences"] == 4  # 512-token slots
    assert one.metrics["kv.sequences"] == 1
    curve = [(s["concurrency"], s["meets"]) for s in four.workloads["capacity"]["curve"]] if four.workloads else None
    assert curve in (None, [(1, True), (2, True)])  # the curve is in result.json, not the study storage
    best = max(view.records, key=lambda r: r.objective_values[0] if r.objective_values else -1)
    assert best.params["parallel"] == 4

    code = main(["confirm", str(results / "capacity-e2e"), "--results", str(results), "--stability", "5s",
                 "--stability-only"])
    held = optuna.load_study(study_name=name, storage=storage).user_attrs[STABILITY_ATTR]
    assert code == 0 and held["trial"] == four.number and held["concurrency"] == 2
    assert held["errors"] == 0 and held["failure"] is None and len(held["samples"]) >= 2
    assert "stability at concurrency 2" in held["summary"]
