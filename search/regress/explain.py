"""Why a claim was not reproduced, in one sentence that follows from the evidence: what B was asked
to change (flags, environment, command) and what its engine selected differently at startup."""

from __future__ import annotations

from typing import Any

from search.regress.ab import SideResult, Subject
from search.regress.claims import ClaimResult


def subject_changes(a: Subject, b: Subject) -> list[str]:
    """What B was asked to do differently from A: flags, environment, engine command."""
    out = [f"{k}: {a.flags.get(k)!r} -> {b.flags.get(k)!r}" for k in sorted(set(a.flags) | set(b.flags), key=str)
           if a.flags.get(k) != b.flags.get(k)]
    out += [f"env {k}: {a.env.get(k)!r} -> {b.env.get(k)!r}" for k in sorted(set(a.env) | set(b.env))
            if a.env.get(k) != b.env.get(k)]
    if a.settings.command != b.settings.command:
        out.append(f"command: {' '.join(a.settings.command)} -> {' '.join(b.settings.command)}")
    if a.settings.image != b.settings.image:
        out.append(f"image: {a.settings.image} -> {b.settings.image}")
    return out


def startup_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What the engine selected differently at startup (backends, KV capacity and sizes, log facts);
    startup phase times are left out (they are noise, not a selection)."""
    out = []
    for group in ("backends", "facts"):
        ga, gb = a.get(group) or {}, b.get(group) or {}
        out += [f"{k}: A {ga.get(k)!r}, B {gb.get(k)!r}" for k in sorted(set(ga) | set(gb)) if ga.get(k) != gb.get(k)]
    out += [f"{k}: A {a.get(k)!r}, B {b.get(k)!r}" for k in ("version", "kv_cache_tokens", "max_concurrency")
            if a.get(k) != b.get(k)]
    return out


def explain_claim(result: ClaimResult, a: SideResult, b: SideResult, changes: list[str]) -> str | None:
    """One sentence on why a claim was not reproduced, that follows from the evidence.

    "Not taking effect" is said only when both halves hold: the claim is contradicted by a null
    measured change (unchanged or inconclusive) and the startup logs, which name what the engine
    selected, show no difference between A and B. Otherwise the sentence lists what did differ.
    """
    if result.verdict == "reproduced" or not a.startup or not b.startup:
        return None  # a side that did not start is reported as failed, not explained
    measured = result.measured
    # An interval that excludes no change is a measured change, however small: never "no change".
    excludes_zero = measured.ci_low > 1.0 or measured.ci_high < 1.0
    null = measured.verdict == "unchanged" or (measured.verdict == "inconclusive" and not excludes_zero)
    differed = startup_differences(a.startup, b.startup)
    named = any(side.startup.get(k) for side in (a, b) for k in ("backends", "facts"))
    asked = f"B's change ({'; '.join(changes)})" if changes else "B's change"
    if differed:
        seen = f"{asked} showed at startup: {'; '.join(differed)}"
    elif named:
        seen = "the startup logs show the same selection in A and B (backends, KV cache, facts)"
    else:
        seen = f"the logs name no backend choice, so whether {asked} took effect cannot be told from them"
    head = f"why `{result.claim.text}`:"
    if result.verdict == "contradicted" and null and not differed and named:
        return f"{head} no measurable change, and {seen}: {asked} is likely not taking effect on this hardware"
    if result.verdict == "undecided":
        effect = "too noisy to tell yet"
    elif excludes_zero and measured.verdict == "inconclusive":
        effect = (f"a measured change of {measured.change_pct:+.1f}% ({measured.level_text} "
                  f"{100 * (measured.ci_low - 1):+.1f}%..{100 * (measured.ci_high - 1):+.1f}%: it excludes no "
                  f"change), smaller than the claimed {100 * (result.claim.ratio - 1):+.1f}%")
    elif null:
        effect = "no measurable change"
    else:
        effect = (f"a real change of {measured.change_pct:+.1f}% ({measured.verdict}), not the claimed "
                  f"{100 * (result.claim.ratio - 1):+.1f}%")
    return f"{head} {effect}; {seen}"
