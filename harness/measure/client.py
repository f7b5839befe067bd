"""Async streaming client for OpenAI-compatible chat endpoints, timing each request honestly.

- TTFT is measured to the first chunk that carries content (not the role-only first chunk,
  which vLLM sends before any token is computed); the first byte is kept separately.
- Token counts come from the server's `usage` (`stream_options.include_usage`), never from
  counting chunks: with speculative decoding one chunk can carry several tokens.
- Every non-2xx, every stream that ends without its usage chunk or finish_reason, every error
  event inside a stream, every abnormal finish_reason and every timeout (the whole request, not
  just one read) is an error, kept with its kind and body. A run with errors never reports 0.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import certifi
import httpx

ERROR_BODY_LIMIT = 2000
# Normal ways for a generation to end; anything else ("abort", "error", ...) is an error.
NORMAL_FINISH = frozenset({"stop", "length", "tool_calls", "function_call", "eos"})
ERROR_KINDS = ("http_<status>", "timeout", "incomplete_stream", "stream_error", "malformed", "connect",
               "finish_<reason>")


@dataclass
class RequestResult:
    """One request as the client saw it. Times are seconds on the monotonic clock."""

    workload: str
    ok: bool
    status: int | None
    start_s: float
    end_s: float
    ttft_s: float | None = None  # to the first content token
    chunk_gaps_s: list[float] = field(default_factory=list)  # inter-token latencies (between content chunks)
    output_tokens: int | None = None  # from usage
    prompt_tokens: int | None = None  # from usage
    cached_prompt_tokens: int | None = None
    finish_reason: str | None = None
    error_kind: str | None = None  # see ERROR_KINDS
    error_body: str | None = None
    text: str = ""
    server_timings: dict[str, Any] | None = None  # the server's own per-request `timings`, if it sends them
    first_byte_s: float | None = None  # first SSE event of any kind (role chunk included)
    content_chunks: int = 0
    max_tokens: int | None = None  # what was asked for; output_tokens below it with ignore_eos = cut
    item: str | None = None
    sized_prompt_tokens: int | None = None  # the prompt's size by the server's /tokenize, before sending
    ttft_kind: str | None = None  # cold | warm, where the workload set it per request
    engine_metrics: dict[str, float] = field(default_factory=dict)  # from server_timings, by the engine module

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (decode latency seen by this request)."""
        if self.ttft_s is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def decode_tok_s(self) -> float | None:
        """Output tokens per second after the first one: this stream's decode speed."""
        tpot = self.tpot_s
        return 1.0 / tpot if tpot else None

    @property
    def cut(self) -> bool:
        """The server returned fewer tokens than asked for (e.g. max_tokens cut to fit the context)."""
        return bool(self.ok and self.max_tokens and self.output_tokens is not None
                    and self.output_tokens < self.max_tokens and self.finish_reason == "length")

    def to_dict(self, keep_text: bool = False) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "text"}
        out["e2e_s"] = self.e2e_s
        out["tpot_s"] = self.tpot_s
        if keep_text:
            out["text"] = self.text
        return out


def _content_of(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    delta = choices[0].get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or delta.get("reasoning") or "")


async def stream_chat(
    client: httpx.AsyncClient,
    base_url: str,
    payload: dict[str, Any],
    workload: str,
    timeout_s: float,
    item: str | None = None,
) -> RequestResult:
    """Send one streaming chat request and time it. Never raises for server faults.

    `timeout_s` bounds the whole request (connect to last byte), not each read: a server that
    trickles one token a minute is a timeout, not a slow success."""
    body = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    start = time.monotonic()
    result = RequestResult(workload=workload, ok=False, status=None, start_s=start, end_s=start,
                           max_tokens=payload.get("max_tokens"), item=item)
    pieces: list[str] = []
    state = {"got_usage": False}
    try:
        async with asyncio.timeout(timeout_s):
            await _consume(client, base_url, body, result, pieces, state, start, timeout_s)
    except TimeoutError:
        result.error_kind = "timeout"
        result.error_body = (f"no complete answer within {timeout_s:.1f} s "
                             f"({len(pieces)} content chunks received)")
    except httpx.TimeoutException as exc:
        result.error_kind = "timeout"
        result.error_body = f"{type(exc).__name__} after {time.monotonic() - start:.1f} s"
    except httpx.HTTPError as exc:  # connection refused/reset, protocol errors, cut streams
        result.error_kind = "incomplete_stream" if result.status else "connect"
        result.error_body = f"{type(exc).__name__}: {exc}"[:ERROR_BODY_LIMIT]
    finally:
        result.end_s = time.monotonic()
        result.text = "".join(pieces)
    if result.error_kind:
        return result
    if not state["got_usage"] or result.finish_reason is None:
        result.error_kind = "incomplete_stream"
        missing = [what for what, present in (("a usage chunk", state["got_usage"]),
                                              ("a finish_reason", result.finish_reason is not None)) if not present]
        result.error_body = f"stream ended without {' and '.join(missing)}"
        return result
    if result.finish_reason not in NORMAL_FINISH:
        result.error_kind = f"finish_{result.finish_reason}"
        result.error_body = f"generation ended with finish_reason {result.finish_reason!r}"
        return result
    result.ok = True
    return result


