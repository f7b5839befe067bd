"""Statistics for A/B runs, claims and regressions: verdicts, exit codes, Markdown and JUnit.

Every decision is made on raw samples, one sample per interleaved round and side:
- the change is the ratio of medians B/A, with a bootstrap confidence interval (each side
  resampled on its own);
- significance is a two-sided Mann-Whitney U test (exact for small samples, no normality assumed);
- a change only counts when it is also at least `min_effect` (default 3%) in size.

Verdict per metric, with "better" meaning higher for throughputs and lower for latencies:
- regressed / improved: significant (p < alpha), the interval excludes no-change, and the
  measured change is at least min_effect in that direction;
- unchanged: the whole interval lies within +-min_effect (any change is too small to matter);
- inconclusive: neither; `repeats_needed` says how many rounds per side would settle it.
Under an A/A comparison whose samples are exchangeable, a false "regressed" has probability at
most alpha/2 (the Mann-Whitney test's size on one side); the min-effect condition lowers it further.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from xml.etree import ElementTree as ET

import numpy as np
from scipy import stats as sps

from harness.metric_registry import direction_of

Verdict = Literal["regressed", "improved", "unchanged", "inconclusive"]
ClaimVerdict = Literal["reproduced", "contradicted", "undecided"]
Direction = Literal["higher", "lower"]

DEFAULT_MIN_EFFECT = 0.03
DEFAULT_ALPHA = 0.02  # two-sided: at most 1% false "regressed" calls under A/A
DEFAULT_CONFIDENCE = 0.95
DEFAULT_POWER = 0.95

EXIT_PASS, EXIT_REGRESSION, EXIT_INCONCLUSIVE = 0, 1, 2
Samples = Sequence[float] | np.ndarray  # raw values of one side


def metric_direction(name: str) -> Direction:
    """Which way is better, as harness/metric_registry.py declares it (rates and scores up, times,
    errors and distances down); ValueError for a metric without a direction."""
    return direction_of(name)


def _clean(values: Samples) -> np.ndarray:
    arr = np.asarray([float(v) for v in values if v is not None and not math.isnan(float(v))], dtype=float)
    return arr


def bootstrap_ratio_ci(a: Samples, b: Samples, confidence: float = DEFAULT_CONFIDENCE,
                       n_resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of median(b) / median(a), each side resampled on its own."""
    arr_a, arr_b = _clean(a), _clean(b)
    rng = np.random.default_rng(seed)
    med_a = np.median(rng.choice(arr_a, size=(n_resamples, arr_a.size), replace=True), axis=1)
    med_b = np.median(rng.choice(arr_b, size=(n_resamples, arr_b.size), replace=True), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = med_b / med_a
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size == 0:
        return math.nan, math.nan
    tail = (1.0 - confidence) / 2.0
    return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1.0 - tail))


def mann_whitney_p(a: Samples, b: Samples) -> float:
    arr_a, arr_b = _clean(a), _clean(b)
    if arr_a.size == 0 or arr_b.size == 0:
        return math.nan
    if np.ptp(np.concatenate([arr_a, arr_b])) == 0:
        return 1.0
    return float(sps.mannwhitneyu(arr_a, arr_b, alternative="two-sided", method="auto").pvalue)


def min_rounds_for_alpha(alpha: float) -> int:
    """Smallest n per side at which an exact two-sided Mann-Whitney test can reach p < alpha at all."""
    n = 1
    while 2.0 / math.comb(2 * n, n) >= alpha:
        n += 1
    return n


def noise_cv(a: Samples, b: Samples) -> float:
    """Pooled relative noise: standard deviation of log samples around each side's own mean."""
    parts = []
    for arr in (_clean(a), _clean(b)):
        arr = arr[arr > 0]
        if arr.size >= 2:
            logs = np.log(arr)
            parts.append(logs - logs.mean())
    if not parts:
        return math.nan
    dev = np.concatenate(parts)
    dof = dev.size - len(parts)
    return float(math.sqrt(float(np.sum(dev**2)) / dof)) if dof > 0 else math.nan


