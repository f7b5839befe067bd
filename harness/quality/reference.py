"""Reference agreement: how far a config's greedy output and next-token distributions drift from a
reference config of the same model.

The reference config (by default the engine's plain defaults) generates a fixed continuation of a
few text prompts once per study, with the top-k logprobs at every position; the answers are
cached in a JSON file keyed by model + reference config + prompts. Each candidate config then
  * regenerates greedily from the same prompt token ids: exact agreement and matched-prefix length;
  * scores the *reference* continuation position by position (teacher forcing), so both sides see
    the same context: mean |logprob difference| of the reference token and a top-k KL divergence.
Positions before the first divergence come free from the greedy run (same context). After it,
the engine module scores the rest its own way (`Engine.forced_positions`): vLLM in one request
with `prompt_logprobs`; other servers (llama.cpp `n_probs`, any OpenAI-compatible one) resume
generation from the forced prefix, one request per divergence (harness/quality/logprobs.py).

Top-k KL: both distributions are coarsened to the reference's top-k tokens plus one "other" bucket.
Coarsening never increases KL, so where the candidate's probabilities are known this is a lower
bound of the true KL; a reference token missing from the candidate's top-k is given the
candidate's k-th probability (an upper bound of its true probability), counted in `floored`.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from harness.engines import get_engine
from harness.files import InputError, load_json, parse_yaml
from harness.measure.client import server_client
from harness.quality.logprobs import Position, generate, parse_positions

__all__ = ["AgreementResult", "Position", "ReferenceAnswers", "ReferenceContinuation", "ReferenceSpec",
           "ReferenceStore", "capture_reference", "compare", "parse_positions", "prompt_sets", "reference_config",
           "reference_key", "topk_kl"]

EPS = 1e-10


class ReferenceSpec(BaseModel):
    """`quality.reference` in a space file: which config is the reference and what to compare."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    params: dict[str, str | int | float | bool | None] = {}  # over the space defaults; {} = plain defaults
    prompts: str = "default"  # a prompt set under `agreement:` in harness/data/quality.yaml
    tokens: int = Field(default=32, ge=1, le=512)  # length of the reference continuation
    top_k: int = Field(default=5, ge=1, le=20)  # logprobs kept per position
    # Filled from the quality section when the suite is judged relatively (max_lost,
    # min_answer_match): the reference config answers the same suite the same way, once.
    suite: str | None = None
    thinking: bool | None = None
    context_scale: float = Field(default=1.0, gt=0, le=1)
    check_timeout_s: float = Field(default=10.0, gt=0, le=120)


@dataclass(frozen=True)
class AgreementPrompt:
    name: str
    text: str


@cache
def prompt_sets() -> dict[str, tuple[AgreementPrompt, ...]]:
    data = parse_yaml(resources.files("harness").joinpath("data/quality.yaml").read_text(), "harness/data/quality.yaml")
    return {name: tuple(AgreementPrompt(**p) for p in items) for name, items in (data.get("agreement") or {}).items()}


@dataclass
class ReferenceContinuation:
    name: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    positions: list[Position]


