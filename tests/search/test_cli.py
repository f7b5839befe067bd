"""The CLI's conventions (docs/cli.md): one exit-code table in every --help and in the docs, one meaning
per code across commands, `search --version`."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from search.cli import build_parser, main, version
from search.exit_codes import MEANING, Exit
from search.regress.nightly import EXIT_CODES
from search.verdicts.gate import EXIT_INCONCLUSIVE

REPO = Path(__file__).resolve().parents[2]


def _all_parsers(parser: argparse.ArgumentParser, name: str = "search") -> dict[str, argparse.ArgumentParser]:
    found = {name: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child_name, child in action.choices.items():
                found.update(_all_parsers(child, f"{name} {child_name}"))
    return found


def test_every_help_ends_with_the_one_exit_code_table() -> None:
    parsers = _all_parsers(build_parser())
    assert {"search run", "search nightly", "search baseline save", "search builds list"} <= set(parsers)
    for name, parser in parsers.items():
        text = parser.format_help()
        for code, meaning in MEANING.items():
            assert re.search(rf"^\s+{int(code)}\s+{re.escape(meaning[:30])}", text, re.MULTILINE), (name, code)


def test_docs_list_every_code_once() -> None:
    doc = (REPO / "docs" / "cli.md").read_text()
    rows = re.findall(r"^\| ([0-9, ]+) \|", doc, re.MULTILINE)
    listed = [int(c) for row in rows for c in row.split(",")]
    assert sorted(listed) == sorted(int(c) for c in Exit)


def test_inconclusive_and_failures_mean_the_same_in_regress_and_nightly() -> None:
    assert EXIT_CODES["inconclusive"] == EXIT_INCONCLUSIVE == Exit.INCONCLUSIVE == 3
    assert EXIT_CODES["start-failed"] == EXIT_CODES["build-failed"] == Exit.FAILED
    # "no history yet" and a usage error are told apart
    assert len({Exit.USAGE, Exit.NO_HISTORY, Exit.INCONCLUSIVE, Exit.FAILED}) == 4


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as bad_flag:
        main(["run", "--no-such-flag"])
    assert bad_flag.value.code == Exit.USAGE
    missing = tmp_path / "missing.yaml"
    assert main(["run", str(missing), "--dry-run"]) == Exit.USAGE
    assert str(missing) in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    printed = capsys.readouterr().out.strip()
    assert printed == f"search (flagsearch) {version()}" and re.search(r"\d+\.\d+", version()), printed


@pytest.mark.parametrize("argv, dest", [
    (["run", "s.yaml"], "results"), (["confirm", "s"], "results"), (["regress", "--baseline", "b.json"], "out"),
    (["ab", "s.yaml"], "out"), (["nightly", "--candidate-build", "x"], "out"),
    (["bisect", "s.yaml", "--build", "a", "--build", "b"], "out"), (["baseline", "save", "s", "--name", "n"], "dir")])
def test_one_output_flag_name_with_the_old_names_kept(argv: list[str], dest: str) -> None:
    parser = build_parser()
    for flag in ("-o", "--out", *{"results": ["--results"], "dir": ["--dir"]}.get(dest, [])):
        assert getattr(parser.parse_args([*argv, flag, "folder"]), dest) == "folder", (argv, flag)


def test_show_best_and_history_print_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from tests.search.test_terminal import make_study

    results = tmp_path / "results" / "js"
    make_study(results)
    capsys.readouterr()
    assert main(["show", str(results), "--json"]) == Exit.PASS
    shown = json.loads(capsys.readouterr().out)
    assert [t["number"] for t in shown["trials"]] == [0, 1, 2] and shown["best"] == [2] and shown["verdict"]
    assert shown["trials"][2]["objective_values"] == [12.0]
    assert main(["best", str(results), "--json"]) == Exit.PASS
    printed = capsys.readouterr()
    best = json.loads(printed.out)
    assert [b["trial"] for b in best["best"]] == [2] and "command" in best["best"][0] and printed.err == ""
    assert main(["history", "none-yet", "--dir", str(tmp_path / "h"), "--json"]) == Exit.NO_HISTORY
    assert json.loads(capsys.readouterr().out)["rows"] == []
