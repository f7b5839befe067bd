"""Quality checks without a server: judging, degeneration, the code sandbox, agreement maths,
requirements -> Optuna constraints, the reference cache, and damaged model copies."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from harness.quality.quality import (
    Check,
    CheckResult,
    QualityModel,
    QualityResult,
    constraint_names,
    constraint_values,
    degeneration,
    judge,
    quality_metrics,
    run_code_test,
    suites,
)
from harness.quality.reference import (
    AgreementResult,
    Position,
    ReferenceAnswers,
    ReferenceContinuation,
    ReferenceSpec,
    ReferenceStore,
    parse_positions,
    prompt_sets,
    reference_key,
    topk_kl,
)

ROOT = Path(__file__).resolve().parents[2]


# ---- the data file -------------------------------------------------------------------------------

def test_suites_load_and_every_check_is_judgeable() -> None:
    data = suites()
    assert {"smoke", "hard"} <= set(data)
    kinds = {c.kind for c in data["smoke"]}
    assert {"number", "contains", "json", "code"} <= kinds
    for checks in data.values():
        names = [c.name for c in checks]
        assert len(names) == len(set(names))
        for c in checks:
            if c.kind == "number":
                assert c.value is not None
            if c.kind == "code":
                assert c.test
    assert len(prompt_sets()["default"]) >= 3


# ---- judging -------------------------------------------------------------------------------------

def test_number_takes_the_last_number() -> None:
    check = Check("add", "number", "2+2?", value=4)
    assert judge(check, "2 + 2 = 4").passed
    assert judge(check, "The answer is 4.").passed
    assert not judge(check, "2 + 2 = 5").passed
    assert not judge(check, "four").passed
    assert judge(Check("g", "number", "?", value=1000), "1,000 grams").passed


def test_choice_contains_regex() -> None:
    choice = Check("c", "choice", "?", expect=("C",))
    assert judge(choice, "C) Paris").passed
    assert not judge(choice, "A) Berlin").passed
    assert not judge(choice, "I do not know").passed
    assert judge(Check("f", "contains", "?", expect=("Paris",)), "It is paris.").passed
    assert not judge(Check("f", "contains", "?", expect=("Paris",)), "Rome").passed
    assert judge(Check("r", "regex", "?", pattern=r"^\d+$"), "42").passed


def test_json_schema_and_expected_values() -> None:
    check = Check("j", "json", "?", schema={"type": "object", "required": ["name", "age"],
                                           "properties": {"age": {"type": "integer"}}},
                  equals={"name": "Ann", "age": 31})
    assert judge(check, '```json\n{"name": "Ann", "age": 31}\n```').passed
    assert judge(check, 'Here: {"name": "Ann", "age": 31} done').passed
    assert not judge(check, '{"name": "Ann", "age": "31"}').passed  # schema: age is a string
    assert not judge(check, '{"name": "Bob", "age": 31}').passed  # wrong value
    assert not judge(check, '{"name": "Ann", "age": 31').passed  # does not parse
    assert not judge(check, "no json here").passed


def test_code_check_runs_the_answer_against_its_test() -> None:
    check = Check("code", "code", "?", test="assert twice(3) == 6")
    good = "```python\ndef twice(x):\n    return 2 * x\n```\nThis doubles x."
    bad = "```python\ndef twice(x):\n    return x + 1\n```"
    assert judge(check, good).passed
    result = judge(check, bad)
    assert not result.passed and "AssertionError" in result.reason
    assert not judge(check, "I cannot write code.").passed


# ---- the sandbox ---------------------------------------------------------------------------------

def test_sandbox_has_no_network_no_env_and_a_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGSEARCH_SECRET_PROBE", "leak")
    ok, why = run_code_test("import socket\ns = socket.socket()", "", 10)
    assert not ok and "network is disabled" in why
    probe = "import os\nassert 'FLAGSEARCH_SECRET_PROBE' not in os.environ\nassert not os.environ.get('PATH')"
    ok, _ = run_code_test(probe, "", 10)
    assert ok
    ok, why = run_code_test("while True:\n    pass", "", 2)
    assert not ok and ("timed out" in why or "exit" in why)
    ok, why = run_code_test("x = bytearray(4 << 30)", "", 10)  # over the 1 GiB address-space limit
    assert not ok and "MemoryError" in why


def test_sandbox_runs_outside_this_process() -> None:
    ok, _ = run_code_test("import sys\nsys.exit(0)", "", 10)
    assert ok  # sys.exit in model code ends the child, not the test run
    ok, why = run_code_test("import sys\nsys.exit(3)", "", 10)
    assert not ok and "exit 3" in why


# ---- degeneration --------------------------------------------------------------------------------

@pytest.mark.parametrize("answer", [
    "",
    "   \n ",
    "the the the the the the the the the the the the the the the the the the",
    "Paris is nice. " * 10,
    "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!",
    "\x00\x01\x02 abc \ufffd\ufffd\ufffd",
    " ".join(["alpha", "beta", "gamma"] * 5 + ["alpha", "gamma", "beta"] * 5),
])
def test_degenerate_answers_are_caught(answer: str) -> None:
    assert degeneration(answer) is not None


@pytest.mark.parametrize("answer", [
    "4",
    "The capital of France is Paris.",
    "```python\ndef is_even(n):\n    return n % 2 == 0\n```\nThis uses the modulo operator.",
    '{\n  "name": "Ann",\n  "age": 31\n}',
    "One hour is equal to 12 hours.",  # wrong, but not garbage
])
def test_sane_answers_are_not_degenerate(answer: str) -> None:
    assert degeneration(answer) is None


def test_truncation_is_fatal_only_when_most_answers_are_cut() -> None:
    checks = [CheckResult(f"c{i}", False, "x y", "", truncated=i < 2) for i in range(5)]
    assert QualityResult("s", 0.0, False, checks).fatal is None  # 2 of 5: verbose, not broken
    checks[2].truncated = True
    fatal = QualityResult("s", 0.0, False, checks).fatal
    assert fatal and "3 of 5 answers hit max_tokens" in fatal


# ---- agreement maths -----------------------------------------------------------------------------

def test_topk_kl_is_zero_for_identical_and_grows_with_drift() -> None:
    ref = {1: math.log(0.7), 2: math.log(0.2), 3: math.log(0.05)}
    assert topk_kl(ref, dict(ref)) == (pytest.approx(0.0, abs=1e-12), 0)
    near = {1: math.log(0.65), 2: math.log(0.25), 3: math.log(0.05)}
    far = {1: math.log(0.2), 2: math.log(0.7), 3: math.log(0.05)}
    kl_near, _ = topk_kl(ref, near)
    kl_far, _ = topk_kl(ref, far)
    assert 0 < kl_near < kl_far
    missing = {4: math.log(0.9), 5: math.log(0.05)}
    kl_missing, floored = topk_kl(ref, missing)
    assert floored == 3 and kl_missing > kl_far


def test_parse_positions_reads_both_server_shapes() -> None:
    vllm = {"logprobs": {"tokens": ["token_id:5", "token_id:7"], "token_logprobs": [-0.1, -0.5],
                         "top_logprobs": [{"token_id:5": -0.1, "token_id:6": -2.0},
                                          {"token_id:7": -0.5, "token_id:8": -1.0, "token_id:9": -3.0}]}}
    def alt(i: int, lp: float) -> dict[str, object]:
        return {"id": i, "logprob": lp}

    llama = {"logprobs": {"content": [
        {"id": 5, "token": "a", "logprob": -0.1, "top_logprobs": [alt(5, -0.1), alt(6, -2.0)]},
        {"id": 7, "token": "b", "logprob": -0.5, "top_logprobs": [alt(7, -0.5), alt(8, -1.0), alt(9, -3.0)]}]}}
    a = parse_positions(vllm, top_k=2)
    b = parse_positions(llama, top_k=2)
    assert [(p.token, p.logprob, p.top) for p in a] == [(p.token, p.logprob, p.top) for p in b]
    assert a[1].top == {7: -0.5, 8: -1.0}


def _reference() -> ReferenceAnswers:
    spec = ReferenceSpec(tokens=2, top_k=2)
    pos = [Position(5, -0.1, {5: -0.1, 6: -2.0}), Position(7, -0.5, {7: -0.5, 8: -1.0})]
    item = ReferenceContinuation("p", [1, 2, 3], [5, 7], "ab", pos)
    return ReferenceAnswers(reference_key("m", {"x": 1}, spec), "m", {"x": 1}, "llamacpp", 2, 2, [item])


def test_reference_store_round_trip_and_key(tmp_path: Path) -> None:
    ref = _reference()
    store = ReferenceStore(tmp_path)
    assert store.load(ref.key) is None
    path = store.save(ref)
    assert path.exists() and json.loads(path.read_text())["key"] == ref.key
    loaded = store.load(ref.key)
    assert loaded is not None and loaded.items[0].positions[0].top == {5: -0.1, 6: -2.0}
    spec = ReferenceSpec(tokens=2, top_k=2)
    assert reference_key("m", {"x": 1}, spec) == ref.key
    assert reference_key("m", {"x": 2}, spec) != ref.key
    assert reference_key("other", {"x": 1}, spec) != ref.key
    assert reference_key("m", {"x": 1}, ReferenceSpec(tokens=3, top_k=2)) != ref.key


# ---- requirements -> constraints -----------------------------------------------------------------

def _result(passed: list[bool], degenerate: str | None = None,
            agreement: AgreementResult | None = None) -> QualityResult:
    checks = [CheckResult(f"c{i}", p, "x", "", "exact" if i % 2 else "json") for i, p in enumerate(passed)]
    if degenerate:
        checks[0].degenerate = degenerate
    cats: dict[str, list[bool]] = {}
    for c in checks:
        cats.setdefault(c.category, []).append(c.passed)
    return QualityResult("smoke", sum(passed) / len(passed), all(passed), checks,
                         categories={k: sum(v) / len(v) for k, v in cats.items()}, agreement=agreement)


def _agreement(kl: float) -> AgreementResult:
    return AgreementResult("k", [], exact=1.0, prefix=1.0, mean_kl=kl, max_kl=kl, mean_abs_logprob_diff=kl,
                           positions=8, floored=0, requests=1, elapsed_s=0.1)


def test_constraints_feasible_only_when_requirements_hold() -> None:
    q = QualityModel(suite="smoke", min_score=0.75, min_exact=1.0, max_kl=0.05)
    assert q.reference == ReferenceSpec()  # implied by max_kl
    names = constraint_names(q)
    assert names == ["quality.degenerate", "quality:min_score", "quality:min_exact", "quality:max_kl"]
    good = constraint_values(_result([True, True, True, True], agreement=_agreement(0.01)), q)
    assert len(good) == len(names) and all(v <= 0 for v in good)
    wrong_exact = constraint_values(_result([True, False, True, True], agreement=_agreement(0.01)), q)
    assert wrong_exact[2] > 0 and wrong_exact[1] <= 0  # 3/4 >= 0.75 but exact 1/2 < 1
    drift = constraint_values(_result([True] * 4, agreement=_agreement(0.2)), q)
    assert drift[3] == pytest.approx(0.15)
    garbage = constraint_values(_result([True] * 4, degenerate="empty answer", agreement=_agreement(0.0)), q)
    assert garbage[0] > 0
    no_agreement = constraint_values(_result([True] * 4), q)
    assert no_agreement[3] > 0  # an unmeasured requirement is infeasible
    assert all(v > 0 for v in constraint_values(None, q))


def test_metrics_and_fatal() -> None:
    r = _result([True, False], degenerate="repetition loop", agreement=_agreement(0.02))
    m = quality_metrics(r)
    assert m["quality.score"] == 0.5 and m["quality.degenerate"] == 1.0 and m["quality.kl"] == 0.02
    assert r.fatal and "repetition loop" in r.fatal
    d = r.to_dict()
    assert d["fatal"] and d["agreement"]["mean_kl"] == 0.02


def test_quality_model_rejects_bad_input() -> None:
    with pytest.raises(ValidationError):
        QualityModel(suite="nope")
    with pytest.raises(ValidationError):
        QualityModel(min_exact=1.5)
    with pytest.raises(ValidationError):
        QualityModel(unknown=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        QualityModel(reference={"prompts": "nope"})  # type: ignore[arg-type]
    assert QualityModel().reference is None and QualityModel(suite=None).suite is None


# ---- damaged model copies ------------------------------------------------------------------------

def _gguf_available() -> bool:
    try:
        import gguf  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _gguf_available(), reason="the gguf package is not installed (pip install gguf)")
def test_damage_gguf_zeroes_and_scales_one_tensor(tmp_path: Path) -> None:
    import gguf

    src = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(src, "llama")
    w.add_tensor("blk.0.attn_norm.weight", np.ones(32, dtype=np.float32))
    w.add_tensor("blk.0.ffn_down.weight", np.full((4, 32), 0.5, dtype=np.float32))
    q = gguf.quants.quantize(np.full((4, 32), 0.25, dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_q.weight", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    script = str(ROOT / "scripts" / "damage_model.py")
    zeroed, scaled, qscaled = tmp_path / "z.gguf", tmp_path / "s.gguf", tmp_path / "q.gguf"
    for dst, extra in ((zeroed, ["--tensor", "blk.0.ffn_down.weight", "--zero"]),
                       (scaled, ["--tensor", "blk.0.attn_norm.weight", "--scale", "8"]),
                       (qscaled, ["--tensor", "blk.0.attn_q.weight", "--scale", "2"])):
        subprocess.run([sys.executable, script, str(src), str(dst), *extra], check=True, capture_output=True)

    def tensor(path: Path, name: str) -> np.ndarray:
        t = next(t for t in gguf.GGUFReader(path).tensors if t.name == name)
        if t.tensor_type == gguf.GGMLQuantizationType.Q8_0:
            return gguf.quants.dequantize(t.data, t.tensor_type)
        return np.array(t.data)

    assert np.all(tensor(zeroed, "blk.0.ffn_down.weight") == 0)
    assert np.all(tensor(zeroed, "blk.0.attn_norm.weight") == 1)  # the rest untouched
    assert np.allclose(tensor(scaled, "blk.0.attn_norm.weight"), 8)
    assert np.allclose(tensor(qscaled, "blk.0.attn_q.weight"), 0.5, rtol=0.02)
    assert np.all(tensor(src, "blk.0.ffn_down.weight") == 0.5)  # the source is never modified
    bad = subprocess.run([sys.executable, script, str(src), str(tmp_path / "x.gguf"), "--tensor", "nope", "--zero"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "no tensor 'nope'" in bad.stderr and not (tmp_path / "x.gguf").exists()


def test_damage_safetensors_rewrites_only_the_holder(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text("{}")
    a = np.array([1.0, 2.0, -3.0], dtype=np.float32)
    b = np.array([1.5, 1.5], dtype=np.float32)
    bf16 = (a.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    header = {"x.weight": {"dtype": "BF16", "shape": [3], "data_offsets": [0, len(bf16)]},
              "y.weight": {"dtype": "F32", "shape": [2], "data_offsets": [len(bf16), len(bf16) + 8]}}
    blob = json.dumps(header).encode()
    (src / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob + bf16 + b.tobytes())
    dst = tmp_path / "broken"
    script = str(ROOT / "scripts" / "damage_model.py")
    subprocess.run([sys.executable, script, str(src), str(dst), "--tensor", "x.weight", "--scale", "4"],
                   check=True, capture_output=True)
    raw = (dst / "model.safetensors").read_bytes()
    base = 8 + len(blob)
    x = (np.frombuffer(raw[base:base + 6], dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    assert np.allclose(x, a * 4)
    assert np.allclose(np.frombuffer(raw[base + 6:base + 14], dtype=np.float32), b)
    assert (dst / "config.json").read_text() == "{}"
    original = (src / "model.safetensors").read_bytes()
    assert original[base:base + 6] == bf16
