"""Per-baseline history of gate results, change-point detection over it, and a trend plot.

Every `regress` and `nightly` result appends one row per gated metric to
FLAGSEARCH_HOME/history/<baseline>.jsonl (one JSON object a line: appends are atomic enough for a
single writer per baseline, and a lock keeps two writers apart). `search history` exports it as
CSV or Parquet and runs change-point detection over it.

Why change points: one A/B compares two builds measured in the same hour; a slow drift, 1% a
week, never fires the gate but adds up. PELT (from `ruptures`) over the candidate's medians (and
over the B/A ratio) finds where the level moved; a drift is flagged when the first and last
segments differ by at least the gate's minimum effect.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import itertools
import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness import flagsearch_home, secrets
from harness.files import load_jsonl
from search.store.results import ResultsError, format_version

COLUMNS = ("time", "baseline", "source", "candidate", "build", "metric", "verdict", "outcome", "median_a",
           "median_b", "ratio", "ci_low", "ci_high", "p_value", "n_a", "n_b", "loadavg_1m", "host")


def history_dir() -> Path:
    return Path(os.environ.get("FLAGSEARCH_HISTORY") or flagsearch_home.home() / "history")


def history_path(baseline: str, directory: Path | None = None) -> Path:
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in baseline)
    return (directory or history_dir()) / f"{safe}.jsonl"


def rows_from_report(report: dict[str, Any], baseline: str, source: str, candidate: str,
                     build: dict[str, Any] | None = None, host: str = "") -> list[dict[str, Any]]:
    """One history row per gated metric of a GateReport.to_dict()."""
    now = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
    load = os.getloadavg()[0]
    rows = []
    for v in report.get("verdicts", []):
        if not v.get("gated"):
            continue
        rows.append({"time": now, "baseline": baseline, "source": source, "candidate": candidate,
                     "build": json.dumps(build or {}, sort_keys=True, default=str), "metric": v["metric"],
                     "verdict": v["verdict"], "outcome": report.get("outcome"), "median_a": v.get("median_a"),
                     "median_b": v.get("median_b"), "ratio": v.get("ratio"), "ci_low": v.get("ci_low"),
                     "ci_high": v.get("ci_high"), "p_value": v.get("p_value"), "n_a": v.get("n_a"),
                     "n_b": v.get("n_b"), "loadavg_1m": round(load, 2), "host": host})
    return rows


# Each row carries its format ("name/N"); rows without one are version 1 (none were written
# before the format was versioned). A reader loads every earlier version and refuses newer rows.
FORMAT_NAME = "flagsearch-history"
FORMAT_VERSION = 1


def _finite(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def append(rows: Sequence[dict[str, Any]], baseline: str, directory: Path | None = None) -> Path:
    path = history_path(baseline, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        for row in rows:
            clean = secrets.scrub({k: _finite(row.get(k)) for k in COLUMNS})  # a build's env may hold a token
            fh.write(json.dumps({"format": f"{FORMAT_NAME}/{FORMAT_VERSION}", **clean}, default=str) + "\n")
        fh.flush()
        fcntl.flock(fh, fcntl.LOCK_UN)
    return path


def load(baseline: str, directory: Path | None = None) -> list[dict[str, Any]]:
    path = history_path(baseline, directory)
    if not path.exists():
        return []
    rows = []
    for n, row in enumerate(load_jsonl(path), 1):  # bounded; a bad line names the file and line
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: expected a JSON object a line")
        try:
            format_version(row.pop("format", None), FORMAT_NAME, FORMAT_VERSION, f"{path}:{n}", missing=1)
        except ResultsError as exc:
            raise ValueError(str(exc)) from None
        rows.append(row)
    return rows


def export(rows: Sequence[dict[str, Any]], out: Path) -> Path:
    """CSV or Parquet (by the file suffix)."""
    import pandas as pd

    frame = pd.DataFrame(list(rows), columns=list(COLUMNS))
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".parquet":
        try:
            frame.to_parquet(out, index=False)
        except ImportError as exc:
            raise ValueError(f"Parquet export needs pyarrow ({exc}); write .csv instead") from None
    elif out.suffix == ".csv":
        frame.to_csv(out, index=False)
    else:
        raise ValueError(f"{out}: export to .csv or .parquet")
    return out


# ---- change points ---------------------------------------------------------------------------------

@dataclass
class Drift:
    metric: str
    series: str  # "median_b" (the candidate's level) or "ratio" (B/A)
    n: int
    change_points: list[int]  # indices where a new segment starts
    segment_means: list[float]
    change_pct: float  # last segment vs first, in percent
    flagged: bool

    def describe(self) -> str:
        where = ", ".join(str(i) for i in self.change_points) or "none"
        word = "DRIFT" if self.flagged else "stable"
        return (f"{self.metric} ({self.series}): {word}: {len(self.segment_means)} segment(s), change points at "
                f"run(s) {where}; last vs first segment {self.change_pct:+.1f}% over {self.n} runs")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def change_points(values: Sequence[float], min_size: int = 2, penalty: float | None = None) -> list[int]:
    """Indices where the level changes (PELT, L2 cost). The default penalty is BIC-like on a noise
    estimate from successive differences, which a slow trend barely inflates."""
    import ruptures

    y = np.asarray([v for v in values], dtype=float)
    if y.size < 2 * min_size:
        return []
    if penalty is None:
        diffs = np.diff(y)
        sigma = float(np.median(np.abs(diffs - np.median(diffs)))) * 1.4826 / math.sqrt(2)
        sigma = sigma or float(np.std(y)) or 1e-12
        penalty = 2.0 * math.log(y.size) * sigma**2 * 2
    algo = ruptures.Pelt(model="l2", min_size=min_size, jump=1).fit(y.reshape(-1, 1))
    ends = algo.predict(pen=penalty)
    return [int(e) for e in ends[:-1]]


SENTINEL_SOURCE = "nightly-sentinel"  # the nightly's A/A: the baseline's build on both sides, not a candidate


def detect_drift(rows: Sequence[dict[str, Any]], min_effect: float = 0.03, series: str = "median_b",
                 min_runs: int = 6) -> list[Drift]:
    """Change points per gated metric over the history (oldest first). The A/A sentinel's rows are left out: their
    B is the baseline's own build, so among the candidates' nights they would pull a real drift back."""
    out = []
    for metric in sorted({r["metric"] for r in rows}):
        vals = [float(r[series]) for r in rows if r["metric"] == metric and r.get(series) is not None
                and math.isfinite(float(r[series])) and r.get("source") != SENTINEL_SOURCE]
        if len(vals) < min_runs:
            continue
        cps = change_points(vals)
        bounds = [0, *cps, len(vals)]
        means = [float(np.mean(vals[a:b])) for a, b in itertools.pairwise(bounds)]
        change = 100.0 * (means[-1] / means[0] - 1.0) if means[0] else 0.0
        out.append(Drift(metric, series, len(vals), cps, means, change,
                         flagged=bool(cps) and abs(change) >= 100 * min_effect))
    return out


# ---- the trend plot ------------------------------------------------------------------------------------

def plot_trend(labels: Sequence[str], values: Sequence[float], lows: Sequence[float], highs: Sequence[float],
               out: Path, title: str, ylabel: str, change_points_at: Sequence[int] = (),
               reference: float | None = None) -> Path:
    """Points with CI bars over runs (or releases), change points as dashed lines. PNG or SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.arange(len(values))
    v = np.asarray(values, dtype=float)
    lo = np.clip(v - np.asarray(lows, dtype=float), 0, None)
    hi = np.clip(np.asarray(highs, dtype=float) - v, 0, None)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(values) + 2), 3.4), dpi=110)
    ax.errorbar(x, v, yerr=[lo, hi], fmt="o-", capsize=4, lw=1.2, color="#1f5fa8")
    if reference is not None:
        ax.axhline(reference, color="grey", lw=0.8, ls=":")
    for cp in change_points_at:
        ax.axvline(cp - 0.5, color="#c0392b", ls="--", lw=1)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=30 if max((len(s) for s in labels), default=0) > 8 else 0, ha="right"
                       if max((len(s) for s in labels), default=0) > 8 else "center", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_history(rows: Sequence[dict[str, Any]], metric: str, out: Path) -> Path:
    """The B/A ratio of one metric over a baseline's history, with its CIs and change points."""
    sel = [r for r in rows if r["metric"] == metric and r.get("ratio") is not None]
    if not sel:
        raise ValueError(f"no history rows for {metric}")
    pct = [100 * (float(r["ratio"]) - 1) for r in sel]
    lows = [100 * (float(r["ci_low"]) - 1) if r.get("ci_low") is not None else p for r, p in zip(sel, pct,
                                                                                                   strict=True)]
    highs = [100 * (float(r["ci_high"]) - 1) if r.get("ci_high") is not None else p for r, p in zip(sel, pct,
                                                                                                      strict=True)]
    labels = [str(r["time"])[5:16].replace("T", " ") for r in sel]
    cps = change_points([float(r["median_b"]) for r in sel if r.get("median_b") is not None])
    return plot_trend(labels, pct, lows, highs, out, f"{sel[0]['baseline']}: {metric}, candidate vs baseline",
                      "change B/A, % (95% CI)", cps, reference=0.0)


def record(report: dict[str, Any], baseline: str, source: str, candidate: str, build: dict[str, Any] | None,
           directory: Path | None = None) -> Path | None:
    """Append a regress/nightly GateReport (as a dict) to the baseline's history."""
    from harness.host.fingerprint import host_fingerprint

    rows = rows_from_report(report, baseline, source, candidate, build, str(host_fingerprint().get("host", "")))
    return append(rows, baseline, directory) if rows else None
