"""Per-run metrics, their names and meanings, placebo detection, statistics and the roofline,
on hand-built request records (the real engines are in test_measure_e2e.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.engines.base import FeatureExpectation, ModelChoice
from harness.measure.client import RequestResult
from harness.measure.measure import (
    check_placebo,
    consistency_warnings,
    run_metrics,
    summarize_samples,
    tokens_per_step,
)
from harness.measure.roofline import BOOT_ID, Roofline, build_roofline, bytes_per_token, host_copy_bandwidth, per_boot
from harness.measure.sample import RunSample
from harness.measure.stats import summarize


def req(start: float, ttft: float, e2e: float, out: int, ok: bool = True, kind: str | None = None,
        gaps: tuple[float, ...] = ()) -> RequestResult:
    return RequestResult(workload="w", ok=ok, status=200 if ok else 400, start_s=start, end_s=start + e2e,
                         ttft_s=ttft if ok else None, chunk_gaps_s=list(gaps), output_tokens=out if ok else None,
                         prompt_tokens=10 if ok else None, finish_reason="length" if ok else None,
                         error_kind=kind, max_tokens=out, content_chunks=out if ok else 0)


def test_effective_and_decode_speeds_are_separate_names() -> None:
    reqs = [req(0.0, 1.0, 5.0, 41, gaps=(0.1,) * 40), req(0.0, 1.0, 5.0, 41, gaps=(0.1,) * 40),
            req(0.0, 0, 0.1, 0, ok=False, kind="http_400")]
    m = run_metrics(reqs, wall_s=5.0, server={"generation_tokens": 82.0})
    assert m["errors"] == 1 and m["requests"] == 3  # a failed request is never dropped silently
    assert m["output_tok_s"] == pytest.approx(82 / 5.0)  # aggregate, what users get
    assert m["stream_tok_s"] == pytest.approx(41 / 5.0)  # per stream, TTFT included
    assert m["stream_decode_tok_s"] == pytest.approx(40 / 4.0)  # per stream, after the first token
    assert m["decode_tok_s"] == pytest.approx(2 * 40 / 4.0)  # both streams over the steady window
    assert m["decode_steps_s"] == m["stream_decode_tok_s"] and m["tokens_per_step"] == 1.0
    assert m["ttft_p50_s"] == m["ttft_cold_p50_s"] == 1.0
    assert m["itl_p99_s"] == pytest.approx(0.1) and m["tpot_p50_s"] == pytest.approx(0.1)
    assert m["server_vs_usage_tokens"] == 1.0


def test_speculative_decoding_steps_are_not_tokens() -> None:
    # 300 tokens generated, 150 of them accepted drafts: 150 steps, 2 tokens per step.
    server = {"generation_tokens": 300.0, "spec_drafts": 100.0, "spec_draft_tokens": 300.0,
              "spec_accepted_tokens": 150.0}
    assert tokens_per_step(server, 300) == pytest.approx(2.0)
    assert tokens_per_step({}, 300) is None
    m = run_metrics([req(0.0, 1.0, 4.0, 301)], wall_s=4.0, server=server, ttft_kind="warm")
    assert m["spec_acceptance_rate"] == pytest.approx(0.5)
    assert m["spec_mean_acceptance_length"] == pytest.approx(2.5)
    assert m["stream_decode_tok_s"] == pytest.approx(100.0)
    assert m["decode_steps_s"] == pytest.approx(50.0)
    assert "ttft_warm_p50_s" in m and "ttft_cold_p50_s" not in m


def sample(repeat: int, server: dict[str, float], errors: int = 0, metrics_error: str | None = None,
           out: float = 10.0) -> RunSample:
    return RunSample(repeat, 1.0, [], server, {"errors": float(errors), "output_tokens": out, "output_tok_s": out},
                     {"http_400": errors} if errors else {}, {}, metrics_error)


def test_placebo_flag_when_the_counter_does_not_move_or_is_absent() -> None:
    spec = FeatureExpectation("speculative_decoding", "spec_drafts", "speculative decoding was requested")
    flat = check_placebo([spec], [sample(0, {"spec_drafts": 0.0}), sample(1, {"spec_drafts": 0.0})])
    assert len(flat) == 1 and "did not move" in flat[0] and "placebo" in flat[0]
    absent = check_placebo([spec], [sample(0, {"generation_tokens": 5.0})])
    assert "absent from /metrics" in absent[0]
    assert check_placebo([spec], [sample(0, {"spec_drafts": 0.0}), sample(1, {"spec_drafts": 4.0})]) == []
    blind = check_placebo([spec], [sample(0, {}, metrics_error="/metrics answered HTTP 501")])
    assert "could not be read" in blind[0] and "501" in blind[0]


def test_errors_are_totals_never_medians_and_usage_mismatch_is_flagged() -> None:
    samples = [sample(0, {"generation_tokens": 10.0}), sample(1, {"generation_tokens": 12.0}), sample(2, {}, errors=1)]
    summary = summarize_samples(samples)
    assert "errors" not in summary and summary["errors_total"].median == 1.0
    assert summary["output_tok_s"].n == 3 and summary["output_tok_s"].values == (10.0, 10.0, 10.0)
    warnings = consistency_warnings(samples)
    assert warnings == ["repeat 1: usage says 10 output tokens, the server counted 12"]


def test_stat_keeps_raw_values_and_a_bootstrap_interval() -> None:
    st = summarize([33.9, 34.0, 33.9, 35.2, 33.1])
    assert st is not None and st.median == 33.9 and st.n == 5 and st.values[3] == 35.2
    assert st.min <= st.ci_low <= st.median <= st.ci_high <= st.max
    assert st.spread_pct == pytest.approx(100 * (35.2 - 33.1) / 33.9)


def test_roofline_from_active_params_and_stated_bandwidth() -> None:
    # The DOMAIN example: ~10B active params at ~0.56 bytes/param (NVFP4 + scales), 273 GB/s on a GB10.
    model = ModelChoice(name="q", path="/nowhere", active_params_b=10.0, bytes_per_param=0.56)
    roof = build_roofline(model, bandwidth_gb_s=273.0)
    assert roof is not None and roof.bytes_source == "active_params" and roof.bandwidth_source == "stated"
    assert roof.ceiling_steps_s == pytest.approx(273e9 / 5.6e9)
    m = roof.metrics({"decode_steps_s": 24.375, "stream_decode_tok_s": 48.75})
    assert m["roofline_pct"] == pytest.approx(50.0) and m["roofline_tok_pct"] == pytest.approx(100.0)
    stated = ModelChoice(name="q", path="/nowhere", attrs={"bytes_per_token_gb": 6.1})
    assert bytes_per_token(stated) == (6.1e9, "stated")
    assert bytes_per_token(ModelChoice(name="q", path="/nowhere")) is None


def test_host_copy_bandwidth_is_measured() -> None:
    bw = host_copy_bandwidth(size_mib=32, rounds=3)
    assert 1e8 < bw < 1e12  # between 0.1 GB/s and 1 TB/s on any real host
    roof = Roofline(2.7e8, bw, "active_params", "measured:host")
    assert roof.metrics({"decode_steps_s": 1.0})["roofline_pct"] > 0


def test_the_bandwidth_is_measured_once_per_boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGSEARCH_HOME", str(tmp_path))
    measured: list[float] = []

    def host() -> float:
        measured.append(host_copy_bandwidth(size_mib=16, rounds=1))
        return measured[-1]

    first = per_boot("host", host)
    assert per_boot("host", host) == first and len(measured) == 1  # the second study reads it back
    cache = tmp_path / "cache" / "bandwidth.json"
    data = json.loads(cache.read_text())
    assert data["boot_id"] == BOOT_ID.read_text().strip() and data["values"] == {"host": first}
    cache.write_text(json.dumps({**data, "boot_id": "an earlier boot"}))
    assert per_boot("host", host) == measured[-1] and len(measured) == 2  # another boot: measured again
    assert per_boot("gpu|/no/python", lambda: None) is None  # could not be measured: not kept
    assert set(json.loads(cache.read_text())["values"]) == {"host"}
    model = ModelChoice(name="m", path="/nowhere", active_params_b=0.135, bytes_per_param=2)
    roof = build_roofline(model)
    assert roof is not None and roof.bandwidth_source == "measured:host" and roof.bandwidth_bytes_s == measured[-1]
