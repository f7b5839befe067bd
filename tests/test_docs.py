"""The reference docs name only what exists: every repository path in README.md and docs/*.md is
there, every `python -m MODULE` is importable, and every `search ...` command they show parses with
the real command line parser (search/cli.py: build_parser). And they are reference: no line holds a
date (YYYY-MM-DD) or a UTC hour, except in a link to a dated lab note.

What counts (docs/lab-notes/ is left out: a lab note records what existed on its day):
- a path: a word that starts with one of the repository's top folders (`search/`, `harness/`,
  `bench/`, `tests/`, `docs/`, `spaces/`, `baselines/`, `scripts/`, `.github/`, `.ci/`), in prose or
  code, and every relative Markdown link `[...](path)`, resolved from the page's folder. A `*` in it
  is a glob that must match something; `name.py: function` and `file.py::test` name the file. A path
  holding a placeholder segment (`spaces/X.yaml`, `results/<study>/`, `{a,b}`) is a pattern, not a path.
- a command: a line of a code block whose first word is `search` (or `.venv/bin/search`, after an
  optional `flock LOCKFILE`), with `\\` continuations joined and `# comments` dropped; and an inline
  code span that starts so. A code-block command must parse completely. An inline span may be a
  fragment (`search confirm STUDY --more-rounds N` in a sentence): its subcommand and every option it
  names must exist, but required arguments it leaves out are not asked for.
- placeholders: an all-capitals word (`STUDY`, `SPACE`, `N`, `PATH`, `EARLIER_STUDY`) is accepted
  wherever the parser wants a value, whatever the value's type or choices, and `COMMAND` as any
  subcommand. Usage synopses are read as such: `[...]` brackets are dropped, `a|b` is each of a and b,
  and a `...` word is more of the same (dropped, or a placeholder value after an option).
- `python -m MODULE` for a module of this repository (search, harness, bench, tests): importable.

Marks, for what the checks cannot tell (each at the end of its line): `<!-- docs: not a command -->`
(in prose) or `# docs: not a command` (in a code block) on a line that shows `search` words but is
not a command (output text, say); `# docs: created above` on a code line naming a file that the
page's own commands create (a baseline saved a few lines before).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from search.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
NOT_A_COMMAND = ("<!-- docs: not a command -->", "# docs: not a command")
CREATED_ABOVE = "# docs: created above"
REPO_PACKAGES = ("search", "harness", "bench", "tests")
TOP_FOLDERS = ("search", "harness", "bench", "tests", "docs", "spaces", "baselines", "scripts", ".github", ".ci")
PATH_RE = re.compile(r"(?<![\w./$~{-])(?:" + "|".join(re.escape(t) for t in TOP_FOLDERS) + r")/[\w./*<>{},+-]*")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
MODULE_RE = re.compile(r"python -m ([\w.]*\w)(?![\w.<])")
PLACEHOLDER_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")
SEARCH_START = re.compile(r"^(?:flock\s+(?:-\S+\s+)*\S+\s+)?(?:\S*/)?search(?:\s|$)")


def reference_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Found:
    page: str
    line: int
    text: str
    in_code: bool

    def where(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def split_page(path: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(code lines, prose lines) of a Markdown page, each with its line number. Fenced blocks and
    blocks indented by four spaces after a blank line are code."""
    code: list[tuple[int, str]] = []
    prose: list[tuple[int, str]] = []
    fenced = False
    previous_blank = True
    indented = False
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            previous_blank = False
            continue
        if not fenced:
            indented = line.startswith("    ") and (previous_blank or indented) and not line.lstrip().startswith("-")
        (code if fenced or indented else prose).append((number, line))
        previous_blank = not line.strip()
    return code, prose


