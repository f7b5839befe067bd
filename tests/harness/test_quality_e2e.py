"""Quality checks on real engines: the default config passes its own checks, A/A agreement is
perfect at temperature 0, a damaged model is caught while a harmless change passes, and a
quantized K cache shows a measurable logprob difference.

llama-server (ready in < 1 s) serves every config here; -t 1 because -t 2 collapses when the
shared machine's other core is busy. One vLLM test reuses the session's shared vLLM server. Every
config runs through the door: the reference is captured by Session.capture_reference and each
verdict is Session.run's quality plan (tests.conftest.quality_of), on a fresh start per config.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness import ModelChoice, QualityPlan, RunRequest, Session, flagsearch_home
from harness.quality.quality import QualityModel, QualityResult, constraint_values
from harness.quality.reference import ReferenceAnswers, ReferenceSpec, ReferenceStore, reference_key
from tests.conftest import llama_settings, quality_of, require

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BASE_FLAGS: dict[str, Any] = {"ctx_size": 2048, "parallel": 1, "threads": 1}
REF_SPEC = ReferenceSpec(tokens=16)  # 4 prompts x 16 tokens: enough to see drift, cheap to compare
QUALITY = QualityModel(suite="smoke", min_score=1.0, reference=REF_SPEC)


def request_for(tmp: Path, model: Path, flags: dict[str, Any]) -> RunRequest:
    """A fresh llama-server start of this config (no prompt cache from before, as every trial)."""
    return RunRequest(llama_settings(), ModelChoice(model.stem, str(model)), {**BASE_FLAGS, **flags}, {}, tmp,
                      fresh=True)


def assess_config(tmp: Path, model: Path, flags: dict[str, Any], reference: ReferenceAnswers,
                  quality: QualityModel = QUALITY) -> QualityResult:
    with Session(keep_server=False) as session:
        return quality_of(session, request_for(tmp, model, flags), QualityPlan(quality, reference))


def show(label: str, r: QualityResult) -> None:
    a = r.agreement
    print(f"\n{label}: score {r.score:.2f} passed={r.passed} fatal={r.fatal} violations={r.violations}")
    if a:
        print(f"  agreement exact {a.exact:.2f} prefix {a.prefix:.2f} mean KL {a.mean_kl:.4f} "
              f"|dlogprob| {a.mean_abs_logprob_diff:.4f} floored {a.floored} ({a.requests} requests)")
    for c in r.checks:
        if not c.passed:
            print(f"  FAIL {c.name}: {c.reason[:100]} <- {c.answer[:80]!r}")


@pytest.fixture(scope="module")
def gguf() -> Path:
    return require(flagsearch_home.smollm2_gguf(), "the SmolLM2 GGUF")


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory, gguf: Path) -> Iterator[tuple[ReferenceAnswers,
                                                                                       QualityResult]]:
    """The default config: capture the reference on it (cached), then assess it against itself."""
    tmp = tmp_path_factory.mktemp("quality")
    request = request_for(tmp, gguf, {})
    with Session() as session:  # the reference's server is kept for its own verdict
        key = reference_key("smollm2-135m-q4_1", BASE_FLAGS, REF_SPEC)
        store = ReferenceStore(tmp / "refs")
        reference = session.capture_reference(request, REF_SPEC, "smollm2-135m-q4_1", BASE_FLAGS, 120.0)
        assert reference.key == key
        store.save(reference)
        cached = store.load(key)
        assert cached is not None
        result = quality_of(session, replace(request, fresh=False), QualityPlan(QUALITY, cached))
        assert session.starts == 1
    yield cached, result


def test_default_config_passes_its_own_checks(default_run: tuple[ReferenceAnswers, QualityResult]) -> None:
    _, result = default_run
    show("default", result)
    assert result.fatal is None
    assert result.score == 1.0, [(c.name, c.reason, c.answer) for c in result.checks if not c.passed]
    assert set(result.categories) == {"exact", "json", "code"}
    assert result.passed and all(v <= 0 for v in constraint_values(result, QUALITY))


def test_aa_agreement_is_perfect_at_temperature_0(default_run: tuple[ReferenceAnswers, QualityResult]) -> None:
    reference, result = default_run
    a = result.agreement
    assert a is not None and a.positions == len(reference.items) * REF_SPEC.tokens
    assert a.exact == 1.0 and a.prefix == 1.0
    assert a.mean_kl == pytest.approx(0.0, abs=1e-9) and a.mean_abs_logprob_diff == pytest.approx(0.0, abs=1e-9)
    assert a.requests == len(reference.items)  # no divergence: no teacher-forcing requests


def test_harmless_batch_size_change_passes(tmp_path: Path, gguf: Path,
                                           default_run: tuple[ReferenceAnswers, QualityResult]) -> None:
    reference, _ = default_run
    result = assess_config(tmp_path, gguf, {"batch_size": 256, "ubatch_size": 64}, reference)
    show("batch 256 / ubatch 64", result)
    assert result.fatal is None and result.passed, result.violations
    assert result.agreement is not None and result.agreement.mean_kl < 0.01


@pytest.fixture(scope="module")
def damaged_gguf(tmp_path_factory: pytest.TempPathFactory, gguf: Path) -> Path:
    """One layer's attention-norm weights scaled by 8: a plausible broken conversion."""
    dst = tmp_path_factory.mktemp("damaged") / "smollm2-blk15-attn-norm-x8.gguf"
    python = sys.executable
    try:
        import gguf as _gguf  # noqa: F401
    except ImportError:  # the engine environment has the gguf package (it converted the model)
        python = str(require(flagsearch_home.vllm_python(), "a Python with the gguf package"))
    subprocess.run([python, str(ROOT / "scripts" / "damage_model.py"), str(gguf), str(dst),
                    "--tensor", "blk.15.attn_norm.weight", "--scale", "8"], check=True, capture_output=True)
    return dst


