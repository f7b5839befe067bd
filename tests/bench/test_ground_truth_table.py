"""bench.ground_truth, the space-driven ground-truth tool (no engine; under a second): the seeded
config order covers a table space's grid once, resuming skips exactly the finished configs, the
vLLM table launches what the demo space defines, and bench.replay reads what the tool writes."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import replay
from bench.common import typed_cell
from bench.ground_truth import Grid, done_keys, show
from harness.files import load_yaml
from search.space.space import Config, load_space

ROOT = Path(__file__).resolve().parents[2]
TABLES = ROOT / "bench" / "tables"


@pytest.fixture(scope="module")
def grid() -> Grid:
    return Grid(load_space(TABLES / "cpu-vllm.yaml"))


def _write(path: Path, grid: Grid, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=grid.columns, restval="")
        writer.writeheader()
        writer.writerows(rows)


def test_configs_cover_the_grid_once_in_a_seeded_order(grid: Grid) -> None:
    configs = grid.configs(0)
    assert len(configs) == 48 == len({grid.key(c) for c in configs})
    assert configs == grid.configs(0) and configs != grid.configs(1)
    assert len(Grid(load_space(TABLES / "cpu-llamacpp.yaml")).configs(0)) == 144


def test_a_when_condition_leaves_a_param_out_of_the_grid(tmp_path: Path) -> None:
    doc = load_yaml(TABLES / "cpu-llamacpp.yaml")
    doc["params"]["cache_type_v"]["when"] = {"flash_attn": "on"}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    configs = Grid(load_space(path)).configs(0)
    assert len(configs) == 144 - 36  # fa off: one V cache type only
    assert all("cache_type_v" not in c for c in configs if c["flash_attn"] == "off")


def test_resume_skips_finished_configs_only(grid: Grid, tmp_path: Path) -> None:
    whole, half, failed, *_ = grid.configs(0)
    rows = [{**whole, "start": 0, "concurrency": c, "repeat": r, "status": "ok", "output_tok_s": 1.0}
            for c in (1, 4) for r in range(3)]
    rows += [{**failed, "start": 0, "status": "failed", "failure": "bad_flag"}]
    path = tmp_path / "t.csv"
    _write(path, grid, rows)
    assert done_keys(grid, path, starts=1) == {grid.key(whole), grid.key(failed)}
    assert grid.key(half) not in done_keys(grid, path, starts=1)
    assert done_keys(grid, path, starts=2) == {grid.key(failed)}  # a second start still to measure
    assert done_keys(grid, tmp_path / "absent.csv", starts=1) == set()


def test_vllm_table_launches_the_demo_definitions(grid: Grid) -> None:
    """The table's params are the demo's (a bool flag, an env variable), so its numbers are the demo's
    configs; the demo fixes `enforce_eager: true` in its engine (cheap starts), so its space is the
    table's eager half."""
    demo = load_yaml(ROOT / "spaces" / "smollm2-cpu.yaml")
    table = load_yaml(TABLES / "cpu-vllm.yaml")
    demo_engine = demo["engines"]["vllm"]
    demo_engine.pop("expect")  # the dry run's cost estimate, not how the engine launches
    assert demo_engine["args"].pop("enforce_eager") is True and "enforce_eager" not in demo["params"]
    assert table["params"]["enforce_eager"] == {"type": "bool"}
    for name in grid.launch:
        if name != "enforce_eager":
            assert {k: v for k, v in demo["params"][name].items() if k != "default"} == table["params"][name], name
    # The one difference: the demo runs vLLM's worker in the engine-core process (faster starts,
    # docs/engines.md); the committed tables were measured before, without it.
    assert demo_engine["env"].pop("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
    assert demo["engines"] == table["engines"] and demo["models"][0]["path"] == table["models"][0]["path"]
    config = {"enforce_eager": True, "dtype": "float32", "max_num_seqs": 4, "max_num_batched_tokens": 512,
              "omp_threads_bind": "0-1"}
    flags, env, _ = grid.space.split(Config(engine="vllm", model="smollm2-135m", values=config))
    assert flags["enforce_eager"] is True and flags["max_num_seqs"] == 4 and flags["dtype"] == "float32"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and "omp_threads_bind" not in flags
    (w,) = grid.space.workload_specs({"concurrency": 4})
    assert w.streams == ("qa",) * 4 and w.max_tokens == 16


def test_the_window_table_launches_the_demo_engine_and_workloads() -> None:
    """The table that judges the demo's pick (bench/tables/cpu-vllm-window.yaml) starts the demo's
    engine exactly (command, env, eager flag), its params, and measures the demo's workloads: 'single'
    is its concurrency 1, 'four_streams' its concurrency 4."""
    demo = load_yaml(ROOT / "spaces" / "smollm2-cpu.yaml")
    table = load_yaml(TABLES / "cpu-vllm-window.yaml")
    demo["engines"]["vllm"].pop("expect")  # the dry run's cost estimate, not how the engine launches
    assert demo["engines"] == table["engines"] and demo["models"][0]["path"] == table["models"][0]["path"]
    for name, param in table["params"].items():
        if name != "concurrency":
            assert {k: v for k, v in demo["params"][name].items() if k != "default"} == param, name
    single, four = demo["workloads"]
    (window,) = table["workloads"]
    assert window["streams"] == four["streams"] and single["streams"] == four["streams"][:1]
    assert window["max_tokens"] == four["max_tokens"] == single["max_tokens"]
    assert table["params"]["concurrency"]["choices"] == [1, 4]


def test_replay_reads_a_written_table(grid: Grid, tmp_path: Path) -> None:
    """Rows as the tool writes them (an excluded stall, a failed start) load as the replay's Table:
    the launch columns are its parameters, concurrency its levels; `show` prints the same cells."""
    a, b, failed, *_ = grid.configs(0)
    rows: list[dict[str, Any]] = []
    for config, speed in ((a, 10.0), (b, 20.0)):
        for c in (1, 4):
            rows += [{**config, "start": 0, "concurrency": c, "repeat": r, "status": "ok", "excluded": 0,
                      "output_tok_s": speed * c + r, "ttft_p50_s": 0.1} for r in range(3)]
    rows.append({**b, "start": 0, "concurrency": 4, "repeat": 3, "status": "ok", "excluded": 1, "output_tok_s": 999})
    rows.append({**failed, "start": 0, "status": "failed", "failure": "oom"})
    path = tmp_path / "cpu_vllm.csv"
    _write(path, grid, rows)
    table = replay.load_table(path)
    assert table.params == list(grid.launch) and table.levels == [1, 4]
    assert len(table.points) == 2 and len(table.failed) == 1
    table.judge(0.03)
    best = table.points[tuple(typed_cell(str(b[k])) for k in grid.launch)][4]
    assert best is table.best and (best.median, best.n) == (81.0, 3)  # the stall left out
    text = show(path)
    assert "| 81 (80-82) | 3 | 100.0 |" in text and "failed: oom" in text


def test_a_table_with_the_decode_window_is_judged_on_it(grid: Grid, tmp_path: Path) -> None:
    """Where the tool recorded decode_tok_s the replay ranks on it, not on end-to-end tok/s (here the
    two disagree on which config is best); older tables without it keep output_tok_s."""
    a, b, *_ = grid.configs(0)
    rows: list[dict[str, Any]] = []
    for config, e2e, decode in ((a, 30.0, 40.0), (b, 35.0, 38.0)):
        for c in (1, 4):
            rows += [{**config, "start": 0, "concurrency": c, "repeat": r, "status": "ok", "excluded": 0,
                      "output_tok_s": e2e, "decode_tok_s": decode, "ttft_p50_s": 0.1} for r in range(2)]
    path = tmp_path / "window.csv"
    _write(path, grid, rows)
    table = replay.load_table(path)
    table.judge(0.01)
    assert table.best.median == 40.0
    assert replay.load_table(path, metric="output_tok_s").points  # still readable on the other column
    assert replay.table_metric([{"output_tok_s": "1", "decode_tok_s": ""}]) == "output_tok_s"
    assert replay.table_metric([{"tok_s": "1", "decode_tok_s": "2"}]) == "tok_s"  # the H100 table's own columns
