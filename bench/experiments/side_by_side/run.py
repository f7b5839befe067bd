"""How noisy is the side-by-side design (search/regress/side_by_side.py) beside fresh starts in turns?

An A/A of bench/tables/calibrate-cpu.yaml's config (llama-server `-t 1 -np 1`, SmolLM2-135M Q4_1, one stream of
128 output tokens, 3 measured runs a start after its warm-ups), measured two ways in one hour, the designs
alternating in segments of `--segment` pairs (fresh, side-by-side, side-by-side, fresh, ...) so that both meet
the same host:
- fresh: `search ab`'s rounds, A and B each started fresh every round, in turns ABBA (run_interleaved), unpinned;
- side-by-side: A and B started at once every round, each pinned to its own half of the CPUs (the default split),
  the halves swapped every round (run_side_by_side).
Both pair A's round r with B's and take the same measured runs a pair. Prints per design the spread of a pair's
log difference (the paired test's noise), its split (search/verdicts/paired_spread.py: per side, run to run,
between starts beyond the runs), the A/A verdict of all pairs and the change it could detect; writes every segment
to --out as it ends (resumable).

    flock /tmp/flagsearch-engines.lock .venv/bin/python -m bench.experiments.side_by_side.run --pairs 12
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bench.common import DATA, REPO, loadavg, now
from bench.experiments.shared_server.run import design_rows
from harness.host.hostload import host_speed_note, load_note
from search.regress.ab import ABRun, run_interleaved, subject_from
from search.regress.side_by_side import plan_placement, run_side_by_side
from search.regress.sides import resolve_source
from search.store.results import write_json_atomic
from search.study.scoring import measure_settings

SPACE = REPO / "bench" / "tables" / "calibrate-cpu.yaml"
METRIC = "single.decode_tok_s"
DESIGNS = ("fresh", "side-by-side")


def segment(space: Path, design: str, pairs: int, logs: Path) -> dict[str, Any]:
    """`pairs` rounds of one design, each side's runs grouped by start."""
    source = resolve_source(str(space), {})
    a = subject_from(source.space, source.config, "A")
    b = subject_from(source.space, source.config, "B")
    workloads = source.space.workload_specs(dict(a.request))
    settings = measure_settings(source.space, METRIC)
    run: ABRun
    if design == "side-by-side":
        placement = plan_placement(a, b)
        run = run_side_by_side(a, b, workloads, workloads, settings, pairs, logs, placement)
    else:
        run = run_interleaved(a, b, workloads, settings, pairs, logs)
    if run.errors:
        raise SystemExit(f"{design}: {run.errors}")
    return {"design": design, "a": run.a.runs[METRIC], "b": run.b.runs[METRIC], "order": run.order,
            "placement": run.placement, "starts": len({*run.a.log_paths, *run.b.log_paths}),
            "host_probe_ms": run.host_probe_ms, "load": run.load,
            "requests_a": sum(run.a.samples["single.requests"]), "requests_b": sum(run.b.samples["single.requests"])}


def summary(segments: list[dict[str, Any]]) -> str:
    lines = design_rows(segments, DESIGNS, between="between starts")
    notes = []
    for design in DESIGNS:
        segs = [s for s in segments if s["design"] == design]
        probes = [p for s in segs for p in s["host_probe_ms"]]
        load = [w for s in segs for w in s["load"]]
        notes += [f"{design}: {n}" for n in (host_speed_note(probes, load), load_note(load)) if n]
    return "\n".join(lines + [""] + [f"- {n}" for n in notes])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=12, help="pairs per design in all")
    ap.add_argument("--segment", type=int, default=4, help="pairs per segment (the designs alternate by segment)")
    ap.add_argument("--out", type=Path, default=DATA / f"side_by_side_aa_cpu_llama_{now()[:10].replace('-', '')}.json",
                    help="the results file (default: bench/data/side_by_side_aa_cpu_llama_DATE.json)")
    ap.add_argument("--report", action="store_true", help="only print the table of --out")
    ap.add_argument("--space", type=Path, default=SPACE, help="another space (default: calibrate-cpu.yaml)")
    ap.add_argument("--logs", type=Path, default=REPO / "results" / "side-by-side-logs")
    args = ap.parse_args()
    where = args.space.resolve()
    shown = where.relative_to(REPO) if where.is_relative_to(REPO) else where
    data: dict[str, Any] = (json.loads(args.out.read_text()) if args.out.exists() else
                            {"space": str(shown), "metric": METRIC, "started": now(), "segments": []})
    if not args.report:
        per_design = args.pairs // args.segment
        for n in range(len(data["segments"]), 2 * per_design):
            design = DESIGNS[n % 2] if (n // 2) % 2 == 0 else DESIGNS[1 - n % 2]  # fresh sbs sbs fresh ...
            t0 = time.monotonic()
            got = segment(args.space, design, args.segment, args.logs / f"{n:02d}-{design}")
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
