"""Quality spot-checks: exact-answer and structure checks at temperature 0, data-driven.

A config that is fast but answers worse must lose; garbage must never win.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import httpx
import jsonschema
import yaml
from pydantic import BaseModel, ConfigDict, Field

from harness.client import chat_once


class QualityModel(BaseModel):
    """The `quality:` section of a space file (validated there; unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    suite: str | None = "smoke"
    min_score: float = Field(default=1.0, ge=0, le=1)


@dataclass(frozen=True)
class Check:
    name: str
    kind: str  # contains | regex | json
    prompt: str
    max_tokens: int = 64
    expect: tuple[str, ...] = ()
    pattern: str | None = None
    schema: dict[str, Any] | None = None


@dataclass
class CheckResult:
    name: str
    passed: bool
    answer: str
    reason: str


@dataclass
class QualityResult:
    suite: str
    score: float  # fraction of checks passed
    passed: bool  # every check passed
    checks: list[CheckResult] = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"suite": self.suite, "score": self.score, "passed": self.passed, "error": self.error,
                "checks": [asdict(c) for c in self.checks]}


@cache
def suites() -> dict[str, tuple[Check, ...]]:
    data = yaml.safe_load(resources.files("harness").joinpath("data/quality.yaml").read_text())
    out = {}
    for suite, checks in data["suites"].items():
        out[suite] = tuple(Check(**{**c, "expect": tuple(c.get("expect", ()))}) for c in checks)
    return out


def _extract_json(text: str) -> Any:
    """The first JSON value in the answer, tolerating a fenced code block around it."""
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.S)
    candidate = fenced.group(1) if fenced else text
    start = min((i for i in (candidate.find("{"), candidate.find("[")) if i >= 0), default=-1)
    if start < 0:
        raise ValueError("no JSON object or array in the answer")
    value, _ = json.JSONDecoder().raw_decode(candidate[start:])
    return value


def judge(check: Check, answer: str) -> CheckResult:
    if check.kind == "contains":
        low = answer.lower()
        ok = any(e.lower() in low for e in check.expect)
        return CheckResult(check.name, ok, answer, "found" if ok else f"none of {list(check.expect)} in answer")
    if check.kind == "regex":
        ok = bool(check.pattern and re.search(check.pattern, answer))
        return CheckResult(check.name, ok, answer, "matched" if ok else f"no match for {check.pattern!r}")
    if check.kind == "json":
        try:
            value = _extract_json(answer)
            if check.schema:
                jsonschema.validate(value, check.schema)
        except (ValueError, jsonschema.ValidationError) as exc:
            return CheckResult(check.name, False, answer, f"{type(exc).__name__}: {str(exc)[:200]}")
        return CheckResult(check.name, True, answer, "valid JSON" + (" matching the schema" if check.schema else ""))
    raise ValueError(f"unknown check kind {check.kind!r}")


async def run_suite(base_url: str, model_id: str, suite: str = "smoke", timeout_s: float = 120.0) -> QualityResult:
    checks = suites()[suite]
    results: list[CheckResult] = []
    async with httpx.AsyncClient() as client:
        for check in checks:
            payload = {"model": model_id, "messages": [{"role": "user", "content": check.prompt}],
                       "max_tokens": check.max_tokens, "temperature": 0.0}
            try:
                body = await chat_once(client, base_url, payload, timeout_s)
                answer = body["choices"][0]["message"].get("content") or ""
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
                results.append(CheckResult(check.name, False, "", f"request failed: {type(exc).__name__}: {exc}"))
                continue
            results.append(judge(check, answer))
    passed = sum(r.passed for r in results)
    return QualityResult(suite, passed / len(results) if results else 0.0, passed == len(results), results)
