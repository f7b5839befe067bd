"""Life during a server start (harness/launch/heartbeat.py): one redrawn line in a terminal, a line every
FLAGSEARCH_HEARTBEAT_S seconds when piped, and `search run` showing it during a real vLLM-CPU start."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness import flagsearch_home
from harness.launch.heartbeat import Heartbeat, PullProgress, last_line

ROOT = Path(__file__).resolve().parents[2]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_piped_one_line_per_interval_with_the_logs_last_line(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("INFO starting\n\x1b[32mINFO\x1b[0m Loading weights took 1.2 s\n\n")
    said: list[str] = []
    beat = Heartbeat("loading", said.append, log, stream=io.StringIO(), interval_s=0.2)
    beat.beat()
    assert said == []  # nothing before the first interval
    time.sleep(0.25)
    beat.beat()
    beat.beat()  # the same interval: no second line
    assert len(said) == 1 and said[0].startswith("loading: 0 s · INFO Loading weights took 1.2 s"), said
    time.sleep(0.25)
    beat.beat("pulling: 120/800 MB")
    assert len(said) == 2 and said[1].endswith("· pulling: 120/800 MB"), said


def test_terminal_one_redrawn_line_erased_at_the_end(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("step 1\n")
    screen, said = Terminal(), []
    with Heartbeat("loading", said.append, log, stream=screen, interval_s=0.01) as beat:
        beat.beat()
        log.write_text("step 1\nstep 2 \x07bell\n")
        beat.beat()  # within a second of the last draw: not redrawn
        assert screen.getvalue() == "\r\x1b[Kloading: 0 s · step 1"
    assert said == []  # a terminal gets the line, not a stream of progress lines
    assert screen.getvalue().endswith("\r\x1b[K") and "\n" not in screen.getvalue()


def test_last_line_reads_a_big_log_from_its_end(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_text("x" * 100_000 + "\nthe end\n")
    assert last_line(log) == "the end" and last_line(tmp_path / "none.log") == "" and last_line(None) == ""


def test_an_image_pulls_progress_in_bytes_and_layers() -> None:
    """The Docker engine's pull events, as the daemon streams them (docker-py's api.pull, decode=True)."""
    pull = PullProgress()
    pull.add({"status": "Pulling from vllm/vllm-openai", "id": "v0.11.0"})
    pull.add({"status": "Pulling fs layer", "id": "a1"})
    pull.add({"status": "Pulling fs layer", "id": "b2"})
    pull.add({"status": "Already exists", "id": "c3"})
    pull.add({"status": "Downloading", "progressDetail": {"current": 50_000_000, "total": 200_000_000}, "id": "a1"})
    pull.add({"status": "Downloading", "progressDetail": {"current": 1_000_000, "total": 600_000_000}, "id": "b2"})
    assert pull.line() == "51/800 MB, 1 of 3 layers done"
    pull.add({"status": "Download complete", "id": "a1"})
    pull.add({"status": "Pull complete", "id": "a1"})
    assert pull.line() == "201/800 MB, 2 of 3 layers done"
    fresh = PullProgress()
    fresh.add({"status": "Pulling from library/busybox", "id": "latest"})  # the tag's own line: not a layer
    assert fresh.line() == ""
    fresh.add({"status": "Digest: sha256:0123"})
    assert fresh.line() == "Digest: sha256:0123"


@pytest.mark.e2e
def test_search_run_shows_a_heartbeat_during_a_vllm_cpu_start(tmp_path: Path) -> None:
    """The real start of the demo's first trial, interrupted as soon as the heartbeat shows: the cost is a
    few seconds of loading, not a trial."""
    if not flagsearch_home.vllm_python().exists():
        pytest.fail(f"{flagsearch_home.vllm_python()} is missing: run `make setup` first", pytrace=False)
    argv = [sys.executable, "-m", "search.cli", "run", "spaces/smollm2-cpu.yaml", "--trials", "1", "--no-confirm",
            "--no-preflight", "--results", str(tmp_path / "results")]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FLAGSEARCH_HEARTBEAT_S": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "loading: " in line and " s · " in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(600), "".join(lines[-20:])
    finally:
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=120)
    reader.join(10)
    text = "".join(lines)
    loading = text.index("loading (waiting for ready)")
    beats = [ln for ln in text[loading:].splitlines() if re.search(r"loading: \d+ s", ln)]
    # The elapsed time, and once the engine has logged something, its last line (vLLM is silent while it
    # imports torch)
    assert any(" s · " in ln for ln in beats), text[-3000:]
    assert proc.returncode == 130 and "interrupted" in text, (proc.returncode, text[-2000:])
    assert "loading" not in stdout  # progress is on stderr; stdout keeps the final table
