"""Quality spot-checks: exact answers, JSON, code and degeneration at temperature 0, data-driven;
plus agreement with a reference config (harness/reference.py).

A config that is fast but answers worse must lose; garbage must never win. The checks live in
harness/data/quality.yaml. `assess` runs a space's `quality:` section against a running server;
`constraint_values` turns the result into Optuna constraints (<= 0 is feasible).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import unicodedata
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import httpx
import jsonschema
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.client import chat_once
from harness.reference import AgreementResult, ReferenceAnswers, ReferenceSpec, compare

KINDS = ("number", "choice", "contains", "regex", "json", "code")
CATEGORY = {"number": "exact", "choice": "exact", "contains": "exact", "regex": "exact", "json": "json",
            "code": "code"}


class QualityModel(BaseModel):
    """The `quality:` section of a space file (validated there; unknown keys are errors).

    Requirements left at None are measured and reported but do not constrain the search."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    suite: str | None = "smoke"  # a suite in harness/data/quality.yaml; None: no spot-checks
    min_score: float = Field(default=1.0, ge=0, le=1)  # fraction of all checks passed
    min_exact: float | None = Field(default=None, ge=0, le=1)  # fraction of exact-answer checks
    json_valid: float | None = Field(default=None, ge=0, le=1)  # fraction of JSON checks valid
    code_pass: float | None = Field(default=None, ge=0, le=1)  # fraction of code checks passing
    min_agreement: float | None = Field(default=None, ge=0, le=1)  # prompts with identical greedy output
    min_prefix: float | None = Field(default=None, ge=0, le=1)  # mean matched-prefix fraction
    max_kl: float | None = Field(default=None, ge=0)  # mean top-k KL vs the reference, nats/token
    max_logprob_diff: float | None = Field(default=None, ge=0)  # mean |logprob diff| of reference tokens
    reference: ReferenceSpec | None = None  # set (or implied by an agreement requirement): compare
    check_timeout_s: float = Field(default=10.0, gt=0, le=120)  # wall limit of one code check
    # Checks in flight at once. 1 keeps each answer independent of batch composition; on a GPU,
    # where a batch of 13 short answers costs about as much as one, 4-16 cuts the suite's share.
    concurrency: int = Field(default=1, ge=1, le=64)

    @model_validator(mode="before")
    @classmethod
    def _reference_implied(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("reference") is None and any(
                data.get(k) is not None for k in ("min_agreement", "min_prefix", "max_kl", "max_logprob_diff")):
            data = {**data, "reference": {}}
        return data

    @model_validator(mode="after")
    def _known_suite(self) -> QualityModel:
        if self.suite is not None and self.suite not in suites():
            raise ValueError(f"suite {self.suite!r} is not one of {sorted(suites())}")
        if self.reference is not None:
            from harness.reference import prompt_sets

            if self.reference.prompts not in prompt_sets():
                raise ValueError(f"reference.prompts {self.reference.prompts!r} is not one of {sorted(prompt_sets())}")
        return self


@dataclass(frozen=True)
class Check:
    name: str
    kind: str  # number | choice | contains | regex | json | code
    prompt: str
    max_tokens: int = 64
    expect: tuple[str, ...] = ()  # contains: any of these; choice: the right letter
    value: float | None = None  # number: the right value
    tolerance: float = 1e-6  # number: relative tolerance
    pattern: str | None = None
    schema: dict[str, Any] | None = None
    equals: dict[str, Any] | None = None  # json: fields that must have these values
    test: str | None = None  # code: Python appended to the answer's code; must exit 0
    allow_truncation: bool = False

    @property
    def category(self) -> str:
        return CATEGORY[self.kind]


@dataclass
class CheckResult:
    name: str
    passed: bool
    answer: str
    reason: str
    category: str = "exact"
    finish_reason: str | None = None
    degenerate: str | None = None  # why the answer is garbage (fails the trial outright)
    truncated: bool = False  # cut at max_tokens


@dataclass
class QualityResult:
    suite: str
    score: float  # fraction of checks passed
    passed: bool  # every requirement met and nothing degenerate
    checks: list[CheckResult] = field(default_factory=list)
    error: str | None = None
    categories: dict[str, float] = field(default_factory=dict)  # category -> fraction passed
    agreement: AgreementResult | None = None
    violations: list[str] = field(default_factory=list)  # requirement -> why it failed
    elapsed_s: float = 0.0

    @property
    def fatal(self) -> str | None:
        """Degenerate output (or no answers at all): the trial fails outright."""
        bad = [f"{c.name}: {c.degenerate}" for c in self.checks if c.degenerate]
        if bad:
            return "degenerate output: " + "; ".join(bad[:3])
        cut = sum(c.truncated for c in self.checks)
        if self.checks and cut / len(self.checks) >= TRUNCATED_FATAL:
            return f"degenerate output: {cut} of {len(self.checks)} answers hit max_tokens (the model does not stop)"
        if self.error:
            return self.error
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"suite": self.suite, "score": self.score, "passed": self.passed, "error": self.error,
                "fatal": self.fatal, "categories": self.categories, "violations": self.violations,
                "elapsed_s": self.elapsed_s, "checks": [asdict(c) for c in self.checks],
                "agreement": self.agreement.to_dict() if self.agreement else None}


