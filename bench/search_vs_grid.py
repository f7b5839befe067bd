"""Search vs exhaustive grid on a real engine (llama-server + SmolLM2 on this CPU).

1. Measures EVERY config of a small discrete space for real (the grid), ordered so that configs
   sharing a server run back to back: the number of server starts saved by reuse is real.
2. Replays Optuna's TPE over those measured values for several seeds: how many trials (and
   server starts) the search needs to get within 3% of the grid's best, vs the grid's count.
   Replaying the measured table (instead of re-measuring for every seed) isolates the sampler's
   efficiency from the machine's noise; step 1's numbers are real measurements.

Usage: .venv/bin/python bench/search_vs_grid.py [--seeds 10] [--results /tmp/grid]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import setup_paths
from search.space import parse_space
from search.study import StudyRunner, default_storage
from search.summary import load_view

LAUNCH = {"threads": [1, 2], "ubatch_size": [128, 512], "flash_attn": ["on", "off"]}
REQUEST = {"concurrency": [1, 2, 4]}


def space_doc() -> dict:
    params: dict = {k: {"type": "categorical", "choices": v} for k, v in LAUNCH.items()}
    params["concurrency"] = {"type": "categorical", "choices": REQUEST["concurrency"], "side": "request"}
    return {
        "name": "grid",
        "engines": {"llamacpp": {"command": [str(setup_paths.llama_server())],
                                 "args": {"ctx_size": 4096, "parallel": 4}, "ready_timeout_s": 60}},
        "models": [{"name": "smollm2", "path": str(setup_paths.smollm2_gguf())}],
        "params": params,
        "measure": {"repeats": 1, "warmup": True, "request_timeout_s": 60},
        "workloads": [{"name": "w", "streams": ["qa"], "max_tokens": 48}],
        "quality": {"suite": None},
        "objectives": [{"metric": "w.output_tok_s"}],
    }


class Quiet:
    def trial_started(self, *a: object) -> None: ...
    def phase(self, text: str) -> None: ...
    def trial_finished(self, record: object) -> None:
        print(".", end="", flush=True)
    def note(self, text: str) -> None: ...


def measure_grid(results: Path) -> tuple[dict[tuple, float], int, int]:
    space = parse_space(space_doc())
    runner = StudyRunner(space, default_storage(results), "grid", results, Quiet())
    keys = list(LAUNCH) + list(REQUEST)
    configs = [dict(zip(keys, values, strict=True))
               for values in itertools.product(*LAUNCH.values(), *REQUEST.values())]
    # The baseline (trial 0) is the first config; queue the rest grouped by server.
    for config in configs[1:]:
        runner.study.enqueue_trial(config)
    runner.run(n_trials=len(configs))
    print()
    table = {}
    for r in load_view(runner.study).records:
        if r.objective_values:
            table[tuple(r.params[k] for k in keys)] = r.objective_values[0]
    return table, runner.starts, runner.starts_saved


def replay(table: dict[tuple, float], seed: int, target: float) -> tuple[int, int]:
    """Trials and server starts TPE needs to reach `target` on the measured table."""
    keys = list(LAUNCH) + list(REQUEST)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed,
                                                                                         n_startup_trials=4))
    starts, last_launch = 0, None
    for n in range(1, len(table) + 1):
        trial = study.ask()
        values = tuple(trial.suggest_categorical(k, LAUNCH.get(k) or REQUEST[k]) for k in keys)
        if values[:len(LAUNCH)] != last_launch:
            starts += 1
            last_launch = values[:len(LAUNCH)]
        value = table[values]
        study.tell(trial, value)
        if value >= target:
            return n, starts
    return len(table), starts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    results = args.results or Path(tempfile.mkdtemp(prefix="grid-"))
    table, starts, saved = measure_grid(results)
    best = max(table.values())
    target = best * 0.97
    runs = [replay(table, seed, target) for seed in range(args.seeds)]
    trials = [t for t, _ in runs]
    tstarts = [s for _, s in runs]
    print(f"\ngrid: {len(table)} configs measured for real, {starts} server starts ({saved} saved by reuse)")
    print(f"best {best:.1f} tok/s; within 3% means >= {target:.1f} tok/s "
          f"({sum(v >= target for v in table.values())} of {len(table)} configs qualify)\n")
    print("| method | trials to within 3% of best | server starts |")
    print("|---|---|---|")
    print(f"| exhaustive grid | {len(table)} | {starts} (with reuse; {len(table)} without) |")
    print(f"| TPE, {args.seeds} seeds (replayed on the measured grid) | mean {statistics.mean(trials):.1f}, "
          f"median {statistics.median(trials):.0f}, max {max(trials)} | mean {statistics.mean(tstarts):.1f} |")
    print("\nmeasured grid (tok/s):")
    keys = list(LAUNCH) + list(REQUEST)
    for values, v in sorted(table.items(), key=lambda kv: -kv[1]):
        print("  " + ", ".join(f"{k}={x}" for k, x in zip(keys, values, strict=True)) + f": {v:.1f}")


if __name__ == "__main__":
    main()
