"""Ground-truth table of a space: every server config of its grid x every load level, measured for
real through the product's door (harness.Session.run, as `search run` measures a trial), with
fresh starts and repeats. bench.replay replays searches over the table.

    flock /tmp/flagsearch-measure.lock .venv/bin/python -m bench.ground_truth run bench/tables/cpu-llamacpp.yaml
    .venv/bin/python -m bench.ground_truth show bench/data/cpu_llamacpp_smollm2.csv

A table space (bench/tables/*.yaml) is an ordinary space file with one engine and one model: its
launch-side params' choices (categorical, bool, fixed; `when:` respected) are the grid, its
request-side params (`side: request`, e.g. concurrency) the load levels every start is measured at, its
`measure:` section the repeats, warmup, timeout and stall policy. Output: one CSV row per measured
run (config columns, the workload when the space has several, the load columns, start, repeat,
output tok/s end to end, decode tok/s of the steady window, TTFT, the load average); a config whose
server does not start, or dies, gets one row with its failure cause. Rows are appended config by
config (a cut run leaves no half config) and configs already in the CSV are skipped, so a table is
measured in chunks (`--minutes`) under the measurement lock. Configs run in a seeded random order,
so that drifts of the machine's load spread over the table instead of following one parameter.

`show` prints a table as Markdown (median tok/s (min-max) and TTFT per config and load level); it
also reads the GPU table measured on the H100 by the earlier self-contained tool (columns `config`,
`load`, `tok_s`: bench/data/gpu_llamacpp_h100.csv, docs/gpu-llamacpp.md).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from bench.common import DATA, loadavg, now, run_config
from bench.replay import table_metric
from harness import LaunchFailed, Session, TrialFailed
from search.space.schema import BoolParam, CategoricalParam, FixedParam
from search.space.space import Space, load_space

MEASURE_COLUMNS = ["start", "repeat", "status", "failure", "output_tok_s", "decode_tok_s", "ttft_p50_s", "stream_tok_s",
                   "errors",
                   "excluded", "ready_s", "max_tokens", "loadavg_1m", "loadavg_5m", "measured_at"]


@dataclass(frozen=True)
class Grid:
    """A table space's server configs and load points."""

    space: Space

    def __post_init__(self) -> None:
        if len(self.space.m.engines) != 1 or len(self.space.m.models) != 1:
            raise SystemExit(f"{self.space.source}: a table space has one engine and one model")

    @property
    def launch(self) -> dict[str, list[Any]]:
        """Each launch-side param's values (a range has none: give it `choices`)."""
        out: dict[str, list[Any]] = {}
        for name, p in self.space.m.params.items():
            if p.side == "request":
                continue
            if isinstance(p, CategoricalParam):
                out[name] = list(p.choices)
            elif isinstance(p, BoolParam):
                out[name] = [True, False]
            elif not isinstance(p, FixedParam):
                raise SystemExit(f"{self.space.source}: params.{name}: a table needs choices, not a range")
        return out

    @property
    def request(self) -> list[str]:
        return [n for n, p in self.space.m.params.items() if p.side == "request"]

    @property
    def columns(self) -> list[str]:
        several = ["workload"] if len(self.space.m.workloads) > 1 else []
        return [*self.launch, *several, *self.request, *MEASURE_COLUMNS]

    def configs(self, seed: int) -> list[dict[str, Any]]:
        """Every server config once (a param inactive under `when:` left out), in a seeded random order."""
        seen: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        for combo in itertools.product(*self.launch.values()):
            values = self.space.sample(optuna.trial.FixedTrial(dict(zip(self.launch, combo, strict=True)))).values
            values = {k: v for k, v in values.items() if k in self.launch}
            seen.setdefault(self.key(values), values)
        configs = list(seen.values())
        random.Random(seed).shuffle(configs)
        return configs

    def key(self, row: dict[str, Any]) -> tuple[tuple[str, str], ...]:
        return tuple((k, str(row[k])) for k in self.launch if row.get(k, "") != "")

    def points(self) -> list[tuple[str, dict[str, Any]]]:
        """(measured workload name, its row columns) in the order run_config measures them."""
        out = []
        for point in self.space.load_points():
            label = ",".join(f"{k}={v}" for k, v in point.items())
            for spec in self.space.workload_specs(point):
                cols = {**({"workload": spec.name} if len(self.space.m.workloads) > 1 else {}), **point,
                        "max_tokens": spec.max_tokens}
                out.append((f"{spec.name}@{label}" if point else spec.name, cols))
        return out


