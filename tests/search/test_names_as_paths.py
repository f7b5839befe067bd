"""Names become paths only after a check: a space name, an engine key, a --study name or a baseline
name can never write outside results/, baselines/ or FLAGSEARCH_HOME (`..`, `/tmp/x`, `x/../../y`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from search.regress.baseline import baseline_path
from search.space.space import SpaceError, parse_space
from search.store.results import ResultsError
from search.store.storage import storage_for, study_name

ROOT = Path(__file__).resolve().parents[2]


def doc(name: str = "ok", engine: str = "llamacpp") -> dict[str, object]:
    return {"name": name, "engines": {engine: {"dialect": "llamacpp", "command": ["/no/such/llama-server"]}},
            "models": [{"name": "m", "path": "/m.gguf"}], "workloads": [{"name": "w", "streams": ["qa"]}],
            "objectives": [{"metric": "w.output_tok_s"}], "quality": {"suite": None}}


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "-flag", "a/b", "../x", "/tmp/x"])
def test_a_space_name_that_is_not_a_plain_name_is_refused(name: str) -> None:
    with pytest.raises(SpaceError, match="name"):
        parse_space(doc(name=name), "s.yaml")


@pytest.mark.parametrize("key", ["x/../../../escaped", "..", "a/b", ".x"])
def test_an_engine_key_that_is_not_a_plain_name_is_refused(key: str) -> None:
    with pytest.raises(SpaceError, match="engine key"):
        parse_space(doc(engine=key), "s.yaml")


@pytest.mark.parametrize("name", ["..", "../escaped", "/tmp/escaped", "a/b", "-x", ""])
def test_study_and_baseline_names_are_checked(name: str) -> None:
    with pytest.raises(ResultsError, match="study name"):
        study_name(name)
    with pytest.raises(ResultsError, match="study name"):
        storage_for(name, "sqlite:///x.db")
    if name:
        with pytest.raises(ValueError, match="baseline name"):
            baseline_path(Path("baselines"), name)
    assert study_name("demo-2026.12_01") == "demo-2026.12_01"


@pytest.mark.parametrize("study", ["../escaped", "/tmp/flagsearch-escaped-study", ".."])
def test_run_with_a_study_outside_results_writes_nothing_and_says_so(tmp_path: Path, study: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "space.yaml").write_text(yaml.safe_dump(doc()))
    done = subprocess.run([sys.executable, "-m", "search.cli", "run", "space.yaml", "--study", study, "--trials", "1",
                           "--no-preflight"], cwd=work, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and "study name" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in work.iterdir()) == ["space.yaml"] and not (tmp_path / "escaped").exists()
    assert not Path("/tmp/flagsearch-escaped-study").exists()
