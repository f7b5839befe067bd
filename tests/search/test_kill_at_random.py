"""The tool SIGKILLed at a random moment (seeded) of each phase that measures, on a real llama-server:
`search run` while trials run, then while the confirmation runs; then `search baseline save`, `search ab`
and `search bisect`, each once it has stored a round. After each kill no engine of the killed process is
left running, and after each resume (the same command again) nothing measured before the kill is lost:
every stored trial keeps its record, and every stored confirmation, baseline, A/B and bisect round its
values, in the finished result."""

from __future__ import annotations

import functools
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy.exc
import yaml

from harness import flagsearch_home
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


def run_and_kill(argv: list[str], ready: Callable[[], bool], delay_s: float) -> tuple[int, float]:
    """Start `search ARGV`, wait until `ready()` holds, then SIGKILL it `delay_s` later. Returns (its pid,
    how long after the start the kill came); the kill must find it still running."""
    proc = subprocess.Popen([sys.executable, "-m", "search.cli", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    try:
        deadline = t0 + 600
        while proc.poll() is None and time.monotonic() < deadline and not ready():
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before the phase the kill was meant for"
        time.sleep(delay_s)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL, "the run ended before the kill: nothing was cut short"
        return proc.pid, time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()


def read(path: Path) -> dict[str, Any]:
    """A JSON file the tool writes atomically, or {} while it does not exist yet."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def a_round_stored(rounds_now: Callable[[Path], list[list[Any]]], out: Path) -> bool:
    """Each side holds at least one finished round."""
    sides = rounds_now(out)
    return bool(sides) and all(len(side) >= 1 for side in sides)


def search(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "search.cli", *argv], capture_output=True, text=True, timeout=900,
                          check=False)


def killed_space(tmp_path: Path) -> Path:
    """The space every phase measures: one stream of 16 tokens, one run a start, no warm-up (seconds a round)."""
    doc = llama_space_doc(engine_args={"ctx_size": 512, "parallel": 1, "threads": 1}, name="killed",
                          params={"batch_size": {"type": "categorical", "choices": [2048, 512], "default": 2048}},
                          measure={"repeats": 1, "warmup": False, "request_timeout_s": 60},
                          workloads=[{"name": "w", "streams": ["qa"], "max_tokens": 16}],
                          budget={"trials": 2}, confirm={"top_k": 1, "max_rounds": 3})
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(doc))
    return space


def test_sigkill_at_a_random_moment_of_each_phase_loses_no_measured_round(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    space = killed_space(tmp_path)
    results = tmp_path / "results"
    storage = f"sqlite:///{results / 'killed' / 'study.db'}"
    argv = ["run", str(space), "--results", str(results), "--no-preflight", "--quiet"]
    phases = [("trials", lambda trials, conf: len(trials) >= 1, rng.uniform(0.0, 1.5)),
              ("confirmation", lambda trials, conf: int(conf.get("rounds", 0)) >= 1, rng.uniform(0.0, 2.0))]
    kept: list[tuple[str, dict[int, dict[str, float]], dict[str, Any]]] = []
    for phase, ready, delay in phases:
        pid, at = run_and_kill(argv, functools.partial(lambda holds: holds(*stored(storage)), ready), delay)
        trials, confirmation = stored(storage)
        print(f"{phase}: SIGKILL {delay:.2f} s after the phase began ({at:.1f} s into the run): "
              f"{len(trials)} trial(s), {confirmation.get('rounds', 0)} confirmation round(s) stored")
        assert left_running(pid) == [], f"engines of the killed run are still running ({phase})"
        kept.append((phase, trials, confirmation))
    done = search(argv)
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


METRIC = "w.output_tok_s"
ROUNDS = 3  # the kill comes after the first stored round: two are left to cut short and resume
Rounds = Callable[[Path], list[list[Any]]]  # per side, its rounds' values of METRIC, read from the folder


def baseline_save(space: Path, out: Path) -> tuple[list[str], Rounds, Rounds]:
    argv = ["baseline", "save", str(space), "--name", "killed", "--rounds", str(ROUNDS), "--dir",
            str(out / "baselines"), "--work-dir", str(out / "work"), "--quiet"]
    return (argv, lambda o: [read(o / "work" / "rounds.json").get("side", {}).get("samples", {}).get(METRIC, [])],
            lambda o: [read(o / "baselines" / "killed.json")["samples"][METRIC]])


def ab(space: Path, out: Path) -> tuple[list[str], Rounds, Rounds]:
    argv = ["ab", str(space), "--b-set", "batch_size=512", "--rounds", str(ROUNDS), "--metric", METRIC, "--out",
            str(out), "--quiet", "--json"]
    return (argv, lambda o: [read(o / "rounds.json").get("run", {}).get(k, {}).get("runs", {}).get(METRIC, [])
                             for k in ("a", "b")],
            lambda o: [read(o / "report.json")["run"][k]["runs"][METRIC] for k in ("a", "b")])


def bisect(space: Path, out: Path) -> tuple[list[str], Rounds, Rounds]:
    copy = out.parent / "llama-server-copy"  # a second "build": the same binary at another path
    if not copy.exists():
        shutil.copy2(flagsearch_home.llama_server(), copy)
    argv = ["bisect", str(space), "--build", f"command:{flagsearch_home.llama_server()}", "--build", f"command:{copy}",
            "--metric", METRIC, "--rounds", str(ROUNDS), "--max-rounds", str(ROUNDS), "--out", str(out), "--quiet"]

    def probe(o: Path) -> list[list[Any]]:  # two builds: one probe, build 1 against build 0
        return [p[k] for p in read(o / "bisect-state.json").get("probes", [])[:1] for k in ("runs_a", "runs_b")]
    return argv, probe, probe


@pytest.mark.parametrize("command", [baseline_save, ab, bisect], ids=["baseline-save", "ab", "bisect"])
def test_sigkill_of_a_command_without_a_study_loses_no_measured_round(
        tmp_path: Path, command: Callable[[Path, Path], tuple[list[str], Rounds, Rounds]]) -> None:
    """Each finished round is in a file (search/regress/rounds.py; bisect's state file) as it ends: killed
    at a random moment after its first stored round, the same command again finishes from those rounds.
    Only a kill that cut the measurement short tests that: one that came after the last round was stored
    (a host fast enough to finish within the drawn delay) is drawn again with no delay, in a fresh folder."""
    rng = random.Random(f"{SEED}-{command.__name__}")
    space = killed_space(tmp_path)
    for attempt, delay in enumerate([rng.uniform(0.0, 1.0), 0.0]):
        out = tmp_path / f"out{attempt}"
        argv, rounds_now, rounds_final = command(space, out)
        pid, at = run_and_kill(argv, functools.partial(a_round_stored, rounds_now, out), delay)
        before = rounds_now(out)
        print(f"{command.__name__}: SIGKILL {delay:.2f} s after its first stored round ({at:.1f} s into the run): "
              f"{len(before[0])} round(s) stored")
        assert left_running(pid) == [], "engines of the killed run are still running"
        if all(len(side) < ROUNDS for side in before):
            break
    assert all(len(side) < ROUNDS for side in before), \
        f"even a kill right after the first stored round found all {ROUNDS} stored: rounds are not stored as they end"
    done = search(argv)
    assert done.returncode in (0, 1, 3), done.stdout + done.stderr  # a verdict of three rounds, whichever
    assert "resuming from" in done.stderr, done.stderr
    after = rounds_final(out)
    for kept_side, final_side in zip(before, after, strict=True):  # 0 rounds lost: each is in the result
        assert len(final_side) == ROUNDS and final_side[:len(kept_side)] == kept_side, (kept_side, final_side)
    print(f"{command.__name__}: measured rounds lost 0, engines left 0")
