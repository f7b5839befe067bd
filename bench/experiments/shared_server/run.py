"""How much noise does the shared-server design (search/regress/shared_server.py) take out of a request-side A/B?

An A/A on a request-side parameter (max_tokens 64 on both sides, space.yaml: llama-server, SmolLM2, `-t 1`, one
stream, 3 measured runs after one warm-up per start or block), measured two ways in one hour, the designs
alternating in segments of `--segment` pairs so that both meet the same host:
- fresh: `search ab`'s rounds, each side started fresh every round (search.regress.ab.run_interleaved);
- shared: one server for the segment, A's and B's runs alternating on it, 3 consecutive runs of a side a block
  (search.regress.shared_server.run_shared; only each side's first run warms up).
Both designs pair A's round (block) r with B's and take the same number of measured runs a pair. The first form of
the shared design (blocks of 3 runs alternating, a warm-up each) is in bench/data/
shared_server_aa_cpu_llama_20261202_blocks.json (`--report --out` that file shows it). Prints per
design the spread of a pair's log difference (what the paired test's noise is), its split (search/verdicts/
paired_spread.py: per side, run to run, between starts or blocks beyond the runs), the A/A verdict of all pairs
and the change it could detect; writes every run to --out (resumable: segments done are kept).

    flock /tmp/flagsearch-engines.lock .venv/bin/python -m bench.experiments.shared_server.run --pairs 12
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import DATA, REPO, loadavg, now
from harness.host.hostload import host_speed_note, load_note
from search.regress.ab import run_interleaved, subject_from
from search.regress.shared_server import run_shared
from search.regress.sides import resolve_source
from search.store.results import write_json_atomic
from search.study.scoring import measure_settings
from search.verdicts.paired_spread import paired_spread
from search.verdicts.sequential import compare_paired, paired_logs

HERE = Path(__file__).parent
SPACE = HERE / "space.yaml"
METRIC = "single.decode_tok_s"
DESIGNS = ("fresh", "shared")
SHOWN = ("fresh", "shared", "shared-blocks")  # shared-blocks: the first form, blocks of runs alternating (JSON only)


def segment(space: Path, design: str, pairs: int, logs: Path) -> dict[str, Any]:
    """`pairs` rounds of one design: each side's runs grouped by start (fresh) or block (shared)."""
    source = resolve_source(str(space), {"max_tokens": 64})
    a = subject_from(source.space, source.config, "A")
    b = subject_from(source.space, source.config, "B")
    workloads = source.space.workload_specs(dict(a.request))
    settings = measure_settings(source.space, METRIC)
    if design == "shared":
        run = run_shared(a, b, workloads, workloads, settings, pairs, logs)
    else:
        run = run_interleaved(a, b, workloads, settings, pairs, logs)
    if run.errors:
        raise SystemExit(f"{design}: {run.errors}")
    return {"design": design, "a": run.a.runs[METRIC], "b": run.b.runs[METRIC], "order": run.order,
            "starts": len({*run.a.log_paths, *run.b.log_paths}), "host_probe_ms": run.host_probe_ms,
            "load": run.load, "requests_a": sum(run.a.samples["single.requests"]),
            "requests_b": sum(run.b.samples["single.requests"])}


def pct(x: float) -> str:
    return f"{100 * x:.2f}%" if math.isfinite(x) else "-"


def design_rows(segments: list[dict[str, Any]], designs: tuple[str, ...],
                between: str = "between starts/blocks") -> list[str]:
    """The A/A table of measured designs, one row each: pairs, starts, runs, the pair difference's SD and its
    parts (search/verdicts/paired_spread.py), mean B/A and the paired test's verdict. Shared with
    bench/experiments/side_by_side."""
    lines = ["| design | pairs | starts | runs a side (requests, warm-ups in) | pair difference SD | per side | "
             f"run to run | {between} | mean B/A | A/A verdict (could detect) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for design in designs:
        segs = [s for s in segments if s["design"] == design]
        runs_a = [r for s in segs for r in s["a"]]
        runs_b = [r for s in segs for r in s["b"]]
        if len(runs_a) < 2:
            continue
        pairs = paired_logs(runs_a, runs_b)
        la, lb = [p[0] for p in pairs], [p[1] for p in pairs]
        diffs = np.subtract(lb, la)
        parts = paired_spread(la, lb, runs_a, runs_b)
        v = compare_paired(METRIC, runs_a, runs_b)
        requests = sum(s["requests_a"] for s in segs)
        runs = sum(len(r) for r in runs_a)
        lines.append(f"| {design} | {len(pairs)} | {sum(s['starts'] for s in segs)} | {runs} ({requests:.0f}) | "
                     f"{pct(float(np.std(diffs, ddof=1)))} | {pct(parts.per_start)} | {pct(parts.within)} | "
                     f"{pct(parts.between)} | {math.exp(float(np.mean(diffs))):.3f} | {v.verdict} "
                     f"({pct(v.mde)}) |")
    return lines


def summary(segments: list[dict[str, Any]]) -> str:
    lines = design_rows(segments, SHOWN)
    probes = [p for s in segments for p in s["host_probe_ms"]]
    load = [w for s in segments for w in s["load"]]
    notes = [n for n in (host_speed_note(probes, load), load_note(load)) if n]
    return "\n".join(lines + [""] + [f"- {n}" for n in notes])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=12, help="pairs per design in all")
    ap.add_argument("--segment", type=int, default=4, help="pairs per segment (the designs alternate by segment)")
    ap.add_argument("--out", type=Path, default=DATA / f"shared_server_aa_cpu_llama_{now()[:10].replace('-', '')}.json",
                    help="the results file (default: bench/data/shared_server_aa_cpu_llama_DATE.json)")
    ap.add_argument("--report", action="store_true", help="only print the table of --out")
    ap.add_argument("--space", type=Path, default=SPACE, help="another build of space.yaml (device.sh: a pinned "
                                                              "server on the GPU machine's CPU)")
    ap.add_argument("--logs", type=Path, default=REPO / "results" / "shared-server-logs")
    args = ap.parse_args()
    where = args.space.resolve()
    shown = where.relative_to(REPO) if where.is_relative_to(REPO) else where
    data: dict[str, Any] = (json.loads(args.out.read_text()) if args.out.exists() else
                            {"space": str(shown), "metric": METRIC, "started": now(), "segments": []})
    if not args.report:
        logs = args.logs
        per_design = args.pairs // args.segment
        for n in range(len(data["segments"]), 2 * per_design):
            design = DESIGNS[n % 2] if (n // 2) % 2 == 0 else DESIGNS[1 - n % 2]  # fresh shared shared fresh ...
            t0 = time.monotonic()
            got = segment(args.space, design, args.segment, logs / f"{n:02d}-{design}")
            data["segments"].append({**got, "seconds": round(time.monotonic() - t0, 1), "at": now(),
                                     "loadavg": loadavg()})
            data["finished"] = now()
            write_json_atomic(args.out, data)
            print(f"segment {n + 1}/{2 * per_design} {design}: {got['starts']} starts, "
                  f"{time.monotonic() - t0:.0f} s, load {loadavg()}", flush=True)
    print(f"{data['space']}, {data['metric']}, {data['started']} .. {data.get('finished', '')}\n")
    print(summary(data["segments"]))


if __name__ == "__main__":
    main()