def test_damaged_model_is_caught(tmp_path: Path, damaged_gguf: Path,
                                 default_run: tuple[ReferenceAnswers, QualityResult]) -> None:
    reference, _ = default_run
    strict = QualityModel(suite="smoke", min_score=1.0, max_kl=0.05, reference=REF_SPEC)
    result = assess_config(tmp_path, damaged_gguf, {}, reference, strict)
    show("damaged (blk.15.attn_norm x8)", result)
    assert not result.passed
    assert result.score < 0.5
    assert result.fatal is not None  # garbage fails the trial outright, whatever the thresholds
    assert result.agreement is not None and result.agreement.mean_kl > 0.05
    values = constraint_values(result, strict)
    assert values[0] > 0 and max(values) > 0


def test_quantized_k_cache_shows_logprob_difference(tmp_path: Path, gguf: Path,
                                                   default_run: tuple[ReferenceAnswers, QualityResult]) -> None:
    reference, aa = default_run
    result = assess_config(tmp_path, gguf, {"flash_attn": "on", "cache_type_k": "q4_0"}, reference)
    show("--cache-type-k q4_0 -fa on", result)
    a = result.agreement
    assert a is not None and aa.agreement is not None
    # A/A is exactly 0; a 4-bit K cache moves the next-token distributions measurably.
    assert a.mean_abs_logprob_diff > 0.01 and a.mean_kl > 1e-4
    assert a.mean_abs_logprob_diff > 10 * aa.agreement.mean_abs_logprob_diff
    assert result.fatal is None  # changed answers, not garbage


def test_vllm_default_passes_and_agrees_with_itself(vllm_session: tuple[Session, RunRequest]) -> None:
    """The demo engine: the shared vLLM-CPU server (eager) passes the smoke suite; A/A is perfect."""
    session, request = vllm_session
    reference = session.capture_reference(request, REF_SPEC, "smollm2-135m", {}, 120.0)
    result = quality_of(session, request, QualityPlan(QUALITY, reference))
    show("vLLM default (eager)", result)
    assert result.fatal is None and result.score == 1.0
    assert result.agreement is not None and result.agreement.exact == 1.0
    assert result.agreement.mean_kl == pytest.approx(0.0, abs=1e-9)