def done_keys(grid: Grid, path: Path, starts: int) -> set[tuple[tuple[str, str], ...]]:
    """Configs with every start finished (measured at every load point, or failed)."""
    if not path.exists():
        return set()
    seen: dict[tuple[tuple[str, str], ...], set[str]] = {}
    failed: set[tuple[tuple[str, str], ...]] = set()
    with path.open() as f:
        for row in csv.DictReader(f):
            key = grid.key(row)
            if row["status"] == "failed":
                failed.add(key)
            else:
                seen.setdefault(key, set()).add(row["start"])
    need = {str(s) for s in range(starts)}
    return failed | {k for k, v in seen.items() if need <= v}


def measure_start(grid: Grid, session: Session, values: dict[str, Any], start: int,
                  log_dir: Path) -> list[dict[str, Any]]:
    """One fresh server start of a config, measured at every load point: its rows."""
    base = {**values, "start": start}
    try:
        measured = run_config(session, grid.space, values, log_dir)
    except (LaunchFailed, TrialFailed) as exc:
        one, five = loadavg()
        return [{**base, "status": "failed", "failure": exc.cause, "loadavg_1m": one, "loadavg_5m": five,
                 "measured_at": now()}]
    rows: list[dict[str, Any]] = []
    one, five = loadavg()
    for name, cols in grid.points():
        wm = measured.workloads[name]
        for sample in wm.samples:
            if sample.repeat < 0:
                continue
            m = sample.metrics
            rows.append({**base, **cols, "repeat": sample.repeat, "status": "errors" if m.get("errors") else "ok",
                         "failure": "", "output_tok_s": _round(m.get("output_tok_s"), 3),
                         "decode_tok_s": _round(m.get("decode_tok_s"), 3),
                         "ttft_p50_s": _round(m.get("ttft_p50_s"), 4), "stream_tok_s": _round(m.get("stream_tok_s"), 3),
                         "errors": int(m.get("errors", 0)), "excluded": int(sample.excluded),
                         "ready_s": round(measured.ready_s, 3), "loadavg_1m": one, "loadavg_5m": five,
                         "measured_at": now()})
    return rows


def _round(value: float | None, digits: int) -> float | str:
    return "" if value is None else round(value, digits)


def run_table(grid: Grid, out: Path, minutes: float, starts: int, seed: int, limit: int | None) -> int:
    """Measure the configs not yet in `out`, in seeded order, until `minutes` or `limit`; returns
    how many are left."""
    out.parent.mkdir(parents=True, exist_ok=True)
    done = done_keys(grid, out, starts)
    todo = [c for c in grid.configs(seed) if grid.key(c) not in done]
    print(f"{len(done)} configs done, {len(todo)} to go; load average {loadavg()[0]}", flush=True)
    deadline = time.monotonic() + minutes * 60
    new_file = not out.exists()
    measured = 0
    # keep_server=False: every start is fresh and stopped after its load points
    with out.open("a", newline="") as f, tempfile.TemporaryDirectory(prefix="gt-") as tmp, \
            Session(keep_server=False) as session:
        writer = csv.DictWriter(f, fieldnames=grid.columns, restval="", extrasaction="ignore")
        if new_file:
            writer.writeheader()
        for values in todo:
            if time.monotonic() > deadline or (limit is not None and measured >= limit):
                break
            t0 = time.monotonic()
            rows: list[dict[str, Any]] = []
            for start in range(starts):
                rows += measure_start(grid, session, values, start, Path(tmp))
                if rows and rows[-1]["status"] == "failed":
                    break
            writer.writerows(rows)  # a config's rows are written together: a cut run leaves no half config
            f.flush()
            measured += 1
            best = max((float(r["output_tok_s"]) for r in rows if r.get("output_tok_s", "") != ""), default=0.0)
            print(f"{' '.join(f'{k}={v}' for k, v in values.items())}: {rows[-1]['status']}"
                  f" best {best:.1f} tok/s, {time.monotonic() - t0:.0f} s, load {loadavg()[0]}", flush=True)
    print(f"measured {measured} configs; {len(todo) - measured} left", flush=True)
    return len(todo) - measured


