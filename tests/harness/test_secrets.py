"""harness/secrets.py: what a secret is, and that scrubbing finds it wherever it lands."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import secrets
from harness.measure.client import forget_api_key, register_api_key, server_client
from search.space.space import SpaceError, parse_space
from search.store.results import scrub

KEY = "sk-abcdef0123456789"
SPACE = {
    "name": "s",
    "engines": {"llamacpp": {"command": ["llama-server", "--hf-token=hf_fromcommand42"],
                             "env": {"MY_PASSWORD": "hunter2hunter2", "OMP_NUM_THREADS": "1"},
                             "args": {"api_key": KEY, "ctx_size": 1024}}},
    "models": [{"name": "m", "path": "/m", "kv_bytes_per_token": 123456789.0}],
    "params": {"auth_token": {"type": "fixed", "value": "tok_fixedvalue_9"}},
    "workloads": [{"name": "w", "streams": ["qa"]}],
    "objectives": [{"metric": "w.output_tok_s"}],
}


@pytest.fixture(autouse=True)
def _forget() -> object:
    secrets.forget_all()
    yield
    secrets.forget_all()


def test_loading_a_space_remembers_its_literal_secrets() -> None:
    parse_space(copy.deepcopy(SPACE), "s.yaml")
    known = secrets.known()
    for value in (KEY, "hf_fromcommand42", "hunter2hunter2", "tok_fixedvalue_9"):
        assert value in known, value
    assert "123456789.0" not in known and "1024" not in known  # sizes under *_token names are not secrets
    text = f"argv: --api-key {KEY} --alias {KEY}; env MY_PASSWORD=hunter2hunter2"
    assert KEY not in secrets.scrub_text(text) and "hunter2hunter2" not in secrets.scrub_text(text)
    assert scrub({"command": f"x --api-key {KEY}", "nested": [{"k": KEY}]}) == \
        {"command": "x --api-key ***", "nested": [{"k": "***"}]}


def test_a_secret_cannot_be_a_searched_parameter() -> None:
    doc = copy.deepcopy(SPACE)
    doc["params"] = {"api_key": {"type": "categorical", "choices": ["a-first-key", "b-second-key"]}}
    with pytest.raises(SpaceError, match="secret cannot be a searched parameter"):
        parse_space(doc, "s.yaml")


def test_env_references_are_kept_and_short_values_are_not_scrubbed_by_value() -> None:
    data = {"env": {"HF_TOKEN": "${HF_TOKEN}", "API_KEY": "literal-value", "OMP_NUM_THREADS": "2"}}
    assert scrub(data, []) == {"env": {"HF_TOKEN": "${HF_TOKEN}", "API_KEY": "***", "OMP_NUM_THREADS": "2"}}
    secrets.remember(["abc", "1"])
    assert secrets.scrub_text("abc 1 abcdef") == "abc 1 abcdef"


def test_argv_secrets_api_key_and_storage_url() -> None:
    argv = ["srv", "--api-key", KEY, "--hf-token=hf_x1y2z3w4", "--max-num-batched-tokens", "8192"]
    assert secrets.argv_secrets(argv) == [KEY, "hf_x1y2z3w4"]
    assert secrets.api_key(argv, {}) == KEY
    assert secrets.api_key(["srv", f"--api-key={KEY}"], {}) == KEY
    assert secrets.api_key(["srv"], {"VLLM_API_KEY": "env-key-123"}) == "env-key-123"
    assert secrets.api_key(["srv"], {}) is None
    assert secrets.url_secrets("postgresql+psycopg2://u:pa55word!@127.0.0.1:5432/db") == ["pa55word!"]
    assert secrets.url_secrets("sqlite:///x.db") == [] and secrets.url_secrets("http://[::1") == []


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.lists(st.integers(0, 250), max_size=6))
def test_line_scrubber_finds_a_secret_split_across_reads(text: str, cuts: list[int]) -> None:
    """However the stream is cut into reads, a secret within a line never reaches the output."""
    data = (text + KEY + text + "\n" + KEY + "\n").encode()
    scrubber = secrets.LineScrubber([KEY])
    out = b""
    last = 0
    for cut in sorted(c % (len(data) + 1) for c in cuts):
        out += scrubber.feed(data[last:cut])
        last = max(last, cut)
    out += scrubber.feed(data[last:]) + scrubber.flush()
    assert KEY.encode() not in out
    assert out == data.replace(KEY.encode(), secrets.REDACTED.encode())


def test_server_client_sends_a_key_only_to_its_server() -> None:
    seen: dict[str, str | None] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen[f"{request.url.host}:{request.url.port}"] = request.headers.get("authorization")
        return httpx.Response(200, json={})

    async def go() -> None:
        async with server_client(transport=httpx.MockTransport(handler)) as client:
            for url in ("http://127.0.0.1:8123/v1/models", "http://localhost:8123/x", "http://127.0.0.1:8124/x",
                        "http://example.org:8123/x"):
                await client.get(url)

    register_api_key("http://0.0.0.0:8123", KEY)
    try:
        asyncio.run(go())
    finally:
        forget_api_key("http://127.0.0.1:8123")
    assert seen["127.0.0.1:8123"] == f"Bearer {KEY}" and seen["localhost:8123"] == f"Bearer {KEY}"
    assert seen["127.0.0.1:8124"] is None and seen["example.org:8123"] is None


def test_history_rows_are_scrubbed_and_versioned(tmp_path: Path) -> None:
    from search.regress import history

    secrets.remember([KEY])
    row = {"baseline": "b", "candidate": f"llama-server --api-key {KEY}", "metric": "w.x", "verdict": "same"}
    path = history.append([row], "b", tmp_path)
    text = path.read_text()
    assert KEY not in text and '"format": "flagsearch-history/1"' in text
    (loaded,) = history.load("b", tmp_path)
    assert loaded["candidate"] == "llama-server --api-key ***" and "format" not in loaded
    path.write_text(text.replace("flagsearch-history/1", "flagsearch-history/9"))
    with pytest.raises(ValueError, match="newer flagsearch"):
        history.load("b", tmp_path)


@pytest.mark.parametrize("name", ["PGPASSWORD", "MYSQL_PWD", "GITHUB_PAT", "NPM_AUTH", "AUTHORIZATION",
                                  "REGISTRY_AUTH", "--auth-token"])
def test_the_names_the_review_found_are_secret(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each name's value was printed, logged and stored before (PGPASSWORD reached the printed command,
    server.log, result.json, study.db, the CSV and the HTML report); now every writer scrubs it."""
    assert secrets.is_secret_name(name)
    if not name.startswith("-"):
        monkeypatch.setenv(name, "s3cr3t-value-42")
        assert secrets.scrub_text("PGPASSWORD=s3cr3t-value-42 psql") == "PGPASSWORD=*** psql"
        assert scrub({"command": "x s3cr3t-value-42"}) == {"command": "x ***"}


