"""What `search ab` / `search regress` say: a "why" that follows from the evidence, a failed side
reported as failed, and a headline that states the outcome that sets the exit code.

The startup logs are real llama-server captures (tests/data): A with the default f16 KV cache,
B with `--cache-type-k q8_0`, both SmolLM2 Q4_1 on this CPU.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from xml.etree import ElementTree as ET

import numpy as np

from harness.engines.llamacpp import LlamaCppEngine
from harness.session import LaunchFailed
from search.exit_codes import Exit
from search.regress.ab import ABRun, deciding_line, report_from_run
from search.regress.claims import judge_claim, parse_claim
from search.regress.explain import explain_claim
from search.regress.gate_report import GateReport
from search.regress.kernel_path import kernel_path_differences
from search.regress.sides import SideResult
from search.verdicts.gate import EXIT_PASS, EXIT_REGRESSION, compare

DATA = Path(__file__).resolve().parents[1] / "data"
FINGERPRINT = {"cpu_model": "AMD EPYC", "cpu_count": 2, "engine": "llamacpp", "engine_version": "b1-1652066"}


def noisy(median: float, cv: float, n: int, seed: int) -> list[float]:
    return list(median * np.exp(np.random.default_rng(seed).normal(0.0, cv, n)))


def side(label: str, log: str | None, samples: list[float] | None = None) -> SideResult:
    startup = asdict(LlamaCppEngine().parse_startup((DATA / log).read_text())) if log else {}
    return SideResult(label, command=f"llama-server {label}", dialect="llamacpp", startup=startup,
                      fingerprint=dict(FINGERPRINT) if log else {},
                      samples={"single.output_tok_s": samples or []})


A_LOG, B_LOG = "llamacpp_cpu_ready.log", "llamacpp_cpu_ready_ctk_q8_0.log"
CHANGES = ["cache_type_k: None -> 'q8_0'"]


# ---- item 1: the "why" follows from the evidence ---------------------------------------------------

def test_the_real_pair_differs_in_the_kv_cache_type_and_shares_the_rest_of_the_path() -> None:
    a, b = side("A", A_LOG), side("B", B_LOG)
    differed, same = kernel_path_differences("llamacpp", a.startup, b.startup)
    assert differed == ["KV cache type: K=f16,V=f16 on A, K=q8_0,V=f16 on B"], differed
    assert "weights on: CPU_Mapped on A and B" in same and "flash attention: enabled on A and B" in same
    # A buffer's size is a consequence, not a selection: it is not part of the path compared.
    assert not any("buffer" in d for d in differed + same)


def test_a_real_slowdown_with_a_changed_kv_cache_is_not_called_not_taking_effect() -> None:
    # The H100 case: B measured -10% (regressed), the claim of +10% is contradicted, the weights
    # backend is shared but the KV cache type and size differ. The old sentence said "likely not
    # taking effect" because one backend line was shared.
    a, b = side("A", A_LOG, noisy(100, 0.01, 6, 1)), side("B", B_LOG, noisy(90, 0.01, 6, 2))
    measured = compare("single.output_tok_s", a.samples["single.output_tok_s"], b.samples["single.output_tok_s"])
    assert measured.verdict == "regressed"
    result = judge_claim(parse_claim("+10% tok/s"), measured)
    assert result.verdict == "contradicted"
    why = explain_claim(result, a, b, CHANGES)
    assert why is not None and "not taking effect" not in why
    assert "regressed" in why and "KV cache type" in why and "q8_0" in why and "buffer" not in why


def test_not_taking_effect_needs_a_null_change_and_identical_startups() -> None:
    same = noisy(100, 0.01, 6, 3), noisy(100, 0.01, 6, 4)
    a, b = side("A", A_LOG, same[0]), side("B", A_LOG, same[1])
    measured = compare("single.output_tok_s", *same)
    assert measured.verdict in ("unchanged", "inconclusive")
    result = judge_claim(parse_claim("+20% tok/s"), measured)
    assert result.verdict == "contradicted"
    why = explain_claim(result, a, b, ["flash_attn: 'off' -> 'on'"])
    assert why is not None and "likely not taking effect" in why and "flash_attn" in why

    # The same null change, but the logs show B selected something else: it did take effect.
    b_changed = side("B", B_LOG, same[1])
    why = explain_claim(result, a, b_changed, CHANGES)
    assert why is not None and "not taking effect" not in why and "no measurable change" in why
    assert "KV cache type" in why


def test_no_explanation_for_a_reproduced_claim_or_a_side_that_never_started() -> None:
    a, b = side("A", A_LOG, noisy(100, 0.01, 6, 5)), side("B", B_LOG, noisy(125, 0.01, 6, 6))
    result = judge_claim(parse_claim("+24% tok/s"), compare("single.output_tok_s", a.samples["single.output_tok_s"],
                                                            b.samples["single.output_tok_s"]))
    assert result.verdict == "reproduced" and explain_claim(result, a, b, CHANGES) is None
    failed = side("B", None)
    contradicted = judge_claim(parse_claim("+50% tok/s"), result.measured)
    assert explain_claim(contradicted, a, failed, CHANGES) is None


# ---- item 2: a side that did not start ----------------------------------------------------------

def test_a_failed_side_is_reported_as_failed_with_command_cause_and_line() -> None:
    a = side("A", A_LOG, noisy(100, 0.01, 1, 7))
    b = SideResult("B: smollm2-llamacpp-gate", command="llama-server -m x.gguf --cache-type-k q4_0",
                   failure={"side": "B", "round": 1, "command": "llama-server -m x.gguf --cache-type-k q4_0",
                            "cause": "bad_flag", "line": "K cache type q4_0 with block size 32 does not divide "
                                                         "n_embd_head_k=80", "log": "/tmp/B-round01.log"})
    run = ABRun(a, b, 0, order=["A", "B"], errors=["B did not start in round 1: bad_flag: K cache type ..."])
    report = report_from_run(run, "ab", ["single.output_tok_s"])
    assert report.fingerprint_differences == [] and report.log_diff == []
    assert report.label_b == "llama-server -m x.gguf --cache-type-k q4_0"
    md = report.markdown()
    first = md.splitlines()[0]
    assert "B (bad_flag) FAILED TO START" in first and f"exit {Exit.FAILED}" in first
    assert "cpu_model" not in md and "does not divide n_embd_head_k=80" in md
    assert "- command: `llama-server -m x.gguf --cache-type-k q4_0`" in md
    assert report.exit_code() == Exit.FAILED
    assert report.to_dict()["failed_sides"][0]["cause"] == "bad_flag"


def test_an_unclassified_exit_still_names_the_log_line() -> None:
    exc = LaunchFailed("exited", "server exited with status 1 before ready",
                       ["0.00.01 I srv  load_model: loading model", "0.00.02 E llama_init: something new broke",
                        "0.00.03 I srv  bye"], "llama-server -m x")
    assert deciding_line(exc).startswith("0.00.02 E llama_init: something new broke")
    classified = LaunchFailed("bad_flag", "error: invalid argument: --nope", [], "llama-server --nope")
    assert deciding_line(classified) == "error: invalid argument: --nope"


# ---- item 7: the headline states what sets the exit code --------------------------------------------

def _report(b_median: float) -> GateReport:
    v = compare("w.output_tok_s", noisy(75, 0.01, 6, 21), noisy(b_median, 0.01, 6, 22))
    return GateReport("ab", "A", "B", [v])


def test_a_contradicted_claim_heads_the_report_and_sets_exit_1() -> None:
    report = _report(75.0)  # no regression: the gate alone would pass
    assert report.outcome == "pass" and report.exit_code() == EXIT_PASS
    report.claims.append(judge_claim(parse_claim("+20% tok/s"), report.verdicts[0]))
    assert report.claims[0].verdict == "contradicted"
    assert report.exit_code() == EXIT_REGRESSION
    first = report.markdown().splitlines()[0]
    assert "CLAIM CONTRADICTED" in first and "exit 1" in first and "PASS, no regression" in first
    assert "**PASS" not in first  # the old headline read "## ab: **PASS**" above a red job
    assert report.to_dict()["headline"].startswith("CLAIM CONTRADICTED (exit 1)")
    junit = ET.fromstring(report.junit_xml())
    failed = [c.get("name") for c in junit.iter("testcase") if c.find("failure") is not None]
    assert failed == ["+20% tok/s"]


def test_regress_headlines() -> None:
    regressed = _report(75 * 0.8)
    first = regressed.markdown().splitlines()[0]
    assert "REGRESSION (w.output_tok_s)" in first and "exit 1" in first
    passed = _report(75 * 1.2)
    assert "PASS, no regression** (exit 0)" in passed.markdown().splitlines()[0]
    reproduced = _report(75 * 1.3)
    reproduced.claims.append(judge_claim(parse_claim("+30% tok/s"), reproduced.verdicts[0]))
    assert reproduced.exit_code() == EXIT_PASS
    assert "CLAIM REPRODUCED** (exit 0)" in reproduced.markdown().splitlines()[0]


# ---- kept servers on a host whose speed varies -----------------------------------------------------

def test_kept_unpinned_servers_on_a_varying_host_are_named_and_pinned_or_fresh_ones_are_not() -> None:
    """One CI run's A/A bisect probe of kept, unpinned llama-servers read -22% while the host's speed
    probe varied 1.74x: the report says why that can happen and what to do. Fresh starts each round, or
    both sides pinned (fingerprint `cpus`), get no such note; nor does a steady host."""
    varying = [{"probe_ms": p, "wall_s": 2.0, "foreign_cores": 0.0, "cores": 2, "contended": False}
               for p in (3.8, 6.7, 4.1, 6.5, 3.9, 6.6)]

    def run(starts: int, cpus: str | None, load: list[dict[str, object]]) -> ABRun:
        sides = [SideResult(label, fingerprint={**FINGERPRINT, "cpus": cpus},
                            samples={"single.output_tok_s": noisy(70, 0.05, 3, seed),
                                     "startup.ready_s": [0.4] * starts})
                 for label, seed in (("A", 1), ("B", 2))]
        return ABRun(sides[0], sides[1], rounds_done=3, order=["A", "B", "B", "A", "A", "B"], load=load)

    kept = report_from_run(run(1, None, varying), "ab", ["single.output_tok_s"])
    assert any("kept running, not pinned" in n and "engine option cpus" in n for n in kept.notes), kept.notes
    for quiet in (run(3, None, varying), run(1, "0", varying),
                  run(1, None, [{**w, "probe_ms": 4.0} for w in varying])):
        notes = report_from_run(quiet, "ab", ["single.output_tok_s"]).notes
        assert not any("kept running" in n for n in notes), notes
        # Every kept run says that its intervals hold no start's own level; fresh starts do not.
        assert any("started once (--keep-servers)" in n for n in notes) == (quiet.a.samples["startup.ready_s"] == [0.4])
    assert any("started once (--keep-servers)" in n for n in kept.notes)
