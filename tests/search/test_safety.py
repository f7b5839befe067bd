"""Safety: space files are untrusted, nothing goes through a shell, secrets never reach what we
write, servers bind to loopback by default, results are written atomically and read strictly.

Source-tree greps are guards in addition to behaviour tests, never instead of them.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import flagsearch_home
from harness.engines import DIALECTS, EngineSettings, ModelChoice, get_engine
from harness.launch import LaunchSpec, get_launcher
from harness.launch.spec import REDACTED, redact_argv
from search.space.space import SpaceError, load_space, parse_space
from search.store.results import ResultsError, TrialRecord, read_json, read_record, write_json_atomic
from search.study.study import free_port

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("search", "harness", "scripts", "bench", "tests")


def python_files() -> list[Path]:
    return sorted(p for d in SOURCE_DIRS if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*.py"))


def calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return "?"


# ---- source guards ----------------------------------------------------------------------------------
def test_no_shell_anywhere_in_the_source() -> None:
    offenders = []
    for path in python_files():
        tree = ast.parse(path.read_text(), str(path))
        for call in calls(tree):
            name = dotted(call.func)
            shell = [k for k in call.keywords if k.arg == "shell" and not (
                isinstance(k.value, ast.Constant) and k.value.value is False)]
            if shell or name in ("os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput",
                                 "asyncio.create_subprocess_shell", "os.execl", "os.spawnl"):
                offenders.append(f"{path.relative_to(ROOT)}:{call.lineno}: {name}")
    assert not offenders, "shell use found:\n" + "\n".join(offenders)
    assert len(python_files()) > 20  # the guard looks at the real tree


def test_yaml_is_only_ever_safe_loaded() -> None:
    offenders = []
    for path in python_files():
        tree = ast.parse(path.read_text(), str(path))
        for call in calls(tree):
            name = dotted(call.func)
            if name in ("yaml.load", "yaml.load_all", "yaml.unsafe_load", "yaml.full_load", "yaml.unsafe_load_all",
                        "yaml.full_load_all"):
                offenders.append(f"{path.relative_to(ROOT)}:{call.lineno}: {name}")
            for k in call.keywords:
                if k.arg == "Loader" and dotted(k.value) not in ("yaml.SafeLoader", "yaml.CSafeLoader"):
                    offenders.append(f"{path.relative_to(ROOT)}:{call.lineno}: Loader={dotted(k.value)}")
    assert not offenders, "unsafe YAML loading:\n" + "\n".join(offenders)


# ---- untrusted space files ----------------------------------------------------------------------------
def test_a_space_file_cannot_run_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for payload in (f"!!python/object/apply:os.system ['touch {marker}']\n",
                    f"name: x\nengines: !!python/object/apply:subprocess.call [['touch', '{marker}']]\n",
                    f"name: !!python/name:os.system\nx: !!python/object/new:os.system ['touch {marker}']\n"):
        space = tmp_path / "evil.yaml"
        space.write_text(payload)
        with pytest.raises(SpaceError) as info:
            load_space(space)
        assert str(space) in str(info.value)
        assert not marker.exists()


SHELL_BAITS = ["$(touch {d}/a)", "; touch {d}/b", "`touch {d}/c`", "| touch {d}/d", "&& touch {d}/e",
               "'; touch {d}/f; '", "\n touch {d}/g", "${{IFS}}touch${{IFS}}{d}/h", "> {d}/i"]


def test_flag_values_reach_the_engine_verbatim_through_a_real_launch(tmp_path: Path) -> None:
    """A space's command and flag values go to exec() as a list: every shell bait arrives as one
    literal argument and nothing runs."""
    baits = [b.format(d=tmp_path) for b in SHELL_BAITS]
    port = free_port()
    echo = "import json, sys; print('ARGV=' + json.dumps(sys.argv[1:]), flush=True)"
    settings_ = EngineSettings(name="cmd", dialect="vllm", command=(sys.executable, "-c", echo))
    spec = get_engine("vllm").build_launch(settings_, ModelChoice("m", "/nonexistent"),
                                           {f"flag_{i}": b for i, b in enumerate(baits)}, {}, port)
    server = get_launcher("process").start(spec, tmp_path / "echo.log")
    deadline = time.monotonic() + 30
    while server.returncode() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    server.stop()
    line = next(x for x in (tmp_path / "echo.log").read_text().splitlines() if x.startswith("ARGV="))
    argv = json.loads(line[5:])
    for i, bait in enumerate(baits):
        assert argv[argv.index(f"--flag-{i}") + 1] == bait
    assert sorted(p.name for p in tmp_path.iterdir()) == ["echo.log"], "a shell bait was executed"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=30).filter(lambda s: "\x00" not in s), min_size=1, max_size=6))
def test_printed_command_line_pastes_back_to_the_same_argv(args: list[str]) -> None:
    """What a user copies from a report (`command_line`) is shell-quoted: pasting it cannot inject."""
    argv = tuple(a for a in ["/bin/engine", *args] if not a.startswith("-"))  # no secret-flag redaction here
    spec = LaunchSpec(engine="e", argv=argv, host="127.0.0.1", port=8000)
    assert shlex.split(spec.command_line()) == list(argv)


def test_launch_spec_refuses_what_exec_cannot_take() -> None:
    for argv in ((), ("a\x00b",)):
        with pytest.raises(ValueError):
            LaunchSpec(engine="e", argv=argv, host="127.0.0.1", port=8000)
    with pytest.raises(ValueError):
        LaunchSpec(engine="e", argv=("x",), host="127.0.0.1", port=8000, env={"A=B": "1"})
    with pytest.raises(ValueError):
        LaunchSpec(engine="e", argv=("x",), host="127.0.0.1", port=70000)


# ---- loopback by default ------------------------------------------------------------------------------
@pytest.mark.parametrize("dialect", [d for d in DIALECTS if d != "command"])
def test_servers_bind_loopback_unless_the_space_says_otherwise(dialect: str) -> None:
    doc = {"name": "s", "engines": {"e": {"dialect": dialect, "command": ["/bin/engine"]}},
           "models": [{"name": "m", "path": "/m"}], "workloads": [{"name": "w", "streams": ["qa"]}],
           "objectives": [{"metric": "w.output_tok_s"}]}
    space = parse_space(doc, "s.yaml")
    settings_ = space.engine_settings("e")
    assert settings_.host == "127.0.0.1"
    spec = get_engine(dialect).build_launch(settings_, space.model_choice("m"), {}, {}, 8000)
    assert spec.host == "127.0.0.1"
    assert spec.argv[list(spec.argv).index("--host") + 1] == "127.0.0.1"
    doc["engines"]["e"]["host"] = "0.0.0.0"  # an explicit, visible choice
    wide = parse_space(doc, "s.yaml").engine_settings("e")
    assert get_engine(dialect).build_launch(wide, space.model_choice("m"), {}, {}, 8000).host == "0.0.0.0"


def test_privileged_containers_are_an_explicit_choice() -> None:
    doc = {"name": "s", "engines": {"e": {"dialect": "vllm", "launcher": "docker", "image": "img",
                                          "command": ["vllm"]}},
           "models": [{"name": "m", "path": "/m"}], "workloads": [{"name": "w", "streams": ["qa"]}],
           "objectives": [{"metric": "w.output_tok_s"}]}
    settings_ = parse_space(doc, "s.yaml").engine_settings("e")
    assert not settings_.privileged and not settings_.ipc_host
    spec = get_engine("vllm").build_launch(settings_, ModelChoice("m", "/m"), {}, {}, 8000)
    assert "--privileged" not in spec.command_line()


# ---- secrets ------------------------------------------------------------------------------------------
def test_secret_flags_are_redacted_in_printed_commands() -> None:
    argv = ["srv", "--api-key", "sk-abcdef123456", "--hf-token=hf_zyxwvu987654", "--port", "1"]
    assert redact_argv(argv) == ["srv", "--api-key", REDACTED, f"--hf-token={REDACTED}", "--port", "1"]
    spec = LaunchSpec(engine="e", argv=tuple(argv), host="127.0.0.1", port=1,
                      env={"HF_TOKEN": "hf_zyxwvu987654", "OMP_NUM_THREADS": "2"})
    line = spec.command_line()
    assert "sk-abcdef123456" not in line and "hf_zyxwvu987654" not in line
    assert "OMP_NUM_THREADS=2" in line


SECRET_ENV = "hf_SECRET_from_env_7f3a9c"
SECRET_LITERAL = "sk-literal-secret-2b8e41"


@pytest.mark.e2e
def test_secrets_never_reach_anything_the_tool_writes(tmp_path: Path) -> None:
    """A real search with a token in the environment, a key written into the space (env and an
    engine flag), then a baseline: grep every byte the tool wrote and printed."""
    binary = flagsearch_home.llama_server()
    if not binary.exists():
        pytest.fail(f"llama-server is missing at {binary}: run `make setup` first", pytrace=False)
    doc = {
        "name": "secrets",
        "engines": {"llamacpp": {
            "dialect": "llamacpp", "command": [str(binary)],
            "env": {"MY_API_KEY": SECRET_LITERAL, "UPSTREAM_TOKEN": "${HF_TOKEN}", "OMP_NUM_THREADS": "1"},
            # The token also reaches the engine's argv (and so its log and the served model id).
            "args": {"ctx_size": 1024, "parallel": 1, "alias": "${HF_TOKEN}"},
            "ready_timeout_s": 60}},
        "models": [{"name": "smollm2", "path": str(flagsearch_home.smollm2_gguf())}],
        "params": {"threads": {"type": "categorical", "choices": [1], "default": 1}},
        "measure": {"repeats": 1, "warmup": False, "request_timeout_s": 60},
        "workloads": [{"name": "single", "streams": ["qa"], "max_tokens": 16}],
        "objectives": [{"metric": "single.output_tok_s"}],
        "quality": {"suite": None},
        "budget": {"trials": 1},
    }
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(doc, sort_keys=False))
    results = tmp_path / "results"
    env = {**os.environ, "HF_TOKEN": SECRET_ENV}
    run = subprocess.run([sys.executable, "-m", "search.cli", "run", str(space), "--results", str(results),
                          "--study", "s", "--trials", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    base = subprocess.run([sys.executable, "-m", "search.cli", "baseline", "save", str(results / "s"), "--name",
                           "secret-check", "--dir", str(tmp_path / "baselines")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert base.returncode == 0, base.stdout + base.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "space.yaml"]
    assert any(p.name == "result.json" for p in written) and any(p.name == "server.log" for p in written)
    assert any(p.name == "study.db" for p in written)
    leaks = [str(p) for p in written for secret in (SECRET_ENV, SECRET_LITERAL) if secret.encode() in p.read_bytes()]
    for name, text in (("search run output", run.stdout + run.stderr), ("baseline output", base.stdout + base.stderr)):
        leaks += [name for secret in (SECRET_ENV, SECRET_LITERAL) if secret in text]
    assert not leaks, f"a secret reached: {leaks}"
    record = read_record(results / "s" / "trials" / "0000" / "result.json")
    assert record.env.get("MY_API_KEY") == REDACTED and record.env.get("OMP_NUM_THREADS") == "1"
    assert f"--alias {REDACTED}" in record.command  # scrubbed by value
    assert list((tmp_path / "baselines").glob("*.json")), base.stdout


# ---- atomic writes, strict reads ----------------------------------------------------------------------
def test_write_is_atomic_when_the_disk_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "result.json"
    write_json_atomic(path, {"v": 1})

    def full(fd: int) -> None:  # fault injection: the disk fills up while the new version is flushed
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ResultsError) as info:
        write_json_atomic(path, {"v": 2, "big": "x" * 100_000})
    assert "disk full" in str(info.value) and str(path) in str(info.value)
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"], "a temporary file was left behind"


def test_unencodable_results_leave_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    write_json_atomic(path, {"v": 1})
    circular: dict[str, object] = {}
    circular["self"] = circular
    with pytest.raises(ResultsError):
        write_json_atomic(path, circular)
    assert read_json(path) == {"v": 1}


def _record(**over: object) -> dict[str, object]:
    rec = TrialRecord(number=3, state="complete", params={"engine": "e", "model": "m"}, engine="e", model="m",
                      metrics={"w.output_tok_s": 12.5}, objective_values=[12.5])
    return {**rec.summary(), "workloads": {}, **over}


def test_corrupted_or_partial_results_give_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "trials" / "0003" / "result.json"
    write_json_atomic(path, _record())
    assert read_record(path).objective_values == [12.5]
    whole = path.read_bytes()
    cases = {
        "partial": whole[: len(whole) // 2],
        "empty": b"",
        "binary": b"\xff\xfe\x00garbage",
        "not an object": b"[1, 2, 3]",
        "damaged": json.dumps(_record(state="complete", objective_values=None)).encode(),
        "wrong types": json.dumps(_record(metrics={"w.output_tok_s": "fast"})).encode(),
        "unknown state": json.dumps(_record(state="great")).encode(),
        "missing fields": json.dumps({"number": 3}).encode(),
    }
    for what, data in cases.items():
        path.write_bytes(data)
        with pytest.raises(ResultsError) as info:
            read_record(path)
        message = str(info.value)
        assert str(path) in message, (what, message)
        assert "\n" not in message, (what, message)


def test_report_on_a_corrupted_results_file_warns_never_silently(tmp_path: Path) -> None:
    """`search report` over a study whose result.json was cut in half names the file in a warning."""
    import optuna

    from search.study.study import RECORD_ATTR, default_storage

    results = tmp_path / "r"
    study = optuna.create_study(storage=default_storage(results), study_name="r", direction="maximize")
    study.set_user_attr("objectives", [["w.output_tok_s", "maximize"]])
    trial = study.ask()
    data = _record(number=trial.number)
    trial.set_user_attr(RECORD_ATTR, {k: v for k, v in data.items() if k != "workloads"})
    study.tell(trial, 12.5)
    path = results / "trials" / "0000" / "result.json"
    write_json_atomic(path, data)
    path.write_bytes(path.read_bytes()[:40])
    argv = [sys.executable, "-m", "search.cli", "report", str(results), "--html", str(tmp_path / "r.html")]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert "Traceback" not in text, text
    assert str(path) in text.replace("\n", "") and "corrupted or partial" in text.replace("\n", " "), text
    assert str(path) in (tmp_path / "r.html").read_text()


def test_a_corrupted_study_database_is_a_one_line_error(tmp_path: Path) -> None:
    results = tmp_path / "r"
    results.mkdir()
    (results / "study.db").write_bytes(b"this is not a database" * 100)
    out = subprocess.run([sys.executable, "-m", "search.cli", "show", str(results)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr
    assert "study.db" in out.stderr or "database" in out.stderr.lower(), out.stderr


@pytest.mark.e2e
def test_servers_listen_on_loopback_only(tmp_path: Path) -> None:
    """From the OS: a real server started from a default space listens on 127.0.0.1, nowhere else."""
    binary = flagsearch_home.llama_server()
    if not binary.exists():
        pytest.fail(f"llama-server is missing at {binary}: run `make setup` first", pytrace=False)
    doc = {"name": "s", "engines": {"e": {"dialect": "llamacpp", "command": [str(binary)],
                                          "args": {"ctx_size": 512, "parallel": 1}}},
           "models": [{"name": "m", "path": str(flagsearch_home.smollm2_gguf())}],
           "workloads": [{"name": "w", "streams": ["qa"]}], "objectives": [{"metric": "w.output_tok_s"}]}
    space = parse_space(doc, "s.yaml")
    port = free_port()
    spec = get_engine("llamacpp").build_launch(space.engine_settings("e"), space.model_choice("m"), {}, {}, port)
    server = get_launcher("process").start(spec, tmp_path / "l.log")
    try:
        from harness.launch import wait_ready

        wait_ready(server, "/health", 60)
        listening = [c.laddr for c in psutil.Process(server.pid).net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN]
    finally:
        server.stop()
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
