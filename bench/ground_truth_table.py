"""What every ground-truth table (bench/ground_truth_*.py) shares: the CSV layout, resuming, the
seeded config order, and one server start measured at every load level through flagsearch's own
harness (harness.session: start, measure, stop).

A table is every server config of a grid (`launch`: parameter -> values) x load levels (concurrency),
one CSV row per measured run: config columns, concurrency, start, repeat, output tok/s, TTFT, the
load average. A config whose server does not start gets one row with its failure cause. Rows are
appended config by config (a cut run leaves no half config) and configs already in the CSV are
skipped, so a table is measured in chunks (`--minutes`) under the measurement lock. Configs run in
a seeded random order, so that drifts of the machine's load spread over the table instead of
following one parameter. bench/replay.py reads these tables.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import itertools
import os
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.session import LaunchFailed, MeasureSettings, measure_running, start_config
from harness.steady import MeasurePolicy
from search.space import Config, Space
from search.study import free_port

MEASURE_COLUMNS = ["concurrency", "start", "repeat", "status", "failure", "output_tok_s", "ttft_p50_s",
                   "stream_tok_s", "errors", "excluded", "ready_s", "max_tokens", "loadavg_1m", "loadavg_5m",
                   "measured_at"]
WORKLOAD = "w"  # the one workload of a table's space; its concurrency is the load level
# The harness's measurement policy (harness/steady.py), kept short for a large table: at most one
# warmup run per start and one re-measurement of a stalled run per load level. Excluded (stalled)
# runs stay in the CSV with excluded=1; the replay leaves them out, as the harness does.
SHORT_POLICY = MeasurePolicy(max_warmups=1, max_remeasure=1)


@dataclass(frozen=True)
class Grid:
    """A table's server-side grid and load levels, and the space that launches and measures it."""

    space: Space
    engine: str
    model: str
    launch: dict[str, list[Any]]
    levels: list[int]
    policy: MeasurePolicy = SHORT_POLICY

    @property
    def columns(self) -> list[str]:
        return [*self.launch, *MEASURE_COLUMNS]

    def configs(self, seed: int) -> list[dict[str, Any]]:
        """Every server config, in a seeded random order."""
        configs = [dict(zip(self.launch, values, strict=True)) for values in itertools.product(*self.launch.values())]
        random.Random(seed).shuffle(configs)
        return configs

    def key(self, row: dict[str, Any]) -> tuple[str, ...]:
        return tuple(str(row[k]) for k in self.launch)


def request_params(levels: Sequence[int]) -> dict[str, Any]:
    """The space parameter that sets a table's load level (request side: no restart)."""
    return {"concurrency": {"type": "categorical", "choices": list(levels), "side": "request"}}


def done_keys(grid: Grid, path: Path, starts: int) -> set[tuple[str, ...]]:
    """Configs with every start finished (measured at every load level, or failed)."""
    if not path.exists():
        return set()
    seen: dict[tuple[str, ...], set[tuple[str, str]]] = {}
    failed: set[tuple[str, ...]] = set()
    with path.open() as f:
        for row in csv.DictReader(f):
            key = grid.key(row)
            if row["status"] == "failed":
                failed.add(key)
            seen.setdefault(key, set()).add((row["start"], row["concurrency"]))
    need = {(str(s), str(c)) for s in range(starts) for c in grid.levels}
    return failed | {k for k, v in seen.items() if need <= v}


def load() -> tuple[float, float]:
    one, five, _ = os.getloadavg()
    return round(one, 2), round(five, 2)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def measure_start(grid: Grid, values: dict[str, Any], start: int, repeats: int, max_tokens: int,
                  log_dir: Path, timeout_s: float) -> list[dict[str, Any]]:
    """One fresh server start of a config, measured at every load level: its rows."""
    config = Config(engine=grid.engine, model=grid.model, values=values)
    flags, env, _ = grid.space.split(config)
    base = {**values, "start": start, "max_tokens": max_tokens}
    try:
        running = start_config(grid.space.engine_settings(grid.engine), grid.space.model_choice(grid.model), flags,
                               env, free_port(), log_dir / "server.log")
    except LaunchFailed as exc:
        one, five = load()
        return [{**base, "concurrency": "", "repeat": "", "status": "failed", "failure": exc.cause,
                 "loadavg_1m": one, "loadavg_5m": five, "measured_at": now()}]
    rows: list[dict[str, Any]] = []
    try:
        for i, concurrency in enumerate(grid.levels):
            specs = grid.space.workload_specs({"concurrency": concurrency})
            # One warmup per start (the first level): later levels run on a warm server.
            settings = MeasureSettings(repeats, i == 0, timeout_s, grid.policy)
            results = measure_running(running, specs, settings)
            one, five = load()
            wm = results.get(WORKLOAD)
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


def add_arguments(parser: argparse.ArgumentParser, out: Path, minutes: float, repeats: int, max_tokens: int,
                  timeout_s: float) -> None:
    """The options every table script takes (defaults per table)."""
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--minutes", type=float, default=minutes, help="stop starting new configs after this")
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--starts", type=int, default=1, help="fresh starts per config")
    parser.add_argument("--max-tokens", type=int, default=max_tokens)
    parser.add_argument("--timeout", type=float, default=timeout_s, help="per request, seconds")
    parser.add_argument("--seed", type=int, default=0, help="order of the configs")
    parser.add_argument("--limit", type=int, default=None, help="measure at most this many configs")


def run_table(grid: Grid, args: argparse.Namespace) -> int:
    """Measure the configs not yet in args.out, in seeded order, until --minutes or --limit; returns
    how many are left."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = done_keys(grid, args.out, args.starts)
    todo = [c for c in grid.configs(args.seed) if grid.key(c) not in done]
    print(f"{len(done)} configs done, {len(todo)} to go; load average {load()[0]}", flush=True)
    deadline = time.monotonic() + args.minutes * 60
    new_file = not args.out.exists()
    measured = 0
    with args.out.open("a", newline="") as f, tempfile.TemporaryDirectory(prefix="gt-") as tmp:
        writer = csv.DictWriter(f, fieldnames=grid.columns, restval="")
        if new_file:
            writer.writeheader()
        for values in todo:
            if time.monotonic() > deadline or (args.limit is not None and measured >= args.limit):
                break
            t0 = time.monotonic()
            rows: list[dict[str, Any]] = []
            for start in range(args.starts):
                rows += measure_start(grid, values, start, args.repeats, args.max_tokens, Path(tmp), args.timeout)
                if rows and rows[-1]["status"] == "failed":
                    break
            writer.writerows(rows)  # a config's rows are written together: a cut run leaves no half config
            f.flush()
            measured += 1
            best = max((float(r["output_tok_s"]) for r in rows if r.get("output_tok_s", "") != ""), default=0.0)
            print(f"{' '.join(f'{k}={v}' for k, v in values.items())}: {rows[-1]['status']}"
                  f" best {best:.1f} tok/s, {time.monotonic() - t0:.0f} s, load {load()[0]}", flush=True)
    print(f"measured {measured} configs; {len(todo) - measured} left", flush=True)
    return len(todo) - measured
