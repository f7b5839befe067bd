"""Quality spot-checks: exact answers, JSON, code and degeneration at temperature 0, data-driven;
plus agreement with a reference config (harness/quality/reference.py).

A config that is fast but answers worse must lose; garbage must never win. The checks live in
harness/data/quality.yaml. `assess` runs a space's `quality:` section against a running server;
`constraint_values` turns the result into Optuna constraints (<= 0 is feasible).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.quality.checks import (  # re-exported: the checks' public names live here too
    CATEGORY,
    KINDS,
    TRUNCATED_FATAL,
    AskContext,
    Check,
    CheckResult,
    ask_context,
    checks_for,
    degeneration,
    judge,
    judge_async,
    run_checks,
    suites,
)
from harness.quality.reference import AgreementResult, ReferenceAnswers, ReferenceSpec, compare
from harness.quality.sandbox import run_code_test

__all__ = ["CATEGORY", "KINDS", "Check", "CheckResult", "QualityModel", "QualityResult", "ask_context", "assess",
           "checks_for", "constraint_names", "constraint_values", "degeneration", "judge", "judge_async",
           "quality_metrics", "run_checks", "run_code_test", "run_suite", "suites"]


RELATIVE = ("max_lost", "min_answer_match")  # requirements judged against the reference's own answers
AGREEMENT = ("min_agreement", "min_prefix", "max_kl", "max_logprob_diff")


class QualityModel(BaseModel):
    """The `quality:` section of a space file (validated there; unknown keys are errors).

    Requirements left at None are measured and reported but do not constrain the search."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # A shipped suite (harness/data/quality*.yaml: smoke, hard, big) or a .yaml file of your own checks.
    suite: str | None = "smoke"
    min_score: float | None = Field(default=1.0, ge=0, le=1)  # fraction of all checks passed (absolute)
    min_exact: float | None = Field(default=None, ge=0, le=1)  # fraction of exact-answer checks
    json_valid: float | None = Field(default=None, ge=0, le=1)  # fraction of JSON checks valid
    code_pass: float | None = Field(default=None, ge=0, le=1)  # fraction of code checks passing
    # Relative to the reference config's own suite answers (a small model fails most hard checks;
    # what matters is what THIS config loses against the reference of the same checkpoint family):
    max_lost: int | None = Field(default=None, ge=0)  # checks the reference passed that this config fails
    min_answer_match: float | None = Field(default=None, ge=0, le=1)  # answers identical to the reference's
    min_agreement: float | None = Field(default=None, ge=0, le=1)  # prompts with identical greedy output
    min_prefix: float | None = Field(default=None, ge=0, le=1)  # mean matched-prefix fraction
    max_kl: float | None = Field(default=None, ge=0)  # mean top-k KL vs the reference, nats/token
    max_logprob_diff: float | None = Field(default=None, ge=0)  # mean |logprob diff| of reference tokens
    reference: ReferenceSpec | None = None  # set (or implied by an agreement requirement): compare
    check_timeout_s: float = Field(default=10.0, gt=0, le=120)  # wall limit of one code check
    # Checks in flight at once. 1 keeps each answer independent of batch composition; on a GPU,
    # where a batch of 13 short answers costs about as much as one, 4-16 cuts the suite's share.
    concurrency: int = Field(default=1, ge=1, le=64)
    thinking: bool | None = None  # None: the chat template's default; else mapped per engine
    context_scale: float = Field(default=1.0, gt=0, le=1)  # needle contexts (small models: 0.1)

    @model_validator(mode="before")
    @classmethod
    def _reference_implied(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("reference") is None and any(data.get(k) is not None for k in (*AGREEMENT, *RELATIVE)):
            data = {**data, "reference": {}}
        if isinstance(data.get("reference"), ReferenceSpec):
            data = {**data, "reference": data["reference"].model_dump()}
        if isinstance(data.get("reference"), dict) and data.get("suite", "smoke"):
            # The reference answers the same suite, the same way, whenever the suite is judged relatively.
            relative = any(data.get(k) is not None for k in RELATIVE)
            data = {**data, "reference": {**data["reference"], **({
                "suite": data.get("suite", "smoke"), "thinking": data.get("thinking"),
                "context_scale": data.get("context_scale", 1.0),
                "check_timeout_s": data.get("check_timeout_s", 10.0)} if relative else {})}}
        return data

    @model_validator(mode="after")
    def _known_suite(self) -> QualityModel:
        if self.suite is not None:
            checks_for(self.suite)  # raises ValueError naming the suite or the file
        if self.suite is None and any(getattr(self, k) is not None for k in RELATIVE):
            raise ValueError(f"{' / '.join(RELATIVE)} need a suite")
        if self.reference is not None:
            from harness.quality.reference import prompt_sets

            if self.reference.prompts not in prompt_sets():
                raise ValueError(f"reference.prompts {self.reference.prompts!r} is not one of {sorted(prompt_sets())}")
        return self

    def ask_context(self, dialect: str | None) -> AskContext:
        return ask_context(dialect, self.thinking, self.context_scale)


@dataclass
class Relative:
    """This config's suite answers against the reference config's."""

    lost: list[str]  # checks the reference passed and this config fails
    gained: list[str]  # the other way round
    answer_match: float  # fraction of checks whose answer text is identical
    reference_score: float
    compared: int
    excused: list[str] = field(default_factory=list)  # degenerate or cut on the reference too

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def relative_to(results: list[CheckResult], reference: ReferenceAnswers) -> Relative | None:
    ref = {c["name"]: c for c in reference.checks}
    common = [r for r in results if r.name in ref]
    if not common:
        return None
    lost = [r.name for r in common if ref[r.name]["passed"] and not r.passed]
    gained = [r.name for r in common if r.passed and not ref[r.name]["passed"]]
    match = sum(r.answer.strip() == str(ref[r.name]["answer"]).strip() for r in common) / len(common)
    score = sum(bool(ref[r.name]["passed"]) for r in common) / len(common)
    excused = [r.name for r in common if ref[r.name].get("degenerate") or ref[r.name].get("truncated")]
    return Relative(lost, gained, match, score, len(common), excused)


@dataclass
class QualityResult:
    suite: str
    score: float  # fraction of checks passed
    passed: bool  # every requirement met and nothing degenerate
    checks: list[CheckResult] = field(default_factory=list)
    error: str | None = None
    categories: dict[str, float] = field(default_factory=dict)  # category -> fraction passed
    agreement: AgreementResult | None = None
    relative: Relative | None = None
    violations: list[str] = field(default_factory=list)  # requirement -> why it failed
    elapsed_s: float = 0.0

    @property
    def fatal(self) -> str | None:
        """Degenerate output (or no answers at all): the trial fails outright."""
        # Judged relatively, an answer the reference config itself degenerated on (or ran to
        # max_tokens on) is the model's habit, not this config's fault: excused.
        excused = set(self.relative.excused) if self.relative else set()
        bad = [f"{c.name}: {c.degenerate}" for c in self.checks if c.degenerate and c.name not in excused]
        if bad:
            return "degenerate output: " + "; ".join(bad[:3])
        judged = [c for c in self.checks if c.name not in excused]
        cut = sum(c.truncated for c in judged)
        if judged and cut / len(judged) >= TRUNCATED_FATAL:
            return f"degenerate output: {cut} of {len(judged)} answers hit max_tokens (the model does not stop)"
        if self.error:
            return self.error
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"suite": self.suite, "score": self.score, "passed": self.passed, "error": self.error,
                "fatal": self.fatal, "categories": self.categories, "violations": self.violations,
                "elapsed_s": self.elapsed_s, "checks": [asdict(c) for c in self.checks],
                "agreement": self.agreement.to_dict() if self.agreement else None,
                "relative": self.relative.to_dict() if self.relative else None}


