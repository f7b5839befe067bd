"""The nightly workflow's own shell steps, run here with bash against the real llama-server (no GitHub
runner): A/A passes and promotes, the same build again is "nothing new", a candidate that fails to start
fails the job, an unsettled gate takes rounds up to the cap and then fails, unpromoted, and a real -40%
candidate fails with its report. Each result lands in the history, which the workflow's drift step reads.

The regression is harness/launch/throttle.py 0.4 --stretch in front of the candidate server (-40% throughput whatever
the load), gated at 10% within at most 10 rounds; the A/A run is gated at 50% within at most 12 rounds (the
paired gate's interval for one short workload reached +-30% at 6 rounds under other agents' load, and +-45% in
one CI run beside the other test worker). Both sides are kept running and alternate runs (--keep-servers):
under other agents' load the spread between server starts dwarfs the one between alternating runs. The
inconclusive run asks for a 0.1% minimum effect at alpha 0.001 within 4 rounds, which no measurement can
settle: the run goes past the gate's first look (3 rounds) to the cap, as an unsettled nightly does
(one measured run per round: it needs an unsettled gate, not a precise number).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import flagsearch_home
from search.cli import main
from search.regress import history
from search.regress.baseline import load_baseline
from tests.conftest import tiny_llama_space

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "nightly-regression.yml"


def step(name: str) -> str:
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["regress"]["steps"]
    script = next(s["run"] for s in steps if s.get("name") == name)
    assert "${{" not in script  # every input comes through env, so this is the script the runner runs
    return str(script)


REGRESS = "Regress every matching baseline"
DRIFT = "Drift over each baseline's history (change points)"


def run_step(work: Path, name: str, **env: str) -> tuple[int, str, dict[str, Any]]:
    """Run one workflow step with bash in `work` (the checkout), as the runner would: each night's job
    starts from a fresh checkout, without the last night's reports (the history is kept)."""
    if name == REGRESS:
        shutil.rmtree(work / "reports", ignore_errors=True)
    full = {**os.environ, "ROUNDS": "6", "JOB_LIMIT_MIN": "30", "CPU_ONLY": "true", "ALLOW": "",
            "ALLOW_NO_BASELINE": "false", "GITHUB_STEP_SUMMARY": str(work / "summary.md"), **env}
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "-c", step(name)], cwd=work, env=full, capture_output=True, text=True,
                          timeout=900)
    print(f"{name} ({env.get('CANDIDATE', '')[-40:]}): exit {proc.returncode} in {time.monotonic() - t0:.0f} s")
    summary = work / "reports" / "nightly.json"
    data = json.loads(summary.read_text()) if summary.exists() and name == REGRESS else {}
    return proc.returncode, proc.stdout + proc.stderr, data


