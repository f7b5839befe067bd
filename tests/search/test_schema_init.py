"""`search schema` (the space's JSON Schema, committed as spaces/space.schema.json and named by every
shipped space for editors) and `search init ENGINE MODEL_PATH` (a commented space that loads as written)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from search.cli import main
from search.commands.init import ENGINES
from search.commands.schema import schema_text
from search.exit_codes import Exit
from search.space.space import load_space

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "spaces").glob("*.yaml"))
HINT = "# yaml-language-server: $schema=space.schema.json"


def validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((REPO / "spaces" / "space.schema.json").read_text()))


def test_the_committed_schema_is_the_models_schema() -> None:
    assert (REPO / "spaces" / "space.schema.json").read_text() == schema_text(), \
        "run `make schema` (search schema -o spaces/space.schema.json) after changing search/space/schema.py"


@pytest.mark.parametrize("space", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_space_names_the_schema_and_is_valid_by_it(space: Path) -> None:
    assert space.read_text().splitlines()[0] == HINT, f"make `{HINT}` the first line of {space.name}"
    errors = [f"{list(e.path)}: {e.message}" for e in validator().iter_errors(yaml.safe_load(space.read_text()))]
    assert not errors, errors


def test_the_schema_catches_what_the_loader_refuses() -> None:
    doc = yaml.safe_load((REPO / "spaces" / "llamacpp-cpu.yaml").read_text())
    doc["params"]["threads"] = {"type": "categorical", "choice": [1, 2]}  # a typo of `choices`
    doc["workloads"][0]["max_tokens"] = "many"
    paths = {tuple(e.path)[:2] for e in validator().iter_errors(doc)}
    assert ("params", "threads") in paths and ("workloads", 0) in paths, paths


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_init_writes_a_commented_space_that_loads(engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    model = tmp_path / ("model.gguf" if engine == "llamacpp" else "my-model")
    model.mkdir() if engine != "llamacpp" else model.write_bytes(b"GGUF")
    assert main(["init", engine, str(model)]) == Exit.PASS
    written = tmp_path / f"{engine}.yaml"
    text = written.read_text()
    assert text.startswith("# yaml-language-server: $schema=") and text.count("\n#") >= 3  # commented
    schema_path = Path(text.splitlines()[0].split("$schema=", 1)[1])
    assert schema_path.is_file() and schema_path.read_text() == schema_text()
    space = load_space(written)
    assert space.m.models[0].path == str(model) and space.m.params and space.m.objectives
    assert not list(validator().iter_errors(yaml.safe_load(text)))
    assert "search run" in capsys.readouterr().err
    assert main(["init", engine, str(model)]) == Exit.USAGE  # never overwrites without --force
    assert main(["init", engine, str(model), "--force", "-o", "other.yaml", "--name", "mine"]) == Exit.PASS
    assert load_space(tmp_path / "other.yaml").name == "mine"


def test_an_initialised_space_dry_runs_with_the_users_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert main(["init", "llamacpp", "m.gguf", "-o", "s.yaml"]) == Exit.PASS
    capsys.readouterr()
    assert main(["run", "s.yaml", "--dry-run", "2"]) == Exit.PASS
    printed = capsys.readouterr().out
    assert f"llama-server -m {tmp_path / 'm.gguf'}" in printed and "# trial 1" in printed, printed
