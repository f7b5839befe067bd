"""`search run` SIGKILLed at a random moment (seeded) of each of its phases, on a real llama-server:
while trials run, then while the confirmation runs. After each kill no engine of the killed process is
left running, and after each resume nothing measured before the kill is lost: every stored trial keeps
its record and every stored confirmation round its values; the resumed run completes the study."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy.exc
import yaml

from harness.launch import reaper
from search.confirm.confirm import CONFIRM_ATTR
from search.store.trial_index import RECORD_ATTR
from tests.conftest import llama_space_doc

pytestmark = pytest.mark.e2e

SEED = 52  # the kill moments are drawn from it: the same seed, the same schedule


def stored(storage: str) -> tuple[dict[int, dict[str, float]], dict[str, Any]]:
    """(metrics of each stored trial record, the stored confirmation) as the study holds them now."""
    if not Path(storage.removeprefix("sqlite:///")).exists():
        return {}, {}
    try:
        study = optuna.load_study(study_name="killed", storage=storage)
    except (KeyError, sqlalchemy.exc.SQLAlchemyError):  # not created yet, or being created
        return {}, {}
    trials = {t.number: dict(t.user_attrs[RECORD_ATTR]["metrics"]) for t in study.get_trials(deepcopy=False)
              if t.user_attrs.get(RECORD_ATTR)}
    confirmation = study.user_attrs.get(CONFIRM_ATTR)
    return trials, confirmation if isinstance(confirmation, dict) else {}


def left_running(pid: int, within_s: float = 15.0) -> list[int]:
    """Engines the process `pid` started that are still alive after `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        alive = [p.pid for p, owner, _ in reaper.tagged_processes() if owner.split(":")[0] == str(pid)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


def run_and_kill(argv: list[str], storage: str, ready: Any, delay_s: float) -> tuple[int, float]:
    """Start `search run`, wait until `ready(trials, confirmation)` holds, then SIGKILL it `delay_s`
    later. Returns (its pid, how long after the start the kill came)."""
    proc = subprocess.Popen([sys.executable, "-m", "search.cli", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    try:
        deadline = t0 + 600
        while proc.poll() is None and time.monotonic() < deadline and not ready(*stored(storage)):
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before the phase the kill was meant for"
        time.sleep(delay_s)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        return proc.pid, time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigkill_at_a_random_moment_of_each_phase_loses_no_measured_round(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    doc = llama_space_doc(engine_args={"ctx_size": 512, "parallel": 1, "threads": 1}, name="killed",
                          params={"batch_size": {"type": "categorical", "choices": [2048, 512], "default": 2048}},
                          measure={"repeats": 1, "warmup": False, "request_timeout_s": 60},
                          workloads=[{"name": "w", "streams": ["qa"], "max_tokens": 16}],
                          budget={"trials": 2}, confirm={"top_k": 1, "max_rounds": 3})
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"
    storage = f"sqlite:///{results / 'killed' / 'study.db'}"
    argv = ["run", str(space), "--results", str(results), "--no-preflight", "--quiet"]
    phases = [("trials", lambda trials, conf: len(trials) >= 1, rng.uniform(0.0, 1.5)),
              ("confirmation", lambda trials, conf: int(conf.get("rounds", 0)) >= 1, rng.uniform(0.0, 2.0))]
    kept: list[tuple[str, dict[int, dict[str, float]], dict[str, Any]]] = []
    for phase, ready, delay in phases:
        pid, at = run_and_kill(argv, storage, ready, delay)
        trials, confirmation = stored(storage)
        print(f"{phase}: SIGKILL {delay:.2f} s after the phase began ({at:.1f} s into the run): "
              f"{len(trials)} trial(s), {confirmation.get('rounds', 0)} confirmation round(s) stored")
        assert left_running(pid) == [], f"engines of the killed run are still running ({phase})"
        kept.append((phase, trials, confirmation))
    done = subprocess.run([sys.executable, "-m", "search.cli", *argv], capture_output=True, text=True, timeout=900,
                          check=False)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    trials, confirmation = stored(storage)
    assert confirmation.get("complete") is True and confirmation["rounds"] >= 3, confirmation.get("answer")
    for phase, before, conf_before in kept:
        for number, metrics in before.items():  # 0 trials lost: each record kept, unchanged
            assert trials.get(number) == metrics, (phase, number)
        rounds = int(conf_before.get("rounds", 0))
        for arm in conf_before.get("arms", []):  # 0 rounds lost: each stored round is in the final one
            final = next(a for a in confirmation["arms"] if a["key"] == arm["key"])
            assert final["runs"][:rounds] == arm["runs"][:rounds], (phase, arm["key"])
    print("measured trials and rounds lost: 0 (each stored before a kill is in the finished study); engines left: 0")