def repeats_needed(cv: float, min_effect: float = DEFAULT_MIN_EFFECT, alpha: float = DEFAULT_ALPHA,
                   power: float = DEFAULT_POWER) -> int | None:
    """Rounds per side to detect a change of min_effect at this noise with the given power.

    Normal approximation for two samples on the log scale, divided by the Mann-Whitney test's
    asymptotic relative efficiency (3/pi), and never below what the exact test needs to reach alpha.
    """
    if not math.isfinite(cv):
        return None
    delta = math.log1p(min_effect)
    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    n = 2.0 * (z * cv / delta) ** 2 / (3.0 / math.pi)
    return max(math.ceil(n), min_rounds_for_alpha(alpha))


@dataclass(frozen=True)
class MetricVerdict:
    metric: str
    direction: Direction
    verdict: Verdict
    median_a: float
    median_b: float
    ratio: float  # median(B) / median(A)
    ci_low: float
    ci_high: float
    p_value: float
    n_a: int
    n_b: int
    cv: float
    repeats_needed: int | None
    min_effect: float
    gated: bool = True
    note: str = ""
    samples_a: tuple[float, ...] = ()
    samples_b: tuple[float, ...] = ()

    @property
    def change_pct(self) -> float:
        return 100.0 * (self.ratio - 1.0)

    def describe(self) -> str:
        ci = f"[{100 * (self.ci_low - 1):+.1f}%, {100 * (self.ci_high - 1):+.1f}%]"
        return (f"{self.metric}: {self.verdict} ({self.change_pct:+.1f}%, CI {ci}, p={self.p_value:.3g}, "
                f"n={self.n_a}/{self.n_b})")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["samples_a"], out["samples_b"] = list(self.samples_a), list(self.samples_b)
        out["change_pct"] = self.change_pct
        return out


def compare(metric: str, a: Sequence[float], b: Sequence[float], direction: Direction | None = None,
            min_effect: float = DEFAULT_MIN_EFFECT, alpha: float = DEFAULT_ALPHA,
            confidence: float = DEFAULT_CONFIDENCE, power: float = DEFAULT_POWER, gated: bool = True,
            seed: int = 0) -> MetricVerdict:
    """The verdict for one metric from raw samples of A (baseline) and B (candidate)."""
    direction = direction or metric_direction(metric)
    arr_a, arr_b = _clean(a), _clean(b)
    common = dict(metric=metric, direction=direction, min_effect=min_effect, gated=gated,
                  samples_a=tuple(arr_a.tolist()), samples_b=tuple(arr_b.tolist()), n_a=int(arr_a.size),
                  n_b=int(arr_b.size))
    if arr_a.size < 2 or arr_b.size < 2:
        return MetricVerdict(verdict="inconclusive", median_a=_median(arr_a), median_b=_median(arr_b),
                             ratio=math.nan, ci_low=math.nan, ci_high=math.nan, p_value=math.nan, cv=math.nan,
                             repeats_needed=min_rounds_for_alpha(alpha),
                             note="fewer than 2 samples on a side", **common)  # type: ignore[arg-type]
    med_a, med_b = float(np.median(arr_a)), float(np.median(arr_b))
    if med_a == 0:
        return _zero_baseline(arr_a, arr_b, common, min_effect, alpha)
    ratio = med_b / med_a
    low, high = bootstrap_ratio_ci(arr_a, arr_b, confidence, seed=seed)
    p = mann_whitney_p(arr_a, arr_b)
    cv = noise_cv(arr_a, arr_b)
    need = repeats_needed(cv, min_effect, alpha, power)
    # Orient so that a positive "gain" is always better.
    verdict = decide(direction, ratio, low, high, p < alpha, min_effect)
    note = ""
    if verdict == "inconclusive":
        if need is not None and need > min(arr_a.size, arr_b.size):
            note = f"about {need} rounds per side would settle a {100 * min_effect:.0f}% change at this noise"
        else:
            note = "the interval straddles the minimum effect; more rounds would narrow it"
    return MetricVerdict(verdict=verdict, median_a=med_a, median_b=med_b, ratio=ratio, ci_low=low, ci_high=high,
                         p_value=p, cv=cv, repeats_needed=need, note=note, **common)  # type: ignore[arg-type]