def show(path: Path) -> str:
    """Markdown: per config, median tok/s (min-max), n and median TTFT at each load level; best first."""
    with path.open() as f:
        rows = list(csv.DictReader(f))
    old = "tok_s" in rows[0]  # the H100 table's own columns
    metric, ttft_col, level_col = ("tok_s", "ttft_s", "load") if old else (table_metric(rows), "ttft_p50_s",
                                                                          "concurrency")
    params = [] if old else [c for c in rows[0] if c not in MEASURE_COLUMNS and c not in (level_col, "workload")]
    name = (lambda r: r["config"]) if old else (lambda r: " ".join(f"{p}={r[p]}" for p in params if r[p] != ""))
    cells: dict[tuple[str, str], list[float]] = {}
    ttft: dict[tuple[str, str], list[float]] = {}
    failed: dict[str, str] = {}
    order: list[str] = []
    for r in rows:
        cfg = name(r)
        if cfg not in order:
            order.append(cfg)
        if r["status"] == "failed":
            failed[cfg] = r["note"] if old else r["failure"]
        elif r["status"] == "ok" and r.get("excluded", "0") != "1" and r[metric] != "":
            cells.setdefault((cfg, r[level_col]), []).append(float(r[metric]))
            if r[ttft_col] != "":
                ttft.setdefault((cfg, r[level_col]), []).append(float(r[ttft_col]))
    levels = sorted({lv for _, lv in cells}, key=float)
    cards = sorted({r["card"] for r in rows}) if old else [f"{path.name}"]
    head = "| config | " + " | ".join(f"{lv} stream{'s' if lv != '1' else ''} tok/s | n | TTFT ms" for lv in levels)
    lines = [f"Card: {', '.join(cards)}; {len(rows)} rows. Cells: median tok/s over all runs of all starts "
             "(min-max), n runs." if old else f"{path.name}: {len(rows)} rows. Cells: median tok/s over all runs "
             "of all starts (min-max), n runs.", "", head + " |", "|---" * (1 + 3 * len(levels)) + "|"]
    first = levels[0] if levels else "1"
    for cfg in sorted(order, key=lambda c: -statistics.median(cells.get((c, first), [0.0]))):
        if cfg in failed and (cfg, first) not in cells:
            lines.append(f"| {cfg} | failed: {failed[cfg][:60]} |" + " |" * (3 * len(levels) - 1))
            continue
        parts = []
        for lv in levels:
            v, t = cells.get((cfg, lv), []), ttft.get((cfg, lv), [])
            parts += ([f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})", str(len(v)),
                       f"{1e3 * statistics.median(t):.1f}" if t else "-"] if v else ["-", "0", "-"])
        lines.append(f"| {cfg} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ground_truth", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure a table space's configs not yet in its CSV")
    r.add_argument("space", type=Path, help="a table space (bench/tables/*.yaml)")
    r.add_argument("--out", type=Path, help="CSV (default bench/data/<space name>.csv)")
    r.add_argument("--minutes", type=float, default=15.0, help="start no new config after this")
    r.add_argument("--starts", type=int, default=1, help="fresh starts per config")
    r.add_argument("--seed", type=int, default=0, help="order of the configs")
    r.add_argument("--limit", type=int, default=None, help="measure at most this many configs")
    s = sub.add_parser("show", help="a table as Markdown")
    s.add_argument("csv", type=Path)
    a = p.parse_args(argv)
    if a.cmd == "show":
        print(show(a.csv))
        return 0
    grid = Grid(load_space(a.space))
    run_table(grid, a.out or DATA / f"{grid.space.name}.csv", a.minutes, a.starts, a.seed, a.limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