@cache
def suites() -> dict[str, tuple[Check, ...]]:
    data = yaml.safe_load(resources.files("harness").joinpath("data/quality.yaml").read_text())
    out = {}
    for suite, checks in data["suites"].items():
        parsed = []
        for c in checks:
            check = Check(**{**c, "expect": tuple(str(e) for e in c.get("expect", ()))})
            if check.kind not in KINDS:
                raise ValueError(f"quality.yaml: {suite}.{check.name}: unknown kind {check.kind!r}")
            parsed.append(check)
        out[suite] = tuple(parsed)
    return out


# ---- degeneration ------------------------------------------------------------------------------

TRUNCATED_FATAL = 0.5  # this fraction of answers cut at max_tokens: the model does not stop


def degeneration(answer: str) -> str | None:
    """Why an answer is garbage rather than merely wrong, or None. Deliberately coarse: a tiny model
    answering wrongly passes this; a broken one looping, emitting bytes or nothing does not.
    Truncation is judged over the whole suite (QualityResult.fatal): one verbose answer cut at
    max_tokens fails its check, most answers cut means the model no longer stops."""
    text = answer.strip()
    if not text:
        return "empty answer"
    odd = sum(1 for ch in text if ch == "\ufffd" or (unicodedata.category(ch) in ("Cc", "Cn", "Co", "Cs")
                                                      and ch not in "\n\t\r"))
    if odd / len(text) > 0.02:
        return f"non-text output ({odd} control/invalid characters of {len(text)})"
    loop = _tail_loop(text)
    if loop:
        return loop
    words = text.split()
    if len(words) >= 24 and len(set(words)) / len(words) < 0.2:
        return f"distinct-token collapse ({len(set(words))} distinct of {len(words)} words)"
    return None


def _tail_loop(text: str) -> str | None:
    """A unit of 1..60 characters repeated back-to-back at the end, covering at least 40 characters
    and 4 repeats (e.g. 'the the the ...', '!!!!!!!!', a sentence over and over)."""
    tail = text[-400:]
    for period in range(1, 61):
        unit = tail[-period:]
        reps = 1
        while reps * period + period <= len(tail) and tail[-(reps + 1) * period:-reps * period] == unit:
            reps += 1
        if reps >= 4 and reps * period >= 40:
            return f"repetition loop ({unit[:30]!r} x{reps})"
    return None


# ---- judging -----------------------------------------------------------------------------------

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _numbers(text: str) -> list[float]:
    out = []
    for m in _NUMBER.finditer(text):
        try:
            out.append(float(m.group(0).replace(",", "")))
        except ValueError:
            continue
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


def _extract_code(text: str) -> str:
    blocks = re.findall(r"```(?:python|py)?[ \t]*\n(.*?)```", text, re.S)
    if blocks:
        return "\n".join(blocks)
    start = text.find("```")  # an unclosed fence: everything after it
    return text[start + 3:].split("\n", 1)[-1] if start >= 0 else text


