"""A space is a script (docs/security.md): --dry-run and --preflight say what in it reaches beyond the
server it starts, Docker mounts are read-only unless the space says otherwise, and preflight names the
command it ran (the space's own, with --help) instead of "nothing was started"."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import yaml

from harness import flagsearch_home
from search.space.space import parse_space
from search.study.dryrun import dry_run, trust_warnings

ROOT = Path(__file__).resolve().parents[2]


def space_doc(engines: dict[str, object]) -> dict[str, object]:
    return {"name": "t", "engines": engines, "models": [{"name": "m", "path": "/m.gguf"}],
            "workloads": [{"name": "w", "streams": ["qa"], "max_tokens": 8}],
            "objectives": [{"metric": "w.output_tok_s"}], "quality": {"suite": None}}


def test_the_dry_run_opens_with_a_warning_block_for_what_reaches_beyond_the_server() -> None:
    home = str(Path.home())
    space = parse_space(space_doc({
        "boxed": {"dialect": "llamacpp", "launcher": "docker", "image": "x:1", "command": ["/srv"],
                  "privileged": True, "host": "0.0.0.0",
                  "volumes": [{"host": "/", "container": "/host", "read_only": False},
                              {"host": "/var/run/docker.sock", "container": "/var/run/docker.sock"},
                              {"host": home, "container": "/root", "read_only": False},
                              {"host": "/data/models", "container": "/models"}]},
        "local": {"dialect": "llamacpp", "command": ["/usr/bin/env", "llama-server"]},
        "ours": {"dialect": "llamacpp", "command": [str(flagsearch_home.home() / "llama.cpp" / "llama-server")]},
        # A venv's python is a link to the system's: the venv under FLAGSEARCH_HOME is what counts.
        "venv": {"dialect": "llamacpp", "command": [str(flagsearch_home.vllm_python())]},
    }), "t.yaml")
    said = trust_warnings(space)
    text = "\n".join(said)
    assert "engines.boxed: privileged: true" in text and "engines.boxed: host 0.0.0.0" in text
    assert "engines.boxed.volumes: / is /, mounted WRITABLE" in text
    assert "docker.sock is the Docker socket (root on this machine), mounted read-only" in text
    assert f"engines.boxed.volumes: {home} is $HOME, mounted WRITABLE" in text
    assert "engines.local: runs /usr/bin/env (outside FLAGSEARCH_HOME" in text
    # The tool's own builds (a venv's python included) and a plain mount are not warned about.
    assert "engines.ours" not in text and "engines.venv" not in text and "/data/models" not in text
    lines = dry_run(space, 1)
    assert lines[0].startswith("# WARNING: this space reaches beyond the server it starts")
    assert all(f"#   {w}" in lines for w in said)


def test_docker_volumes_are_read_only_unless_the_space_says_otherwise() -> None:
    space = parse_space(space_doc({"d": {"dialect": "llamacpp", "launcher": "docker", "image": "x:1",
                                         "command": ["/srv"],
                                         "volumes": [{"host": "/data", "container": "/data"},
                                                     {"host": "/cache", "container": "/cache", "read_only": False}]}}),
                        "t.yaml")
    data, cache = space.engine_settings("d").volumes
    assert data.read_only and not cache.read_only


def test_preflight_names_the_command_it_ran(tmp_path: Path) -> None:
    """The space's command is run with --help on this machine (here it leaves a file, as the review's
    did): preflight says so, where it used to print "nothing was started"."""
    engine = tmp_path / "engine.sh"
    engine.write_text(f"#!/bin/sh\necho ran > {tmp_path}/wrote-this\necho '--threads N  --ctx-size N  --port N "
                      "--host H --model M --alias A --batch-size N --parallel N --flash-attn X --n-gpu-layers N'\n")
    engine.chmod(engine.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "m.gguf").write_text("")
    doc = space_doc({"llamacpp": {"command": [str(engine)]}})
    doc["models"] = [{"name": "m", "path": str(tmp_path / "m.gguf")}]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc))
    home = tmp_path / "home"
    done = subprocess.run([sys.executable, "-m", "search.cli", "run", str(tmp_path / "s.yaml"), "--preflight"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "FLAGSEARCH_HOME": str(home)})
    said = " ".join(done.stderr.split())
    assert (tmp_path / "wrote-this").exists()  # it did run the space's command
    assert f"it ran only `{engine} --help` to read the flags" in said, said
    assert "nothing was started" not in said
    assert f"engines.llamacpp: runs {engine} (outside FLAGSEARCH_HOME" in said
