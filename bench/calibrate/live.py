"""Live calibration: independent repetitions of `search ab` itself (search.regress.ab.run_interleaved with
its sequential stop rule: fresh starts, ABBA order, every run through harness.Session.run) for
pairs of arms of one config. Each repetition is one verdict exactly as `search ab` gives it; a
measure file keeps every repetition's rounds (all runs of every start) for the analysis.

Arms: `A` and `A2` are the pinned config (A/A); `T5`/`T10`/`T20` run it under harness/launch/throttle.py
(frozen for that share of every 100 ms: a CPU quota without cgroups), `S5`/`S10`/`S20` under its
`--stretch` proxy (every response byte delivered later: a load-independent slowdown);
`set:k=v,k2=v2` is another config of the space (e.g. on a GPU, `set:cache_type_k=q8_0`).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, measure_settings
from harness.launch.cpus import format_cpu_list
from search.regress.ab import SequentialPlan, Subject, report_from_run, run_interleaved, sequential_stop, subject_from
from search.regress.baseline import config_params, parse_assignments, pinned_space, raw_space_doc
from search.space.space import load_space
from search.store.results import write_json_atomic

THROTTLES = {"T5": 0.05, "T10": 0.10, "T20": 0.20}
STRETCHES = {"S5": 0.05, "S10": 0.10, "S20": 0.20}
DEFAULT_SPACE = REPO / "bench" / "tables" / "calibrate-cpu.yaml"


def subjects(space_path: Path, sets: dict[str, Any], names: set[str]) -> dict[str, Subject]:
    """The arms asked for, as search.regress.ab subjects of the pinned config."""
    space = load_space(space_path)
    raw = raw_space_doc(space_path)
    base = config_params(space, sets)
    pinned, config = pinned_space(raw, base, str(space_path))
    engine_cmd = shlex.join(pinned.engine_settings(config.engine).command)
    out: dict[str, Subject] = {}
    for name in sorted(names):
        if name in ("A", "A2"):
            out[name] = subject_from(pinned, config, name)
        elif name in THROTTLES or name in STRETCHES:
            fraction = THROTTLES.get(name) or STRETCHES[name]
            stretch = " --stretch" if name in STRETCHES else ""
            # A pinned server (engine option `cpus`) keeps its cores; the relay moves to this process's own.
            relay = ""
            if pinned.engine_settings(config.engine).cpus:
                relay = f" --relay-cpus {format_cpu_list(os.sched_getaffinity(0))}"
            command = (f"{shlex.quote(sys.executable)} -m harness.launch.throttle {fraction}{stretch}{relay}"
                       f" -- {engine_cmd}")
            out[name] = subject_from(pinned, config, name, command=command)
        elif name.startswith("set:"):
            other = config_params(space, {**sets, **parse_assignments(name[4:].split(","))})
            p_space, p_config = pinned_space(raw, other, str(space_path))
            out[name] = subject_from(p_space, p_config, name)
        else:
            raise SystemExit(f"unknown arm {name!r} (A, A2, {', '.join([*THROTTLES, *STRETCHES])}, set:k=v,...)")
    return out


def measure(out: Path, space_path: Path, sets: dict[str, Any], pairs: list[tuple[str, str]], metric: str,
            reps: int, cap: int, minutes: float, boundary: str = "pocock", sides: int = 2) -> dict[str, Any]:
    """`reps` repetitions of every pair (pairs interleaved, so drift spreads over them), until
    `minutes`; the file is rewritten after every repetition (an interruption keeps what was measured).
    `sides` 1 judges as `search regress` does ("is B worse?"), 2 as `search ab`."""
    arms = subjects(space_path, sets, {x for pair in pairs for x in pair})
    space = load_space(space_path)
    workload = metric.split(".", 1)[0]
    workloads = [w for w in space.curve_specs() if w.name == workload]
    if not workloads:
        raise SystemExit(f"{space_path}: no workload {workload!r} (the metric's prefix)")
    settings = measure_settings(space)
    plan = SequentialPlan((metric,), max_rounds=cap, boundary=boundary, sides=sides)
    data: dict[str, Any] = {"format": "live-ab", "space": str(space_path), "params": sets, "metric": metric,
                            "cap": cap, "min_effect": plan.min_effect, "alpha": plan.alpha, "boundary": boundary,
                            "sides": sides,
                            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            "command": " ".join(sys.argv), "reps": []}
    logs = REPO / "results" / "calibration-logs" / out.stem  # server logs: not data to commit
    t0 = time.monotonic()
    for rep in range(reps):
        for a, b in pairs:
            if time.monotonic() - t0 > minutes * 60:
                return data
            started, load = time.monotonic(), os.getloadavg()[0]
            run = run_interleaved(arms[a], arms[b], workloads, settings, cap, logs / f"{rep:03d}-{a}-{b}",
                                  stop=sequential_stop(plan))
            report = report_from_run(run, f"{a} vs {b}", [metric], plan.min_effect, plan.alpha, sides=sides)
            verdict = next(v for v in report.verdicts if v.metric == metric)
            data["reps"].append({"rep": rep, "a": a, "b": b, "verdict": verdict.verdict,
                                 "change_pct": verdict.change_pct, "rounds": run.rounds_done,
                                 "seconds": round(time.monotonic() - started, 1), "load1": load,
                                 "errors": run.errors, "run": run.to_dict()})
            write_json_atomic(out, data)
            print(f"rep {rep + 1} {a} vs {b}: {verdict.verdict} ({verdict.change_pct:+.1f}%) after "
                  f"{run.rounds_done} rounds, {time.monotonic() - started:.0f} s, load {load:.1f}", flush=True)
    return data

