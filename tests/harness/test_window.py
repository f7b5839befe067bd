"""The steady decode window (harness/measure/window.py) on hand-built request timelines: which stretch of
time counts, how many tokens fall in it, and what it says when the server did not deliver it. The
real engines are in test_window_e2e.py."""

from __future__ import annotations

import pytest

from harness.measure.client import RequestResult
from harness.measure.measure import run_metrics
from harness.measure.window import check, steady_window, token_times


def stream(start: float, ttft: float, tokens: int, gap: float, asked: int | None = None,
           finish: str = "length") -> RequestResult:
    """A request whose tokens arrive one per chunk, `gap` apart, after its first one at start + ttft."""
    end = start + ttft + gap * (tokens - 1)
    return RequestResult(workload="w", ok=True, status=200, start_s=start, end_s=end, ttft_s=ttft,
                         chunk_gaps_s=[gap] * (tokens - 1), output_tokens=tokens, prompt_tokens=10,
                         finish_reason=finish, max_tokens=asked or tokens, content_chunks=tokens)


def test_one_stream_window_is_decode_alone() -> None:
    r = stream(0.0, ttft=2.0, tokens=101, gap=0.05)
    assert token_times(r)[0] == 2.0 and token_times(r)[-1] == pytest.approx(7.0)
    w = steady_window([r], 1)
    assert w is not None and w.concurrency == 1
    assert w.tokens == pytest.approx(100) and w.seconds == pytest.approx(5.0)
    assert w.tok_s == pytest.approx(20.0)  # the 2 s first-token wait is not in it
    m = run_metrics([r], wall_s=7.0, server={})
    assert m["decode_tok_s"] == pytest.approx(20.0)
    assert m["output_tok_s"] == pytest.approx(101 / 7.0)  # end-to-end, named apart


def test_staggered_streams_count_only_the_time_all_decode() -> None:
    # Prefill queued: stream 2 gets its first token 1 s after stream 1; both decode at 10 tok/s each.
    a = stream(0.0, ttft=1.0, tokens=51, gap=0.1)  # decodes 1.0 .. 6.0
    b = stream(0.0, ttft=2.0, tokens=51, gap=0.1)  # decodes 2.0 .. 7.0
    w = steady_window([a, b], 2)
    assert w is not None and w.concurrency == 2
    assert w.seconds == pytest.approx(4.0)  # 2.0 .. 6.0
    assert w.tok_s == pytest.approx(20.0, rel=0.03)  # two streams x 10 tok/s, ramps left out
    assert w.coverage == pytest.approx(0.8)
    assert check([a, b], w, exact_tokens=True) == []


def test_serialized_streams_are_named_not_hidden() -> None:
    # A server that runs one sequence at a time: the second stream decodes after the first ends.
    a = stream(0.0, ttft=0.5, tokens=41, gap=0.05)  # 0.5 .. 2.5
    b = stream(0.0, ttft=2.7, tokens=41, gap=0.05)  # 2.7 .. 4.7
    w = steady_window([a, b], 2)
    assert w is not None and w.concurrency == 1 and w.tok_s == pytest.approx(20.0)
    notes = check([a, b], w, exact_tokens=True)
    assert any("not 2" in n and "queued" in n for n in notes)


def test_a_window_the_server_did_not_deliver_is_said() -> None:
    early = stream(0.0, ttft=0.5, tokens=30, gap=0.05, asked=256, finish="stop")
    full = stream(0.0, ttft=0.5, tokens=256, gap=0.05)
    notes = check([early, full], steady_window([early, full], 2), exact_tokens=False)
    assert any(n.startswith("window short: 1 of 2") and "fewest 30" in n and "end of sequence" in n
               for n in notes)
    assert any("covers" in n for n in notes)  # 29 of 255 gaps shared: mostly one stream alone
    notes_exact = check([early], steady_window([early], 1), exact_tokens=True)
    assert any("finish_reason 'stop'" in n for n in notes_exact)


def test_speculative_chunks_spread_their_tokens() -> None:
    r = stream(0.0, ttft=1.0, tokens=51, gap=0.1)
    r.output_tokens = 102  # two tokens per chunk
    w = steady_window([r], 1)
    assert w is not None and w.tok_s == pytest.approx(20.0)
