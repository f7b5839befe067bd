"""The controlled slowdown lives in harness/throttle.py (confirmation controls use it); this path
is kept for the benchmarks, tests and docs that run `bench/throttle.py`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.throttle import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
