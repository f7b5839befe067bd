"""`search best`: the winner as the user's daily command (a named container, a fixed port, a restart
policy, the trial's volumes) and, separately, the exact command the trial ran."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import optuna

from search.commands.show import daily_command
from search.space.space import load_space
from search.store.results import TrialRecord, TrialState
from search.store.storage import default_storage
from search.store.trial_index import RECORD_ATTR
from search.study.dryrun import launch_of

ROOT = Path(__file__).resolve().parents[2]
QWEN = ROOT / "spaces" / "qwen122b.yaml"


def _recipe_record() -> TrialRecord:
    space = load_space(QWEN)
    _, params = space.queued_configs()[0]  # the community recipe (vllm_albond, entrypoint kept)
    config = space.sample(optuna.trial.FixedTrial({k: v for k, v in params.items()}))
    launch = launch_of(space, config, port=41234)
    return TrialRecord(number=1, state=TrialState.COMPLETE, params=config.as_params(), engine=config.engine,
                       model=config.model, command=launch.command, metrics={"qa.decode_tok_s": 51.0,
                                                                             "uniform_short.decode_tok_s": 90.0},
                       objective_values=[51.0, 90.0], constraint_values=[0.0])


def test_the_daily_command_is_a_named_detached_container_on_a_fixed_port() -> None:
    space = load_space(QWEN)
    record = _recipe_record()
    daily = shlex.split(daily_command(space, record, "qwen122b spark", 8000))
    trial = shlex.split(record.command)
    assert daily[:7] == ["docker", "run", "-d", "--name", "qwen122b-spark", "--restart", "unless-stopped"]
    assert "--rm" not in daily and trial[2] == "--rm"
    assert daily[daily.index("--port") + 1] == "8000" and trial[trial.index("--port") + 1] == "41234"
    volumes = [daily[i + 1] for i, w in enumerate(daily) if w == "-v"]
    assert volumes == [trial[i + 1] for i, w in enumerate(trial) if w == "-v"] and len(volumes) == 4
    assert "--entrypoint" not in daily  # the recipe's image keeps its patching entrypoint, daily too
    # The same server otherwise: every word after the port is the trial's.
    assert daily[daily.index("--port") + 2:] == trial[trial.index("--port") + 2:]


def test_search_best_prints_the_daily_command_and_the_trials_own(tmp_path: Path) -> None:
    results = tmp_path / "qwen122b-spark"
    study = optuna.create_study(storage=default_storage(results), study_name=results.name,
                                directions=["maximize", "maximize"])
    study.set_user_attr("objectives", [["qa.decode_tok_s", "maximize"], ["uniform_short.decode_tok_s", "maximize"]])
    study.set_user_attr("space_source", str(QWEN))
    record = _recipe_record()
    trial = study.ask()
    trial.set_user_attr(RECORD_ATTR, record.summary())
    study.tell(trial, [51.0, 90.0])
    out = subprocess.run([sys.executable, "-m", "search.cli", "best", str(results), "--port", "8001"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert [ln for ln in out.stdout.splitlines() if ln.strip()] == [record.command]  # paste: the trial again
    err = out.stderr.splitlines()
    i = next(i for i, ln in enumerate(err) if ln.startswith("# trial #1 as a daily driver"))
    assert "port 8001" in err[i] and err[i + 1].startswith("docker run -d --name qwen122b-spark --restart "
                                                             "unless-stopped ")
    assert "# the exact command trial #1 ran (foreground, removed when stopped):" in err
    daily = subprocess.run([sys.executable, "-m", "search.cli", "best", str(results), "--daily"],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert daily.stdout.strip() == err[i + 1].replace("--port 8001", "--port 8000")