@pytest.mark.parametrize("name", ["PWD", "OLDPWD", "PATH", "PATCH_DIR", "TOKENIZER", "--max-num-batched-tokens",
                                  "--hf-overrides", "CUDA_VISIBLE_DEVICES"])
def test_ordinary_names_stay_readable(name: str) -> None:
    assert not secrets.is_secret_name(name)  # PWD (the working directory) scrubbed would hide every path


def test_a_header_or_a_json_flag_holding_a_token_is_redacted_and_remembered() -> None:
    argv = ["srv", "--header", "Authorization: Bearer sk-header-123456", "-H", "X-Api-Key: key-in-header-9",
            "--hf-overrides", '{"hf_token": "hf_jsonvalue_77", "rope_scaling": {"factor": 2}}',
            '--speculative-config={"api_key": "spec-key-88888"}']
    assert secrets.redact_argv(argv) == [
        "srv", "--header", "Authorization: Bearer ***", "-H", "X-Api-Key: ***",
        "--hf-overrides", '{"hf_token": "***", "rope_scaling": {"factor": 2}}',
        '--speculative-config={"api_key": "***"}']
    assert set(secrets.argv_secrets(argv)) == {"sk-header-123456", "key-in-header-9", "hf_jsonvalue_77",
                                               "spec-key-88888"}
    doc = copy.deepcopy(SPACE)
    doc["engines"]["llamacpp"]["args"]["hf_overrides"] = '{"token": "hf_in_an_arg_0001"}'
    doc["engines"]["llamacpp"]["args"]["header"] = "Authorization: Bearer bearer-in-arg-02"
    parse_space(doc, "s.yaml")
    assert {"hf_in_an_arg_0001", "bearer-in-arg-02"} <= set(secrets.known())


def test_a_secret_as_a_categorical_choice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Optuna stores every choice in trial_params.distribution_json, which no scrubber reaches."""
    for choice in ("Authorization: Bearer sk-choice-12345", "--api-key sk-choice-12345"):
        doc = copy.deepcopy(SPACE)
        doc["params"] = {"extra": {"type": "categorical", "choices": ["none", choice]}}
        with pytest.raises(SpaceError, match=r"params.extra.choices\[1\]: holds a secret"):
            parse_space(doc, "s.yaml")
    monkeypatch.setenv("PGPASSWORD", "env-password-77")
    doc = copy.deepcopy(SPACE)
    doc["params"] = {"dsn": {"type": "categorical", "choices": ["a", "postgresql://u:env-password-77@h/db"]}}
    with pytest.raises(SpaceError, match="holds a secret"):
        parse_space(doc, "s.yaml")
