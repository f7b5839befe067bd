"""The steady decode window: the unit every throughput verdict rests on.

A run of `c` streams, each asked for exactly N output tokens, has three phases: prefill (every
stream waits for its first token; queueing when the server batches or serializes), a steady part
in which all `c` streams decode at once, and a tail in which streams finish one by one. Output
tokens over the run's wall time (`output_tok_s`, end-to-end throughput) mixes all three: with 16-32
token runs, 37-52% of the wall time is waiting for the first token, so it is mostly a latency
number (docs/measurement.md). The window measures the steady part alone:

- each request's content chunks are placed on one clock (start + TTFT + the gaps between chunks);
- the window is the union of the stretches of time in which the most streams decode at once
  (all `c` of them unless the server never ran them together, e.g. `--max-num-seqs 1`);
- `decode_tok_s` = output tokens emitted inside the window / the window's length: the server's
  aggregate decode throughput at that concurrency, with no first-token wait in it.

A chunk may carry several tokens (speculative decoding): each request's tokens are spread evenly
over its chunks (usage total / chunks), which is exact without speculation.

The window is only as good as the tokens behind it, so `check` says, in words that reach the
result and the report, when the server did not deliver the window that was asked for: requests
that stopped before N tokens (an engine that ignores `ignore_eos`, a context that cut max_tokens)
or a window that covers little of the decode time (streams that never overlapped).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.measure.client import RequestResult

MIN_COVERAGE = 0.5  # a window shorter than half the median decode time is mostly ramps, not steady


@dataclass(frozen=True)
class Window:
    """The steady decode window of one run."""

    concurrency: int  # streams decoding at once inside the window
    asked_concurrency: int
    seconds: float
    tokens: float
    coverage: float  # window length / median decode time of a request

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def token_times(r: RequestResult) -> list[float]:
    """The clock time of each content chunk of a request (first one at start + TTFT)."""
    if r.ttft_s is None:
        return []
    t = r.start_s + r.ttft_s
    out = [t]
    for gap in r.chunk_gaps_s:
        t += gap
        out.append(t)
    return out


def _segments(spans: Sequence[tuple[float, float]]) -> tuple[int, list[tuple[float, float]]]:
    """(most spans open at once, the stretches of time in which that many are open)."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
    level, top, opened = 0, 0, None
    segments: list[tuple[float, float]] = []
    for t, step in events:
        if step < 0 and level == top and opened is not None and t > opened:
            segments.append((opened, t))
        level += step
        if level > top:
            top, segments = level, []
        opened = t if level == top else None
    return top, segments


def steady_window(requests: Sequence[RequestResult], concurrency: int) -> Window | None:
    """The window of a run (None when no request produced two timed chunks)."""
    timed = [(r, times) for r in requests if r.ok and r.output_tokens and len(times := token_times(r)) >= 2]
    if not timed:
        return None
    spans = [(times[0], times[-1]) for _, times in timed]
    level, segments = _segments(spans)
    tokens = 0.0
    for r, times in timed:
        per_chunk = (r.output_tokens or 0) / len(times)
        # A chunk at a segment's opening was emitted before the window began: (start, end].
        tokens += per_chunk * sum(1 for t in times[1:] if any(a < t <= b for a, b in segments))
    seconds = sum(b - a for a, b in segments)
    decode_times = sorted(b - a for a, b in spans)
    median = decode_times[len(decode_times) // 2]
    return Window(level, concurrency, seconds, tokens, seconds / median if median > 0 else 0.0)


def check(requests: Sequence[RequestResult], window: Window | None, exact_tokens: bool) -> list[str]:
    """Why this run's window is not the one asked for (empty: it is)."""
    ok = [r for r in requests if r.ok]
    out = []
    short = [r for r in ok if r.max_tokens and r.output_tokens is not None and r.output_tokens < r.max_tokens]
    if short:
        worst = min(short, key=lambda r: r.output_tokens or 0)
        why = ("the engine cannot be told to ignore end of sequence" if not exact_tokens
               else f"finish_reason {worst.finish_reason!r}")
        out.append(f"window short: {len(short)} of {len(ok)} requests stopped before their {worst.max_tokens} "
                   f"tokens (fewest {worst.output_tokens}; {why})")
    if ok and window is None:
        out.append("no decode window: no request produced two timed output chunks")
    elif window is not None:
        if window.concurrency < window.asked_concurrency:
            out.append(f"window at {window.concurrency} concurrent streams, not {window.asked_concurrency}: the "
                       "server never decoded all streams at once (it queued them)")
        if window.coverage < MIN_COVERAGE:
            out.append(f"window covers {100 * window.coverage:.0f}% of a request's decode time: the streams "
                       "overlapped little (staggered prefill or queueing); ask for more tokens")
    return out
