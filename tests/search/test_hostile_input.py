"""Hostile and damaged input: every file format, CLI arguments and storage URLs fail fast, in one
line that names the file, never with a traceback, a hang or a partial write.

The "no hang" cases run the real CLI in a subprocess under a generous guard timeout (60 s; the
reported bug hung past 60 s): the guard is what turns a hang into a failure, not a speed claim.
"""

from __future__ import annotations

import copy
import json
import os
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from harness import secrets
from harness.files import MAX_DEPTH, InputError, load_json, load_yaml, parse_yaml, read_text
from harness.measure.user_prompts import PromptSource, load_prompts
from harness.measure.workloads import parse_catalogue
from harness.quality import checks as quality_checks
from harness.quality.reference import ReferenceStore
from search.cli import main
from search.regress import history
from search.regress.baseline import load_baseline
from search.space.space import SpaceError, load_space
from search.store.results import ResultsError, read_record

ROOT = Path(__file__).resolve().parents[2]
GUARD_S = 60  # a hang guard, not a timing claim
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True)
def _forget_secrets() -> object:
    """Generated documents may hold secret-named keys: their values must not be scrubbed from
    the messages of tests that run later in this process."""
    yield
    secrets.forget_all()


def laughs(levels: int = 9, fanout: int = 9) -> str:
    """The reported space: each alias level repeats the one below (fanout**levels values)."""
    lines = ["name: laughs", "a0: &a0 [" + ", ".join(["lol"] * fanout) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fanout) + "]" for i in range(1, levels + 1)]
    lines += [f"engines: {{llamacpp: {{command: [x], args: {{big: *a{levels}}}}}}}", "models: [{name: m, path: p}]",
              "workloads: [{name: w, streams: [qa]}]", "objectives: [{metric: w.output_tok_s}]"]
    return "\n".join(lines) + "\n"


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "search.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=GUARD_S, env={**os.environ, "PYTHONPATH": str(ROOT)})


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_billion_laughs_space_fails_fast_naming_the_file(tmp_path: Path) -> None:
    """Reproduces the reported hang (nested aliases; `search run` ran past 60 s): now a one-line error."""
    path = tmp_path / "laughs.yaml"
    path.write_text(laughs())
    proc = run_cli("run", str(path), "--dry-run", "1", cwd=tmp_path)
    assert_one_line_error(proc, str(path), "aliases")
    assert not (tmp_path / "results").exists()  # nothing written


@pytest.mark.parametrize(("text", "reason"), [
    ("a: &a [*a]\n", "recursive YAML alias"),
    ("x: " + "[" * 200 + "]" * 200 + "\n", f"nested deeper than {MAX_DEPTH}"),
    ("x: {" * 100 + "}" * 100 + "\n", f"nested deeper than {MAX_DEPTH}"),
    ("name: a\nname: b\n", "appears twice"),
    ("x: " + "7" * 5000 + "\n", "more digits"),
    ("x: !!python/object/apply:os.system ['true']\n", "not valid YAML"),
    ("x: [unclosed\n", "not valid YAML at line"),
    ("- a\n- b\n", "must be a mapping"),
])
def test_bad_space_files_give_one_named_line(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError) as info:
        load_space(path)
    message = str(info.value)
    assert message.startswith(str(path)) and reason in message and "\n" not in message, message


def test_not_utf8_names_the_file_the_byte_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: x\ndescription: caf\xe9\n")
    proc = run_cli("run", str(path), cwd=tmp_path)
    assert_one_line_error(proc, str(path), "not UTF-8", "byte 24", "line 2")