async def _consume(client: httpx.AsyncClient, base_url: str, body: dict[str, Any], result: RequestResult,
                   pieces: list[str], state: dict[str, bool], start: float, timeout_s: float) -> None:
    last_content_t: float | None = None
    async with client.stream("POST", base_url + "/v1/chat/completions", json=body,
                             timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))) as resp:
        result.status = resp.status_code
        if resp.status_code >= 300:
            raw = await resp.aread()
            result.error_kind = f"http_{resp.status_code}"
            result.error_body = raw.decode(errors="replace")[:ERROR_BODY_LIMIT]
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                if line.strip().startswith("{"):  # a JSON error body sent with a 200 and no SSE framing
                    result.error_kind = "stream_error"
                    result.error_body = line[:ERROR_BODY_LIMIT]
                    return
                continue
            now = time.monotonic()
            if result.first_byte_s is None:
                result.first_byte_s = now - start
            data = line[5:].strip()
            if data == "[DONE]":
                break
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError:
                result.error_kind = "malformed"
                result.error_body = data[:ERROR_BODY_LIMIT]
                return
            if "error" in chunk:
                result.error_kind = "stream_error"
                result.error_body = json.dumps(chunk["error"])[:ERROR_BODY_LIMIT]
                return
            text = _content_of(chunk)
            if text:
                if result.ttft_s is None:
                    result.ttft_s = now - start
                elif last_content_t is not None:
                    result.chunk_gaps_s.append(now - last_content_t)
                last_content_t = now
                result.content_chunks += 1
                pieces.append(text)
            for choice in chunk.get("choices") or []:
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
            usage = chunk.get("usage")
            if usage:
                state["got_usage"] = True
                result.output_tokens = usage.get("completion_tokens")
                result.prompt_tokens = usage.get("prompt_tokens")
                details = usage.get("prompt_tokens_details") or {}
                result.cached_prompt_tokens = details.get("cached_tokens")
            if chunk.get("timings"):  # a server's own per-request timings; its engine module reads them
                result.server_timings = chunk["timings"]


async def chat_once(client: httpx.AsyncClient, base_url: str, payload: dict[str, Any],
                    timeout_s: float) -> dict[str, Any]:
    """Non-streaming chat completion (quality checks need logprobs and the whole answer)."""
    resp = await client.post(base_url + "/v1/chat/completions", json={**payload, "stream": False},
                             timeout=timeout_s)
    resp.raise_for_status()
    return resp.json()


async def served_model_id(client: httpx.AsyncClient, base_url: str, timeout_s: float = 10.0) -> str:
    # Also from a plain httpx client (not server_client): the key of a registered server is sent.
    resp = await client.get(base_url + "/v1/models", timeout=timeout_s, headers=auth_headers(base_url))
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


# ---- servers that demand a key ---------------------------------------------------------------------
# A server started with `--api-key` (or LLAMA_API_KEY / VLLM_API_KEY) refuses requests without it.
# The launchers register the key of each server they start (harness.secrets.api_key) and every
# client made by server_client() sends it to that server, and only to that server.
_API_KEYS: dict[str, str] = {}
_LOCAL = ("127.0.0.1", "localhost", "0.0.0.0", "::1", "")


def _origin(url: httpx.URL | str) -> str:
    u = httpx.URL(url)
    host = "127.0.0.1" if u.host in _LOCAL else u.host
    return f"{host}:{u.port or (443 if u.scheme == 'https' else 80)}"


def register_api_key(base_url: str, key: str) -> None:
    _API_KEYS[_origin(base_url)] = key


def forget_api_key(base_url: str) -> None:
    _API_KEYS.pop(_origin(base_url), None)


def auth_headers(base_url: str) -> dict[str, str]:
    key = _API_KEYS.get(_origin(base_url))
    return {"Authorization": f"Bearer {key}"} if key else {}


class ServerAuth(httpx.Auth):
    """Adds `Authorization: Bearer KEY` to requests for a server registered with a key."""

    def auth_flow(self, request: httpx.Request):  # type: ignore[no-untyped-def]
        key = _API_KEYS.get(_origin(request.url))
        if key and "authorization" not in request.headers:
            request.headers["Authorization"] = f"Bearer {key}"
        yield request


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for every client of the process: by default httpx builds one per client and
    loads the CA bundle into it, ~27 ms of CPU each time (15 clients in a 3-trial search)."""
    return ssl.create_default_context(cafile=certifi.where())


def server_client(**kwargs: Any) -> httpx.AsyncClient:
    """An httpx client for talking to the servers we started (sends their API keys)."""
    return httpx.AsyncClient(auth=ServerAuth(), verify=tls_context(), **kwargs)
