"""One measured run of a workload: its requests, the server's counter deltas and the metrics made of them.

Its own module because the run's reviewers (harness/measure/steady.py: stalls, warm-up, when to stop;
harness/measure/natural_end.py: the answers' own ends) read it and harness/measure/measure.py, which
makes it, calls them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.measure.client import RequestResult


@dataclass
class RunSample:
    repeat: int  # -1 for the warmup run
    wall_s: float
    requests: list[RequestResult]
    server: dict[str, float]  # canonical counter deltas over this run (+ gauge peaks: *_peak)
    metrics: dict[str, float]
    errors_by_kind: dict[str, int]
    histograms: dict[str, float] = field(default_factory=dict)  # server histogram means over this run
    metrics_error: str | None = None  # why the server's /metrics could not be read, if so
    flags: list[str] = field(default_factory=list)  # why this run looks stalled or an outlier
    excluded: bool = False  # left out of the summary (re-measured): a stall, not the config

    def to_dict(self) -> dict[str, Any]:
        return {"repeat": self.repeat, "wall_s": self.wall_s, "server": self.server, "metrics": self.metrics,
                "flags": self.flags, "excluded": self.excluded,
                "errors_by_kind": self.errors_by_kind, "histograms": self.histograms,
                "metrics_error": self.metrics_error,
                "requests": [r.to_dict() for r in self.requests]}
