"""Does a host-speed probe taken during a run explain the run's throughput on a VM whose host
changes speed within seconds? One vLLM-CPU start of the demo's default config, then four-stream
128-token runs one after another; beside them, one probe process pinned to each core times a small
fixed piece of CPU work every 50 ms (~1% of a core), and a third on core 1 times a read of a 64 MiB
buffer every 250 ms (probe2: the shared cache and memory the integer loop does not touch). Per run:
decode_tok_s, the stretch in which every stream decoded, and each probe's mean time inside it.

    python -m bench.experiments.host_covariate.measure RUNS [ROWS_FILE] [--no-memory]

Rows: rows.json here; fit.py prints how much of the runs' spread the probe explains."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import default_params, request_for
from harness import MeasureSettings, Session
from harness.measure.workloads import WorkloadSpec
from search.space.space import load_space

ROOT = Path(__file__).resolve().parents[3]
STREAMS = ("qa", "code", "json", "math")  # the demo's four_streams workload
ONE_RUN = MeasureSettings(repeats=1, warmup=False, request_timeout_s=120)
WORK = 20_000  # ~0.2-0.4 ms of CPU here
EVERY_S = 0.05
# What the integer loop cannot see: a host whose other tenants take the shared cache or the memory
# bus. A 64 MiB buffer spills the 2-4 MiB L2 of these VMs and fits the host's shared L3 on one
# (480 MiB) and not on another; summed every 250 ms (15 ms a read on the Xeon VM, ~6% of a core).
MEMORY_BYTES = 64 << 20
MEMORY_EVERY_S = 0.25


def timed_loop(core: int, out: str, stop: Any, work: Callable[[], object], every_s: float) -> None:
    """Time `work` every `every_s` on one core until stopped; (monotonic start, seconds) pairs in `out`."""
    os.sched_setaffinity(0, {core})
    rows = []
    while not stop.is_set():
        t = time.monotonic()
        work()
        rows.append((t, time.monotonic() - t))
        time.sleep(every_s)
    Path(out).write_text(json.dumps(rows))


def probe(core: int, out: str, stop: Any) -> None:
    """The integer loop: sum(range(WORK)) every EVERY_S."""
    timed_loop(core, out, stop, lambda: sum(range(WORK)), EVERY_S)


def memory_probe(core: int, out: str, stop: Any) -> None:
    """One read of a MEMORY_BYTES buffer every MEMORY_EVERY_S."""
    import numpy as np

    buffer = np.ones(MEMORY_BYTES // 8)
    timed_loop(core, out, stop, buffer.sum, MEMORY_EVERY_S)


def decoding_stretch(requests: list[Any]) -> tuple[float, float]:
    """From the last stream's first token to the first stream's end: every stream decoding."""
    ok = [r for r in requests if r.ok and r.ttft_s is not None]
    return max(r.start_s + r.ttft_s for r in ok), min(r.end_s for r in ok)


def main(runs: int, memory: bool = True) -> list[dict[str, Any]]:
    space = load_space(ROOT / "spaces" / "smollm2-cpu.yaml")
    default = default_params(space)
    tmp = Path(tempfile.mkdtemp())
    stop = mp.Event()
    kinds = [(probe, 0), (probe, 1)] + ([(memory_probe, 1)] if memory else [])
    files = [str(tmp / f"probe{k}.json") for k in range(len(kinds))]
    probes = [mp.Process(target=target, args=(core, f, stop)) for (target, core), f in zip(kinds, files, strict=True)]
    runs_seen: list[dict[str, Any]] = []
    with Session(keep_server=True) as session:
        request = request_for(space, default, tmp, fresh=True)
        session.run(request, [WorkloadSpec("w", STREAMS, max_tokens=128)], ONE_RUN)  # warm-up
        request = request_for(space, default, tmp, fresh=False)
        for p in probes:
            p.start()
        for i in range(runs):
            s = session.run(request, [WorkloadSpec("w", STREAMS, max_tokens=128)], ONE_RUN).workloads["w"].samples[0]
            t0, t1 = decoding_stretch(s.requests)
            runs_seen.append({"i": i, "t0": t0, "t1": t1, "dec": s.metrics.get("decode_tok_s", 0.0),
                              "window_s": s.metrics.get("window_s", 0.0)})
            print(i, round(runs_seen[-1]["dec"], 1), flush=True)
    stop.set()
    for p in probes:
        p.join(10)
    samples = [json.loads(Path(f).read_text()) for f in files]
    rows = []
    for r in runs_seen:
        row = {k: round(v, 4) for k, v in r.items()}
        for k, probe_rows in enumerate(samples):
            inside = [d for t, d in probe_rows if r["t0"] <= t <= r["t1"]]
            row[f"probe{k}_ms"] = round(1000 * statistics.mean(inside), 4) if inside else None
            row[f"probe{k}_n"] = len(inside)
        rows.append(row)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=int)
    parser.add_argument("rows", nargs="?", default="rows.json", help="file name beside this module")
    parser.add_argument("--no-memory", action="store_true", help="the two integer-loop probes only")
    args = parser.parse_args()
    result = main(args.runs, memory=not args.no_memory)
    (Path(__file__).parent / args.rows).write_text(json.dumps(result) + "\n")
