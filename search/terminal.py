"""What the CLI prints: consoles that never fold a message, tables sized to where they go, no secrets.

- Messages (errors, progress lines) are printed with soft wrap: rich never inserts a line break,
  so an error stays one line that a terminal wraps visually and a pipe or log file keeps whole
  (grep finds it; nothing is cut mid-word).
- Tables take the terminal's width on a terminal and a fixed PIPED_WIDTH when piped (CI logs,
  files), where rich would otherwise assume 80 columns and fold every cell.
- Text that comes from users, files or engines is escaped before it reaches rich's markup: an
  error quoting `choices [f16, q8_0]` or a path `[/tmp]` would otherwise lose its brackets or
  raise a MarkupError.
- `install_scrubbing_streams` wraps sys.stdout/sys.stderr so that every line the CLI prints (rich,
  print, JSON events) has known secret values replaced (harness.secrets), and terminal escapes other
  than rich's colours shown as text: a space, a shared study or an engine cannot move the cursor,
  clear the screen or retitle the terminal (`safe`/`printable` show every control character).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape

from harness import secrets

PIPED_WIDTH = 160


# Control characters a space, a shared study or an engine could smuggle to the terminal: every C0
# control but newline and tab, DEL, and the C1 controls (0x9b is a one-byte CSI). Shown as \xNN.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# What the stream lets through: rich's own colours (SGR: ESC [ digits ; m) and the carriage return of
# a redrawn progress line; any other escape (cursor moves, screen clears, OSC titles, hyperlinks) is shown.
_UNSAFE_IN_STREAM = re.compile(r"\x1b(?!\[[0-9;]*m)|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f-\x9f]")


def _shown(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group(0)):02x}"


def printable(text: Any) -> str:
    """Text from users, files or engines with its control characters (terminal escapes) made visible."""
    return _CONTROL.sub(_shown, str(text))


class ScrubbingStream:
    """A text stream that replaces known secret values, and neutralises terminal escapes other than
    colours, before writing to the stream it wraps."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(_UNSAFE_IN_STREAM.sub(_shown, secrets.scrub_text(text)))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, ...
        return getattr(self.stream, name)


def install_scrubbing_streams() -> None:
    """Idempotent: wrap sys.stdout and sys.stderr once."""
    if not isinstance(sys.stdout, ScrubbingStream):
        sys.stdout = ScrubbingStream(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, ScrubbingStream):
        sys.stderr = ScrubbingStream(sys.stderr)  # type: ignore[assignment]


def width_for(stream: TextIO) -> int | None:
    """None (the terminal's own width) on a terminal, PIPED_WIDTH when piped."""
    try:
        return None if stream.isatty() else PIPED_WIDTH
    except (AttributeError, ValueError):  # a closed or odd stream
        return PIPED_WIDTH


def make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width_for(stream))


out = make_console()
err = make_console(stderr=True)


def progress_printer(quiet: bool) -> Callable[[str], None]:
    """A long command's progress callback: each line on stderr after the seconds since it was made
    (nothing with `quiet`)."""
    t0 = time.monotonic()

    def show(text: str) -> None:
        if not quiet:
            err.print(f"[dim]{time.monotonic() - t0:7.1f}s[/] {text}", soft_wrap=True)
    return show


def safe(text: Any) -> str:
    """User, file or engine text made safe for rich markup and for the terminal (printable)."""
    return escape(printable(text))


def error(message: Any, label: str = "error") -> None:
    err.print(f"[red]{label}[/]: {safe(message)}")


def warning(message: Any, label: str = "warning") -> None:
    err.print(f"[yellow]{label}[/]: {safe(message)}")
