"""What the CLI prints: error lines never folded, tables at the terminal's width on a terminal and
160 columns when piped, user text shown literally (never eaten as rich markup)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import optuna

from search.store.results import TrialRecord
from search.study.study import RECORD_ATTR, default_storage
from search.terminal import PIPED_WIDTH

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def cli_piped(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run([sys.executable, "-m", "search.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**env, "PYTHONPATH": str(ROOT)})


def cli_on_terminal(*args: str, cwd: Path, columns: int) -> str:
    """Run the CLI with stdout and stderr on a pseudo-terminal `columns` wide; return what it drew."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen([sys.executable, "-m", "search.cli", *args], cwd=cwd, stdout=follower, stderr=follower,
                            stdin=subprocess.DEVNULL, env={**env, "PYTHONPATH": str(ROOT), "TERM": "xterm"})
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(leader)
    return ANSI.sub("", b"".join(chunks).decode(errors="replace")).replace("\r\n", "\n")


def make_study(results: Path) -> None:
    """A stored study whose table is wide: long parameter values and a long failure note."""
    study = optuna.create_study(storage=default_storage(results), study_name=results.name, direction="maximize")
    study.set_user_attr("objectives", [["w.output_tok_s", "maximize"]])
    for n in range(3):
        trial = study.ask()
        params = {"engine": "e", "model": "m", "cache_type_k": f"q8_0-variant-{n}", "choices": "[f16, q8_0]",
                  "a_long_parameter_name": "a-long-parameter-value-" * 2}
        rec = TrialRecord(number=trial.number, state="complete", params=params, engine="e", model="m",
                          metrics={"w.output_tok_s": 10.0 + n}, objective_values=[10.0 + n])
        trial.set_user_attr(RECORD_ATTR, rec.summary())
        study.tell(trial, 10.0 + n)


def test_piped_error_is_one_line_and_keeps_its_brackets(tmp_path: Path) -> None:
    long_dir = tmp_path / ("d" * 90)
    long_dir.mkdir()
    space = long_dir / "space.yaml"
    space.write_text("name: s\nengines: {e: {command: [x]}}\nmodels: [{name: m, path: p}]\n"
                     "params: {t: {type: categorical, choices: [f16, q8_0], default: nope}}\n"
                     "workloads: [{name: w, streams: [qa]}]\nobjectives: [{metric: w.output_tok_s}]\n")
    proc = cli_piped("run", str(space), cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) > PIPED_WIDTH, proc.stderr  # longer than any width: not folded
    assert "['f16', 'q8_0']" in lines[0] and str(space) in lines[0], lines[0]


def test_error_on_a_terminal_is_not_folded(tmp_path: Path) -> None:
    space = tmp_path / "broken-space-file-with-a-long-name.yaml"
    space.write_bytes(b"name: x\ndescription: caf\xe9 and more text so that the line is long\n")
    text = cli_on_terminal("run", str(space), cwd=tmp_path, columns=60)
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and len(lines[0]) > 60, text  # the terminal wraps it; rich inserted no break
    assert "invalid continuation byte" in lines[0]


def test_tables_follow_the_terminal_width_and_use_a_wide_layout_when_piped(tmp_path: Path) -> None:
    results = tmp_path / "results" / "wide"
    make_study(results)
    piped = cli_piped("show", str(results), cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    widths = [len(line) for line in piped.stdout.splitlines()]
    assert max(widths) <= PIPED_WIDTH and max(widths) > 100, piped.stdout  # wide, never rich's 80
    assert "[f16, q8_0]" in piped.stdout  # a value with brackets is shown, not eaten as markup
    narrow = cli_on_terminal("show", str(results), cwd=tmp_path, columns=90)
    table = [line for line in narrow.splitlines() if line.startswith(("┏", "┃", "│", "└"))]
    assert table and max(len(line) for line in table) <= 90, narrow


def test_terminal_escapes_from_a_space_or_a_shared_study_are_shown_not_obeyed(tmp_path: Path) -> None:
    """A space's choice and a shared study's record carry escapes (retitle the terminal, clear the
    screen, a one-byte CSI): `search run --dry-run` and `search show` print them as text, on a
    terminal too, while rich's own colours still pass."""
    import yaml

    evil = "q8_0\x1b]0;pwned\x07\x1b[2J\x9b31m"
    doc = {"name": "esc", "engines": {"llamacpp": {"command": ["llama-server"]}},
           "models": [{"name": "m", "path": "/m.gguf"}],
           "params": {"cache_type_k": {"type": "categorical", "choices": ["f16", evil], "default": evil}},
           "workloads": [{"name": "w", "streams": ["qa"], "max_tokens": 8}],
           "objectives": [{"metric": "w.output_tok_s"}], "quality": {"suite": None}}
    (tmp_path / "esc.yaml").write_text(yaml.safe_dump(doc, allow_unicode=True))
    dry = cli_piped("run", str(tmp_path / "esc.yaml"), "--dry-run", "1", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "\x1b" not in dry.stdout and "\x9b" not in dry.stdout and "\x07" not in dry.stdout
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m" in dry.stdout
    results = tmp_path / "results" / "shared"
    study = optuna.create_study(storage=default_storage(results), study_name="shared", direction="maximize")
    study.set_user_attr("objectives", [["w.output_tok_s", "maximize"]])
    trial = study.ask()
    rec = TrialRecord(number=0, state="complete", params={"engine": "e", "model": "m", "cache_type_k": evil},
                      engine="e", model="m", command=f"llama-server -ctk '{evil}'", metrics={"w.output_tok_s": 1.0},
                      objective_values=[1.0])
    trial.set_user_attr(RECORD_ATTR, rec.summary())
    study.tell(trial, 1.0)
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "search.cli", "show", str(results)], cwd=tmp_path, stdout=follower,
                            stderr=follower, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm"})
    os.close(follower)
    drawn = b""
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:
            break
        if not data:
            break
        drawn += data
    proc.wait(timeout=120)
    os.close(leader)
    text = drawn.decode(errors="replace")
    assert "\\x1b]0;pwned" in text and "\x1b]0;" not in text and "\x1b[2J" not in text, text[-2000:]
    assert not re.findall(r"\x1b(?!\[[0-9;]*m)", text)  # only colours reached the terminal