def decide(direction: Direction, ratio: float, low: float, high: float, significant: bool,
           min_effect: float) -> Verdict:
    """The verdict from a ratio B/A, its interval and the test: a change must be significant, its
    whole interval on one side and at least min_effect; "unchanged" needs the interval inside
    +-min_effect."""
    sign = 1.0 if direction == "higher" else -1.0
    gain, gain_lo, gain_hi = sorted_gain(sign, ratio, low, high)
    if significant and gain_lo > 0 and gain >= min_effect:
        return "improved"
    if significant and gain_hi < 0 and gain <= -min_effect:
        return "regressed"
    if (1 - min_effect) < low and high < (1 + min_effect):
        return "unchanged"
    return "inconclusive"


def sorted_gain(sign: float, ratio: float, low: float, high: float) -> tuple[float, float, float]:
    """(gain, low, high) of the relative change, oriented so that positive is better."""
    ends = sorted((sign * (low - 1.0), sign * (high - 1.0)))
    return sign * (ratio - 1.0), ends[0], ends[1]


def _median(arr: np.ndarray) -> float:
    return float(np.median(arr)) if arr.size else math.nan


def _zero_baseline(arr_a: np.ndarray, arr_b: np.ndarray, common: dict[str, Any], min_effect: float,
                   alpha: float) -> MetricVerdict:
    """Counts such as errors: 0 in the baseline. Any candidate error is a change, no ratio exists."""
    med_b = float(np.median(arr_b))
    worse_if_up = common["direction"] == "lower"
    if float(arr_b.max()) == 0:
        verdict: Verdict = "unchanged"
    elif med_b > 0 or mann_whitney_p(arr_a, arr_b) < alpha:
        verdict = "regressed" if worse_if_up else "improved"
    else:
        verdict = "inconclusive"
    return MetricVerdict(verdict=verdict, median_a=0.0, median_b=med_b, ratio=math.nan, ci_low=math.nan,
                         ci_high=math.nan, p_value=mann_whitney_p(arr_a, arr_b), cv=math.nan,
                         repeats_needed=None, note="baseline median is 0: judged on counts, not a ratio",
                         **common)  # type: ignore[arg-type]


# ---- claims ---------------------------------------------------------------------------------------

_CLAIM = re.compile(r"^\s*(?P<num>[+-]?\d+(?:\.\d+)?)\s*(?P<unit>%|x)\s*(?P<metric>.*?)\s*$", re.IGNORECASE)

# What people write after the number -> the metric leaf we measure.
CLAIM_METRICS = {
    "": "output_tok_s", "tok/s": "output_tok_s", "tokens/s": "output_tok_s", "throughput": "output_tok_s",
    "e2e": "output_tok_s", "end-to-end": "output_tok_s", "stream tok/s": "stream_tok_s",
    "ttft": "ttft_p50_s", "tpot": "tpot_p50_s", "itl": "itl_p50_s", "latency": "e2e_p50_s",
}


@dataclass(frozen=True)
class Claim:
    text: str
    metric_leaf: str
    ratio: float  # claimed median(B)/median(A)
    hardware: str | None = None  # where the claim was measured ("on B200"), if it says
    needs: tuple[str, ...] = ()  # what the change relies on ("needs FlashInfer CUTLASS MoE"): log words

    @property
    def direction(self) -> Direction:
        return metric_direction(self.metric_leaf)


def parse_claim(text: str) -> Claim:
    """'+24% tok/s', '1.93x', '-10% ttft', '+5% ttft_p90_s' -> the claimed ratio B/A on one metric.

    For a latency, '-10% ttft' means B's TTFT is 10% lower; '2x ttft' means twice as fast (half the time).
    Provenance and prerequisites may follow: '+24% tok/s on B200 needs FlashInfer CUTLASS MoE; FP4'
    says where it was measured and which paths (words that a startup log line names; ';' between
    several) the change relies on.
    """
    parts = re.split(r"\s+(?:needs|requires)\s+", text, maxsplit=1, flags=re.IGNORECASE)
    body, needs_text = parts[0], (parts[1] if len(parts) > 1 else "")
    body, _, hardware = body.partition(" on ")
    needs = tuple(n.strip() for n in needs_text.split(";") if n.strip())
    match = _CLAIM.match(body)
    if not match:
        raise ValueError(f"cannot read the claim {text!r}; write e.g. '+24% tok/s', '1.93x', '-10% ttft'")
    num, unit, what = float(match["num"]), match["unit"].lower(), match["metric"].strip().lower()
    leaf = CLAIM_METRICS.get(what, what)
    try:
        direction = metric_direction(leaf)
    except ValueError:
        known = ", ".join(k for k in CLAIM_METRICS if k)
        raise ValueError(f"claim {text!r}: unknown metric {what!r} (use {known}, or a metric name)") from None
    if unit == "%":
        ratio = 1.0 + num / 100.0
    else:
        if num <= 0:
            raise ValueError(f"claim {text!r}: a factor must be positive")
        ratio = num if direction == "higher" else 1.0 / num
    if ratio <= 0:
        raise ValueError(f"claim {text!r}: the claimed change leaves nothing (ratio {ratio:.3g})")
    return Claim(text=text.strip(), metric_leaf=leaf, ratio=ratio, hardware=hardware.strip() or None, needs=needs)