@pytest.mark.slow  # the whole workflow replayed step by step; its exit codes have unit tests in make test
def test_the_workflow_steps_fail_on_every_failure_and_pass_only_a_measured_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGSEARCH_HISTORY", str(tmp_path / "history"))
    # Two runs a round, no warm-up: every outcome here is a gate decision at 10% or more, or none at all.
    space = tiny_llama_space(tmp_path, repeats=2, warmup=False)
    work = tmp_path / "checkout"
    work.mkdir()
    (work / ".venv").symlink_to(REPO / ".venv")
    assert main(["baseline", "save", str(space), "--name", "nightly-e2e", "--rounds", "3", "--min-effect", "0.3",
                 "--dir", str(work / "baselines"), "--work-dir", str(tmp_path / "save"), "--quiet"]) == 0
    saved = load_baseline(work / "baselines" / "nightly-e2e.json")
    assert saved.source["round_s"] > 0  # what the nightly prices its plan with
    server = flagsearch_home.llama_server()
    keep = "--keep-servers --quiet"

    # A/A: a measured pass, promoted with its provenance and the promotion chain.
    # Up to 12 rounds: a calm A/A settles at the first look (3 rounds); one CI run beside the other worker's tests
    # (14% spread per start and 15% run to run, every turn contended) was still +-45% wide at the old cap of 6.
    # With the A/A sentinel due every night: after the measured night, the baseline's build against itself, its
    # verdicts and spread in nightly.json and its own history rows (a false call there is not the night's outcome).
    code, out, night = run_step(work, REGRESS, CANDIDATE=f"command:{server}", ROUNDS="12",
                                NIGHTLY_ARGS=f"{keep} --min-effect 0.5 --sentinel-every 1")
    result = night["results"][0]
    assert code == 0 and result["outcome"] == "pass" and "nightly passed" in out, out[-3000:]
    sentinel = result["sentinel"]
    assert "single.decode_tok_s" in sentinel["verdicts"] and isinstance(sentinel["false_call"], bool), sentinel
    assert (work / "reports" / "nightly-e2e" / "sentinel" / "report.json").exists()
    assert {r["source"] for r in history.load("nightly-e2e")} == {"nightly", "nightly-sentinel"}
    promoted = load_baseline(work / "reports" / "promoted" / "nightly-e2e.json")
    assert promoted.source["kind"] == "nightly" and promoted.source["build"] == f"command:{server}"
    assert promoted.source["chain_length"] == 1 and set(promoted.source["chain_ratio"]) == {"single.decode_tok_s"}
    assert promoted.fingerprint["build"]["executable_sha256"] and promoted.gate == saved.gate
    assert "- nightly-e2e: PASS" in (work / "summary.md").read_text()

    # The same binary again: nothing new, said in one line, red unless allowed by name; nothing measured.
    code, out, night = run_step(work, REGRESS, CANDIDATE=f"command:{server}", NIGHTLY_ARGS=keep)
    assert code == 4 and night["results"][0]["outcome"] == "nothing-new" and "::error::nothing new" in out
    assert "no new build since the last nightly" in out and not (work / "reports" / "nightly-e2e").exists()
    code, out, _ = run_step(work, REGRESS, CANDIDATE=f"command:{server}", NIGHTLY_ARGS=keep, ALLOW="nothing-new")
    assert code == 0 and "(allowed by --allow)" in out

    # A candidate that does not start fails the job, naming the side and the engine's line.
    code, out, night = run_step(work, REGRESS, CANDIDATE=f"command:{server} --cache-type-k q9_0", NIGHTLY_ARGS=keep)
    result = night["results"][0]
    assert code == 7 and result["outcome"] == "start-failed" and "::error::a build or a server start failed" in out
    assert "candidate (B)" in result["detail"] and not (work / "reports" / "promoted").exists(), out[-3000:]

    # Unsettled: rounds past the first look up to the cap, then red and not promoted.
    code, out, night = run_step(work, REGRESS, CANDIDATE=f"command:{server} --threads 1", ROUNDS="4",
                                NIGHTLY_ARGS=f"{keep} --min-effect 0.001 --alpha 0.001 --repeats 1")
    result = night["results"][0]
    assert code == 3 and result["outcome"] == "inconclusive" and result["rounds"] == 4, out[-3000:]
    assert "::error::inconclusive" in out and not (work / "reports" / "promoted").exists()

    # A real -40% candidate: a regression, with the report in the job summary. (At -20% one fresh-clone run beside
    # another worker's load, A at 27 tok/s against ~50-70 calm and 15% per start, left it inconclusive at 10 rounds.)
    slow = f"{sys.executable} {REPO / 'harness' / 'launch' / 'throttle.py'} 0.4 --stretch -- {server}"
    code, out, night = run_step(work, REGRESS, CANDIDATE=f"command:{slow}", ROUNDS="10",
                                NIGHTLY_ARGS=f"{keep} --min-effect 0.1 --workload single")
    result = night["results"][0]
    report = json.loads((work / "reports" / "nightly-e2e" / "report.json").read_text())
    v = next(v for v in report["verdicts"] if v["metric"] == "single.decode_tok_s")
    assert code == 1 and result["outcome"] == "regression" and v["verdict"] == "regressed", (v, out[-3000:])
    assert -60 < v["change_pct"] < -25 and "::error::a baseline regressed" in out
    assert "REGRESSION" in (work / "summary.md").read_text()

    # Every measured night is in the history, which the drift step reads (too few runs to flag here).
    tok = [r for r in history.load("nightly-e2e") if r["metric"] == "single.decode_tok_s" and r["source"] == "nightly"]
    assert len(tok) == 4
    assert tok[0]["outcome"] == "pass" and tok[-1]["verdict"] == "regressed"
    code, out, _ = run_step(work, DRIFT)
    shown = (work / "reports" / "history.txt").read_text()
    # The listing shows every row (the sentinel's too); the drift reads the candidates' nights only.
    assert code == 0 and shown.count("single.decode_tok_s") == 5 and "nightly-sentinel" in shown, out
    assert "regressed" in shown
