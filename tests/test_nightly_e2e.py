"""`search nightly` end to end on the real llama-server: A/A passes (and promotes a baseline with its
provenance), an injected regression fails, and every result lands in the baseline's history.

The regression is bench/throttle.py --stretch 0.7 in front of the candidate server (every response
byte delivered 3.3x later than it came: throughput x 0.3 whatever the load, far beyond the 30%
minimum effect the baseline gates on here; a SIGSTOP freeze is no slowdown under contention, as the
scheduler gives the frozen server its CPU back). Both sides are kept running and alternate runs
(--keep-servers): under other agents' load the spread between server starts dwarfs the one between
alternating runs. The A/A run is capped at the sequential gate's minimum of 3 rounds: it then ends
there, a pass or inconclusive, which proves what 5 rounds did.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness import setup_paths
from harness.builds import ensure_build, parse_build
from search import history
from search.baseline import load_baseline
from search.cli import main
from search.commands.nightly import promote
from tests.test_bisect_e2e import tiny_llama_space

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent


def test_nightly_passes_aa_promotes_and_fails_an_injected_regression(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGSEARCH_HISTORY", str(tmp_path / "history"))
    space = tiny_llama_space(tmp_path)
    baselines = tmp_path / "baselines"
    assert main(["baseline", "save", str(space), "--name", "nightly-e2e", "--rounds", "3", "--min-effect", "0.3",
                 "--dir", str(baselines), "--work-dir", str(tmp_path / "save"), "--quiet"]) == 0
    saved = load_baseline(baselines / "nightly-e2e.json")
    assert saved.source["round_s"] > 0  # what the nightly prices its plan with

    server = setup_paths.llama_server()
    aa = main(["nightly", "--candidate-build", f"command:{server}", "--baselines", str(baselines),
               "--rounds", "3", "--keep-servers", "--job-limit-min", "30", "--promote", str(tmp_path / "promoted"),
               "--out", str(tmp_path / "aa"), "--quiet"])
    report = json.loads((tmp_path / "aa" / "nightly-e2e" / "report.json").read_text())
    # A/A never fails the job: 0 (pass) or, when other work makes the machine too noisy to call the
    # change unchanged within 30%, 3 (inconclusive: the workflow's warning). Only a pass promotes.
    assert aa in (0, 3) and report["outcome"] in ("pass", "inconclusive"), report["verdicts"][0]
    assert (tmp_path / "promoted" / "nightly-e2e.json").exists() == (aa == 0)
    if aa != 0:  # the promotion itself, from the same real report
        promote(saved, tmp_path / "aa" / "nightly-e2e", ensure_build(parse_build(f"command:{server}")),
                tmp_path / "promoted", 1.0)
    promoted = load_baseline(tmp_path / "promoted" / "nightly-e2e.json")
    assert promoted.source["kind"] == "nightly" and promoted.source["build"] == f"command:{server}"
    assert promoted.source["outcome"] in ("pass", "inconclusive") and promoted.source["round_s"] > 0
    assert len(promoted.samples["single.output_tok_s"]) == 3 == promoted.source["rounds"]
    assert promoted.fingerprint["build"]["executable_sha256"]  # the exact binary that was measured
    assert promoted.gate == saved.gate

    slow = f"{sys.executable} {REPO / 'bench' / 'throttle.py'} 0.7 --stretch -- {server}"
    bad = main(["nightly", "--candidate-build", f"command:{slow}", "--baselines", str(baselines), "--rounds", "6",
                "--keep-servers", "--promote", str(tmp_path / "promoted2"), "--out", str(tmp_path / "bad"), "--quiet"])
    report = json.loads((tmp_path / "bad" / "nightly-e2e" / "report.json").read_text())
    v = next(v for v in report["verdicts"] if v["metric"] == "single.output_tok_s")
    assert bad == 1 and v["verdict"] == "regressed" and v["change_pct"] < -40, v
    assert not (tmp_path / "promoted2").exists()  # a failing run promotes nothing

    rows = history.load("nightly-e2e")
    tok = [r for r in rows if r["metric"] == "single.output_tok_s"]
    assert [r["source"] for r in tok] == ["nightly", "nightly"]
    assert tok[0]["verdict"] in ("unchanged", "inconclusive") and tok[1]["verdict"] == "regressed"
    assert json.loads(tok[1]["build"])["spec"].endswith(f"-- {server}")
