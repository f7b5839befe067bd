"""Does a host-speed probe taken during a run explain the run's throughput on a VM whose host
changes speed within seconds? One vLLM-CPU start of the demo's default config, then four-stream
128-token runs one after another; beside them, one probe process pinned to each core times a small
fixed piece of CPU work every 50 ms (~1% of a core). Per run: decode_tok_s, the stretch in which
every stream decoded, and each core's mean probe time inside it.

    python -m bench.experiments.host_covariate.measure RUNS

Rows: rows.json here; fit.py prints how much of the runs' spread the probe explains."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import default_params, request_for
from harness import MeasureSettings, Session
from harness.workloads import WorkloadSpec
from search.space import load_space

ROOT = Path(__file__).resolve().parents[3]
STREAMS = ("qa", "code", "json", "math")  # the demo's four_streams workload
ONE_RUN = MeasureSettings(repeats=1, warmup=False, request_timeout_s=120)
WORK = 20_000  # ~0.2-0.4 ms of CPU here
EVERY_S = 0.05


def probe(core: int, out: str, stop: Any) -> None:
    """Time WORK every EVERY_S on one core until stopped; (monotonic start, seconds) lines in `out`."""
    os.sched_setaffinity(0, {core})
    rows = []
    while not stop.is_set():
        t = time.monotonic()
        sum(range(WORK))
        rows.append((t, time.monotonic() - t))
        time.sleep(EVERY_S)
    Path(out).write_text(json.dumps(rows))


def decoding_stretch(requests: list[Any]) -> tuple[float, float]:
    """From the last stream's first token to the first stream's end: every stream decoding."""
    ok = [r for r in requests if r.ok and r.ttft_s is not None]
    return max(r.start_s + r.ttft_s for r in ok), min(r.end_s for r in ok)


def main(runs: int) -> list[dict[str, Any]]:
    space = load_space(ROOT / "spaces" / "smollm2-cpu.yaml")
    default = default_params(space)
    tmp = Path(tempfile.mkdtemp())
    stop = mp.Event()
    files = [str(tmp / f"probe{c}.json") for c in (0, 1)]
    probes = [mp.Process(target=probe, args=(c, f, stop)) for c, f in zip((0, 1), files, strict=True)]
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
        for core, probe_rows in enumerate(samples):
            inside = [d for t, d in probe_rows if r["t0"] <= t <= r["t1"]]
            row[f"probe{core}_ms"] = round(1000 * statistics.mean(inside), 4) if inside else None
            row[f"probe{core}_n"] = len(inside)
        rows.append(row)
    return rows


if __name__ == "__main__":
    result = main(int(sys.argv[1]))
    (Path(__file__).parent / "rows.json").write_text(json.dumps(result) + "\n")