def judge(check: Check, answer: str) -> CheckResult:
    """Score one answer (code checks run a subprocess: use judge_async from async code)."""
    cat = check.category
    if check.kind == "number":
        assert check.value is not None, f"{check.name}: a number check needs `value`"
        nums = _numbers(answer)  # the last number: "2 + 2 = 4", "The answer is 7."
        ok = bool(nums) and math.isclose(nums[-1], check.value, rel_tol=check.tolerance, abs_tol=check.tolerance)
        return CheckResult(check.name, ok, answer, "right number" if ok else
                           f"expected {check.value:g}, last number is {nums[-1]:g}" if nums else "no number", cat)
    if check.kind == "choice":
        m = re.search(r"\b([A-E])\b", answer)
        got = m.group(1) if m else None
        ok = got is not None and got in check.expect
        return CheckResult(check.name, ok, answer, f"chose {got}" + ("" if ok else f", expected {check.expect[0]}"),
                           cat)
    if check.kind == "contains":
        low = answer.lower()
        ok = any(e.lower() in low for e in check.expect)
        return CheckResult(check.name, ok, answer, "found" if ok else f"none of {list(check.expect)} in answer", cat)
    if check.kind == "regex":
        ok = bool(check.pattern and re.search(check.pattern, answer))
        return CheckResult(check.name, ok, answer, "matched" if ok else f"no match for {check.pattern!r}", cat)
    if check.kind == "json":
        try:
            value = _extract_json(answer)
            if check.schema:
                jsonschema.validate(value, check.schema)
            for key, want in (check.equals or {}).items():
                if not isinstance(value, dict) or value.get(key) != want:
                    got = value.get(key) if isinstance(value, dict) else None
                    raise ValueError(f"{key} is {got!r}, expected {want!r}")
        except (ValueError, jsonschema.ValidationError) as exc:
            return CheckResult(check.name, False, answer, f"{type(exc).__name__}: {str(exc)[:200]}", cat)
        return CheckResult(check.name, True, answer, "valid JSON" + (" matching the schema" if check.schema else ""),
                           cat)
    if check.kind == "code":
        ok, why = run_code_test(_extract_code(answer), check.test or "", 10.0)
        return CheckResult(check.name, ok, answer, why, cat)
    raise ValueError(f"unknown check kind {check.kind!r}")


async def judge_async(check: Check, answer: str, timeout_s: float) -> CheckResult:
    if check.kind == "code":
        ok, why = await asyncio.to_thread(run_code_test, _extract_code(answer), check.test or "", timeout_s)
        return CheckResult(check.name, ok, answer, why, check.category)
    return judge(check, answer)


# ---- running model-written code ----------------------------------------------------------------

# Prepended to model code: no sockets even where a network namespace is unavailable.
_NO_NET = ("import socket as _socket\n"
           "def _no_network(*a, **k):\n    raise OSError('network is disabled in quality checks')\n"
           "_socket.socket = _no_network\n_socket.create_connection = _no_network\n"
           "_socket.getaddrinfo = _no_network\ndel _socket\n")


@cache
def _netns_prefix() -> tuple[str, ...]:
    """`unshare -rn` gives the child an empty network namespace (no interfaces but a down loopback)."""
    exe = shutil.which("unshare")
    if not exe:
        return ()
    try:
        ok = subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return (exe, "-rn") if ok else ()


def _limits(cpu_s: int) -> None:  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_code_test(code: str, test: str, timeout_s: float = 10.0) -> tuple[bool, str]:
    """Run model code + its test in a separate, isolated Python: `-I -S` (no site, no env vars, no
    cwd on the path), an empty environment, a scratch cwd, CPU/memory/file limits, no network
    namespace where the kernel allows it, and a wall-clock timeout. Pass = exit status 0."""
    if not code.strip():
        return False, "no code in the answer"
    with tempfile.TemporaryDirectory(prefix="flagsearch-code-") as tmp:
        path = os.path.join(tmp, "check.py")
        with open(path, "w") as fh:
            fh.write(_NO_NET + "\n" + code + "\n\n# ---- test ----\n" + test + "\n")
        argv = [*_netns_prefix(), sys.executable, "-I", "-S", path]
        try:
            proc = subprocess.run(argv, cwd=tmp, env={}, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=timeout_s, preexec_fn=lambda: _limits(max(1, int(timeout_s))),
                                  start_new_session=True)
        except subprocess.TimeoutExpired:
            return False, f"timed out after {timeout_s:g} s"
    if proc.returncode == 0:
        return True, "test passed"
    err = proc.stderr.decode(errors="replace").strip().splitlines()
    return False, f"test failed (exit {proc.returncode}): {err[-1][:200] if err else 'no output'}"


