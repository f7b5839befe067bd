"""Where the test suite's CPU goes: samples every process's CPU time every 0.5 s while a command
runs, and writes the CPU seconds used during the command per kind of process (llama-server,
vLLM-CPU, `search` CLI processes, the pytest-xdist workers, ...) to a JSON file.

    .venv/bin/python -m bench.experiments.suite_cpu.sample OUT.json -- bash scripts/test.sh -n 2 \
        --dist loadgroup -m "not serial"

A process's CPU is counted from the first time it is seen (a process that existed before the
command counts only what it used during it); one that lived less than a sample interval can be
missed. The sampler itself costs a few percent of one core: use it to attribute, not to time.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

INTERVAL_S = 0.5


@dataclass
class Seen:
    kind: str
    first_cpu: float
    last_cpu: float


def kind_of(cmdline: list[str], name: str) -> str:
    """The kind of process, from its command line (vLLM renames its engine core and worker)."""
    text = " ".join(cmdline)
    if "VLLM" in name or "vllm" in text:
        return "vllm-cpu"
    if "llama-server" in text:
        return "llama-server"
    if "search.cli" in text or text.endswith("/bin/search") or "/bin/search " in text:
        return "search-cli"
    if "import sys;exec(eval(sys.stdin.readline()))" in text or "-u -c" in text:
        return "pytest-xdist-worker"
    if "pytest" in text:
        return "pytest"
    if "postgres" in text:
        return "postgres"
    if "docker" in text or "containerd" in text:
        return "docker"
    if "python" in name or "python" in text:
        return "python-other"
    return "other"


def sample(seen: dict[tuple[int, float], Seen], me: int) -> None:
    for proc in psutil.process_iter(["pid", "create_time", "cmdline", "name", "cpu_times"]):
        info = proc.info
        if info["pid"] == me or info["cpu_times"] is None:
            continue
        cpu = info["cpu_times"].user + info["cpu_times"].system
        key = (info["pid"], info["create_time"])
        if key not in seen:
            seen[key] = Seen(kind_of(info["cmdline"] or [], info["name"] or ""), cpu, cpu)
        seen[key].last_cpu = cpu


def main() -> int:
    out = Path(sys.argv[1])
    command = sys.argv[sys.argv.index("--") + 1:]
    seen: dict[tuple[int, float], Seen] = {}
    me = psutil.Process().pid
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            with contextlib.suppress(psutil.Error):  # a process that ended mid-read
                sample(seen, me)
            time.sleep(INTERVAL_S)

    # Everything that exists now counts from now on.
    sample(seen, me)
    for s in seen.values():
        s.first_cpu = s.last_cpu
    thread = threading.Thread(target=loop, daemon=True)
    started = time.monotonic()
    thread.start()
    code = subprocess.call(command)
    done.set()
    thread.join()
    wall = time.monotonic() - started
    kinds: dict[str, dict[str, float]] = {}
    for s in seen.values():
        total = kinds.setdefault(s.kind, {"cpu_s": 0.0, "processes": 0})
        total["cpu_s"] += s.last_cpu - s.first_cpu
        total["processes"] += 1
    table = {k: {"cpu_s": round(v["cpu_s"], 1), "processes": int(v["processes"])}
             for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]["cpu_s"])}
    cores = psutil.cpu_count() or 1
    out.write_text(json.dumps({"command": command, "exit": code, "wall_s": round(wall, 1), "cores": cores,
                               "kinds": table}, indent=1) + "\n")
    print(f"{'kind':<22} {'CPU s':>8} {'processes':>9}")
    for kind, row in table.items():
        print(f"{kind:<22} {row['cpu_s']:>8} {row['processes']:>9}")
    print(f"wall {wall:.0f} s x {cores} cores = {wall * cores:.0f} core-seconds")
    return code


if __name__ == "__main__":
    sys.exit(main())
