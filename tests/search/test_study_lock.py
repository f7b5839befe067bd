"""The study lock (search/study/lock.py) on SQLite, across processes: a second worker waits while
the first holds it, and a worker killed while holding it does not block the others. The race it
closes is shown end to end by tests/search/test_distributed.py (workers started at the same instant)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from search.study.lock import StudyLock

ROOT = Path(__file__).resolve().parents[2]
HOLDER = """
import sys, time
from search.study.lock import StudyLock
lock = StudyLock(sys.argv[1], "s")
print("trying", flush=True)
lock.acquire()
print("held", flush=True)
time.sleep(float(sys.argv[2]))
lock.release()
"""


def holder(url: str, hold_s: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, url, str(hold_s)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    assert line(proc) == "trying"
    return proc


def line(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> str:
    """The process's next output line, read through the pipe's one buffer (communicate() after a
    readline() misses what readline already buffered); '' if none comes within timeout_s."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline() if proc.stdout else ""), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return got[0].strip() if got else ""


def test_a_second_worker_waits_until_the_first_releases(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    lock = StudyLock(url, "s")
    lock.acquire()
    other = holder(url, 0)
    time.sleep(0.5)
    assert other.poll() is None, "the other worker took a held lock"
    lock.release()
    lock.release()  # releasing twice is harmless: the loop releases early, then again at the end
    assert line(other) == "held" and other.wait(timeout=60) == 0


def test_a_worker_killed_holding_the_lock_does_not_block_the_others(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    dead = holder(url, 600)
    assert line(dead) == "held"
    dead.send_signal(signal.SIGKILL)
    dead.wait(timeout=30)
    after = holder(url, 0)
    assert line(after) == "held", "the dead worker's lock outlived it"
    assert after.wait(timeout=60) == 0
