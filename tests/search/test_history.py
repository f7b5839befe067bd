"""History of gate results: append, export (CSV/Parquet), change points (ruptures), the trend plot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from search.regress import history


def report(median_b: float, ratio: float) -> dict[str, object]:
    return {"outcome": "pass", "verdicts": [
        {"metric": "w.output_tok_s", "gated": True, "verdict": "unchanged", "median_a": 100.0, "median_b": median_b,
         "ratio": ratio, "ci_low": ratio - 0.02, "ci_high": ratio + 0.02, "p_value": 0.5, "n_a": 6, "n_b": 6},
        {"metric": "w.ttft_p50_s", "gated": False, "verdict": "unchanged", "median_a": 1.0, "median_b": 1.0,
         "ratio": 1.0, "ci_low": float("nan"), "ci_high": 1.0, "p_value": 0.5, "n_a": 6, "n_b": 6}]}


def test_append_load_export(tmp_path: Path) -> None:
    for i in range(3):
        rows = history.rows_from_report(report(100.0 + i, 1.0), "base/line", "nightly", f"build {i}", {"v": i})
        assert len(rows) == 1  # only gated metrics are kept
        history.append(rows, "base/line", tmp_path)
    assert history.history_path("base/line", tmp_path).name == "base-line.jsonl"
    rows = history.load("base/line", tmp_path)
    assert [r["median_b"] for r in rows] == [100.0, 101.0, 102.0]
    csv = history.export(rows, tmp_path / "h.csv")
    assert list(pd.read_csv(csv)["candidate"]) == ["build 0", "build 1", "build 2"]
    parquet = history.export(rows, tmp_path / "h.parquet")
    assert pd.read_parquet(parquet)["ratio"].tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match=r"csv or \.parquet"):
        history.export(rows, tmp_path / "h.xlsx")


def series_rows(values: list[float]) -> list[dict[str, object]]:
    return [history.rows_from_report(report(v, v / 100), "b", "nightly", str(i))[0] for i, v in enumerate(values)]


def test_a_step_is_found_where_it_happened() -> None:
    rng = np.random.default_rng(1)
    values = list(100 + rng.normal(0, 1.0, 10)) + list(90 + rng.normal(0, 1.0, 10))
    assert history.change_points(values) == [10]
    drift = history.detect_drift(series_rows(values), min_effect=0.03)[0]
    assert drift.flagged and drift.change_points == [10] and -12 < drift.change_pct < -8


def test_a_slow_drift_no_single_step_shows_is_flagged() -> None:
    # -0.5% a run over 24 runs: each neighbour is within noise, the whole is -11%.
    rng = np.random.default_rng(2)
    values = [100 * (1 - 0.005 * i) + rng.normal(0, 0.6) for i in range(24)]
    drift = history.detect_drift(series_rows(values), min_effect=0.03)[0]
    assert drift.flagged and drift.change_pct < -5


def test_noise_alone_is_not_a_drift() -> None:
    rng = np.random.default_rng(3)
    values = list(100 + rng.normal(0, 2.0, 30))
    drift = history.detect_drift(series_rows(values), min_effect=0.03)[0]
    assert not drift.flagged, drift.describe()


def test_the_a_a_sentinel_s_rows_are_not_part_of_the_drift_series() -> None:
    """A sentinel night measures the baseline's own build as B: a candidate series that stepped down 10% at night 10,
    with a sentinel row at the old speed after every candidate night, is still the step (the sentinel rows, counted
    in, made it a series that alternates between the two speeds)."""
    rng = np.random.default_rng(1)
    values = list(100 + rng.normal(0, 1.0, 10)) + list(90 + rng.normal(0, 1.0, 10))
    rows = []
    for i, v in enumerate(values):
        rows.append(history.rows_from_report(report(v, v / 100), "b", "nightly", str(i))[0])
        old = 100 + float(rng.normal(0, 1.0))
        rows.append(history.rows_from_report(report(old, 1.0), "b", history.SENTINEL_SOURCE, str(i))[0])
    drift = history.detect_drift(rows, min_effect=0.03)[0]
    assert drift.flagged and drift.n == 20 and drift.change_points == [10], drift.describe()


def test_too_short_a_history_says_nothing() -> None:
    assert history.detect_drift(series_rows([100, 90, 80]), min_runs=6) == []


def test_plot_trend_writes_a_png(tmp_path: Path) -> None:
    rows = series_rows([100, 101, 99, 100, 90, 91, 89, 90])
    out = history.plot_history(rows, "w.output_tok_s", tmp_path / "trend.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_history_command_prints_flags_a_drift_and_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from search.cli import main

    rng = np.random.default_rng(4)
    values = list(100 + rng.normal(0, 1.0, 8)) + list(85 + rng.normal(0, 1.0, 8))
    for v in values:
        history.append(history.rows_from_report(report(v, v / 100), "nightly-x", "nightly", "c"), "nightly-x",
                       tmp_path)
    code = main(["history", "nightly-x", "--dir", str(tmp_path), "--export", str(tmp_path / "h.csv"),
                 "--plot", str(tmp_path / "h.png")])
    out = capsys.readouterr().out
    assert code == 1 and "DRIFT" in out and "change points at run(s) 8" in out
    assert len(pd.read_csv(tmp_path / "h.csv")) == 16 and (tmp_path / "h.png").stat().st_size > 0
    assert main(["history", "no-such-baseline", "--dir", str(tmp_path)]) == 6  # no history yet
    capsys.readouterr()
    assert main(["history", "nightly-x", "--dir", str(tmp_path), "--json", "--last", "5"]) == 1
    shown = json.loads(capsys.readouterr().out)  # one JSON object: the drift verdicts and the last rows
    assert len(shown["rows"]) == 5 and any(d["flagged"] and d["change_points"] == [8] for d in shown["drifts"])


def test_a_damaged_history_is_an_error_naming_the_file_not_no_history(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """"No history yet" (6, a first night) and a damaged or newer-format file (2, one line naming the
    file and line) are told apart: the nightly workflow passes the first and fails the second."""
    from search.cli import main

    assert main(["history", "first-night", "--dir", str(tmp_path)]) == 6
    history.append(history.rows_from_report(report(100.0, 1.0), "x", "nightly", "c"), "x", tmp_path)
    path = history.history_path("x", tmp_path)
    path.write_text(path.read_text() + '{"format": "flagsearch-history/1", "time": \n')
    capsys.readouterr()
    assert main(["history", "x", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{path}:2" in " ".join(err.split()) and "Traceback" not in err, err
    path.write_text('{"format": "flagsearch-history/99", "time": "t"}\n')
    assert main(["history", "x", "--dir", str(tmp_path)]) == 2
    assert "newer" in capsys.readouterr().err
