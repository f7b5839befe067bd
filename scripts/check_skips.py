"""Compare the tests a suite run skipped (tests/skip_record.py wrote them) with tests/allowed_skips.txt.

    python scripts/check_skips.py RECORD [--subset]

Exit 0 when they agree, 1 otherwise, naming each difference. A full run must skip exactly the allowed
set; with --subset (scripts/test.sh given arguments: part of the suite) every skip must be allowed."""

from __future__ import annotations

import sys
from pathlib import Path

ALLOWED = Path(__file__).resolve().parents[1] / "tests" / "allowed_skips.txt"


def read_ids(path: Path) -> set[str]:
    lines = path.read_text().splitlines() if path.exists() else []
    return {line.split("#", 1)[0].strip() for line in lines} - {""}


def differences(skipped: set[str], allowed: set[str], subset: bool) -> list[str]:
    out = [f"skipped, but not in {ALLOWED.name}: {node}" for node in sorted(skipped - allowed)]
    if not subset:
        out += [f"in {ALLOWED.name}, but ran (remove it from the list): {node}" for node in sorted(allowed - skipped)]
    return out


def main(argv: list[str]) -> int:
    found = differences(read_ids(Path(argv[0])), read_ids(ALLOWED), "--subset" in argv[1:])
    for line in found:
        print(f"check_skips: {line}", file=sys.stderr)
    if not found:
        print(f"check_skips: the skipped tests are the allowed set ({ALLOWED.name})", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