def inline_spans(prose: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Inline code spans of the prose, each with the line it starts on; a span may run over a line
    break (not over a blank line)."""
    spans: list[tuple[int, str]] = []
    paragraph: list[tuple[int, str]] = []
    for number, line in [*prose, (0, "")]:
        if line.strip():
            paragraph.append((number, line))
            continue
        text = "\n".join(t for _, t in paragraph)
        for match in re.finditer(r"`([^`]+)`", text):
            first = paragraph[text[: match.start()].count("\n")][0]
            spans.append((first, " ".join(match.group(1).split())))
        paragraph = []
    return spans


def code_commands(page: str, code: list[tuple[int, str]]) -> list[Found]:
    found: list[Found] = []
    pending: tuple[int, str] | None = None
    for number, line in code:
        text = line.strip().removeprefix("$ ")
        if pending is not None:
            start, so_far = pending
            text = so_far + " " + text
            number = start
            pending = None
        if text.endswith("\\"):
            pending = (number, text[:-1])
            continue
        if SEARCH_START.match(text) and not any(m in text for m in NOT_A_COMMAND):
            found.append(Found(page, number, text, in_code=True))
    return found


def all_commands() -> list[Found]:
    found: list[Found] = []
    for path in reference_pages():
        page = str(path.relative_to(ROOT))
        code, prose = split_page(path)
        found += code_commands(page, code)
        lines = dict(prose)
        for number, span in inline_spans(prose):
            if SEARCH_START.match(span) and not any(m in lines.get(number, "") for m in NOT_A_COMMAND):
                found.append(Found(page, number, span, in_code=False))
    return found


def all_paths() -> list[tuple[Found, Path]]:
    """(where, resolved path) of every repository path and relative link of the reference pages."""
    found: list[tuple[Found, Path]] = []
    for path in reference_pages():
        page = str(path.relative_to(ROOT))
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if CREATED_ABOVE in line:
                continue
            for match in PATH_RE.finditer(line):
                word = match.group(0).split("::")[0].rstrip(".,:;)")
                found.append((Found(page, number, word, in_code=False), ROOT / word))
            for match in LINK_RE.finditer(line):
                target = match.group(1).split("#")[0]
                if target and "://" not in target and not target.startswith("mailto:"):
                    found.append((Found(page, number, target, in_code=False), path.parent / target))
    return found


def is_pattern(word: str) -> bool:
    """A path with a placeholder segment (`spaces/X.yaml`, `<study>`, `{a,b}`, `NNNN`) names a pattern."""
    if any(c in word for c in "<>{}"):
        return True
    return any(PLACEHOLDER_RE.match(part.split(".")[0]) and part.split(".")[0] not in ("README",)
               for part in word.split("/"))


def exists(path: Path) -> bool:
    return bool(glob.glob(str(path))) if "*" in str(path) else path.exists()


def test_every_path_the_reference_pages_name_exists() -> None:
    missing = [f.where() for f, path in all_paths() if not is_pattern(f.text) and not exists(path)]
    assert not missing, "paths named in README.md or docs/*.md that do not exist:\n" + "\n".join(missing)


def test_every_module_the_reference_pages_run_exists() -> None:
    missing = []
    for path in reference_pages():
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            for module in MODULE_RE.findall(line):
                if module.split(".")[0] not in REPO_PACKAGES or importable(module):
                    continue
                missing.append(f"{path.relative_to(ROOT)}:{number}: python -m {module}")
    assert not missing, "modules run in README.md or docs/*.md that do not exist:\n" + "\n".join(missing)


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


DATE_RE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\bUTC\b")
LAB_NOTE_RE = re.compile(r"lab-notes/[\w.-]+")


def test_the_reference_pages_hold_no_dated_measurement() -> None:
    """Reference says how the tool works now; a measurement with its date or hour is a record and
    goes to docs/lab-notes/ (a link to a dated note is fine)."""
    dated = []
    for path in reference_pages():
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if DATE_RE.search(LAB_NOTE_RE.sub("", line)):
                dated.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not dated, ("dated lines in README.md or docs/*.md (move the measurement to docs/lab-notes/ and "
                       "state its conclusion here):\n" + "\n".join(dated))


class ParseError(Exception):
    pass


class Placeholders(list[object]):
    """An action's choices that also take any placeholder word."""

    def __contains__(self, value: object) -> bool:
        return (isinstance(value, str) and bool(PLACEHOLDER_RE.match(value))) or list.__contains__(self, value)


def placeholder_tolerant(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The real parser, with errors raised instead of printed and exited, and placeholders accepted
    as any argument's value: its subcommands and options are untouched, so a removed one fails."""

    def error(message: str) -> None:
        raise ParseError(message)

    def tolerant(convert: object) -> object:
        def call(value: str) -> object:
            return value if PLACEHOLDER_RE.match(value) else convert(value)  # type: ignore[operator]
        return call

    parser.error = error  # type: ignore[method-assign,assignment]
    parser.exit_on_error = False
    parser.allow_abbrev = False  # the docs spell every option in full
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                placeholder_tolerant(child)
            continue
        if action.type is not None and callable(action.type):
            action.type = tolerant(action.type)  # type: ignore[assignment]
        if action.choices is not None and not isinstance(action.choices, dict):
            action.choices = Placeholders(action.choices)
    return parser


ELLIPSIS = ("...", "…")
FRAGMENT_GAPS = ("the following arguments are required", "expected one argument", "expected at least one argument")


def command_words(text: str) -> list[str]:
    """The words after `search`, with a synopsis' brackets dropped."""
    words = shlex.split(text.replace("\\|", "|"), comments=True)
    if words[0] == "flock":
        words = words[next(i for i, w in enumerate(words) if w.endswith("search")):]
    return [w.strip("[]") for w in words[1:] if w.strip("[]")]


def readings(words: list[str]) -> list[list[str]]:
    """Every reading of a synopsis: each alternative of an `a|b` word, a `...` word dropped or a
    placeholder value, `COMMAND` as each subcommand."""
    out: list[list[str]] = [[]]
    for word in words:
        if word in ELLIPSIS:
            choices = [[], ["VALUE"]]
        elif "|" in word and not word.startswith("-") and " " not in word:
            choices = [[w] for w in word.split("|")]
        else:
            choices = [[word]]
        out = [so_far + c for so_far in out for c in choices]
    if words and words[0] == "COMMAND":
        names = [n for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction) for n in a.choices]
        out = [[name, *w[1:]] for w in out for name in names]
    return out


def parse_one(words: list[str], fragment: bool) -> str | None:
    parser = placeholder_tolerant(build_parser())
    try:
        parser.parse_args(words)
    except (ParseError, argparse.ArgumentError) as e:
        message = str(e)
        if fragment and (message.startswith(FRAGMENT_GAPS) or message.endswith(FRAGMENT_GAPS)):
            return None
        return message
    except SystemExit as e:  # --help, --version
        return None if e.code in (0, None) else f"exit {e.code}"
    return None


def parse(words: list[str], fragment: bool) -> str | None:
    """None when some reading of the words parses; else the parser's complaint. A fragment may
    leave out required arguments and an option's value."""
    problems = [parse_one(w, fragment) for w in readings(words)]
    return None if None in problems else problems[0]


def test_every_search_command_the_reference_pages_show_parses(capsys: pytest.CaptureFixture[str]) -> None:
    commands = all_commands()
    assert len(commands) > 20, "the reference pages show search commands; none found: the extraction broke"
    bad = []
    for found in commands:
        problem = parse(command_words(found.text), fragment=not found.in_code)
        if problem is not None:
            bad.append(f"{found.where()}\n    -> {problem}")
    capsys.readouterr()
    assert not bad, "search commands in README.md or docs/*.md that the CLI does not take:\n" + "\n".join(bad)


def test_the_check_fails_on_a_removed_option_or_subcommand() -> None:
    """The checks above can fail: an option or subcommand the parser lacks is refused, also in a
    fragment, and a missing path is reported."""
    assert parse(["confirm", "STUDY", "--more-rounds", "N"], fragment=True) is None
    assert parse(["confirm", "STUDY", "--no-such-option", "N"], fragment=True) is not None
    assert parse(["confirm", "STUDY", "--more-round", "N"], fragment=True) is not None  # no abbreviations
    assert parse(["no-such-command", "STUDY"], fragment=True) is not None
    assert parse(["run", "--dry-run", "8"], fragment=False) is not None  # its space file is required
    assert parse(["run", "spaces/smollm2-cpu.yaml", "--dry-run", "many"], fragment=False) is not None
    assert not exists(ROOT / "search/no_such_module.py") and is_pattern("spaces/X.yaml")
    assert not is_pattern("docs/lab-notes/README.md")


def test_the_readme_space_in_ten_lines_loads(tmp_path: Path) -> None:
    """README's ten-line space is a valid space file (validated as `search run` validates it)."""
    from search.space.space import load_space

    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "README.md shows no yaml space"
    path = tmp_path / "space.yaml"
    path.write_text(blocks[0])
    space = load_space(path)
    assert space.name == "llama-threads" and len(blocks[0].strip().splitlines()) <= 10
