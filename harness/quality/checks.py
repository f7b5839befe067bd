"""Quality spot-checks as data: loading suites (shipped harness/data/quality*.yaml or the user's own
YAML file), asking each check's prompt at temperature 0, and judging the answer.

Kinds beyond exact answers: `json` (jsonschema + expected values), `code` (the answer's function
run against asserts in an isolated subprocess: harness/quality/sandbox.py), `tool` (a well-formed call of
the named function with valid arguments, native `tool_calls` or the JSON the prompt asks for),
`needle` (a fact hidden at a depth of a long filler context sized EXACTLY by the server's
tokenizer, then asked for). Thinking is stripped (`<think>...</think>`) before judging.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import unicodedata
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import jsonschema

from harness.files import load_yaml, parse_yaml
from harness.measure.client import chat_once, tls_context
from harness.quality.sandbox import run_code_test

KINDS = ("number", "choice", "contains", "regex", "json", "code", "tool", "needle")
CATEGORY = {"number": "exact", "choice": "exact", "contains": "exact", "regex": "exact", "json": "json",
            "code": "code", "tool": "tool", "needle": "long"}


@dataclass(frozen=True)
class Check:
    name: str
    kind: str  # see KINDS
    prompt: str
    max_tokens: int = 64
    expect: tuple[str, ...] = ()  # contains/needle: any of these; choice: the right letter
    value: float | None = None  # number: the right value
    tolerance: float = 1e-6  # number: relative tolerance
    pattern: str | None = None
    schema: dict[str, Any] | None = None  # json: the answer's schema; tool: the arguments' schema
    equals: dict[str, Any] | None = None  # json: fields that must have these values; tool: arguments
    test: str | None = None  # code: Python appended to the answer's code; must exit 0
    allow_truncation: bool = False
    group: str | None = None  # reported category instead of the kind's (e.g. multilingual)
    system: str | None = None  # a system message before the prompt
    tool: dict[str, Any] | None = None  # tool: the function (OpenAI `function` object) to call
    native_tools: bool = False  # tool: also send it as `tools` (servers with a tool-call parser)
    context_tokens: int = 0  # needle: whole prompt size at context_scale 1, by the server's tokenizer
    needle: str = ""  # needle: the sentence hidden in the filler
    depth: float = 0.5  # needle: where (fraction of the filler) it is hidden

    @property
    def category(self) -> str:
        return self.group or CATEGORY[self.kind]


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
    prompt_tokens: int | None = None  # needle: the sized prompt


def parse_checks(items: Any, where: str) -> tuple[Check, ...]:
    if not isinstance(items, list) or not items:
        raise ValueError(f"{where}: expected a non-empty list of checks")
    parsed = []
    for c in items:
        if not isinstance(c, dict):
            raise ValueError(f"{where}: every check is a mapping")
        try:
            check = Check(**{**c, "expect": tuple(str(e) for e in c.get("expect", ()))})
        except TypeError as exc:
            raise ValueError(f"{where}.{c.get('name', '?')}: {exc}") from None
        if check.kind not in KINDS:
            raise ValueError(f"{where}.{check.name}: unknown kind {check.kind!r} (known: {', '.join(KINDS)})")
        if check.kind == "tool" and not (check.tool and check.tool.get("name")):
            raise ValueError(f"{where}.{check.name}: a tool check needs `tool` with a `name`")
        if check.kind == "needle" and not (check.needle and check.expect and check.context_tokens > 0):
            raise ValueError(f"{where}.{check.name}: a needle check needs `needle`, `expect` and `context_tokens`")
        parsed.append(check)
    names = [c.name for c in parsed]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: check names must be unique")
    return tuple(parsed)


@cache
def suites() -> dict[str, tuple[Check, ...]]:
    """The shipped suites: every `suites:` entry of harness/data/quality*.yaml."""
    out: dict[str, tuple[Check, ...]] = {}
    for res in sorted(resources.files("harness").joinpath("data").iterdir(), key=lambda r: r.name):
        if res.name.startswith("quality") and res.name.endswith(".yaml"):
            data = parse_yaml(res.read_text(encoding="utf-8"), f"harness/data/{res.name}") or {}
            for suite, checks in (data.get("suites") or {}).items():
                if suite in out:
                    raise ValueError(f"{res.name}: suite {suite!r} is defined twice")
                out[suite] = parse_checks(checks, f"{res.name}: {suite}")
    return out


def is_file_suite(suite: str) -> bool:
    return suite.endswith((".yaml", ".yml"))


@cache
def checks_for(suite: str) -> tuple[Check, ...]:
    """A shipped suite by name, or the user's own checks: a YAML file holding a list of checks (or
    `suites:` with exactly one suite), in the shipped format."""
    if not is_file_suite(suite):
        if suite not in suites():
            raise ValueError(f"suite {suite!r} is not one of {sorted(suites())} (or a .yaml file of checks)")
        return suites()[suite]
    data = load_yaml(Path(suite), max_bytes=16 << 20)  # bounded (harness.files): a one-line ValueError
    if isinstance(data, dict) and isinstance(data.get("suites"), dict) and len(data["suites"]) == 1:
        data = next(iter(data["suites"].values()))
    return parse_checks(data, suite)


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
    if check.kind == "needle":
        ok = any(e.lower() in answer.lower() for e in check.expect)
        return CheckResult(check.name, ok, answer, "found the needle" if ok else
                           f"none of {list(check.expect)} in the answer", cat)
    if check.kind == "tool":
        return _judge_tool(check, answer)
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


def _judge_tool(check: Check, answer: str) -> CheckResult:
    """The answer is a call {"name": ..., "arguments": {...}} (native tool_calls are turned into
    this by _ask); arguments validated against `schema`, and `equals` compared."""
    cat = check.category
    want = (check.tool or {}).get("name")
    try:
        call = _extract_json(re.sub(r"</?tool_call>", "", answer))
        if isinstance(call, list) and call:
            call = call[0]
        if not isinstance(call, dict):
            raise ValueError("the call is not a JSON object")
        if call.get("name") != want:
            raise ValueError(f"called {call.get('name')!r}, expected {want!r}")
        args = call.get("arguments", call.get("parameters"))
        if isinstance(args, str):
            args = json.loads(args)
        if not isinstance(args, dict):
            raise ValueError("arguments are not a JSON object")
        if check.schema:
            jsonschema.validate(args, check.schema)
        for key, value in (check.equals or {}).items():
            if args.get(key) != value:
                raise ValueError(f"argument {key} is {args.get(key)!r}, expected {value!r}")
    except (ValueError, jsonschema.ValidationError) as exc:
        return CheckResult(check.name, False, answer, f"{type(exc).__name__}: {str(exc)[:200]}", cat)
    return CheckResult(check.name, True, answer, f"well-formed call of {want}", cat)


async def judge_async(check: Check, answer: str, timeout_s: float) -> CheckResult:
    if check.kind == "code":
        ok, why = await asyncio.to_thread(run_code_test, _extract_code(answer), check.test or "", timeout_s)
        return CheckResult(check.name, ok, answer, why, check.category)
    return judge(check, answer)


# ---- asking ------------------------------------------------------------------------------------

_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S)


def strip_thinking(text: str) -> str:
    """The answer without its reasoning (<think>...</think>; an unclosed block is all reasoning)."""
    return _THINK.sub("", text).strip() if "<think>" in text else text


def tool_prompt(check: Check) -> str:
    tool = check.tool or {}
    return (f"{check.prompt}\n\nYou can call this function:\n{json.dumps(tool)}\n"
            'To call it, reply with only a JSON object {"name": <function name>, "arguments": {...}}.')


@dataclass
class AskContext:
    """What asking needs beyond the prompt: request extras (thinking), the scale of needle contexts
    and a token counter (the server's tokenizer, for needle sizing)."""

    extras: dict[str, Any] = field(default_factory=dict)
    context_scale: float = 1.0
    dialect: str | None = None


def ask_context(dialect: str | None, thinking: bool | None, context_scale: float) -> AskContext:
    """Request extras for the suite: thinking on/off as the engine module spells it."""
    extras: dict[str, Any] = {}
    if thinking is not None and dialect:
        from harness.engines import get_engine

        extras = get_engine(dialect).thinking_extras(thinking)
    elif thinking is not None:
        extras = {"chat_template_kwargs": {"enable_thinking": thinking}}
    return AskContext(extras, context_scale, dialect)


async def needle_messages(client: httpx.AsyncClient, base_url: str, model_id: str, check: Check,
                          ctx: AskContext) -> tuple[list[dict[str, str]], int]:
    """The needle prompt: filler with the needle at `depth`, sized EXACTLY to the scaled target."""
    from harness.engines import get_engine
    from harness.engines.base import count_tokens_via_usage
    from harness.measure.workloads import filler_text, sized_messages

    async def count(msgs: list[dict[str, str]]) -> Any:
        if ctx.dialect:
            return await get_engine(ctx.dialect).count_tokens(client, base_url, model_id, msgs)
        return await count_tokens_via_usage(client, base_url, model_id, msgs)

    def filler(n: int, seed: int) -> str:
        words = filler_text(n, seed).split(" ") if n else []
        at = round(check.depth * len(words))
        return " ".join([*words[:at], check.needle, *words[at:]])

    target = max(1, round(check.context_tokens * ctx.context_scale))
    seed = sum(map(ord, check.name))  # the same prompt on every config (same tokenizer)
    return await sized_messages(count, "Document.", check.prompt, target, seed, filler)


async def ask(client: httpx.AsyncClient, base_url: str, model_id: str, check: Check, timeout_s: float,
              ctx: AskContext) -> tuple[str, str | None, int | None]:
    """(answer, finish_reason, sized prompt tokens) for one check."""
    n = None
    if check.kind == "needle":
        msgs, n = await needle_messages(client, base_url, model_id, check, ctx)
    else:
        prompt = tool_prompt(check) if check.kind == "tool" else check.prompt
        msgs = [{"role": "user", "content": prompt}]
    if check.system:
        msgs = [{"role": "system", "content": check.system}, *msgs]
    payload: dict[str, Any] = {"model": model_id, "messages": msgs, "max_tokens": check.max_tokens,
                               "temperature": 0.0, **ctx.extras}
    if check.kind == "tool" and check.native_tools:
        payload["tools"] = [{"type": "function", "function": check.tool}]
    body = await chat_once(client, base_url, payload, timeout_s)
    choice = body["choices"][0]
    message = choice["message"]
    calls = message.get("tool_calls") or []
    if calls:  # a native call, in the shape the prompt asks for
        fn = calls[0].get("function") or {}
        return json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")}), choice.get("finish_reason"), n
    return strip_thinking(message.get("content") or ""), choice.get("finish_reason"), n


async def run_checks(base_url: str, model_id: str, checks: tuple[Check, ...], timeout_s: float = 120.0,
                     code_timeout_s: float = 10.0, concurrency: int = 1,
                     ctx: AskContext | None = None) -> list[CheckResult]:
    """Ask each check's prompt (temperature 0, `concurrency` at a time) and judge the answers, in order."""
    gate = asyncio.Semaphore(concurrency)
    ctx = ctx or AskContext()

    async def one(client: httpx.AsyncClient, check: Check) -> CheckResult:
        async with gate:
            try:
                answer, finish, n = await ask(client, base_url, model_id, check, timeout_s, ctx)
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
                return CheckResult(check.name, False, "", f"request failed: {type(exc).__name__}: {exc}",
                                   check.category)
        result = await judge_async(check, answer, code_timeout_s)
        result.finish_reason = finish
        result.prompt_tokens = n
        result.truncated = finish == "length"
        result.degenerate = degeneration(answer)
        if result.degenerate:
            result.passed = False
            result.reason = f"degenerate: {result.degenerate}"
        elif result.truncated and not check.allow_truncation and result.passed:
            result.passed = False
            result.reason = "truncated at max_tokens (the answer did not finish)"
        return result

    async with httpx.AsyncClient(verify=tls_context()) as client:
        return list(await asyncio.gather(*(one(client, c) for c in checks)))
