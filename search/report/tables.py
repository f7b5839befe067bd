"""The report's pandas tables: one row per trial, per measured run, per request; CSV/Parquet export."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from search.report.data import ReportInput, ratio, shown_params, trial_note
from search.store.results import ResultsError
from search.store.summary import StudyView

REQUEST_COLUMNS = ("study", "trial", "trial_state", "workload", "concurrency", "repeat", "run_wall_s",
                   "request", "ok", "status", "error_kind", "error_body", "ttft_s", "tpot_s", "e2e_s",
                   "output_tokens", "prompt_tokens", "cached_prompt_tokens", "finish_reason", "start_s",
                   "end_s", "chunks", "chunk_gaps_s")
RUN_COLUMNS = ("study", "trial", "trial_state", "workload", "concurrency", "repeat", "wall_s",
               "errors_by_kind")
INTEGER_COLUMNS = ("trial", "repeat", "request", "status", "output_tokens", "prompt_tokens",
                   "cached_prompt_tokens", "concurrency", "chunks")


def trials_frame(view: StudyView) -> pd.DataFrame:
    """One row per trial: params, objectives, × default per objective, quality, errors, startup."""
    records = sorted(view.records, key=lambda r: r.number)
    params = shown_params(records)
    metrics = [m for m, _ in view.objectives]
    base = view.baseline
    rows = []
    for r in records:
        row: dict[str, Any] = {"trial": r.number, "state": r.state}
        for p in params:
            row[f"param.{p}"] = r.params.get(p)
        none: list[float | None] = [None] * len(metrics)
        values: list[float | None] = list(r.objective_values) if r.objective_values else none
        base_values: list[float | None] = list(base.objective_values) if base and base.objective_values else none
        for m, v, b in zip(metrics, values, base_values, strict=True):
            row[m] = v
            row[f"{m} ×default"] = ratio(v, b)
        row["feasible"] = StudyView.is_feasible(r)
        row["quality"] = r.metrics.get("quality.score")
        row["errors"] = r.metrics.get("errors")
        row["ready_s"] = r.ready_s
        row["reused_server"] = r.reused_server
        row["wall_s"] = r.wall_s
        row["failure_cause"] = r.failure.cause if r.failure else None
        row["note"] = trial_note(view, r)
        row["command"] = r.command
        rows.append(row)
    return pd.DataFrame(rows)


def _trial_columns(view: StudyView, number: int, state: str, params: dict[str, Any],
                   shown: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"study": view.name, "trial": number, "trial_state": state}
    for p in shown:
        out[f"param.{p}"] = params.get(p)
    return out


def _iter_runs(inp: ReportInput) -> Iterable[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(trial columns, workload measurement, run sample) for every measured run of every trial."""
    shown = shown_params(inp.view.records) if inp.view.records else []
    for number in sorted(inp.results):
        data = inp.results[number]
        cols = _trial_columns(inp.view, number, str(data.get("state")), data.get("params") or {}, shown)
        for wl in (data.get("workloads") or {}).values():
            for sample in wl.get("samples") or []:
                yield cols, wl, sample


