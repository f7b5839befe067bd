"""`search ab` of a pull request named by its ref: `--b-build 'pkg @ git+file:///...@refs/pull/1/head'`.

A real git repository published the way a forge publishes a pull request (refs/pull/1/head, next to
the branch feature/x); its package is a thin launcher that execs the real llama-server, so each side is
a pip build from the repository (main for A, the PR head for B) driving a real engine. The test shows
that the ref with slashes is resolved to its commit, both builds are created, both servers start and
are measured, and the report records the exact commits. One round: the comparison itself is not the
point here (tests/search/test_nightly_e2e.py and the ab tests judge measurements).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from harness import flagsearch_home
from search.cli import main
from tests.conftest import tiny_llama_space
from tests.fake_builds import add_pull_request, engine_repo

pytestmark = pytest.mark.e2e

LAUNCHER = "import os, sys\nSPEED = '{speed}'\nif __name__ == '__main__':\n    os.execv(sys.argv[1], sys.argv[1:])\n"


def launcher_repo(root: Path) -> tuple[Path, str, str]:
    """A repository whose main and refs/pull/1/head differ by one line; (path, main commit, PR commit)."""
    repo, base = engine_repo(root, LAUNCHER.format(speed="base"))
    return repo, base, add_pull_request(repo, LAUNCHER.format(speed="pr"))


def test_ab_of_a_pull_request_ref_builds_both_sides_and_records_the_commits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    space = tiny_llama_space(tmp_path)
    server = str(flagsearch_home.llama_server())
    doc = yaml.safe_load(space.read_text())
    doc["engines"]["llamacpp"]["command"] = [sys.executable, "-m", "fakeengine", server]
    # A second, longer workload that --workload leaves out: one workload measured and gated, as a PR
    # check on a 12-minute start would ask.
    doc["workloads"].append({"name": "long", "streams": ["qa"], "max_tokens": 64})
    space.write_text(yaml.safe_dump(doc))
    repo, base, head = launcher_repo(tmp_path)
    monkeypatch.setenv("FLAGSEARCH_HOME", str(tmp_path / "home"))  # the builds go here, not the user's cache

    out = tmp_path / "ab"
    code = main(["ab", str(space), "--a-build", f"fakeengine @ git+file://{repo}@main",
                 "--b-build", f"fakeengine @ git+file://{repo}@refs/pull/1/head", "--rounds", "1",
                 "--workload", "single", "--out", str(out), "--quiet"])
    report = json.loads((out / "report.json").read_text())
    assert not report["failed_sides"] and not report["errors"], report["headline"]
    assert code in (0, 1, 3)  # one round decides nothing; both sides ran
    run = report["run"]
    a_build, b_build = run["a"]["fingerprint"]["build"], run["b"]["fingerprint"]["build"]
    assert (a_build["git_ref"], a_build["git_commit"]) == ("main", base)
    assert (b_build["git_ref"], b_build["git_commit"]) == ("refs/pull/1/head", head)
    assert run["a"]["samples"]["single.output_tok_s"] and run["b"]["samples"]["single.output_tok_s"]
    measured = {m.partition(".")[0] for side in ("a", "b") for m in run[side]["samples"]}
    judged = {v["metric"].partition(".")[0] for v in report["verdicts"]}
    assert "long" not in measured | judged and "single" in judged, (measured, judged)  # (and startup.*)
    # Each side ran its own build's launcher, which started the real llama-server.
    assert "/builds/pip-fakeengine-" in run["b"]["command"] and server in run["b"]["command"]
    launcher = [run[side]["command"].removeprefix(f"taskset -c {cpu} ").split()[0] for side in ("a", "b")
                for cpu in [doc["engines"]["llamacpp"]["cpus"]]]
    assert launcher[0] != launcher[1], launcher
