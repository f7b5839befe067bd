"""Metrics are declared once: direction and aggregation come from the registry, not from guesses."""

from __future__ import annotations

import pytest

from harness.measure.measure import run_metrics
from harness.measure.metric_registry import aggregate_of, direction_of, metric_def
from search.verdicts.gate import metric_direction


def test_directions_of_full_names() -> None:
    assert direction_of("four_streams.output_tok_s") == "higher"
    assert direction_of("chat@concurrency=4.ttft_p99_s") == "lower"
    assert direction_of("quality.kl") == "lower"  # a distance: the old suffix guess raised here
    assert direction_of("quality.score") == "higher"
    assert direction_of("single.roofline_pct") == "higher"  # the old guess raised here too
    assert direction_of("errors") == "lower"
    assert metric_direction("startup.ready_s") == "lower"


def test_descriptive_and_unknown_metrics_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="descriptive"):
        direction_of("single.output_tokens")
    with pytest.raises(ValueError, match="unknown metric"):
        direction_of("single.tok_per_watt")


def test_every_metric_a_run_produces_is_declared() -> None:
    from harness.measure.client import RequestResult

    req = RequestResult(workload="w", ok=True, status=200, start_s=0.0, end_s=1.0, ttft_s=0.1, output_tokens=50,
                        prompt_tokens=20, chunk_gaps_s=[0.02] * 49, content_chunks=50, max_tokens=50,
                        server_timings={"predicted_per_second": 60.0, "prompt_per_second": 900.0})
    metrics = run_metrics([req], 1.0, {"generation_tokens": 50.0, "spec_accepted_tokens": 10.0,
                                       "spec_draft_tokens": 20.0, "spec_drafts": 5.0})
    undeclared = [k for k in metrics if metric_def(f"w.{k}") is None]
    assert undeclared == []
    assert aggregate_of("w@c=4.errors") == "sum" and aggregate_of("w.output_tok_s") == "geomean"
