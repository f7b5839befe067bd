"""The walk-throughs of docs/regression.md run: every `search ab` / `search run` / `search builds make`
command their tables show is run here with `--dry-run` against the shipped space it names (nothing is
built, pulled or started), so a walk-through that names a removed option, a route that no longer
parses or a build the planner refuses fails the suite. tests/test_docs.py parses every command of the
docs; this runs the ones a user would paste first."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from search.cli import main

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "regression.md"
SECTIONS = ("### Walk-through: the nightly on a DGX Spark", "### Walk-through: checking PR #44700's claim on the Spark")


def walkthrough_commands() -> list[str]:
    text = DOC.read_text()
    found = []
    for title in SECTIONS:
        start = text.index(title)
        end = text.find("\n## ", start)
        end = text.find("\n### ", start + 1) if text.find("\n### ", start + 1) != -1 else end
        for code in re.findall(r"`(search (?:ab|run|builds make) [^`]+)`", text[start:end]):
            found.append(code)
    return found


def test_the_walkthroughs_show_the_commands_they_rely_on() -> None:
    commands = walkthrough_commands()
    assert any("--pr 44700" in c and "overlay:vllm-node" in c for c in commands), commands


@pytest.mark.parametrize("command", walkthrough_commands())
def test_each_walkthrough_command_plans(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    words = shlex.split(command)[1:]
    words = [str(REPO / w) if w.startswith("spaces/") else w for w in words]
    if "--dry-run" not in words:
        words.append("--dry-run")
    code = main(words)
    out = capsys.readouterr()
    assert code == 0, out.err
    if words[0] == "ab":
        assert "# A:" in out.out and "# B:" in out.out and "confounded" not in out.out + out.err
