"""A confirmation is stored round by round on a real llama-server: killed (SIGKILL) after two
rounds it resumes from those two, and Ctrl-C ends it with one line and its finished rounds stored."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from search.confirm.confirm import CONFIRM_ATTR
from search.study.study import StudyRunner, default_storage
from tests.conftest import Quiet, llama_space_doc

pytestmark = pytest.mark.e2e

ROUNDS = 4


def stored(storage: str, name: str) -> dict[str, Any]:
    data = optuna.load_study(study_name=name, storage=storage).user_attrs.get(CONFIRM_ATTR)
    return data if isinstance(data, dict) else {}


def confirm_until(space: Path, folder: Path, storage: str, rounds: int, sig: signal.Signals) -> tuple[int, str, str]:
    """`search confirm --rounds ROUNDS` as a child process, sent `sig` once `rounds` rounds are stored."""
    proc = subprocess.Popen([sys.executable, "-m", "search.cli", "confirm", str(folder), "--space", str(space),
                             "--results", str(folder.parent), "--top", "1", "--rounds", str(ROUNDS)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            if int(stored(storage, folder.name).get("rounds", 0)) >= rounds:
                proc.send_signal(sig)
                break
            time.sleep(0.3)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


@pytest.mark.slow  # make test kills and resumes a confirmation in test_kill_at_random
def test_a_killed_confirmation_resumes_from_its_stored_rounds(tmp_path: Path) -> None:
    doc = llama_space_doc(engine_args={"ctx_size": 512, "parallel": 1, "threads": 1}, name="resume",
                          params={"batch_size": {"type": "categorical", "choices": [2048, 512], "default": 2048}},
                          measure={"repeats": 1, "warmup": False, "request_timeout_s": 60},
                          workloads=[{"name": "w", "streams": ["qa"], "max_tokens": 16}],
                          budget={"trials": 2}, confirm={"top_k": 1, "max_rounds": ROUNDS})
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(doc))
    folder = tmp_path / "results" / "resume"
    storage = default_storage(folder)
    from search.space.space import load_space

    runner = StudyRunner(load_space(str(space)), storage, "resume", folder, Quiet())
    runner.study.enqueue_trial({"batch_size": 512})
    runner.run(n_trials=2)

    code, _, _ = confirm_until(space, folder, storage, 2, signal.SIGKILL)
    assert code == -signal.SIGKILL
    first = stored(storage, "resume")
    assert first["complete"] is False and first["rounds"] >= 2, first.get("answer")
    kept = {a["key"]: a["runs"] for a in first["arms"]}
    assert all(len(runs) == first["rounds"] for runs in kept.values())

    # Resumed, then Ctrl-C once a further round is stored: one line, exit 130, the rounds kept.
    code, out, err = confirm_until(space, folder, storage, first["rounds"] + 1, signal.SIGINT)
    # Progress is on stderr (docs/cli.md), the interruption its one last line.
    assert f"resuming the interrupted confirmation: {first['rounds']} of at most {ROUNDS} rounds" in err, out + err
    assert code == 130 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("interrupted")]
    assert said == [lines[-1]] and said[0].startswith("interrupted: servers stopped;") and "resumes them" in said[0]
    second = stored(storage, "resume")
    assert second["complete"] is False and second["rounds"] > first["rounds"]
    for arm in second["arms"]:  # the stored rounds are the same values, not re-measured
        assert arm["runs"][:first["rounds"]] == kept[arm["key"]]

    done = subprocess.run([sys.executable, "-m", "search.cli", "confirm", str(folder), "--space", str(space),
                           "--results", str(folder.parent)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    final = stored(storage, "resume")
    assert final["complete"] is True and final["rounds"] == ROUNDS and final["stages"] == 1, final["answer"]
    for arm in final["arms"]:
        assert arm["runs"][:second["rounds"]] == [runs for a in second["arms"] if a["key"] == arm["key"]
                                                  for runs in a["runs"]]
    assert not final["answer"].startswith("not confirmed yet"), final["answer"]
    assert (folder / "confirm").is_dir()