@dataclass
class ReferenceAnswers:
    """The reference config's greedy continuations with their logprobs (the cached file)."""

    key: str
    model: str
    config: dict[str, Any]
    dialect: str
    tokens: int
    top_k: int
    items: list[ReferenceContinuation]
    created_s: float = field(default_factory=time.time)
    capture_s: float = 0.0
    checks: list[dict[str, Any]] = field(default_factory=list)  # the suite on the reference: name, passed, answer

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for item in out["items"]:  # JSON object keys must be strings
            for pos in item["positions"]:
                pos["top"] = {str(k): v for k, v in pos["top"].items()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReferenceAnswers:
        items = [ReferenceContinuation(
            name=i["name"], prompt_ids=list(i["prompt_ids"]), token_ids=list(i["token_ids"]), text=i["text"],
            positions=[Position(p["token"], p["logprob"], {int(k): v for k, v in p["top"].items()})
                       for p in i["positions"]]) for i in data["items"]]
        return cls(key=data["key"], model=data["model"], config=dict(data["config"]), dialect=data["dialect"],
                   tokens=data["tokens"], top_k=data["top_k"], items=items, created_s=data.get("created_s", 0.0),
                   capture_s=data.get("capture_s", 0.0), checks=list(data.get("checks") or []))


def reference_config(defaults: Mapping[str, Any], spec: ReferenceSpec) -> dict[str, Any]:
    """The reference config: the space's default config with the reference's overrides."""
    return {**defaults, **spec.params}


def reference_key(model: str, config: Mapping[str, Any], spec: ReferenceSpec) -> str:
    """Stable key of a reference: model, reference config, prompt texts, length and top-k."""
    prompts = [asdict(p) for p in prompt_sets()[spec.prompts]]
    key: dict[str, Any] = {"model": model, "config": dict(config), "prompts": prompts, "tokens": spec.tokens,
                           "top_k": spec.top_k}
    if spec.suite:  # the checks' content too: an edited check file needs new reference answers
        from harness.quality.checks import checks_for

        key["suite"] = [spec.suite, spec.thinking, spec.context_scale, [asdict(c) for c in checks_for(spec.suite)]]
    blob = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class ReferenceStore:
    """Reference answers as JSON files, one per key, in a folder (e.g. the study's results dir)."""

    def __init__(self, folder: Path):
        self.folder = folder

    def path(self, key: str) -> Path:
        return self.folder / f"reference-{key}.json"

    def load(self, key: str) -> ReferenceAnswers | None:
        path = self.path(key)
        if not path.exists():
            return None
        data = load_json(path)
        try:
            return ReferenceAnswers.from_dict(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # damaged or hand-edited: one line
            what = f"missing key {exc}" if isinstance(exc, KeyError) else " ".join(str(exc).split())[:200]
            raise InputError(str(path), f"not a stored set of reference answers ({what}); delete it to capture "
                                        "them again") from None

    def save(self, ref: ReferenceAnswers) -> Path:
        path = self.path(ref.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(ref.to_dict()))
        tmp.replace(path)
        return path


# ---- talking to servers ------------------------------------------------------------------------

async def tokenize(client: httpx.AsyncClient, base_url: str, model_id: str, dialect: str, text: str,
                   timeout_s: float) -> list[int]:
    """Token ids of a prompt as the server's tokenizer (with its special tokens) sees it."""
    last: Exception | None = None
    for body in get_engine(dialect).tokenize_bodies(model_id, text):
        try:
            resp = await client.post(base_url + "/tokenize", json=body, timeout=timeout_s)
            resp.raise_for_status()
            tokens = resp.json()["tokens"]
            return [int(t["id"]) if isinstance(t, dict) else int(t) for t in tokens]
        except (httpx.HTTPError, KeyError, ValueError, TypeError) as exc:
            last = exc
    raise RuntimeError(f"cannot tokenize on {base_url}: {type(last).__name__}: {last}")


async def capture_reference(base_url: str, model_id: str, dialect: str, spec: ReferenceSpec, model: str,
                            config: Mapping[str, Any], timeout_s: float = 120.0) -> ReferenceAnswers:
    """Run the reference prompts on a server running the reference config."""
    start = time.monotonic()
    items = []
    async with server_client() as client:
        for prompt in prompt_sets()[spec.prompts]:
            ids = await tokenize(client, base_url, model_id, dialect, prompt.text, timeout_s)
            positions, text = await generate(client, base_url, model_id, ids, spec.tokens, spec.top_k, timeout_s)
            items.append(ReferenceContinuation(prompt.name, ids, [p.token for p in positions], text, positions))
    checks: list[dict[str, Any]] = []
    if spec.suite:
        from harness.quality.checks import ask_context, checks_for, run_checks

        results = await run_checks(base_url, model_id, checks_for(spec.suite), timeout_s, spec.check_timeout_s,
                                   1, ask_context(dialect, spec.thinking, spec.context_scale))
        checks = [{"name": r.name, "passed": r.passed, "answer": r.answer, "reason": r.reason,
                   "degenerate": r.degenerate, "truncated": r.truncated} for r in results]
    return ReferenceAnswers(key=reference_key(model, config, spec), model=model, config=dict(config),
                            dialect=dialect, tokens=spec.tokens, top_k=spec.top_k, items=items,
                            capture_s=time.monotonic() - start, checks=checks)


# ---- comparing ---------------------------------------------------------------------------------

def topk_kl(ref: dict[int, float], cand: dict[int, float]) -> tuple[float, int]:
    """KL(ref || cand) over the reference's top-k tokens plus an 'other' bucket; and how many
    reference tokens were missing from the candidate's top-k (given its k-th probability)."""
    if not cand:
        return float("inf"), len(ref)
    floor = math.exp(min(cand.values()))
    cand_rest = max(EPS, 1.0 - sum(math.exp(v) for v in cand.values()))
    p = {t: math.exp(v) for t, v in ref.items()}
    missing = [t for t in p if t not in cand]
    q = {t: (math.exp(cand[t]) if t in cand else min(floor, cand_rest)) for t in p}
    p_rest = max(0.0, 1.0 - sum(p.values()))
    q_rest = max(EPS, 1.0 - sum(q.values()))
    kl = sum(pi * math.log(max(pi, EPS) / max(q[t], EPS)) for t, pi in p.items() if pi > 0)
    if p_rest > EPS:
        kl += p_rest * math.log(p_rest / q_rest)
    return max(0.0, kl), len(missing)


@dataclass
class PromptAgreement:
    name: str
    exact: bool
    prefix_tokens: int
    tokens: int
    mean_kl: float
    mean_abs_logprob_diff: float
    floored: int  # positions where the reference token was not in the candidate's top-k
    text: str  # the candidate's greedy continuation


@dataclass
class AgreementResult:
    reference_key: str
    prompts: list[PromptAgreement]
    exact: float  # fraction of prompts with an identical greedy continuation
    prefix: float  # mean matched-prefix length as a fraction of the continuation
    mean_kl: float
    max_kl: float  # the worst prompt's mean KL
    mean_abs_logprob_diff: float
    positions: int
    floored: int
    requests: int
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ref_token_logprob(p: Position, ref_token: int) -> tuple[float, bool]:
    """The candidate's logprob of the reference token, or its k-th logprob (an upper bound) if absent."""
    if p.token == ref_token and p.logprob is not None:
        return p.logprob, False
    if ref_token in p.top:
        return p.top[ref_token], False
    return (min(p.top.values()) if p.top else math.log(EPS)), True


async def compare(base_url: str, model_id: str, dialect: str, reference: ReferenceAnswers,
                  timeout_s: float = 120.0) -> AgreementResult:
    """Greedy agreement and teacher-forced logprob agreement of a running config vs the reference."""
    start = time.monotonic()
    prompts = []
    requests = 0
    engine = get_engine(dialect)
    async with server_client() as client:
        for item in reference.items:
            gen, text = await generate(client, base_url, model_id, item.prompt_ids, reference.tokens,
                                       reference.top_k, timeout_s)
            requests += 1
            cand_ids = [p.token for p in gen]
            prefix = next((i for i, (a, b) in enumerate(zip(cand_ids, item.token_ids, strict=True)) if a != b),
                          len(item.token_ids))
            forced: dict[int, Position] = {i: gen[i] for i in range(min(prefix + 1, len(gen)))}
            if prefix + 1 < len(item.token_ids):
                more, n_req = await engine.forced_positions(client, base_url, model_id, item.prompt_ids,
                                                            item.token_ids, prefix + 1, reference.top_k, timeout_s)
                forced.update(more)
                requests += n_req
            kls, diffs, floored = [], [], 0
            for i, ref_pos in enumerate(item.positions):
                cand = forced[i]
                kl, _ = topk_kl(ref_pos.top, cand.top)
                kls.append(kl)
                ref_lp = ref_pos.logprob if ref_pos.logprob is not None else ref_pos.top.get(ref_pos.token, 0.0)
                cand_lp, was_floored = _ref_token_logprob(cand, ref_pos.token)
                floored += was_floored
                diffs.append(abs(ref_lp - cand_lp))
            prompts.append(PromptAgreement(item.name, prefix == len(item.token_ids), prefix, len(item.token_ids),
                                           _mean(kls), _mean(diffs), floored, text))
    n_pos = sum(p.tokens for p in prompts)
    return AgreementResult(
        reference_key=reference.key, prompts=prompts,
        exact=_mean([float(p.exact) for p in prompts]),
        prefix=_mean([p.prefix_tokens / p.tokens for p in prompts]),
        mean_kl=_weighted([(p.mean_kl, p.tokens) for p in prompts]),
        max_kl=max((p.mean_kl for p in prompts), default=0.0),
        mean_abs_logprob_diff=_weighted([(p.mean_abs_logprob_diff, p.tokens) for p in prompts]),
        positions=n_pos, floored=sum(p.floored for p in prompts), requests=requests,
        elapsed_s=time.monotonic() - start)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _weighted(pairs: list[tuple[float, int]]) -> float:
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else 0.0
