"""Life during a long wait (a server start: minutes for a big model; an image pull).

In a terminal: one line, redrawn about once a second, with the elapsed time and the last line the
engine logged (or the pull's progress). Piped (CI logs, files): one progress line every
FLAGSEARCH_HEARTBEAT_S seconds (default 30), so a log shows the wait is alive without thousands of lines.
The terminal line goes to stderr, where all progress goes, and is erased when the wait ends.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

DEFAULT_EVERY_S = 30.0
_REDRAW_S = 1.0
# Colour codes and other control characters of an engine's log: never sent raw to a terminal.
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x1f\x7f]")


def every_s() -> float:
    try:
        return max(0.1, float(os.environ.get("FLAGSEARCH_HEARTBEAT_S", DEFAULT_EVERY_S)))
    except ValueError:
        return DEFAULT_EVERY_S


def last_line(path: Path | None, tail_bytes: int = 4096) -> str:
    """The last non-empty line of a (growing) log, read from its end; control characters removed."""
    if path is None:
        return ""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - tail_bytes))
            lines = fh.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        text = _CONTROL.sub("", line).strip()
        if text:
            return text
    return ""


class Heartbeat:
    """Call `beat()` from a wait loop as often as it polls; `done()` (or leaving the with-block) at the end."""

    def __init__(self, what: str, progress: Callable[[str], None], log_path: Path | None = None,
                 stream: TextIO | None = None, interval_s: float | None = None):
        self.what, self.progress, self.log_path = what, progress, log_path
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False
        self.interval_s = interval_s if interval_s is not None else every_s()
        self.t0 = time.monotonic()
        self.next_line_at = self.t0 + self.interval_s
        self.drawn_at: float | None = None
        self.beats = 0  # piped lines given to `progress`

    def text(self, status: str | None = None) -> str:
        said = status if status is not None else last_line(self.log_path)
        return f"{self.what}: {time.monotonic() - self.t0:.0f} s" + (f" · {said}" if said else "")

    def beat(self, status: str | None = None) -> None:
        """`status`: what to show instead of the log's last line (e.g. an image pull's progress)."""
        now = time.monotonic()
        if self.tty:
            if self.drawn_at is None or now - self.drawn_at >= _REDRAW_S:
                width = shutil.get_terminal_size((120, 24)).columns - 1
                self.stream.write("\r\x1b[K" + _CONTROL.sub("", self.text(status))[:width])
                self.stream.flush()
                self.drawn_at = now
        elif now >= self.next_line_at:
            self.progress(self.text(status))
            self.beats += 1
            self.next_line_at = now + self.interval_s

    def done(self) -> None:
        if self.tty and self.drawn_at is not None:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.drawn_at = None

    def __enter__(self) -> Heartbeat:
        return self

    def __exit__(self, *exc: object) -> None:
        self.done()


class PullProgress:
    """An image pull's progress from the Docker engine's pull events (`{"id": LAYER, "status":
    "Downloading", "progressDetail": {"current": N, "total": M}}`), as one status line for Heartbeat."""

    def __init__(self) -> None:
        self.layers: dict[str, tuple[int, int]] = {}  # layer id -> (bytes done, bytes in all)
        self.done: set[str] = set()
        self.status = ""

    def add(self, event: dict[str, object]) -> None:
        layer, status = str(event.get("id") or ""), str(event.get("status") or "")
        detail = event.get("progressDetail")
        if layer and isinstance(detail, dict) and isinstance(detail.get("total"), int) and status == "Downloading":
            self.layers[layer] = (int(detail.get("current") or 0), int(detail["total"]))
        if layer and status in ("Download complete", "Pull complete", "Already exists"):
            self.done.add(layer)
            if layer in self.layers:
                self.layers[layer] = (self.layers[layer][1], self.layers[layer][1])
        if not layer and status:
            self.status = status  # "Pulling from ...", "Digest: ...", "Status: ..."

    def line(self) -> str:
        got = sum(current for current, _ in self.layers.values())
        total = sum(size for _, size in self.layers.values())
        seen = len(self.layers.keys() | self.done)
        if not seen:
            return self.status
        mb = f"{got / 1e6:.0f}/{total / 1e6:.0f} MB, " if total else ""
        return f"{mb}{len(self.done)} of {seen} layers done"
