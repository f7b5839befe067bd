"""Window length and the position effect on real llama-server starts, through Session.run: per-run
decode_tok_s, output_tok_s, TTFT, prompt and cached prompt tokens of every measured run.

    python -m bench.experiments.window_length.measure MAX_TOKENS RUNS STARTS THREADS

Measured 2026-11-27 on a calm 2-core machine under the measurement lock (rows_64/128/256.json: 3
starts x 6 runs, `-t 1`); spread.py prints their spread (docs/measurement.md, window length)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import optuna

from harness import MeasureSettings, Session
from search.space.space import load_space

SPACE = """
name: window-length
engines:
  llamacpp:
    dialect: llamacpp
    command: ["${{FLAGSEARCH_HOME}}/engines/llama.cpp-0.3.36/bin/llama-server"]
    args: {{ctx_size: 2048, parallel: 1}}
    ready_timeout_s: 60
models:
  - name: smollm2-135m-q4_1
    path: "${{FLAGSEARCH_HOME}}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
params:
  threads: {{type: categorical, choices: [1, 2], default: {threads}}}
measure: {{repeats: {runs}, request_timeout_s: 120, max_warmups: 2}}
workloads:
  - {{name: single, streams: [qa], max_tokens: {max_tokens}}}
quality: {{suite: null}}
objectives:
  - metric: single.decode_tok_s
"""


def main(max_tokens: int, runs: int, starts: int, threads: int) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp())
    (tmp / "space.yaml").write_text(SPACE.format(threads=threads, runs=runs, max_tokens=max_tokens))
    space = load_space(tmp / "space.yaml")
    config = space.sample(optuna.trial.FixedTrial({"threads": threads}))
    m = space.m.measure
    settings = MeasureSettings(m.repeats, m.warmup, m.request_timeout_s, m.policy("decode_tok_s"))
    rows: list[dict[str, Any]] = []
    with Session(keep_server=False) as session:
        for i in range(starts):
            request = space.request(config, tmp / f"start{i}", fresh=True)
            wm = session.run(request, space.workload_specs({}), settings).workloads["single"]
            for s in wm.samples:
                r = s.requests[0]
                rows.append({"start": i, "repeat": s.repeat, "excluded": s.excluded,
                             "dec": round(s.metrics.get("decode_tok_s", 0.0), 2),
                             "out": round(s.metrics.get("output_tok_s", 0.0), 2), "ttft": round(r.ttft_s or 0.0, 4),
                             "ptok": r.prompt_tokens, "cached": r.cached_prompt_tokens, "otok": r.output_tokens})
    return rows


if __name__ == "__main__":
    n, runs, starts, threads = (int(x) for x in sys.argv[1:5])
    result = main(n, runs, starts, threads)
    (Path(__file__).parent / f"rows_{n}.json").write_text(json.dumps(result))
    print("\n".join(map(str, result)))
