"""The bisection logic of `search bisect` (pure: verdicts in, next probe out) and its state file."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from search.regress.bisect import Probe, Step, bisect_verdict, judge_probe, next_step
from search.verdicts.gate import compare


def drive(n: int, verdict: Callable[[int, int, int], str], rounds: int = 3,
          max_rounds: int = 9) -> tuple[Step, list[Probe]]:
    """Run the state machine with a verdict oracle (good index, probe index, rounds so far)."""
    probes: list[Probe] = []
    for _ in range(100):
        step = next_step(n, probes, rounds, max_rounds)
        if step.kind == "done":
            return step, probes
        if not probes or probes[-1].final or (probes[-1].good, probes[-1].build) != (step.good, step.build):
            probes.append(Probe(good=step.good, build=step.build))
        p = probes[-1]
        p.rounds += step.rounds
        p.verdict = verdict(p.good, p.build, p.rounds)
        p.final = p.verdict != "inconclusive"
    raise AssertionError("bisection did not stop")


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 13])
def test_finds_every_first_bad_build(n: int) -> None:
    for k in range(1, n):
        step, probes = drive(n, lambda g, b, _r, k=k: "regressed" if g < k <= b else "unchanged")
        assert (step.outcome, step.first_bad) == ("found", k)
        # First the whole range, then halving: about log2(n) + 1 probes, and the adjacent pair
        # (last good, first bad) measured directly before a build is named, if no probe did.
        assert probes[0].build == n - 1
        assert len(probes) <= n.bit_length() + 2
        assert (probes[-1].good, probes[-1].build) == (k - 1, k)


def test_a_gradual_drift_is_not_pinned_on_one_build() -> None:
    # Each build is 2% slower than the one before: against an older reference two steps add up to a
    # regression, against its neighbour none is one. No single build is to blame.
    step, probes = drive(6, lambda g, b, _r: "regressed" if b - g >= 2 else "unchanged")
    assert step.outcome == "inconclusive" and "gradual" in step.note
    assert any(p.build - p.good == 1 for p in probes)


def test_no_regression_is_one_probe() -> None:
    step, probes = drive(6, lambda *_: "improved")
    assert step.outcome == "none"
    assert [(p.good, p.build) for p in probes] == [(0, 5)]


def test_inconclusive_probe_gets_more_rounds_then_is_set_aside() -> None:
    # Build 2 stays inconclusive; 3 is the first regressed build: the answer is the range 2..3.
    def oracle(g: int, b: int, _r: int) -> str:
        if b == 2:
            return "inconclusive"
        return "regressed" if g < 3 <= b else "unchanged"

    step, probes = drive(6, oracle, rounds=3, max_rounds=9)
    assert step.outcome == "inconclusive"
    assert step.range_ == (2, 3)
    two = [p for p in probes if p.build == 2]
    assert len(two) == 1 and two[0].rounds == 9  # 3 + 3 + 3: extended up to the cap, once


def test_inconclusive_that_settles_with_more_rounds() -> None:
    step, probes = drive(4, lambda g, b, r: "inconclusive" if r < 6 else ("regressed" if b >= 2 > g else "unchanged"))
    assert (step.outcome, step.first_bad) == ("found", 2)
    assert all(p.rounds == 6 for p in probes)


def test_a_build_that_fails_is_skipped() -> None:
    def oracle(bad: int, first: int) -> Callable[[int, int, int], str]:
        return lambda g, b, _r: "error" if b == bad else ("regressed" if g < first <= b else "unchanged")

    step, _ = drive(8, oracle(2, 4))
    assert (step.outcome, step.first_bad) == ("found", 4)
    # A failed build right before the first bad one: either could be first; the range says so.
    step, _ = drive(8, oracle(3, 4))
    assert step.outcome == "inconclusive" and step.range_ == (3, 4)


def test_range_end_inconclusive_states_the_whole_range() -> None:
    step, _ = drive(5, lambda *_: "inconclusive", max_rounds=6)
    assert step.outcome == "inconclusive" and step.range_ == (1, 4)


def test_needs_two_builds() -> None:
    with pytest.raises(ValueError, match="two builds"):
        next_step(1, [], 3, 9)


def test_one_sided_verdict_clears_a_probe_that_cannot_have_regressed() -> None:
    """The probe measured in docs/regression.md's bisection (0.29.0 vs 0.28.0, 10 rounds under load):
    the gate calls it inconclusive (its interval reaches +30%, past +20%), but the interval excludes a
    20% regression, so bisect counts the build as good. A probe whose interval does reach -20% stays
    inconclusive, and a real regression stays regressed."""
    # Its raw samples (tok/s): two A rounds hit a load spike.
    a = [7.912, 3.557, 7.347, 7.797, 7.805, 4.11, 7.69, 7.474, 7.977, 7.733]
    b = [7.63, 7.474, 7.84, 7.519, 8.168, 6.855, 7.545, 7.464, 7.888, 7.171]
    v = compare("four_streams.output_tok_s", a, b, min_effect=0.2)
    assert v.verdict == "inconclusive" and v.ci_high > 1.2 and v.ci_low > 0.8
    assert bisect_verdict(v) == "not regressed"
    v = compare("four_streams.output_tok_s", b, a, min_effect=0.2)
    assert v.ci_low < 0.8 and bisect_verdict(v) == "inconclusive"
    v = compare("four_streams.output_tok_s", a, [x / 2 for x in a], min_effect=0.2)
    assert bisect_verdict(v) == "regressed"
    # Lower is better for latency: a slower probe is the regression side.
    lat_a = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0]
    v = compare("four_streams.ttft_p50_s", lat_a, [x * 0.7 for x in lat_a[:3]] + [x * 1.05 for x in lat_a[3:]],
                min_effect=0.2)
    assert bisect_verdict(v) in ("not regressed", "improved", "unchanged")


def test_a_probe_of_kept_unpinned_servers_on_a_varying_host_says_so() -> None:
    """The CI run's A/A probe (kept, unpinned, the host's speed probe 3.8-6.7 ms) read -22%: its note names
    that cause; a pinned probe (fingerprint cpus) or one of fresh starts does not get it."""
    def probe(cpus: str | None) -> Probe:
        runs_a = [[70.0, 71.0], [69.0, 70.5], [70.2, 69.8], [71.0, 70.0], [69.5, 70.4]]
        return Probe(good=0, build=1, rounds=5, runs_a=runs_a, runs_b=[[v * 0.78 for v in r] for r in runs_a],
                     samples_a=[70.0] * 5, samples_b=[55.0] * 5, fingerprint_a={"cpus": cpus},
                     fingerprint_b={"cpus": cpus}, host_probe_ms=[3.8, 6.7, 4.1, 6.5, 3.9, 6.6])
    kept = judge_probe(probe(None), "single.decode_tok_s", 0.2, 0.05, 5, 5, kept=True)
    assert "kept running, not pinned" in kept.note and "CPU speed varied" in kept.note, kept.note
    for quiet in (judge_probe(probe("0"), "single.decode_tok_s", 0.2, 0.05, 5, 5, kept=True),
                  judge_probe(probe(None), "single.decode_tok_s", 0.2, 0.05, 5, 5, kept=False)):
        assert "kept running" not in quiet.note and "CPU speed varied" in quiet.note, quiet.note


def test_a_probe_cut_short_goes_on_to_the_rounds_it_was_to_reach() -> None:
    # Killed (or Ctrl-C'd) after 2 of its 5 rounds, the first probe is stored unjudged with what it was to
    # reach: the resumed bisection measures its 3 missing rounds, never sets it aside or starts it again.
    cut = Probe(good=0, build=3, rounds=2, planned=5, runs_a=[[10.0], [10.1]], runs_b=[[9.0], [9.1]])
    assert next_step(4, [cut], rounds=5, max_rounds=10) == Step("measure", 0, 3, 3)
    assert not cut.final
    # An extension of an inconclusive probe cut short likewise resumes that extension, to its end.
    extended = Probe(good=0, build=3, rounds=7, planned=10, verdict="inconclusive")
    assert next_step(4, [extended], rounds=5, max_rounds=10) == Step("measure", 0, 3, 3)