def test_size_limit_and_non_regular_files(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * 200_000)  # 2 MB of comments: cheap to parse, still refused
    with pytest.raises(InputError, match="too large"):
        load_yaml(big)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # nobody writes: a plain open() would block forever
    with pytest.raises(InputError, match="not a regular file"):
        read_text(fifo)
    with pytest.raises(InputError, match="folder"):
        read_text(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        read_text(tmp_path / "missing.yaml")


def test_aliases_within_the_limit_still_load() -> None:
    """Anchors are a legitimate YAML feature: a few shared blocks load as before."""
    data = parse_yaml("base: &b {x: 1}\na: *b\nb: {<<: *b, y: 2}\n", "ok.yaml")
    assert data == {"base": {"x": 1}, "a": {"x": 1}, "b": {"x": 1, "y": 2}}


@st.composite
def alias_ladders(draw: st.DrawFn) -> tuple[str, int]:
    """A YAML text whose top level repeats earlier anchors: (text, values once expanded)."""
    levels = draw(st.integers(1, 12))
    fanout = draw(st.integers(1, 12))
    text = laughs(levels, fanout)
    return text, fanout ** (levels + 1)


@FAST
@given(alias_ladders())
def test_alias_expansion_is_bounded(case: tuple[str, int]) -> None:
    text, expanded = case
    try:
        parse_yaml(text, "gen.yaml", max_nodes=50_000)
    except InputError as exc:
        assert "expands to more than" in str(exc) and expanded > 10_000, (expanded, str(exc))
    else:
        assert expanded <= 50_000 * 2  # loaded: it really was small


@FAST
@given(st.binary(max_size=400))
def test_any_bytes_as_a_space_file(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("s") / "space.yaml"
    path.write_bytes(data)
    try:
        load_space(path)
    except SpaceError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)


yaml_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                         st.text(string.printable, max_size=12))
yaml_docs = st.recursive(yaml_scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                           st.dictionaries(st.text(string.ascii_letters, max_size=8),
                                                                           c, max_size=4)), max_leaves=30)


@FAST
@given(yaml_docs)
def test_any_yaml_document_as_a_space(tmp_path_factory: pytest.TempPathFactory, doc: object) -> None:
    path = tmp_path_factory.mktemp("s") / "space.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        load_space(path)
    except SpaceError as exc:
        assert "\n" not in str(exc)


json_docs = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
                         lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=8), c,
                                                                                      max_size=4)),
                         max_leaves=30)


def _stored_readers(path: Path) -> list[object]:
    """Each reader of a stored JSON format: it returns or raises its own one-line error."""
    out: list[object] = []
    for reader, errors in ((read_record, ResultsError), (load_baseline, ResultsError), (load_json, InputError),
                           (lambda p: ReferenceStore(p.parent).load("k"), InputError)):
        try:
            out.append(reader(path))
        except errors as exc:  # type: ignore[misc]
            assert "\n" not in str(exc) and str(path) in str(exc), str(exc)  # one line naming the file
    return out


@FAST
@given(st.one_of(st.binary(max_size=300), json_docs.map(lambda d: json.dumps(d).encode())))
def test_any_stored_json_file(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    folder = tmp_path_factory.mktemp("j")
    path = folder / "reference-k.json"
    path.write_bytes(data)
    _stored_readers(path)


def test_deep_json_is_refused_not_a_recursion_error(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ResultsError, match="nested deeper"):
        read_record(path)
    with pytest.raises(ResultsError, match="nested deeper"):
        load_baseline(path)


# ---- CLI arguments and storage URLs -------------------------------------------------------------------

SUBCOMMANDS = ["run", "show", "best", "report", "baseline", "ab", "regress", "--help", "bogus", ""]
arg_text = st.one_of(st.sampled_from(["--trials", "--dry-run", "--storage", "--json", "--html", "-x", "0", "-1",
                                      "1e309", "nan", "space.yaml", "results", "\x00", "é", "[/red]"]),
                     st.text(max_size=12))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(SUBCOMMANDS), st.lists(arg_text, max_size=5))
def test_any_cli_arguments(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str], command: str, args: list[str]) -> None:
    """No traceback: an exit status (argparse's 2 included) and at most one error line; no file left half
    written. Runs in an empty folder, so nothing here can start an engine (no space file exists)."""
    cwd = tmp_path_factory.mktemp("cli")
    monkeypatch.chdir(cwd)
    try:
        code = main([command, *args] if command else args)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        code = exc.code if isinstance(exc.code, int) else 2
    captured = capsys.readouterr()
    assert code in (0, 1, 2, 7), (code, captured.err)  # 7: a storage that fails (search/exit_codes.py)
    assert "Traceback" not in captured.err
    if code == 2 and captured.err.startswith("error:"):
        assert len(captured.err.strip().splitlines()) == 1, captured.err
    assert not [p for p in cwd.rglob("*") if p.name.endswith(".tmp")]


