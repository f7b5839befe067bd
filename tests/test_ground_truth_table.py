"""bench/ground_truth_table.py, shared by the ground-truth tables (no engine; under a second): the
seeded config order covers the grid once, resuming skips exactly the finished configs, the vLLM
table launches what the demo space defines, and bench/replay.py reads what the tables write."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import ground_truth_llamacpp  # noqa: E402
import ground_truth_vllm  # noqa: E402
import replay  # noqa: E402
from ground_truth_table import Grid, done_keys  # noqa: E402

from search.space import Config  # noqa: E402


@pytest.fixture(scope="module")
def grid() -> Grid:
    return ground_truth_vllm.make_grid(16)


def _write(path: Path, grid: Grid, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=grid.columns, restval="")
        writer.writeheader()
        writer.writerows(rows)


def test_configs_cover_the_grid_once_in_a_seeded_order(grid: Grid) -> None:
    configs = grid.configs(0)
    assert len(configs) == 48 == len({grid.key(c) for c in configs})
    assert configs == grid.configs(0) and configs != grid.configs(1)
    llama = ground_truth_llamacpp.LAUNCH
    assert len({tuple(c.values()) for c in Grid(grid.space, "x", "y", llama, [1]).configs(0)}) == 144


def test_resume_skips_finished_configs_only(grid: Grid, tmp_path: Path) -> None:
    whole, half, failed, *_ = grid.configs(0)
    rows = [{**whole, "start": 0, "concurrency": c, "repeat": r, "status": "ok", "output_tok_s": 1.0}
            for c in grid.levels for r in range(3)]
    rows += [{**half, "start": 0, "concurrency": grid.levels[0], "repeat": 0, "status": "ok", "output_tok_s": 1.0}]
    rows += [{**failed, "start": 0, "status": "failed", "failure": "bad_flag"}]
    path = tmp_path / "t.csv"
    _write(path, grid, rows)
    assert done_keys(grid, path, starts=1) == {grid.key(whole), grid.key(failed)}
    assert done_keys(grid, path, starts=2) == {grid.key(failed)}  # a second start still to measure
    assert done_keys(grid, tmp_path / "absent.csv", starts=1) == set()


def test_vllm_table_launches_the_demo_definitions(grid: Grid) -> None:
    """The bool flag stays a flag and omp_threads_bind stays the demo's environment variable."""
    config = {"enforce_eager": True, "dtype": "float32", "max_num_seqs": 4, "max_num_batched_tokens": 512,
              "omp_threads_bind": "0-1"}
    flags, env, _ = grid.space.split(Config(engine=grid.engine, model=grid.model, values=config))
    assert flags["enforce_eager"] is True and flags["max_num_seqs"] == 4 and flags["dtype"] == "float32"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and "omp_threads_bind" not in flags
    assert grid.space.engine_settings(grid.engine).env["VLLM_CPU_KVCACHE_SPACE"] == "1"  # the demo's engine env
    (w,) = grid.space.workload_specs({"concurrency": 4})
    assert w.streams == ("qa",) * 4 and w.max_tokens == 16


def test_replay_reads_a_written_table(grid: Grid, tmp_path: Path) -> None:
    """Rows as run_table writes them (warmup rows, an excluded stall, a failed start) load as the
    replay's Table: the launch columns are its parameters, concurrency its levels."""
    a, b, failed, *_ = grid.configs(0)
    rows: list[dict[str, Any]] = []
    for config, speed in ((a, 10.0), (b, 20.0)):
        for c in grid.levels:
            rows.append({**config, "start": 0, "concurrency": c, "repeat": -1, "status": "ok", "output_tok_s": 1.0})
            rows += [{**config, "start": 0, "concurrency": c, "repeat": r, "status": "ok", "excluded": 0,
                      "output_tok_s": speed * c + r} for r in range(3)]
    rows.append({**b, "start": 0, "concurrency": 4, "repeat": 3, "status": "ok", "excluded": 1, "output_tok_s": 999})
    rows.append({**failed, "start": 0, "status": "failed", "failure": "oom"})
    path = tmp_path / "cpu_vllm.csv"
    _write(path, grid, rows)
    table = replay.load_table(path)
    assert table.params == list(grid.launch) and table.levels == grid.levels
    assert len(table.points) == 2 and len(table.failed) == 1
    table.judge(0.03)
    best = table.points[tuple(replay._typed(str(b[k])) for k in grid.launch)][4]
    assert best is table.best and (best.median, best.n) == (81.0, 3)  # warmup and stall left out
