"""Greedy completions with per-token logprobs, in the shapes servers return them, and teacher
forcing by resuming generation: the requests reference agreement (harness/quality/reference.py) is made
of. Engines that read teacher-forced logprobs another way override `Engine.forced_positions`
(vLLM: one request with `prompt_logprobs`, harness/engines/vllm.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

RESUME_CHUNK = 8  # tokens generated per resume request on servers without prompt_logprobs


@dataclass
class Position:
    """One position of a continuation: the token, its logprob, and the top-k alternatives."""

    token: int
    logprob: float | None
    top: dict[int, float]  # token id -> logprob, at most top_k entries


def token_id(value: Any) -> int:
    """vLLM with return_tokens_as_token_ids spells tokens 'token_id:123'."""
    if isinstance(value, int):
        return value
    text = str(value)
    return int(text.split(":", 1)[1]) if text.startswith("token_id:") else int(text)


def top(alts: dict[int, float], k: int) -> dict[int, float]:
    return dict(sorted(alts.items(), key=lambda kv: kv[1], reverse=True)[:k])


def parse_positions(choice: dict[str, Any], top_k: int) -> list[Position]:
    """Per-token logprobs of a completion choice, in either shape servers use.

    vLLM (OpenAI completions): logprobs = {tokens, token_logprobs, top_logprobs: [{tok: lp}]};
    llama.cpp: logprobs = {content: [{id, token, logprob, top_logprobs: [{id, token, logprob}]}]}.
    """
    lp = choice.get("logprobs") or {}
    out: list[Position] = []
    if lp.get("content") is not None:
        for entry in lp["content"]:
            alts = {int(t["id"]): float(t["logprob"]) for t in entry.get("top_logprobs") or []}
            out.append(Position(int(entry["id"]), float(entry["logprob"]), top(alts, top_k)))
        return out
    for tok, tok_lp, tops in zip(lp.get("tokens") or [], lp.get("token_logprobs") or [],
                                 lp.get("top_logprobs") or [], strict=False):
        alts = {token_id(k): float(v) for k, v in (tops or {}).items()}
        out.append(Position(token_id(tok), None if tok_lp is None else float(tok_lp), top(alts, top_k)))
    return out


async def complete(client: httpx.AsyncClient, base_url: str, model_id: str, prompt_ids: list[int],
                   max_tokens: int, top_k: int, timeout_s: float, **extra: Any) -> dict[str, Any]:
    """One greedy completion of token ids with top-k logprobs (both spellings: `logprobs` for
    OpenAI-compatible servers, `n_probs` for llama.cpp); its first choice."""
    body = {"model": model_id, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0.0,
            "logprobs": top_k, "n_probs": top_k, "ignore_eos": True, "return_tokens_as_token_ids": True,
            "cache_prompt": True, **extra}
    resp = await client.post(base_url + "/v1/completions", json=body, timeout=timeout_s)
    if resp.status_code >= 300:
        raise RuntimeError(f"completions answered HTTP {resp.status_code}: {resp.text[:300]}")
    choice: dict[str, Any] = resp.json()["choices"][0]
    return choice


async def generate(client: httpx.AsyncClient, base_url: str, model_id: str, prompt_ids: list[int],
                   n: int, top_k: int, timeout_s: float) -> tuple[list[Position], str]:
    choice = await complete(client, base_url, model_id, prompt_ids, n, top_k, timeout_s)
    positions = parse_positions(choice, top_k)
    if len(positions) < n:
        raise RuntimeError(f"asked for {n} tokens with logprobs, got {len(positions)} "
                           f"(does this server return logprobs on /v1/completions?)")
    return positions[:n], str(choice.get("text") or "")


async def forced_by_resuming(client: httpx.AsyncClient, base_url: str, model_id: str, prompt_ids: list[int],
                             token_ids: list[int], start: int, top_k: int,
                             timeout_s: float) -> tuple[dict[int, Position], int]:
    """Teacher forcing by resuming generation from the forced prefix: every generated position whose
    predecessors match the reference is a valid forced distribution. (positions, requests made)"""
    out: dict[int, Position] = {}
    requests = 0
    pos = start
    n = len(token_ids)
    chunk = RESUME_CHUNK
    while pos < n:
        gen, _ = await generate(client, base_url, model_id, prompt_ids + token_ids[:pos], min(chunk, n - pos),
                                top_k, timeout_s)
        requests += 1
        used = len(gen)
        for j, p in enumerate(gen):
            out[pos + j] = p
            if p.token != token_ids[pos + j]:
                used = j + 1
                break
        pos += used
        # A config that diverges at once wastes the rest of each chunk: shrink it; grow it back on matches.
        chunk = min(RESUME_CHUNK, max(1, 2 * used))
    return out, requests