storage_urls = st.one_of(
    st.text(max_size=30),
    st.builds(lambda scheme, password, port, path: f"{scheme}://user:{password}@127.0.0.1:{port}/{path}",
              st.sampled_from(["postgresql", "postgresql+psycopg2", "mysql", "sqlite", "oracle", "redis", "x"]),
              st.text(string.ascii_letters + string.digits, min_size=8, max_size=16), st.integers(1, 65535),
              st.text(string.ascii_letters, max_size=8)),
    st.builds(lambda path: f"sqlite:///{path}", st.text(max_size=20)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(storage_urls, st.sampled_from(["show", "best", "report"]))
@example("-:", "show")  # found by hypothesis in a CI run: a URL that looks like an option
def test_any_storage_url(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str], url: str, command: str) -> None:
    """A bad or unreachable storage URL is one error line; a password in it is never printed."""
    monkeypatch.chdir(tmp_path_factory.mktemp("url"))
    # --storage=URL: a URL that starts with "-" (hypothesis found "-:") is a value, not an option.
    args = [command, "s", f"--storage={url}"] + (["--html", "r.html"] if command == "report" else [])
    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    captured = capsys.readouterr()
    assert code in (1, 2, 7), (url, captured.out, captured.err)
    assert "Traceback" not in captured.err, captured.err
    assert len(captured.err.strip().splitlines()) <= 1, captured.err
    if "://user:" in url:
        password = url.split("://user:", 1)[1].split("@", 1)[0]
        assert password not in captured.out + captured.err


# ---- every other format: valid files with one field replaced by anything -----------------------------

FORMATS = Path(__file__).resolve().parents[1] / "data" / "formats" / "0.1.0"


def _paths(doc: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Every key path of a JSON document (so that a mutation can hit any field at any depth)."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):
            out += _paths(v, (*prefix, i))
    return out


def _replace(doc: object, path: tuple[object, ...], value: object) -> object:
    if not path:
        return value
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]  # type: ignore[index]
    node[path[-1]] = value  # type: ignore[index]
    return doc


@st.composite
def mutated(draw: st.DrawFn, source: Path) -> object:
    doc = json.loads(source.read_text())
    path = draw(st.sampled_from(_paths(doc)))
    return _replace(doc, path, draw(json_docs))


@FAST
@given(mutated(FORMATS / "study" / "trials" / "0000" / "result.json"))
def test_a_result_record_with_any_field_replaced(tmp_path_factory: pytest.TempPathFactory, doc: object) -> None:
    path = tmp_path_factory.mktemp("r") / "result.json"
    path.write_text(json.dumps(doc))
    try:
        read_record(path)
    except ResultsError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)


@FAST
@given(mutated(FORMATS / "baseline.json"))
def test_a_baseline_with_any_field_replaced(tmp_path_factory: pytest.TempPathFactory, doc: object) -> None:
    path = tmp_path_factory.mktemp("b") / "baseline.json"
    path.write_text(json.dumps(doc))
    try:
        baseline = load_baseline(path)
        baseline.pinned_config()
        baseline.gated_metrics()
    except ResultsError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)