def requests_frame(inp: ReportInput) -> pd.DataFrame:
    """Every raw sample: one row per request per repeat per workload per trial."""
    rows = []
    for cols, wl, sample in _iter_runs(inp):
        for i, req in enumerate(sample.get("requests") or []):
            gaps = list(req.get("chunk_gaps_s") or [])
            ttft, e2e, out_tokens = req.get("ttft_s"), req.get("e2e_s"), req.get("output_tokens")
            if e2e is None and req.get("end_s") is not None and req.get("start_s") is not None:
                e2e = req["end_s"] - req["start_s"]
            tpot = ((e2e - ttft) / (out_tokens - 1)
                    if ttft is not None and e2e is not None and out_tokens and out_tokens > 1 else None)
            row = {**cols, "workload": wl.get("name"), "concurrency": wl.get("concurrency"),
                   "repeat": sample.get("repeat"), "run_wall_s": sample.get("wall_s"), "request": i,
                   "ok": req.get("ok"), "status": req.get("status"), "error_kind": req.get("error_kind"),
                   "error_body": req.get("error_body"), "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e,
                   "output_tokens": out_tokens, "prompt_tokens": req.get("prompt_tokens"),
                   "cached_prompt_tokens": req.get("cached_prompt_tokens"),
                   "finish_reason": req.get("finish_reason"), "start_s": req.get("start_s"),
                   "end_s": req.get("end_s"), "chunks": len(gaps) + 1 if ttft is not None else 0,
                   "chunk_gaps_s": gaps}
            for k, v in (req.get("server_timings") or {}).items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    row[f"server_timings.{k}"] = v
            rows.append(row)
    return _tidy(pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(REQUEST_COLUMNS)))


def runs_frame(inp: ReportInput) -> pd.DataFrame:
    """One row per measured run (repeat) per workload per trial: run metrics and server counter deltas."""
    rows = []
    for cols, wl, sample in _iter_runs(inp):
        row = {**cols, "workload": wl.get("name"), "concurrency": wl.get("concurrency"),
               "repeat": sample.get("repeat"), "wall_s": sample.get("wall_s"),
               "errors_by_kind": json.dumps(sample.get("errors_by_kind") or {}, sort_keys=True)}
        row.update({f"metric.{k}": v for k, v in (sample.get("metrics") or {}).items()})
        row.update({f"server.{k}": v for k, v in (sample.get("server") or {}).items()})
        rows.append(row)
    return _tidy(pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(RUN_COLUMNS)))


def _tidy(df: pd.DataFrame) -> pd.DataFrame:
    """Types that survive Parquet: nullable integers, and one type per parameter column."""
    for col in INTEGER_COLUMNS:
        if col in df.columns:
            df[col] = pd.array([None if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)
                                for v in df[col]], dtype="Int64")
    for col in [c for c in df.columns if c.startswith("param.")]:
        kinds = {type(v) for v in df[col] if v is not None}
        if len(kinds) > 1 or kinds & {dict, list}:
            df[col] = [None if v is None else (json.dumps(v) if isinstance(v, dict | list) else str(v))
                       for v in df[col]]
    return df


def export_tables(inp: ReportInput, csv_dir: Path | None = None,
                  parquet_dir: Path | None = None) -> list[Path]:
    """Write trials, runs and requests (every raw sample) as CSV and/or Parquet; returns the paths."""
    if not inp.results:
        where = inp.results_dir / "trials" if inp.results_dir else "the results folder (give --results-dir)"
        raise ResultsError(f"no raw samples found: no trials/NNNN/result.json under {where}")
    tables = {"trials": _tidy(trials_frame(inp.view)), "runs": runs_frame(inp),
              "requests": requests_frame(inp)}
    written: list[Path] = []
    if csv_dir is not None:
        csv_dir.mkdir(parents=True, exist_ok=True)
        for name, df in tables.items():
            path = csv_dir / f"{name}.csv"
            flat = df.copy()
            for col in flat.columns:  # lists (chunk gaps) as JSON text: one cell, still parseable
                if flat[col].map(lambda v: isinstance(v, list | dict)).any():
                    flat[col] = flat[col].map(lambda v: json.dumps(v) if isinstance(v, list | dict) else v)
            flat.to_csv(path, index=False)
            written.append(path)
    if parquet_dir is not None:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ResultsError("Parquet export needs pyarrow: pip install pyarrow "
                               "(it is in flagsearch's dev extras)") from None
        parquet_dir.mkdir(parents=True, exist_ok=True)
        for name, df in tables.items():
            path = parquet_dir / f"{name}.parquet"
            df.to_parquet(path, index=False)
            written.append(path)
    return written


# ---- plots (matplotlib -> inline SVG) -----------------------------------------------------------

