"""Where the demo's answers end by themselves, and n-gram acceptance with and without ignore_eos.

Starts the demo's vLLM-CPU default (bf16, eager, in-process worker) with n-gram speculation (2 tokens,
prompt lookup 4), sends each of the demo's four prompts alone, temperature 0, 128 tokens, once to the
answer's own end and once with ignore_eos, and records the tokens, the text and the server's
spec-decode counter deltas of each request. Output: results.json here. About 2 minutes; nothing else
should run (docs/measurement.md, "Past the model's own end").

    .venv/bin/python -m bench.experiments.natural_end.probe
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx

from harness import flagsearch_home
from harness.measure.workloads import catalogue
from search.space.space import load_space

ROOT = Path(__file__).resolve().parents[3]

PORT = 8391
BASE = f"http://127.0.0.1:{PORT}"
ITEMS = ("qa", "code", "json", "math")
SPEC = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}


def start() -> subprocess.Popen[bytes]:
    # The demo's own engine command and environment, from its space file.
    engine = load_space(ROOT / "spaces" / "smollm2-cpu.yaml").engine_settings("vllm")
    env = dict(os.environ, **engine.env)
    cmd = [*engine.command, "--model", str(flagsearch_home.smollm2_hf()), "--served-model-name", "smollm2",
           "--max-model-len", "2048", "--enforce-eager", "--port", str(PORT), "--dtype", "bfloat16",
           "--speculative-config", json.dumps(SPEC)]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if httpx.get(BASE + "/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(1)
    server.kill()
    raise SystemExit("the server did not become ready in 10 minutes")


def spec_counters() -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(BASE + "/metrics").text.splitlines():
        if line.startswith("vllm:spec_decode_num_") and "_total" in line.split(" ")[0]:
            name = line.split("{")[0].removeprefix("vllm:spec_decode_num_")
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def main() -> None:
    items, _ = catalogue()
    server = start()
    results = {}
    try:
        for name in ITEMS:
            for ignore_eos in (False, True):
                before = spec_counters()
                reply = httpx.post(BASE + "/v1/chat/completions", timeout=300, json={
                    "model": "smollm2", "messages": [{"role": "user", "content": items[name].prompt}],
                    "max_tokens": 128, "temperature": 0, "ignore_eos": ignore_eos}).json()
                after = spec_counters()
                key = f"{name}/{'ignore_eos' if ignore_eos else 'own_end'}"
                results[key] = {"tokens": reply["usage"]["completion_tokens"],
                                "spec": {k: after[k] - before.get(k, 0.0) for k in after},
                                "text": reply["choices"][0]["message"]["content"]}
                print(key, results[key]["tokens"], results[key]["spec"], flush=True)
    finally:
        server.terminate()
        server.wait(60)
    (Path(__file__).parent / "results.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