def _summarise(suite: str, results: list[CheckResult]) -> QualityResult:
    passed = sum(r.passed for r in results)
    cats: dict[str, list[bool]] = {}
    for r in results:
        cats.setdefault(r.category, []).append(r.passed)
    failed_requests = [r for r in results if r.reason.startswith("request failed")]
    error = (f"every quality request failed: {failed_requests[0].reason}"
             if results and len(failed_requests) == len(results) else None)
    return QualityResult(suite, passed / len(results) if results else 0.0, passed == len(results) and bool(results),
                         results, error, {k: sum(v) / len(v) for k, v in cats.items()})


async def run_suite(base_url: str, model_id: str, suite: str = "smoke", timeout_s: float = 120.0) -> QualityResult:
    """The spot-checks of one suite (no reference agreement); passed = every check passed."""
    results = await run_checks(base_url, model_id, checks_for(suite), timeout_s)
    return _summarise(suite, results)


async def assess(base_url: str, model_id: str, dialect: str, quality: QualityModel,
                 reference: ReferenceAnswers | None = None, timeout_s: float = 120.0) -> QualityResult:
    """Everything the space's `quality:` section asks of a running config, with requirements judged.

    `reference` comes from reference.capture_reference on the reference config (cached with
    reference.ReferenceStore); without it, agreement requirements count as violated."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    if quality.suite:
        results = await run_checks(base_url, model_id, checks_for(quality.suite), timeout_s, quality.check_timeout_s,
                                   quality.concurrency, quality.ask_context(dialect))
        result = _summarise(quality.suite, results)
        if reference is not None and reference.checks:
            result.relative = relative_to(results, reference)
    else:
        result = QualityResult("", 1.0, True)
    if quality.reference is not None and reference is not None:
        try:
            result.agreement = await compare(base_url, model_id, dialect, reference, timeout_s)
        except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as exc:
            result.error = result.error or f"reference agreement failed: {type(exc).__name__}: {exc}"
    result.violations = _violations(result, quality, reference is not None)
    result.passed = not result.violations and result.fatal is None
    result.elapsed_s = loop.time() - start
    return result


def quality_metrics(result: QualityResult) -> dict[str, float]:
    """Flat metrics for the trial record (`quality.*`), usable as objectives or in reports."""
    out = {"quality.score": result.score, "quality.degenerate": float(result.fatal is not None),
           "quality.elapsed_s": result.elapsed_s}
    for cat, frac in result.categories.items():
        out[f"quality.{cat}"] = frac
    rel = result.relative
    if rel is not None:
        out.update({"quality.lost": float(len(rel.lost)), "quality.gained": float(len(rel.gained)),
                    "quality.answer_match": rel.answer_match, "quality.reference_score": rel.reference_score})
    a = result.agreement
    if a is not None:
        out.update({"quality.agreement": a.exact, "quality.prefix": a.prefix, "quality.kl": a.mean_kl,
                    "quality.logprob_diff": a.mean_abs_logprob_diff})
    return out


def _requirements(quality: QualityModel) -> list[tuple[str, str, str, float]]:
    """(name, metric, op, threshold) for every requirement the space set."""
    reqs: list[tuple[str, str, str, float]] = []
    for name, metric, op in (("min_score", "quality.score", ">="), ("min_exact", "quality.exact", ">="),
                             ("json_valid", "quality.json", ">="), ("code_pass", "quality.code", ">="),
                             ("min_agreement", "quality.agreement", ">="), ("min_prefix", "quality.prefix", ">="),
                             ("max_kl", "quality.kl", "<="), ("max_logprob_diff", "quality.logprob_diff", "<="),
                             ("max_lost", "quality.lost", "<="), ("min_answer_match", "quality.answer_match", ">=")):
        threshold = getattr(quality, name)
        if threshold is not None and (quality.suite or name != "min_score"):
            reqs.append((name, metric, op, float(threshold)))
    return reqs


def _violations(result: QualityResult, quality: QualityModel, have_reference: bool) -> list[str]:
    metrics = quality_metrics(result)
    out = []
    for name, metric, op, threshold in _requirements(quality):
        value = metrics.get(metric)
        if value is None:
            why = "no reference answers" if metric in _AGREEMENT and not have_reference else "not measured"
            out.append(f"{name}: {metric} {why}")
        elif (op == ">=" and value < threshold) or (op == "<=" and value > threshold):
            out.append(f"{name}: {metric} = {value:.4g}, required {op} {threshold:g}")
    return out


_AGREEMENT = ("quality.agreement", "quality.prefix", "quality.kl", "quality.logprob_diff", "quality.lost",
              "quality.answer_match")


def constraint_names(quality: QualityModel) -> list[str]:
    """Names of the values constraint_values returns, in order (for reports)."""
    return ["quality.degenerate", *(f"quality:{name}" for name, *_ in _requirements(quality))]


def constraint_values(result: QualityResult | None, quality: QualityModel) -> list[float]:
    """Optuna constraints (<= 0 feasible): degeneration first, then one per requirement, each the
    distance to its threshold; an unmeasured requirement (or no result at all) is infeasible (1.0)."""
    if result is None:
        return [1.0] * len(constraint_names(quality))
    metrics = quality_metrics(result)
    out = [1.0 if result.fatal else 0.0]
    for _, metric, op, threshold in _requirements(quality):
        value = metrics.get(metric)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            out.append(1.0)
        else:
            out.append(threshold - value if op == ">=" else value - threshold)
    return out
