"""The streaming client against injected faults (httpx.MockTransport): every failure is counted
with its kind and body, TTFT is to the first content token, tokens come from `usage`.
The real engines are exercised in test_measure_e2e.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import httpx

from harness.measure.client import RequestResult, stream_chat

PAYLOAD = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def sse(*events: dict | str) -> list[bytes]:
    return [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events]


def delta(text: str | None = None, role: str | None = None, finish: str | None = None) -> dict:
    d: dict = {}
    if role:
        d["role"] = role
    if text is not None:
        d["content"] = text
    return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13,
                                  "prompt_tokens_details": {"cached_tokens": 0}}}


def run(handler: Callable[[httpx.Request], httpx.Response], timeout_s: float = 5.0) -> RequestResult:
    async def go() -> RequestResult:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await stream_chat(client, "http://test", PAYLOAD, "w", timeout_s, item="qa")
    return asyncio.run(go())


def streaming(chunks: list[bytes], gap_s: float = 0.0, status: int = 200) -> Callable[[httpx.Request], httpx.Response]:
    async def body() -> AsyncIterator[bytes]:
        for c in chunks:
            if gap_s:
                await asyncio.sleep(gap_s)
            yield c

    def handler(request: httpx.Request) -> httpx.Response:
        sent = json.loads(request.content)
        assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
        return httpx.Response(status, content=body(), headers={"content-type": "text/event-stream"})
    return handler


def test_success_uses_usage_and_first_content_token() -> None:
    # Two tokens arrive in one chunk (as with speculative decoding): usage, not chunks, counts them.
    chunks = sse(delta(role="assistant", text=""), delta("Hello"), delta(" big world"),
                 delta("!", finish="length"), USAGE, "[DONE]")
    r = run(streaming(chunks, gap_s=0.05))
    assert r.ok and r.error_kind is None and r.status == 200
    assert r.output_tokens == 4 and r.prompt_tokens == 9 and r.cached_prompt_tokens == 0
    assert r.content_chunks == 3 and r.text == "Hello big world!"
    assert r.finish_reason == "length" and r.item == "qa" and r.max_tokens == 4
    assert r.first_byte_s is not None and r.ttft_s is not None
    assert r.ttft_s >= r.first_byte_s + 0.04  # the role-only chunk is not the first token
    assert len(r.chunk_gaps_s) == 2 and all(g >= 0.04 for g in r.chunk_gaps_s)
    assert r.tpot_s is not None and r.decode_tok_s is not None and not r.cut


def test_http_400_is_an_error_with_the_servers_message() -> None:
    msg = {"error": {"message": "This model's maximum context length is 2048 tokens.", "code": 400}}
    r = run(lambda req: httpx.Response(400, json=msg))
    assert not r.ok and r.status == 400 and r.error_kind == "http_400"
    assert "maximum context length is 2048" in (r.error_body or "")


def test_stream_without_usage_or_finish_is_incomplete() -> None:
    r = run(streaming(sse(delta("Hel"), delta("lo"))))  # connection closes: no finish, no usage
    assert not r.ok and r.error_kind == "incomplete_stream"
    assert "usage chunk" in (r.error_body or "") and "finish_reason" in (r.error_body or "")
    assert r.text == "Hello"
    r = run(streaming(sse(delta("Hi", finish="stop"), "[DONE]")))
    assert not r.ok and r.error_kind == "incomplete_stream" and "usage" in (r.error_body or "")


def test_error_event_inside_a_stream_and_malformed_data() -> None:
    r = run(streaming(sse(delta("a"), {"error": {"message": "engine died"}})))
    assert r.error_kind == "stream_error" and "engine died" in (r.error_body or "")
    r = run(streaming([b"data: {not json\n\n"]))
    assert r.error_kind == "malformed"
    r = run(streaming([b'{"error": "exceed_context_size_error"}\n']))  # JSON body, no SSE framing
    assert r.error_kind == "stream_error" and "exceed_context_size" in (r.error_body or "")


def test_abnormal_finish_reason_is_an_error() -> None:
    r = run(streaming(sse(delta("a", finish="abort"), USAGE, "[DONE]")))
    assert not r.ok and r.error_kind == "finish_abort"


def test_a_trickling_stream_is_a_timeout_of_the_whole_request() -> None:
    # Each read is quick (0.2 s) but the whole answer would take 4 s: a 1 s budget must stop it.
    chunks = sse(*[delta("x") for _ in range(20)], delta("", finish="stop"), USAGE, "[DONE]")
    r = run(streaming(chunks, gap_s=0.2), timeout_s=1.0)
    assert not r.ok and r.error_kind == "timeout"
    assert 0.9 < r.e2e_s < 2.0 and "content chunks received" in (r.error_body or "")


def test_connection_refused_is_a_connect_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)
    r = run(refuse)
    assert not r.ok and r.error_kind == "connect" and r.status is None


def test_cut_output_is_visible() -> None:
    usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}
    r = run(streaming(sse(delta("a"), delta("b", finish="length"), usage, "[DONE]")))
    assert r.ok and r.cut  # asked for 4, got 2 with finish_reason length
