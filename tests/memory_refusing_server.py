"""TEST FIXTURE ONLY (fault injection): an engine that refuses to start for memory, as vLLM does when
less than its share is free on the device, the first N times (N read from, and counted down in, the
--refusals file); after that it serves as tests/fault_server.py does."""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--host", default="127.0.0.1")
p.add_argument("--port", type=int, required=True)
p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
p.add_argument("--refusals", required=True, help="a file holding how many starts are still to be refused")
args = p.parse_args()
left = Path(args.refusals)
n = int(left.read_text().strip() or 0)
if n > 0:
    left.write_text(str(n - 1))
    print("Traceback (most recent call last):\nValueError: Free memory on device cuda:0 (40.0/121.7 GiB) on startup "
          f"is less than desired GPU memory utilization ({args.gpu_memory_utilization}, "
          f"{121.7 * args.gpu_memory_utilization:.2f} GiB). Decrease GPU memory utilization or reduce GPU memory "
          "used by other processes.", file=sys.stderr, flush=True)
    sys.exit(1)
sys.argv = [str(Path(__file__).with_name("fault_server.py")), "--host", args.host, "--port", str(args.port)]
runpy.run_path(sys.argv[0], run_name="__main__")
