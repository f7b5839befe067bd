"""Why a claim was not reproduced, in one sentence that follows from the evidence: what B was asked
to change (flags, environment, command) and the kernel path each side's engine selected at run time
(the selections its startup log names: harness/engines, `Engine.kernel_paths`)."""

from __future__ import annotations

from search.regress.ab import Subject
from search.regress.claims import ClaimResult
from search.regress.kernel_path import kernel_path, kernel_path_differences, touched_labels
from search.regress.sides import SideResult


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


def explain_claim(result: ClaimResult, a: SideResult, b: SideResult, changes: list[str], dialect: str = "",
                  touched: dict[str, list[str]] | None = None) -> str | None:
    """One sentence on why a claim was not reproduced, that follows from the evidence.

    "Not taking effect" is said only when both halves hold: the claim is contradicted by a null
    measured change (unchanged or inconclusive) and the kernel paths the engine selected (its startup
    log, read by the engine's parser) are the same on A and B. When a PR's changed files are known
    (`touched`: kernel path key -> files), the path the change acts on is named with what both sides ran
    ("GDN prefill kernel: Triton/FLA on A and B: the PR's change to that path ran on neither side's fast
    kernel"). Otherwise the sentence lists what did differ.
    """
    if result.verdict == "reproduced" or not a.startup or not b.startup:
        return None  # a side that did not start is reported as failed, not explained
    dialect = dialect or a.dialect or b.dialect
    measured = result.measured
    # An interval that excludes no change is a measured change, however small: never "no change".
    excludes_zero = measured.ci_low > 1.0 or measured.ci_high < 1.0
    null = measured.verdict == "unchanged" or (measured.verdict == "inconclusive" and not excludes_zero)
    differed, same = kernel_path_differences(dialect, a.startup, b.startup)
    named = bool(same or differed)
    asked = f"B's change ({'; '.join(changes)})" if changes else "B's change"
    acted = touched_labels(dialect, touched or {})
    path_a = kernel_path(dialect, a.startup)
    on_path = [f"{label}: {path_a[label]} on A and B (the change is in {file})" for label, file in acted.items()
               if label in path_a and kernel_path(dialect, b.startup).get(label) == path_a[label]]
    if differed:
        seen = f"{asked} changed the kernel path: {'; '.join(differed)}"
    elif on_path:
        seen = f"the kernel path the change acts on stayed the same: {'; '.join(on_path)}"
    elif named:
        seen = f"the kernel path was the same on A and B ({'; '.join(same)})"
    else:
        seen = f"the logs name no kernel selection, so whether {asked} took effect cannot be told from them"
    head = f"why `{result.claim.text}`:"
    if result.verdict == "contradicted" and null and not differed and named:
        what = ("the change did not reach a different kernel here: its fast path is not the one selected on this "
                "hardware" if on_path else f"{asked} is likely not taking effect on this hardware")
        return f"{head} no measurable change, and {seen}: {what}"
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
