"""Async streaming client for OpenAI-compatible chat endpoints, timing each request honestly.

TTFT is measured to the first chunk that carries content (not the role-only first chunk);
token counts come from the server's `usage`, never from counting chunks; every non-2xx, every
stream that ends without its final usage chunk and every timeout is an error kept with its body.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

ERROR_BODY_LIMIT = 2000


@dataclass
class RequestResult:
    """One request as the client saw it. Times are seconds on the monotonic clock."""

    workload: str
    ok: bool
    status: int | None
    start_s: float
    end_s: float
    ttft_s: float | None = None
    chunk_gaps_s: list[float] = field(default_factory=list)
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    finish_reason: str | None = None
    error_kind: str | None = None  # http_<status> | timeout | incomplete_stream | connect | malformed
    error_body: str | None = None
    text: str = ""
    server_timings: dict[str, Any] | None = None  # llama.cpp's per-request `timings`

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (decode latency seen by this request)."""
        if self.ttft_s is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def to_dict(self, keep_text: bool = False) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "text"}
        out["e2e_s"] = self.e2e_s
        if keep_text:
            out["text"] = self.text
        return out


def _content_of(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    delta = choices[0].get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


async def stream_chat(
    client: httpx.AsyncClient,
    base_url: str,
    payload: dict[str, Any],
    workload: str,
    timeout_s: float,
) -> RequestResult:
    """Send one streaming chat request and time it. Never raises for server faults."""
    body = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    start = time.monotonic()
    result = RequestResult(workload=workload, ok=False, status=None, start_s=start, end_s=start)
    pieces: list[str] = []
    last_content_t: float | None = None
    got_usage = False
    try:
        async with client.stream("POST", base_url + "/v1/chat/completions", json=body,
                                 timeout=httpx.Timeout(timeout_s, connect=10.0)) as resp:
            result.status = resp.status_code
            if resp.status_code >= 300:
                raw = await resp.aread()
                result.error_kind = f"http_{resp.status_code}"
                result.error_body = raw.decode(errors="replace")[:ERROR_BODY_LIMIT]
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    result.error_kind = "malformed"
                    result.error_body = data[:ERROR_BODY_LIMIT]
                    return result
                if "error" in chunk:
                    result.error_kind = "stream_error"
                    result.error_body = json.dumps(chunk["error"])[:ERROR_BODY_LIMIT]
                    return result
                now = time.monotonic()
                text = _content_of(chunk)
                if text:
                    if result.ttft_s is None:
                        result.ttft_s = now - start
                    elif last_content_t is not None:
                        result.chunk_gaps_s.append(now - last_content_t)
                    last_content_t = now
                    pieces.append(text)
                for choice in chunk.get("choices") or []:
                    if choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
                usage = chunk.get("usage")
                if usage:
                    got_usage = True
                    result.output_tokens = usage.get("completion_tokens")
                    result.prompt_tokens = usage.get("prompt_tokens")
                    details = usage.get("prompt_tokens_details") or {}
                    result.cached_prompt_tokens = details.get("cached_tokens")
                if chunk.get("timings"):
                    result.server_timings = chunk["timings"]
    except httpx.TimeoutException as exc:
        result.error_kind = "timeout"
        result.error_body = f"{type(exc).__name__} after {time.monotonic() - start:.1f} s"
        return result
    except httpx.HTTPError as exc:  # connection refused/reset, protocol errors, cut streams
        result.error_kind = "incomplete_stream" if result.status else "connect"
        result.error_body = f"{type(exc).__name__}: {exc}"[:ERROR_BODY_LIMIT]
        return result
    finally:
        result.end_s = time.monotonic()
        result.text = "".join(pieces)
    if not got_usage or result.finish_reason is None:
        result.error_kind = "incomplete_stream"
        result.error_body = ("stream ended without " +
                             ("a usage chunk" if not got_usage else "a finish_reason"))
        return result
    result.ok = True
    return result


async def chat_once(client: httpx.AsyncClient, base_url: str, payload: dict[str, Any],
                    timeout_s: float) -> dict[str, Any]:
    """Non-streaming chat completion (quality checks need logprobs and the whole answer)."""
    resp = await client.post(base_url + "/v1/chat/completions", json={**payload, "stream": False},
                             timeout=timeout_s)
    resp.raise_for_status()
    return resp.json()


async def served_model_id(client: httpx.AsyncClient, base_url: str) -> str:
    resp = await client.get(base_url + "/v1/models", timeout=10.0)
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]