def _words(text: str) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9]+", text.lower()) if w]


def hardware_matches(claimed: str, here: str) -> bool:
    """'B200' matches 'NVIDIA B200'; 'H100 SXM' matches 'NVIDIA H100 80GB HBM3 (SXM)'; 'CPU' matches a host
    without a GPU (here given as 'CPU: <model>')."""
    have = " ".join(_words(here))
    return all(w in have for w in _words(claimed))


def hardware_here(fingerprint: dict[str, Any]) -> str:
    """The hardware a measurement ran on, in words, from its fingerprint."""
    if fingerprint.get("gpu_name"):
        count = fingerprint.get("gpu_count") or 1
        return f"{count}x {fingerprint['gpu_name']}" if count != 1 else str(fingerprint["gpu_name"])
    return f"CPU: {fingerprint.get('cpu_model', 'unknown')} ({fingerprint.get('cpu_count', '?')} cores)"


def missing_prerequisites(claim: Claim, log_text: str) -> list[str]:
    """The claim's prerequisites that no line of a (base run's) log names: every word of a
    prerequisite must appear in one line, in any order, case-insensitively."""
    lines = [set(_words(line)) for line in log_text.splitlines()]
    return [need for need in claim.needs if not any(set(_words(need)) <= line for line in lines)]


@dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    metric: str
    verdict: ClaimVerdict
    measured: MetricVerdict
    explanation: str

    def to_dict(self) -> dict[str, Any]:
        return {"claim": asdict(self.claim), "metric": self.metric, "verdict": self.verdict,
                "measured": self.measured.to_dict(), "explanation": self.explanation}


def judge_claim(claim: Claim, measured: MetricVerdict, tolerance: float = DEFAULT_MIN_EFFECT,
                here: str | None = None) -> ClaimResult:
    """Is the claimed change there on this hardware? (`here`: this host's hardware in words; when
    the claim names other hardware, the explanation says that the verdict is about this machine.)

    With c the claimed change and [lo, hi] the measured interval, both oriented so that the claim
    points up: reproduced if lo > 0 (a real change in the claimed direction) and hi >= c - tolerance
    (as large as claimed, within the tolerance); contradicted if hi < c - tolerance (significantly
    smaller than claimed, no change or the opposite); undecided otherwise (too noisy to tell).
    """
    up = 1.0 if claim.ratio >= 1.0 else -1.0
    c = up * (claim.ratio - 1.0)
    ends = sorted((up * (measured.ci_low - 1.0), up * (measured.ci_high - 1.0)))
    lo, hi = ends
    measured_txt = (f"measured {measured.change_pct:+.1f}% (CI {100 * (measured.ci_low - 1):+.1f}% to "
                    f"{100 * (measured.ci_high - 1):+.1f}%) vs claimed {100 * (claim.ratio - 1):+.1f}%")
    if not math.isfinite(lo) or not math.isfinite(hi):
        return ClaimResult(claim, measured.metric, "undecided", measured, f"no interval: {measured.note}")
    if hi < c - tolerance:
        verdict: ClaimVerdict = "contradicted"
        why = "the measured change is significantly smaller than claimed"
    elif lo > 0:
        verdict = "reproduced"
        why = "a real change in the claimed direction, as large as claimed"
    else:
        verdict = "undecided"
        why = "the interval holds both no change and the claimed change; run more rounds"
    if claim.hardware and here and not hardware_matches(claim.hardware, here):
        why += (f". The claim was measured on {claim.hardware}; this was measured on {here}: the verdict "
                f"is about this hardware, not about {claim.hardware}")
    elif claim.hardware and here:
        why += f" (claimed on {claim.hardware}, measured on the same kind: {here})"
    return ClaimResult(claim, measured.metric, verdict, measured, f"{measured_txt}: {why}")


