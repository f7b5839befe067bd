"""Memory fit on unified-memory boxes, with each engine's memory knobs read by its own module, and
the context-length check against the workloads."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import optuna
import pytest

import search.study.memory_fit as memory_fit
from search.space.space import Config, Space, parse_space
from search.study.memory_fit import estimate, free_at_start, local_memory


def space(engines: dict[str, Any], params: dict[str, Any], device: dict[str, Any] | None = None,
          workload: dict[str, Any] | None = None) -> Space:
    return parse_space({
        "name": "fit",
        "device": device or {"name": "GB10", "memory_gb": 121.7, "unified_memory": True, "os_reserve_gb": 8,
                             "reserve_gb": 5},
        "engines": engines,
        "models": [{"name": "q", "path": "/models/q", "size_gb": 76.0, "kv_bytes_per_token": 38500}],
        "params": params,
        "workloads": [workload or {"name": "w", "profile": "uniform_short"}],
        "quality": {"suite": None},
        "objectives": [{"metric": "w.output_tok_s"}],
    }, "test")


def config_of(s: Space, **params: object) -> Config:
    return s.sample(optuna.trial.FixedTrial(params))


VLLM = {"vllm": {"command": ["vllm", "serve"]}}
SGLANG = {"sglang": {"command": ["python3", "-m", "sglang.launch_server"]}}
ATLAS = {"atlas": {"dialect": "command", "command": ["atlas", "--port", "{port}"],
                   "flag_map": {"util": "--gpu-memory-utilization", "seq": "--max-seq-len"}}}
LLAMA = {"llamacpp": {"command": ["llama-server"]}}


def test_each_engine_module_names_its_own_memory_knobs() -> None:
    def one(value: object) -> dict[str, Any]:
        return {"type": "categorical", "choices": [value]}

    vllm = space(VLLM, {"gpu_memory_utilization": one(0.9), "max_model_len": one(131072)})
    sgl = space(SGLANG, {"mem_fraction_static": one(0.9), "context_length": one(131072)})
    atlas = space(ATLAS, {"util": one(0.9), "seq": one(131072)})
    results = [estimate(s, config_of(s, **{k: p.choices[0] for k, p in s.m.params.items()}))
               for s in (vllm, sgl, atlas)]
    for fit in results:
        assert fit is not None and fit.fits
        # The same share and context however the engine spells them: 121.7 x 0.9 - 5 GB reserve.
        assert fit.available_gb == pytest.approx(121.7 * 0.9 - 5)
        assert fit.need_gb == pytest.approx(76.0 + 131072 * 38500 / 2**30)
    # llama.cpp's -c is shared by its -np slots: 4 slots of 4096 give 1024 tokens per sequence, too
    # short for uniform_short's json item (1024 output tokens plus its prompt).
    llama = space(LLAMA, {"ctx_size": one(4096), "parallel": one(4)})
    fit = estimate(llama, config_of(llama, ctx_size=4096, parallel=4))
    assert fit is not None and not fit.fits and fit.reason == "context" and "context limit 1024" in fit.detail


def test_a_context_shorter_than_the_workloads_is_rejected_before_launch() -> None:
    cat = {"type": "categorical"}
    s = space(VLLM, {"max_model_len": {**cat, "choices": [32768, 65536]}},
              workload={"name": "w", "streams": ["rag32k"]})
    short = estimate(s, config_of(s, max_model_len=32768))
    assert short is not None and not short.fits and short.reason == "context"
    assert "33024 tokens of the longest request (w/rag32k" in short.detail
    ok = estimate(s, config_of(s, max_model_len=65536))
    assert ok is not None and ok.fits


def test_a_share_that_starves_the_os_is_warned_about_on_unified_memory() -> None:
    cat = {"type": "categorical"}
    s = space(VLLM, {"gpu_memory_utilization": {**cat, "choices": [0.9, 0.99]}})
    assert estimate(s, config_of(s, gpu_memory_utilization=0.9)).warning is None  # type: ignore[union-attr]
    starved = estimate(s, config_of(s, gpu_memory_utilization=0.99))
    assert starved is not None and starved.fits and "leaves the OS and page cache 1.2 GB" in (starved.warning or "")
    discrete = space(VLLM, {"gpu_memory_utilization": {**cat, "choices": [0.99]}},
                     device={"memory_gb": 80, "reserve_gb": 1})
    assert estimate(discrete, config_of(discrete, gpu_memory_utilization=0.99)).warning is None  # type: ignore[union-attr]


def test_free_memory_is_read_where_the_device_is_this_machine() -> None:
    here = local_memory()
    assert here is not None and 0 < here.available_gb <= here.total_gb
    cat = {"type": "categorical"}
    # A unified-memory device the size of this machine: flagsearch runs on it, so its free memory
    # now is what an engine could take at start.
    this_box = {"memory_gb": round(here.total_gb, 1), "unified_memory": True, "reserve_gb": 0, "os_reserve_gb": 0}
    s = space(VLLM, {"gpu_memory_utilization": {**cat, "choices": [1.0]}}, device=this_box)
    free = free_at_start(s)
    assert free is not None and free.total_gb == pytest.approx(here.total_gb, rel=0.01)
    fit = estimate(s, config_of(s, gpu_memory_utilization=1.0), free)
    assert fit is not None and fit.available_gb == pytest.approx(free.available_gb)
    assert "free at start" in fit.detail
    from search.study.dryrun import dry_run

    assert any(line.startswith("# unified memory: ") and "free now on this machine" in line for line in dry_run(s, 1))
    # The DGX Spark of the flagship space is not this machine: nothing is read.
    spark = space(VLLM, {"gpu_memory_utilization": {**cat, "choices": [0.9]}})
    assert free_at_start(spark) is None


def test_memory_fit_has_no_table_per_dialect() -> None:
    source = inspect.getsource(memory_fit)
    for dialect in ("\"vllm\"", "\"sglang\"", "\"llamacpp\"", "\"command\"", "gpu_memory_utilization", "ctx_size"):
        assert dialect not in source


def test_the_users_own_prompts_count_in_the_longest_request() -> None:
    from search.study.dryrun import dead_choices
    from search.study.memory_fit import longest_request

    data = Path(__file__).resolve().parents[1] / "data" / "user"
    s = parse_space({
        "name": "u", "engines": VLLM, "models": [{"name": "m", "path": "/m"}],
        "params": {"max_model_len": {"type": "categorical", "choices": [128, 4096], "default": 4096}},
        "workloads": [{"name": "mine", "source": {"path": f"{data}/prompts.jsonl"}, "concurrency": 2},
                      {"name": "docs", "source": {"path": f"{data}/docs", "format": "documents",
                                                  "context_tokens": 1024, "max_tokens": 256}}],
        "quality": {"suite": None}, "objectives": [{"metric": "mine.output_tok_s"}]}, "user")
    assert longest_request(s) == (1280, "docs/documents")  # the retrieved part + question, plus output
    (dead,) = dead_choices(s)
    assert dead.startswith("max_model_len=128: no feasible config uses it")
