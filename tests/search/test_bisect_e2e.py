"""`search bisect` over real engine builds finds the injected regression.

Four command builds of the real llama-server (SmolLM2 Q4_1, `-t 1`): b0 the binary, b1 a copy of it
at another path, b2 and b3 the binary behind harness/launch/throttle.py --stretch 0.5 (every response byte
delivered 2x later than it came: throughput x 0.5 whatever the load, far beyond the 20% threshold
used here and beyond the spread of a round under other agents' load, which was seen 2.7x between
rounds of one server; the SIGSTOP throttle is no slowdown under contention). The first
regressed build is b2. The search probes b3 against b0 (is there a regression at all?), then b1
against b0, then b2 against b1 (the reference moves to the last good build).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from harness import flagsearch_home
from search.cli import main
from tests.conftest import tiny_llama_space

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]




@pytest.mark.slow  # statistical: 4 builds told apart; make test bisects for real in test_kill_at_random
def test_bisect_finds_the_first_throttled_build_and_resumes(tmp_path: Path,
                                                            record_branch: Callable[[str, str], None]) -> None:
    # Two runs a round, no warm-up: the sides differ by 50%, far beyond a run's spread (2-4% alone),
    # and the first round's cold server is paired with the other side's.
    space = tiny_llama_space(tmp_path, repeats=2, warmup=False)
    server = flagsearch_home.llama_server()
    copy = tmp_path / "llama-server-copy"
    shutil.copy2(server, copy)
    slow = f"{sys.executable} {REPO / 'harness' / 'launch' / 'throttle.py'} 0.5 --stretch -- {server}"
    builds = [{"build": f"command:{server}", "label": "b0"}, {"build": f"command:{copy}", "label": "b1"},
              {"build": f"command:{slow}", "label": "b2-throttled"},
              {"build": f"command:{slow}", "label": "b3-throttled"}]
    (tmp_path / "builds.yaml").write_text(yaml.safe_dump(builds))
    out = tmp_path / "bisect"
    # 5 rounds: at 4 (the fewest that can reach p < 0.05) one slow round of the good build under a
    # load spike already left a probe inconclusive (seen: -43%, p 0.11, with --stretch 0.6); at 5 the
    # exact test tolerates two such inversions. No extra rounds for an inconclusive probe
    # (--max-rounds = --rounds); extending a probe is covered in tests/search/test_bisect.py.
    # --keep-servers: both sides live, runs alternating; on a machine loaded by other work the spread
    # between server starts is far larger than between alternating runs, and an A/A probe of fresh
    # starts was seen called "regressed" (-48%) under a load average of 10.
    argv = ["bisect", str(space), "--builds", str(tmp_path / "builds.yaml"), "--metric", "single.decode_tok_s",
            "--keep-servers", "--alpha", "0.05", "--rounds", "5", "--max-rounds", "5", "--min-effect", "0.2",
            "--out", str(out), "--quiet"]
    code = main(argv)
    state = json.loads((out / "bisect-state.json").read_text())
    probes, answer = state["probes"], state["next"]
    first = probes[0]
    assert (first["good"], first["build"], first["verdict"]) == (0, 3, "regressed"), first
    assert -90 < first["change_pct"] < -30 and first["rounds"] == 5
    assert first["fingerprint_b"]["build"]["label"] == "b3-throttled"
    assert len(first["host_probe_ms"]) == 10 and all(p > 0 for p in first["host_probe_ms"])  # before each turn
    assert len(first["load"]) == 10 and all(w["own_cores"] > 0 for w in first["load"])  # each turn's load window
    text = (out / "bisect.md").read_text()
    if answer["outcome"] == "found":
        assert answer["first_bad"] == 2 and code == 1
        # Named only after the adjacent pair itself (last good b1, first bad b2) was measured regressed.
        assert any((p["good"], p["build"], p["verdict"]) == (1, 2, "regressed") for p in probes), probes
        assert "First regressed build: `b2-throttled`" in text
        record_branch("detected", "first bad build b2 named")
    else:
        # Under a heavy load the A/A probe (b1 vs b0) can stay inconclusive at the round cap; the answer
        # is then the narrowest range, which must still hold exactly b1 and b2.
        assert answer["outcome"] == "inconclusive" and answer["range_"] == [1, 2] and code == 3, (answer, probes)
        assert any(p["build"] == 1 and p["verdict"] == "inconclusive" and p["rounds"] == 5 for p in probes)
        record_branch("fallback", "A/A probe inconclusive at the cap: range b1..b2")
    assert "| b0 | b3-throttled |" in text
    # Resuming a finished bisection measures nothing more and gives the same answer.
    assert main(argv) == code
    again = json.loads((out / "bisect-state.json").read_text())
    assert again["probes"] == probes and again["next"] == answer