@FAST
@given(st.one_of(st.binary(max_size=300), json_docs.map(lambda d: (json.dumps(d) + "\n").encode())))
def test_any_history_file(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    folder = tmp_path_factory.mktemp("h")
    (folder / "b.jsonl").write_bytes(data)
    try:
        history.load("b", folder)
    except ValueError as exc:
        assert "b.jsonl" in str(exc) and "\n" not in str(exc)


@FAST
@given(st.one_of(st.binary(max_size=300), yaml_docs.map(lambda d: yaml.safe_dump(d).encode())))
def test_any_quality_suite_file(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("q") / "suite.yaml"
    path.write_bytes(data)
    quality_checks.checks_for.cache_clear()
    try:
        quality_checks.checks_for(str(path))
    except ValueError as exc:
        assert "suite.yaml" in str(exc)


@FAST
@given(st.one_of(st.binary(max_size=300), json_docs.map(lambda d: json.dumps(d).encode())),
       st.sampled_from(["jsonl", "sharegpt"]))
def test_any_user_prompt_file(tmp_path_factory: pytest.TempPathFactory, data: bytes, fmt: str) -> None:
    path = tmp_path_factory.mktemp("p") / "prompts.jsonl"
    path.write_bytes(data)
    try:
        load_prompts(PromptSource(path=str(path), format=fmt))  # type: ignore[arg-type]
    except ValueError as exc:
        assert "prompts.jsonl" in str(exc)


@FAST
@given(yaml_docs)
def test_any_workload_catalogue(data: object) -> None:
    try:
        parse_catalogue(data)
    except ValueError as exc:
        assert "\n" not in str(exc) or len(str(exc)) < 2000


# ---- the review's hostile inputs (issue 52): one line naming the file and the key, never a traceback ----

def test_a_long_string_aliased_many_times_is_refused_by_its_size(tmp_path: Path) -> None:
    """1 MB of YAML: a 600 KB string aliased 1,000 times is far under the node cap and 600 MB once expanded;
    it is refused from the node graph, in well under a second, before anything expands it."""
    path = tmp_path / "space.yaml"
    path.write_text("name: &s " + "x" * 600_000 + "\nmodels: [" + ", ".join(["*s"] * 1000) + "]\n")
    started = time.monotonic()
    with pytest.raises(SpaceError, match="expands to more than 16 MiB of text") as info:
        load_space(path)
    assert str(path) in str(info.value) and time.monotonic() - started < 30


@pytest.mark.parametrize(("params", "key", "reason"), [
    ({"n": {"type": "int", "low": 1, "high": 10 ** 4000}}, "params.n.high", "out of range"),
    ({"n": {"type": "int", "low": 1, "high": 10, "step": 10 ** 400}}, "params.n.step", "out of range"),
    ({"f": {"type": "float", "low": -1.0, "high": 1e308}}, "params.f.high", "out of range"),
    ({"f": {"type": "float", "low": 0.0, "high": float("inf")}}, "params.f.high", "not a finite number"),
    ({"f": {"type": "float", "low": float("nan"), "high": 1.0}}, "params.f.low", "not a finite number"),
    ({"c": {"type": "categorical", "choices": [1.0, float("nan")]}}, "params.c.choices[1]", "not a finite number"),
])
def test_overflowing_and_non_finite_numbers_are_one_line_naming_the_key(
        tmp_path: Path, params: dict[str, object], key: str, reason: str) -> None:
    doc = {"name": "n", "engines": {"llamacpp": {"command": ["llama-server"]}},
           "models": [{"name": "m", "path": "/m"}], "workloads": [{"name": "w", "streams": ["qa"]}],
           "objectives": [{"metric": "w.output_tok_s"}], "quality": {"suite": None}, "params": params}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpaceError) as info:
        load_space(path)
    said = str(info.value)
    assert said.startswith(f"{path}: {key}: ") and reason in said and "\n" not in said, said


def test_a_hung_start_cannot_be_given_an_infinite_deadline(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text("name: n\nengines: {llamacpp: {command: [llama-server], ready_timeout_s: .inf}}\n"
                    "models: [{name: m, path: /m}]\nworkloads: [{name: w, streams: [qa]}]\n"
                    "objectives: [{metric: w.output_tok_s}]\n")
    with pytest.raises(SpaceError, match=r"engines.llamacpp.ready_timeout_s: inf is not a finite number"):
        load_space(path)


def test_a_read_only_results_folder_is_one_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    if os.geteuid() == 0:  # root writes anywhere: make the folder a file instead, which no one can write into
        (tmp_path / "results").write_text("")
    else:
        (tmp_path / "results").mkdir()
        (tmp_path / "results").chmod(0o555)
    space = tmp_path / "space.yaml"
    space.write_text("name: ro\nengines: {llamacpp: {command: [/no/such/llama-server]}}\n"
                     "models: [{name: m, path: /m}]\nworkloads: [{name: w, streams: [qa]}]\n"
                     "objectives: [{metric: w.output_tok_s}]\nquality: {suite: null}\n")
    done = subprocess.run([sys.executable, "-m", "search.cli", "run", str(space), "--results",
                           str(tmp_path / "results"), "--no-preflight", "--trials", "1"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "results" in lines[0] and "cannot create the results folder" in lines[0], lines


def test_a_damaged_reference_file_is_one_line_naming_it(tmp_path: Path) -> None:
    for text in ('{"key": "k", "items": [{"name": 1}]}', '{"key": "k"}', '[1, 2]', '{"items": "x", "key": "k"}'):
        (tmp_path / "reference-k.json").write_text(text)
        with pytest.raises(InputError) as info:
            ReferenceStore(tmp_path).load("k")
        assert str(tmp_path / "reference-k.json") in str(info.value) and "\n" not in str(info.value)
