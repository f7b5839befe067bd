"""The whole comparison: every metric's verdict, claims, quality, fingerprint and log differences,
one outcome and exit code, rendered as Markdown (for a PR comment) and JUnit XML (for any CI)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any
from xml.etree import ElementTree as ET

from search.exit_codes import Exit
from search.regress.claims import ClaimResult, ClaimVerdict
from search.verdicts.gate import EXIT_INCONCLUSIVE, EXIT_PASS, EXIT_REGRESSION, MetricVerdict


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
        """The quality test's verdict (search/verdicts/sequential.py compare_quality), never a bare drop in score:
        one check lost on one side may be noise, and the test says when it is."""
        return (self.quality.get("test") or {}).get("verdict") == "regressed"

    @property
    def quality_inconclusive(self) -> bool:
        return (self.quality.get("test") or {}).get("verdict") == "inconclusive"

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
        if self.errors or self.inconclusive or self.quality_inconclusive:
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
        return {"pass": EXIT_PASS, "regression": EXIT_REGRESSION, "error": Exit.FAILED}.get(self.outcome,
                                                                                        EXIT_INCONCLUSIVE)

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
        lines += ["| metric | gated | A | B | change | interval (its level) | p | n A/B | could detect | verdict |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for v in self.verdicts:
            ci = (f"{100 * (v.ci_low - 1):+.1f}% .. {100 * (v.ci_high - 1):+.1f}% ({100 * v.level:.3g}%)"
                  if math.isfinite(v.ci_low) else "-")
            change = f"{v.change_pct:+.1f}%" if math.isfinite(v.ratio) else "-"
            # What the run could have seen belongs to a "no difference" answer; next to a settled change it
            # reads as a contradiction (a -48% found where "±116%" was the detectable size at 95% power).
            mde = f"±{100 * v.mde:.1f}%" if math.isfinite(v.mde) and v.verdict in ("unchanged", "inconclusive") else "-"
            lines.append(f"| {v.metric} | {'yes' if v.gated else 'no'} | {v.median_a:.4g} | {v.median_b:.4g} | "
                         f"{change} | {ci} | {v.p_value:.3g} | {v.n_a}/{v.n_b} | {mde} | **{v.verdict}** |")
        lines.append("")
        for v in self.verdicts:
            if v.gated and v.sensitivity():
                lines.append(f"- {v.metric} {v.verdict}: {v.sensitivity()}")
        if self.quality:
            qa, qb = self.quality.get("score_a"), self.quality.get("score_b")
            test = self.quality.get("test") or {}
            mark = test.get("verdict", "not tested")
            lines.append(f"Quality score: A {qa} / B {qb}: {mark} (McNemar over {test.get('checks', '?')} checks "
                         f"on {self.quality.get('starts_a', 1)}/{self.quality.get('starts_b', 1)} starts, "
                         f"p {test.get('p_value', math.nan):.3g})" + (f"; {test['seen']}" if test.get("seen") else ""))
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
