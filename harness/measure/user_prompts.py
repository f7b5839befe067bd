"""The user's own prompts as a workload source: a JSONL file, ShareGPT-style conversations, or a
folder of documents for RAG; optionally replayed at the file's own timestamps.

Formats (`format:` in a space's `workloads[].source`):
- `jsonl`: one JSON object per line, with `prompt` (a string) or `messages` (OpenAI chat
  messages); optional `max_tokens` and `timestamp` (seconds, any origin: only differences count).
- `sharegpt`: a JSON list (or JSONL) of `{"conversations": [{"from": "human"|"gpt"|"system",
  "value": ...}, ...]}`; each conversation is sent up to and including its last human turn.
- `documents`: a folder of .txt/.md files; each request's "retrieved part" is document text in a
  seeded order (different for every request), sized EXACTLY to the item's context by the server's
  tokenizer, followed by one of `questions`.
Every request gets a nonce line first (as the shipped workloads do), so that repeats stay cold
unless the workload says `warm: true`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from harness.files import MAX_JSON_BYTES, parse_json, read_bytes, read_text

Messages = list[dict[str, str]]
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
          "chatgpt": "assistant", "bing": "assistant", "bard": "assistant"}


@dataclass(frozen=True)
class UserPrompt:
    messages: tuple[tuple[str, str], ...]  # (role, content), hashable
    max_tokens: int | None = None
    timestamp: float | None = None

    def as_messages(self) -> Messages:
        return [{"role": r, "content": c} for r, c in self.messages]


@dataclass(frozen=True)
class PromptSource:
    """Where a workload's prompts come from (validated in search/space/schema.py)."""

    path: str
    format: Literal["jsonl", "sharegpt", "documents"] = "jsonl"
    replay: bool = False  # send at the file's timestamps (open loop) instead of closed-loop streams
    time_scale: float = 1.0  # replay: 2.0 sends twice as fast
    limit: int | None = None  # use the first N prompts
    context_tokens: int = 4096  # documents: size of the retrieved part + question, exact
    questions: tuple[str, ...] = ("Using only the documents above, what are their three main topics?",)
    max_tokens: int = 256  # for prompts that do not say


def _load_json_lines(path: Path) -> list[Any]:
    text = read_text(path, MAX_JSON_BYTES)  # bounded; not UTF-8 names the byte and line
    stripped = text.lstrip()
    if stripped.startswith("["):
        data = parse_json(text, str(path))
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list")
        return data
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            out.append(parse_json(line, f"{path}:{n}"))
    return out


def _jsonl(path: Path) -> list[UserPrompt]:
    out = []
    for n, row in enumerate(_load_json_lines(path), 1):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {n}: expected an object")
        if isinstance(row.get("messages"), list):
            msgs = tuple((str(m["role"]), str(m["content"])) for m in row["messages"])
        elif isinstance(row.get("prompt"), str):
            msgs = (("user", row["prompt"]),)
        else:
            raise ValueError(f"{path}: line {n}: needs `prompt` (string) or `messages` (list)")
        if not msgs:
            raise ValueError(f"{path}: line {n}: no messages")
        ts = row.get("timestamp")
        mt = row.get("max_tokens")
        out.append(UserPrompt(msgs, int(mt) if mt else None, float(ts) if ts is not None else None))
    return out


def _sharegpt(path: Path) -> list[UserPrompt]:
    out = []
    for n, row in enumerate(_load_json_lines(path), 1):
        turns = row.get("conversations") if isinstance(row, dict) else None
        if not isinstance(turns, list):
            raise ValueError(f"{path}: conversation {n}: needs a `conversations` list")
        msgs = [(_ROLES.get(str(t.get("from", "")).lower(), "user"), str(t.get("value", ""))) for t in turns]
        last_user = max((i for i, (role, _) in enumerate(msgs) if role == "user"), default=-1)
        if last_user < 0:
            continue  # nothing to ask
        ts = row.get("timestamp")
        out.append(UserPrompt(tuple(msgs[:last_user + 1]), None, float(ts) if ts is not None else None))
    return out


@cache
def _documents(folder: str) -> tuple[str, ...]:
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"{folder}: not a folder of documents")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in (".txt", ".md") and p.is_file())
    docs = tuple(t for p in files if (t := read_bytes(p, MAX_JSON_BYTES).decode("utf-8", errors="replace").strip()))
    if not docs:
        raise ValueError(f"{folder}: no non-empty .txt or .md files")
    return docs


def document_filler(folder: str) -> Any:
    """A filler over the folder's documents: the first n words of the documents in the seed's order
    (the n+1-word text extends the n-word one, so token counts grow with n, as sizing needs)."""
    docs = _documents(folder)

    def filler(n_words: int, seed: int) -> str:
        order = list(range(len(docs)))
        random.Random(seed).shuffle(order)
        words: list[str] = []
        while len(words) < n_words:  # a short folder repeats in a new order
            for i in order:
                words.extend(docs[i].split())
            random.Random(seed + len(words)).shuffle(order)
        return " ".join(words[:n_words])

    return filler


def load_prompts(source: PromptSource) -> list[UserPrompt]:
    """The prompts of a jsonl or sharegpt source, in file order (replay: timestamp order)."""
    path = Path(source.path)
    if not path.is_file():
        raise ValueError(f"{path}: no such prompt file")
    prompts = _jsonl(path) if source.format == "jsonl" else _sharegpt(path)
    if source.limit:
        prompts = prompts[:source.limit]
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    if source.replay:
        if any(p.timestamp is None for p in prompts):
            raise ValueError(f"{path}: replay needs a `timestamp` on every prompt")
        prompts.sort(key=lambda p: p.timestamp or 0.0)
    return prompts


def validate(source: PromptSource) -> None:
    """Raise ValueError naming the file if the source cannot be read (space-load time)."""
    if source.format == "documents":
        _documents(source.path)
    else:
        load_prompts(source)


def replay_offsets(prompts: list[UserPrompt], time_scale: float) -> list[float]:
    t0 = prompts[0].timestamp or 0.0
    return [((p.timestamp or 0.0) - t0) / time_scale for p in prompts]


def with_nonce(messages: Messages, nonce: str) -> Messages:
    """The nonce goes first (before any shared system prompt), as in the shipped workloads."""
    first = messages[0]
    return [{**first, "content": f"{nonce}\n{first['content']}"}, *messages[1:]]