# ---- the whole comparison ------------------------------------------------------------------------

@dataclass
class GateReport:
    """All verdicts of one comparison plus what else must be said (fingerprint, quality, errors)."""

    title: str
    label_a: str
    label_b: str
    verdicts: list[MetricVerdict]
    fingerprint_differences: list[str] = field(default_factory=list)
    quality: dict[str, Any] = field(default_factory=dict)  # score_a, score_b, failed checks...
    notes: list[str] = field(default_factory=list)
    claims: list[ClaimResult] = field(default_factory=list)
    log_diff: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the comparison itself failed (start, crash)
    # A side that did not start: side, round, command, cause, line (the deciding log line), log.
    failed_sides: list[dict[str, Any]] = field(default_factory=list)

    @property
    def quality_regressed(self) -> bool:
        qa, qb = self.quality.get("score_a"), self.quality.get("score_b")
        return qa is not None and qb is not None and qb < qa

    @property
    def regressed(self) -> list[MetricVerdict]:
        return [v for v in self.verdicts if v.gated and v.verdict == "regressed"]

    @property
    def inconclusive(self) -> list[MetricVerdict]:
        return [v for v in self.verdicts if v.gated and v.verdict == "inconclusive"]

    @property
    def outcome(self) -> str:
        if self.regressed or self.quality_regressed:
            return "regression"
        if self.errors or self.inconclusive:
            return "inconclusive" if not self.errors else "error"
        return "pass"

    @property
    def claims_outcome(self) -> ClaimVerdict | None:
        """The claims taken together: one contradicted claim contradicts, one undecided leaves it open."""
        if not self.claims:
            return None
        verdicts = {c.verdict for c in self.claims}
        return "contradicted" if "contradicted" in verdicts else "undecided" if "undecided" in verdicts \
            else "reproduced"

    def exit_code(self) -> int:
        """With claims (and a comparison that ran), the claims decide; otherwise the gated verdicts."""
        if self.claims and not self.errors:
            return {"contradicted": EXIT_REGRESSION, "undecided": EXIT_INCONCLUSIVE}.get(
                self.claims_outcome or "", EXIT_PASS)
        return {"pass": EXIT_PASS, "regression": EXIT_REGRESSION}.get(self.outcome, EXIT_INCONCLUSIVE)

    def headline(self) -> str:
        """The outcome that sets the exit code first, the gate's result beside it: a CI reader who sees
        only this line knows why the job is green or red."""
        code = self.exit_code()
        if self.failed_sides:
            sides = ", ".join(f"{f['side']} ({f['cause']})" for f in self.failed_sides)
            return f"**ERROR: {sides} FAILED TO START** (exit {code})"
        gate = {"pass": "PASS, no regression", "regression": "REGRESSION", "inconclusive": "INCONCLUSIVE",
                "error": "ERROR"}[self.outcome]
        what = [v.metric for v in self.regressed] + (["quality score"] if self.quality_regressed else [])
        if what:
            gate += f" ({', '.join(what)})"
        if self.claims and not self.errors:
            return f"**CLAIM {(self.claims_outcome or '').upper()}** (exit {code}); gate: {gate}"
        return f"**{gate}** (exit {code})"

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "a": self.label_a, "b": self.label_b, "outcome": self.outcome,
                "claims_outcome": self.claims_outcome, "headline": self.headline().replace("**", ""),
                "exit_code": self.exit_code(), "verdicts": [v.to_dict() for v in self.verdicts],
                "fingerprint_differences": self.fingerprint_differences, "quality": self.quality,
                "notes": self.notes, "claims": [c.to_dict() for c in self.claims], "log_diff": self.log_diff,
                "errors": self.errors, "failed_sides": self.failed_sides}

    def markdown(self) -> str:
        lines = [f"## {self.title}: {self.headline()}", "",
                 f"A = `{self.label_a}`  ", f"B = `{self.label_b}`", ""]
        for f in self.failed_sides:
            lines += [f"**{f['side']} failed to start** (round {f.get('round', '?')}): cause `{f['cause']}`",
                      f"- command: `{f['command']}`", f"- log says: `{f['line']}`"]
            if f.get("log"):
                lines.append(f"- log: {f['log']}")
            lines.append("")
        for e in self.errors:
            lines.append(f"- :x: error: {e}")
        if self.fingerprint_differences:
            lines.append("**Fingerprints differ in material fields** (the comparison is about these, or is "
                         "not like for like):")
            lines += [f"- `{d}`" for d in self.fingerprint_differences]
            lines.append("")
        lines += ["| metric | gated | A median | B median | change | 95% CI | p | n A/B | verdict |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for v in self.verdicts:
            ci = (f"{100 * (v.ci_low - 1):+.1f}% .. {100 * (v.ci_high - 1):+.1f}%"
                  if math.isfinite(v.ci_low) else "-")
            change = f"{v.change_pct:+.1f}%" if math.isfinite(v.ratio) else "-"
            lines.append(f"| {v.metric} | {'yes' if v.gated else 'no'} | {v.median_a:.4g} | {v.median_b:.4g} | "
                         f"{change} | {ci} | {v.p_value:.3g} | {v.n_a}/{v.n_b} | **{v.verdict}** |")
        lines.append("")
        if self.quality:
            qa, qb = self.quality.get("score_a"), self.quality.get("score_b")
            mark = "regressed" if self.quality_regressed else "ok"
            lines.append(f"Quality score: A {qa} / B {qb} ({mark})")
            for name in self.quality.get("failed_b_only", []):
                lines.append(f"- check `{name}` passes on A and fails on B")
            lines.append("")
        for c in self.claims:
            lines.append(f"**Claim `{c.claim.text}`** on `{c.metric}`: **{c.verdict}**: {c.explanation}")
        if self.claims:
            lines.append("")
        if self.log_diff:
            lines.append("What the logs said:")
            lines += [f"- {d}" for d in self.log_diff]
            lines.append("")
        for v in self.verdicts:
            if v.note and v.gated:
                lines.append(f"- {v.metric}: {v.note}")
        lines += [f"- {n}" for n in self.notes]
        return "\n".join(lines).rstrip() + "\n"

    def junit_xml(self) -> str:
        """One testcase per gated metric (plus quality, errors, fingerprint): any CI renders it."""
        suite = ET.Element("testsuite", name=self.title)
        cases = 0
        failures = 0
        skipped = 0
        for v in self.verdicts:
            if not v.gated:
                continue
            case = ET.SubElement(suite, "testcase", classname="flagsearch.regress", name=v.metric)
            cases += 1
            if v.verdict == "regressed":
                ET.SubElement(case, "failure", message=v.describe()).text = v.describe()
                failures += 1
            elif v.verdict == "inconclusive":
                ET.SubElement(case, "skipped", message=v.describe() + (f"; {v.note}" if v.note else ""))
                skipped += 1
            else:
                ET.SubElement(case, "system-out").text = v.describe()
        if self.quality:
            case = ET.SubElement(suite, "testcase", classname="flagsearch.regress", name="quality.score")
            cases += 1
            if self.quality_regressed:
                ET.SubElement(case, "failure", message=f"quality score {self.quality.get('score_a')} -> "
                                                       f"{self.quality.get('score_b')}")
                failures += 1
        for c in self.claims:
            case = ET.SubElement(suite, "testcase", classname="flagsearch.claim", name=c.claim.text)
            cases += 1
            if c.verdict == "contradicted":
                ET.SubElement(case, "failure", message=c.explanation)
                failures += 1
            elif c.verdict == "undecided":
                ET.SubElement(case, "skipped", message=c.explanation)
                skipped += 1
            else:
                ET.SubElement(case, "system-out").text = c.explanation
        for e in self.errors:
            case = ET.SubElement(suite, "testcase", classname="flagsearch.regress", name="run")
            ET.SubElement(case, "error", message=e)
            cases += 1
        if self.fingerprint_differences:
            case = ET.SubElement(suite, "testcase", classname="flagsearch.regress", name="fingerprint")
            ET.SubElement(case, "system-out").text = "\n".join(self.fingerprint_differences)
            cases += 1
        suite.set("tests", str(cases))
        suite.set("failures", str(failures))
        suite.set("errors", str(len(self.errors)))
        suite.set("skipped", str(skipped))
        ET.indent(suite)
        return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"
