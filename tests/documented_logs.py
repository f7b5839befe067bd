"""Documented failure lines of the engines (tests/data/<engine>_failures_documented.txt), shared by
the engine tests: one `cause<TAB>log line` a line, `#` starts a comment."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).parent / "data"


def documented_failures(name: str) -> list[tuple[str, str]]:
    """(cause, line) pairs of a documented-failures file under tests/data, in file order."""
    rows = []
    for line in (DATA / name).read_text().splitlines():
        if line and not line.startswith("#"):
            cause, text = line.split("\t", 1)
            rows.append((cause, text))
    return rows
