"""Ground-truth table: every server config of a llama-server space x concurrency levels, measured
for real through flagsearch's own harness (harness.session: start, measure, stop), with repeats.

One CSV row per measured run (config columns, concurrency, start, repeat, output tok/s, TTFT,
load average); a config whose server does not start gets one row with its failure cause. The
run is resumable: rows are appended as they are measured and configs already in the CSV are
skipped, so it can be run in chunks (`--minutes`) under the measurement lock:

    flock /tmp/flagsearch-measure.lock .venv/bin/python bench/ground_truth_llamacpp.py --minutes 18

Configs are measured in a seeded random order, so that drifts in the machine's load spread over
the table instead of following one parameter. bench/replay.py replays searches over the table.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import itertools
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import setup_paths
from harness.session import LaunchFailed, MeasureSettings, measure_running, start_config
from harness.steady import MeasurePolicy
from search.space import Config, Space, parse_space
from search.study import free_port

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
COLUMNS = [*LAUNCH, "concurrency", "start", "repeat", "status", "failure", "output_tok_s", "ttft_p50_s",
           "stream_tok_s", "errors", "excluded", "ready_s", "max_tokens", "loadavg_1m", "loadavg_5m", "measured_at"]
# The harness's measurement policy (harness/steady.py), kept short for a 144-config table: at most
# one warmup run per start and 1 re-measurement of a stalled run per load level. Excluded
# (stalled) runs are kept in the CSV with excluded=1; the replay leaves them out, as the harness does.
POLICY = MeasurePolicy(max_warmups=1, max_remeasure=1)


def space_doc(max_tokens: int) -> dict[str, Any]:
    params: dict[str, Any] = {k: {"type": "categorical", "choices": v} for k, v in LAUNCH.items()}
    params["concurrency"] = {"type": "categorical", "choices": CONCURRENCY, "side": "request"}
    return {
        "name": "ground-truth",
        "engines": {"llamacpp": {"command": [str(setup_paths.llama_server())], "args": FIXED_ARGS,
                                 "ready_timeout_s": 60}},
        "models": [{"name": "smollm2", "path": str(setup_paths.smollm2_gguf())}],
        "params": params,
        "workloads": [{"name": "w", "streams": ["qa"], "max_tokens": max_tokens}],
        "quality": {"suite": None},
        "objectives": [{"metric": "w.output_tok_s"}],
    }


def all_configs(seed: int) -> list[dict[str, Any]]:
    configs = [dict(zip(LAUNCH, values, strict=True)) for values in itertools.product(*LAUNCH.values())]
    random.Random(seed).shuffle(configs)
    return configs


def config_key(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(str(row[k]) for k in LAUNCH)


def done_keys(path: Path, starts: int) -> set[tuple[str, ...]]:
    """Configs with every start finished (measured at every concurrency level, or failed)."""
    if not path.exists():
        return set()
    seen: dict[tuple[str, ...], set[tuple[str, str]]] = {}
    failed: set[tuple[str, ...]] = set()
    with path.open() as f:
        for row in csv.DictReader(f):
            key = config_key(row)
            if row["status"] == "failed":
                failed.add(key)
            seen.setdefault(key, set()).add((row["start"], row["concurrency"]))
    need = {(str(s), str(c)) for s in range(starts) for c in CONCURRENCY}
    return failed | {k for k, v in seen.items() if need <= v}


def load() -> tuple[float, float]:
    one, five, _ = os.getloadavg()
    return round(one, 2), round(five, 2)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def measure_config(space: Space, values: dict[str, Any], start: int, repeats: int, max_tokens: int,
                   log_dir: Path, timeout_s: float) -> list[dict[str, Any]]:
    config = Config(engine="llamacpp", model="smollm2", values=values)
    flags, env, _ = space.split(config)
    settings = space.engine_settings("llamacpp")
    base = {**values, "start": start, "max_tokens": max_tokens}
    try:
        running = start_config(settings, space.model_choice("smollm2"), flags, env, free_port(),
                               log_dir / "server.log")
    except LaunchFailed as exc:
        one, five = load()
        return [{**base, "concurrency": "", "repeat": "", "status": "failed", "failure": exc.cause,
                 "loadavg_1m": one, "loadavg_5m": five, "measured_at": now()}]
    rows: list[dict[str, Any]] = []
    try:
        for i, concurrency in enumerate(CONCURRENCY):
            specs = space.workload_specs({"concurrency": concurrency})
            # One warmup per start (the first level): later levels run on a warm server.
            results = measure_running(running, specs, MeasureSettings(repeats, i == 0, timeout_s, POLICY))
            one, five = load()
            wm = results.get("w")
            if wm is None or not running.alive():
                cause, _ = running.crash_cause()
                return [*rows, {**base, "concurrency": concurrency, "repeat": "", "status": "failed",
                                "failure": cause, "loadavg_1m": one, "loadavg_5m": five, "measured_at": now()}]
            for sample in wm.samples:
                m = sample.metrics
                rows.append({**base, "concurrency": concurrency, "repeat": sample.repeat,
                             "status": "ok" if not m.get("errors") else "errors", "failure": "",
                             "output_tok_s": round(m["output_tok_s"], 3),
                             "ttft_p50_s": round(m["ttft_p50_s"], 4) if "ttft_p50_s" in m else "",
                             "stream_tok_s": round(m["stream_tok_s"], 3) if "stream_tok_s" in m else "",
                             "errors": int(m.get("errors", 0)), "excluded": int(sample.excluded),
                             "ready_s": round(running.ready_s, 3),
                             "loadavg_1m": one, "loadavg_5m": five, "measured_at": now()})
    finally:
        running.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--minutes", type=float, default=18.0, help="stop starting new configs after this")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--starts", type=int, default=1, help="fresh starts per config")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=60.0, help="per request, seconds")
    parser.add_argument("--seed", type=int, default=0, help="order of the configs")
    parser.add_argument("--limit", type=int, default=None, help="measure at most this many configs")
    args = parser.parse_args()
    if not setup_paths.llama_server().exists():
        sys.exit(f"no llama-server at {setup_paths.llama_server()} (run make setup)")
    space = parse_space(space_doc(args.max_tokens))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = done_keys(args.out, args.starts)
    todo = [c for c in all_configs(args.seed) if config_key(c) not in done]
    print(f"{len(done)} configs done, {len(todo)} to go; load average {load()[0]}", flush=True)
    deadline = time.monotonic() + args.minutes * 60
    new_file = not args.out.exists()
    measured = 0
    with args.out.open("a", newline="") as f, tempfile.TemporaryDirectory(prefix="gt-") as tmp:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, restval="")
        if new_file:
            writer.writeheader()
        for values in todo:
            if time.monotonic() > deadline or (args.limit is not None and measured >= args.limit):
                break
            t0 = time.monotonic()
            rows: list[dict[str, Any]] = []
            for start in range(args.starts):
                rows += measure_config(space, values, start, args.repeats, args.max_tokens, Path(tmp), args.timeout)
                if rows and rows[-1]["status"] == "failed":
                    break
            writer.writerows(rows)  # a config's rows are written together: a cut run leaves no half config
            f.flush()
            measured += 1
            best = max((float(r["output_tok_s"]) for r in rows if r.get("output_tok_s", "") != ""), default=0.0)
            print(f"{' '.join(f'{k}={v}' for k, v in values.items())}: {rows[-1]['status']}"
                  f" best {best:.1f} tok/s, {time.monotonic() - t0:.0f} s, load {load()[0]}", flush=True)
    print(f"measured {measured} configs; {len(todo) - measured} left", flush=True)


if __name__ == "__main__":
    main()
