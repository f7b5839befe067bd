"""Ground-truth table: every server config of a llama-server space x concurrency levels, measured
for real through flagsearch's own harness (harness.session: start, measure, stop), with repeats.

The CSV layout, resuming and the measuring of one start are bench/ground_truth_table.py's (shared
with the other tables). Resumable, so it runs in chunks (`--minutes`) under the measurement lock:

    flock /tmp/flagsearch-measure.lock .venv/bin/python bench/ground_truth_llamacpp.py --minutes 18

bench/replay.py replays searches over the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ground_truth_table import WORKLOAD, Grid, add_arguments, request_params, run_table

from harness import setup_paths
from search.space import parse_space

DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "cpu_llamacpp_smollm2.csv"
# Server side: 2 x 2 x 3 x 2 x 2 x 3 = 144 configs. A quantized V cache without flash attention
# does not start (llama-server refuses it): 36 configs are real, cheap failures.
LAUNCH: dict[str, list[Any]] = {
    "threads": [1, 2],
    "flash_attn": ["on", "off"],
    "ubatch_size": [32, 128, 512],
    "cache_type_k": ["f16", "q8_0"],
    "cache_type_v": ["f16", "q8_0"],
    "parallel": [1, 2, 4],
}
CONCURRENCY = [1, 2, 4]
FIXED_ARGS = {"ctx_size": 4096, "batch_size": 2048}


def space_doc(max_tokens: int) -> dict[str, Any]:
    params: dict[str, Any] = {k: {"type": "categorical", "choices": v} for k, v in LAUNCH.items()}
    return {
        "name": "ground-truth",
        "engines": {"llamacpp": {"command": [str(setup_paths.llama_server())], "args": FIXED_ARGS,
                                 "ready_timeout_s": 60}},
        "models": [{"name": "smollm2", "path": str(setup_paths.smollm2_gguf())}],
        "params": {**params, **request_params(CONCURRENCY)},
        "workloads": [{"name": WORKLOAD, "streams": ["qa"], "max_tokens": max_tokens}],
        "quality": {"suite": None},
        "objectives": [{"metric": f"{WORKLOAD}.output_tok_s"}],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, DEFAULT_OUT, minutes=18.0, repeats=3, max_tokens=16, timeout_s=60.0)
    args = parser.parse_args()
    if not setup_paths.llama_server().exists():
        sys.exit(f"no llama-server at {setup_paths.llama_server()} (run make setup)")
    grid = Grid(parse_space(space_doc(args.max_tokens)), "llamacpp", "smollm2", LAUNCH, CONCURRENCY)
    run_table(grid, args)


if __name__ == "__main__":
    main()
