"""Several workers on one study: through a real PostgreSQL server (scripts/postgres.sh) and through
one SQLite file, all started at the same instant; the study's budget holds (search/study/lock.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml

from search.store.storage import BUDGET_ATTR, counted_trials
from search.study.study import RECORD_ATTR
from tests.conftest import llama_space_doc

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]
ROOT = Path(__file__).resolve().parents[2]
# A worker process: imports first; then, each round, waits until every worker is ready and runs
# `search run` (argv: ready folder, worker count, rounds, CLI args where {round} is the round).
# Imports take seconds on a busy machine: without the wait the workers would start seconds apart
# and hide the race; paid once for all rounds, they keep the test short.
WORKER = """
import sys, time
from pathlib import Path
from search.cli import build_parser, main
build_parser()  # imports every command's module now
root, n, rounds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
codes = []
for r in range(rounds):
    ready = root / str(r)
    ready.mkdir(exist_ok=True)
    (ready / str(time.time_ns())).touch()
    while len(list(ready.iterdir())) < n:
        time.sleep(0.001)
    codes.append(main([a.replace("{round}", str(r)) for a in sys.argv[4:]]))
    print(f"round {r} exit {codes[-1]}", flush=True)
sys.exit(max(codes))
"""


@pytest.fixture(scope="session")
def postgres_url() -> str:
    if os.environ.get("FLAGSEARCH_PG_URL"):
        return os.environ["FLAGSEARCH_PG_URL"]
    subprocess.run(["bash", str(ROOT / "scripts" / "postgres.sh"), "start"], check=True, timeout=300)
    out = subprocess.run(["bash", str(ROOT / "scripts" / "postgres.sh"), "url"], check=True, capture_output=True,
                         text=True, timeout=60)
    return out.stdout.strip()


def llamacpp_space(tmp: Path) -> Path:
    # -t 1 everywhere: the suite runs two tests at once on two cores, and -t 2 crawls then.
    doc = llama_space_doc(
        engine_args={"ctx_size": 2048, "threads": 1}, name="dist",
        params={"parallel": {"type": "categorical", "choices": [1, 2], "default": 1},
                "batch_size": {"type": "categorical", "choices": [512, 2048], "default": 2048},
                "ubatch_size": {"type": "categorical", "choices": [128, 512], "default": 512}},
        measure={"repeats": 1, "warmup": False, "request_timeout_s": 60})
    path = tmp / "space.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def start_together(n: int, args: list[str], tmp: Path, results: Callable[[int], Path], rounds: int = 1,
                   ok: Callable[[int, str], bool] = lambda rc, _: rc == 0) -> list[str]:
    """Run n `search run` workers that begin each round at the same instant; their outputs, after
    all ended. `{round}` in args and results folders is replaced by the round's number."""
    ready = tmp / f"ready-{uuid.uuid4().hex[:6]}"
    ready.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(ready), str(n), str(rounds), *args, "--results",
                                 str(results(i))], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for i in range(n)]
    outputs = [w.communicate(timeout=900)[0] for w in workers]
    for w, out in zip(workers, outputs, strict=True):
        assert ok(w.returncode, out), out
    return outputs


def test_two_workers_share_one_budget_without_duplicates_or_losses(tmp_path: Path, postgres_url: str) -> None:
    space = llamacpp_space(tmp_path)
    study = f"dist-{uuid.uuid4().hex[:8]}"
    budget = 6
    start_together(2, ["run", str(space), "--storage", postgres_url, "--study", study, "--trials", str(budget),
                       "--quiet", "--no-confirm"], tmp_path, lambda i: tmp_path / f"w{i}")

    loaded = optuna.load_study(study_name=study, storage=postgres_url)
    trials = loaded.get_trials(deepcopy=False)
    finished = [t for t in trials if t.state.is_finished()]
    assert len(finished) == budget, [(t.number, t.state) for t in trials]
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    # Every finished trial carries its record (nothing lost), each trial number once (nothing doubled).
    assert all(RECORD_ATTR in t.user_attrs for t in finished)
    numbers = Counter(t.user_attrs[RECORD_ATTR]["number"] for t in finished)
    assert all(n == 1 for n in numbers.values())
    # Both workers did work: each wrote trial folders of its own.
    assert all(list((tmp_path / f"w{i}" / study / "trials").glob("*/result.json")) for i in range(2))
    # The default config ran exactly once, whichever worker took it.
    assert sum(bool(t.user_attrs.get("baseline")) for t in finished) == 1


def failing_engine_space(tmp: Path) -> Path:
    """Fault injection: an "engine" that exits 0.3 s after it starts, so each trial is a quick real
    failure (a failed start counts in the budget) and many rounds of many workers take seconds.
    What is under test is the claim on the budget, which does not depend on the engine."""
    model = tmp / "model.gguf"
    model.write_bytes(b"\0")
    exits = [sys.executable, "-c", "import sys, time; time.sleep(0.3); sys.exit(1)"]
    doc = {
        "name": "race",
        "engines": {"llamacpp": {"command": exits, "args": {"parallel": 1}, "ready_timeout_s": 10}},
        "models": [{"name": "m", "path": str(model)}],
        "params": {"threads": {"type": "categorical", "choices": [1, 2], "default": 2},
                   "batch_size": {"type": "categorical", "choices": [512, 1024, 2048], "default": 2048},
                   "ubatch_size": {"type": "categorical", "choices": [128, 256, 512], "default": 512}},
        "measure": {"repeats": 1, "warmup": False, "request_timeout_s": 10},
        "workloads": [{"name": "w", "streams": ["qa"], "max_tokens": 8}],
        "quality": {"suite": None},
        "objectives": [{"metric": "w.output_tok_s"}],
    }
    path = tmp / "race.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_workers_started_at_the_same_instant_never_exceed_the_budget(tmp_path: Path, backend: str,
                                                                      request: pytest.FixtureRequest) -> None:
    space = failing_engine_space(tmp_path)
    workers, budget, rounds = 5, 7, 3
    tag = uuid.uuid4().hex[:8]
    # SQLite: a fresh file each round, so that the workers also race to create its tables.
    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else \
        f"sqlite:///{tmp_path / 'race-{round}.db'}"
    outputs = start_together(workers, ["run", str(space), "--storage", url, "--study", f"race-{tag}-{{round}}",
                                       "--trials", str(budget), "--quiet", "--no-confirm"], tmp_path,
                             lambda i: tmp_path / f"w{i}-{{round}}", rounds,
                             ok=lambda rc, out: rc == 0 or (rc == 1 and "no feasible config" in out))
    for round_ in range(rounds):
        here = url.replace("{round}", str(round_))
        trials = optuna.load_study(study_name=f"race-{tag}-{round_}", storage=here).get_trials(deepcopy=False)
        states = [(t.number, t.state.name, t.user_attrs.get(BUDGET_ATTR, True)) for t in trials]
        assert counted_trials(optuna.load_study(study_name=f"race-{tag}-{round_}", storage=here)) == budget, \
            (round_, states, outputs)
        # Nothing beyond the budget was even started: no skipped or duplicate trial either.
        assert len(trials) == budget and all(t.state.is_finished() for t in trials), (round_, states)
        assert sum(bool(t.user_attrs.get("baseline")) for t in trials) == 1, (round_, states)
        assert len({repr(sorted(t.params.items())) for t in trials}) == budget, "a config ran twice"