# ---- running a suite ---------------------------------------------------------------------------

async def _ask(client: httpx.AsyncClient, base_url: str, model_id: str, check: Check,
               timeout_s: float) -> tuple[str, str | None]:
    payload = {"model": model_id, "messages": [{"role": "user", "content": check.prompt}],
               "max_tokens": check.max_tokens, "temperature": 0.0}
    body = await chat_once(client, base_url, payload, timeout_s)
    choice = body["choices"][0]
    return choice["message"].get("content") or "", choice.get("finish_reason")


async def run_checks(base_url: str, model_id: str, checks: tuple[Check, ...], timeout_s: float = 120.0,
                     code_timeout_s: float = 10.0, concurrency: int = 1) -> list[CheckResult]:
    """Ask each check's prompt (temperature 0, `concurrency` at a time) and judge the answers, in order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, check: Check) -> CheckResult:
        async with gate:
            try:
                answer, finish = await _ask(client, base_url, model_id, check, timeout_s)
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
                return CheckResult(check.name, False, "", f"request failed: {type(exc).__name__}: {exc}",
                                   check.category)
        result = await judge_async(check, answer, code_timeout_s)
        result.finish_reason = finish
        result.truncated = finish == "length"
        result.degenerate = degeneration(answer)
        if result.degenerate:
            result.passed = False
            result.reason = f"degenerate: {result.degenerate}"
        elif result.truncated and not check.allow_truncation and result.passed:
            result.passed = False
            result.reason = "truncated at max_tokens (the answer did not finish)"
        return result

    async with httpx.AsyncClient() as client:
        return list(await asyncio.gather(*(one(client, c) for c in checks)))


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
    results = await run_checks(base_url, model_id, suites()[suite], timeout_s)
    return _summarise(suite, results)


async def assess(base_url: str, model_id: str, dialect: str, quality: QualityModel,
                 reference: ReferenceAnswers | None = None, timeout_s: float = 120.0) -> QualityResult:
    """Everything the space's `quality:` section asks of a running config, with requirements judged.

    `reference` comes from reference.capture_reference on the reference config (cached with
    reference.ReferenceStore); without it, agreement requirements count as violated."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    if quality.suite:
        results = await run_checks(base_url, model_id, suites()[quality.suite], timeout_s, quality.check_timeout_s,
                                   quality.concurrency)
        result = _summarise(quality.suite, results)
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
    a = result.agreement
    if a is not None:
        out.update({"quality.agreement": a.exact, "quality.prefix": a.prefix, "quality.kl": a.mean_kl,
                    "quality.logprob_diff": a.mean_abs_logprob_diff})
    return out


def _requirements(quality: QualityModel) -> list[tuple[str, str, str, float]]:
    """(name, metric, op, threshold) for every requirement the space set."""
    reqs: list[tuple[str, str, str, float]] = []
    if quality.suite:
        reqs.append(("min_score", "quality.score", ">=", quality.min_score))
    for name, metric, op in (("min_exact", "quality.exact", ">="), ("json_valid", "quality.json", ">="),
                             ("code_pass", "quality.code", ">="), ("min_agreement", "quality.agreement", ">="),
                             ("min_prefix", "quality.prefix", ">="), ("max_kl", "quality.kl", "<="),
                             ("max_logprob_diff", "quality.logprob_diff", "<=")):
        threshold = getattr(quality, name)
        if threshold is not None:
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


_AGREEMENT = ("quality.agreement", "quality.prefix", "quality.kl", "quality.logprob_diff")


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
