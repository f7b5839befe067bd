"""Claims such as "+24% tok/s on B200 needs FlashInfer": parsed, and judged against a measured verdict.

A claim names a change on one metric, optionally where it was measured and what it relies on; the
measured side is a search.verdicts.gate.MetricVerdict, and the claim is reproduced, contradicted or undecided.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any, Literal

from search.verdicts.gate import DEFAULT_MIN_EFFECT, Direction, MetricVerdict, metric_direction

ClaimVerdict = Literal["reproduced", "contradicted", "undecided"]

_CLAIM = re.compile(r"^\s*(?P<num>[+-]?\d+(?:\.\d+)?)\s*(?P<unit>%|x)\s*(?P<metric>.*?)\s*$", re.IGNORECASE)

# What people write after the number -> the metric leaf we measure. "tok/s" is the decode throughput
# of the steady window (the unit every verdict uses); "e2e" is end-to-end throughput, TTFT in.
CLAIM_METRICS = {
    "": "decode_tok_s", "tok/s": "decode_tok_s", "tokens/s": "decode_tok_s", "throughput": "decode_tok_s",
    "decode": "decode_tok_s", "e2e": "output_tok_s", "end-to-end": "output_tok_s", "stream tok/s": "stream_tok_s",
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
    """The hardware a measurement ran on, in words, from its fingerprint: 'NVIDIA GB10 (sm_121, 119.7 GiB)'."""
    if fingerprint.get("gpu_name"):
        count = fingerprint.get("gpu_count") or 1
        name = f"{count}x {fingerprint['gpu_name']}" if count != 1 else str(fingerprint["gpu_name"])
        bits = [sm for sm in [_sm(fingerprint.get("gpu_compute_capability"))] if sm]
        mem = re.match(r"\s*(\d+(?:\.\d+)?)\s*MiB", str(fingerprint.get("gpu_memory") or ""))
        if mem:
            bits.append(f"{float(mem.group(1)) / 1024:.1f} GiB")
        return f"{name} ({', '.join(bits)})" if bits else name
    return f"CPU: {fingerprint.get('cpu_model', 'unknown')} ({fingerprint.get('cpu_count', '?')} cores)"


def _sm(capability: Any) -> str | None:
    """'12.1' -> 'sm_121' (nvidia-smi's compute_cap as CUDA names the architecture)."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", str(capability or ""))
    return f"sm_{m.group(1)}{m.group(2)}" if m else None


# What a claim's hardware words name: architecture and memory, for saying plainly how far the claim's
# machine is from this one (a kernel written for sm_100 may not exist for sm_121 at all).
KNOWN_GPUS: dict[str, tuple[str, str]] = {
    "GB10": ("sm_121", "128 GB unified"), "GB200": ("sm_100", "186 GB"), "GB300": ("sm_103", "288 GB"),
    "B200": ("sm_100", "180 GB"), "B300": ("sm_103", "288 GB"), "H200": ("sm_90", "141 GB"),
    "H100": ("sm_90", "80 GB"), "GH200": ("sm_90", "96 GB"), "H20": ("sm_90", "96 GB"), "A100": ("sm_80", "40/80 GB"),
    "L40S": ("sm_89", "48 GB"), "L4": ("sm_89", "24 GB"), "RTX PRO 6000": ("sm_120", "96 GB"),
    "RTX 5090": ("sm_120", "32 GB"), "RTX 4090": ("sm_89", "24 GB"), "Thor": ("sm_110", "128 GB unified"),
}


def claimed_hardware(claimed: str) -> str:
    """'B200' -> 'B200 (sm_100, 180 GB)'; hardware flagsearch does not know is named as written."""
    words = set(_words(claimed))
    for name in sorted(KNOWN_GPUS, key=len, reverse=True):  # 'GB200' before 'B200'
        if set(_words(name)) <= words:
            sm, mem = KNOWN_GPUS[name]
            return f"{claimed} ({sm}, {mem})"
    return claimed


def hardware_gap(claim: Claim, fingerprint: dict[str, Any]) -> str | None:
    """'claimed on B200 (sm_100, 180 GB), measured on NVIDIA GB10 (sm_121, 119.7 GiB)' when the claim
    names other hardware than this machine's; None when it names none or the same kind."""
    if not claim.hardware:
        return None
    here = hardware_here(fingerprint)
    if hardware_matches(claim.hardware, here):
        return None
    return f"claimed on {claimed_hardware(claim.hardware)}, measured on {here}"


def missing_prerequisites(claim: Claim, log_text: str, selected: dict[str, str] | None = None) -> list[str]:
    """The claim's prerequisites that neither one line of a (base run's) log nor one path the engine's
    log parser reports as selected (`selected`: StartupInfo.backends, e.g. {'moe': 'FLASHINFER_CUTLASS'})
    names: every word of a prerequisite must appear in one of them, in any order, case-insensitively."""
    # A bracketed list is a list of candidates ("out of potential backends: ['MARLIN', ...]"): it names
    # what could have been chosen, not what was.
    lines = [set(_words(re.sub(r"\[[^\]]*\]", " ", line))) for line in log_text.splitlines()]
    lines += [set(_words(f"{key} {value}")) for key, value in (selected or {}).items()]
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
        why += (f". Claimed on {claimed_hardware(claim.hardware)}, measured on {here}: the verdict "
                f"is about this hardware, not about {claim.hardware}")
    elif claim.hardware and here:
        why += f" (claimed on {claim.hardware}, measured on the same kind: {here})"
    return ClaimResult(claim, measured.metric, verdict, measured, f"{measured_txt}: {why}")

