"""The nightly's decisions, apart from running anything: one explicit outcome per baseline, read from
the regress report (report.json) or from what stopped the run before it, and one job result.

A nightly must never pass by not measuring. Every way a night can go has its own name, and only
`pass` (and `drift`, a pass that is reported and never promoted) leaves the job green unless the
user allows that outcome by name (`--allow nothing-new`):

- pass (exit 0): measured; every gated metric settled unchanged or better.
- drift (exit 0): a pass, but a gated metric is significantly worse within the threshold, or the B/A
  ratios multiplied along the promotion chain are worse than the threshold: reported, not promoted.
- regression (1): a gated metric (or the quality score) regressed.
- start-failed (7): either side's server did not start (the report names the side and the log line).
- build-failed (7): either side's build (pip, git, image) failed, or it is not the build the job
  needs (no CUDA torch).
- error (7): the comparison failed otherwise (an unexpected exception included), or nothing was
  measured.
- unreadable (2): a baseline file in the folder could not be read (damaged, or written by a newer
  flagsearch): a failure, never a skip (a baseline of other hardware is a skip, and said).
- inconclusive (3): still unsettled at the plan's cap of rounds: never promoted.
- nothing-new (4): the candidate is exactly the baseline's own build, or the build that passed last
  night (same digest, wheel, commit, binary).
- no-candidate (5): the candidate does not exist (no such version, tag or ref).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.builds.builds import BuildSpec, parse_build
from harness.engines import EngineSettings
from search.exit_codes import Exit

OUTCOMES = ("pass", "drift", "regression", "start-failed", "build-failed", "error", "unreadable", "inconclusive",
            "nothing-new", "no-candidate")
# Each outcome's code in the one table of every command (search/exit_codes.py).
EXIT_CODES = {"pass": Exit.PASS, "drift": Exit.PASS, "regression": Exit.REGRESSION, "start-failed": Exit.FAILED,
              "build-failed": Exit.FAILED, "error": Exit.FAILED, "unreadable": Exit.USAGE,
              "inconclusive": Exit.INCONCLUSIVE,
              "nothing-new": Exit.NOTHING_NEW, "no-candidate": Exit.NO_CANDIDATE}
# Outcomes a user may accept by name (--allow): never a regression, and pass/drift need no permission.
ALLOWABLE = ("start-failed", "build-failed", "error", "inconclusive", "nothing-new", "no-candidate")
# The job's exit code is that of the most severe outcome left after --allow, in this order.
SEVERITY = ("regression", "unreadable", "start-failed", "build-failed", "error", "inconclusive", "no-candidate",
            "nothing-new", "drift", "pass")


@dataclass
class Result:
    """One baseline's night: its outcome, one line saying why, and where the evidence is."""

    baseline: str
    outcome: str
    detail: str
    report: str | None = None
    rounds: int | None = None
    drift: list[str] = field(default_factory=list)
    promoted: str | None = None
    sentinel: dict[str, Any] | None = None  # an A/A sentinel night's reading (search/commands/nightly.py)

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"unknown nightly outcome {self.outcome!r}")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exit_code": EXIT_CODES[self.outcome]}


def result_from_report(baseline: str, report: dict[str, Any], path: str | None = None,
                       chain: dict[str, float] | None = None,
                       chain_var: dict[str, tuple[float, float]] | None = None) -> Result:
    """The outcome of one regress report (the dict its report.json holds). `chain`: per metric, the
    product of the B/A ratios of the promotions that led to this baseline (search.regress.nightly_plan.promote
    keeps it in the baseline's source), against which a pass is also checked for drift; `chain_var`: the
    summed variance of their log ratios (kept beside it)."""
    run = report.get("run") or {}
    rounds = run.get("rounds_done")
    failed = report.get("failed_sides") or []
    if failed:
        f = failed[0]
        side = "candidate (B)" if str(f.get("side")).upper() == "B" else "baseline (A)"
        return Result(baseline, "start-failed", f"the {side} did not start in round {f.get('round', '?')}: "
                                                f"{f.get('cause')}: {f.get('line')} (log {f.get('log')})", path, rounds)
    if report.get("errors"):
        return Result(baseline, "error", "; ".join(str(e) for e in report["errors"])[:500], path, rounds)
    gated = [v for v in report.get("verdicts") or [] if v.get("gated")]
    outcome = report.get("outcome")
    if outcome == "regression":
        what = [f"{v['metric']} {_pct(v)}" for v in gated if v.get("verdict") == "regressed"]
        q = report.get("quality") or {}
        if not what and q:
            what = [f"quality score {q.get('score_a')} -> {q.get('score_b')}"]
        return Result(baseline, "regression", "regressed: " + ", ".join(what), path, rounds)
    # From here on, a pass must rest on measurements of both sides.
    unmeasured = [v["metric"] for v in gated if not v.get("n_a") or not v.get("n_b")]
    if not gated or unmeasured:
        return Result(baseline, "error", "nothing was measured on "
                      + (", ".join(unmeasured) if unmeasured else "any gated metric") + ": no verdict", path, rounds)
    if outcome == "inconclusive":
        open_ = [f"{v['metric']} {_pct(v)}" for v in gated if v.get("verdict") == "inconclusive"]
        return Result(baseline, "inconclusive", f"not settled after {rounds} rounds (the plan's cap): "
                      + ", ".join(open_) + "; not promoted", path, rounds)
    if outcome != "pass":
        return Result(baseline, "error", f"the report's outcome is {outcome!r}", path, rounds)
    kept = one_start_per_side(report)
    drift = drifted(gated, chain or {}, kept, chain_var)
    if drift:
        return Result(baseline, "drift", "passed, but " + "; ".join(drift) + ": not promoted", path, rounds, drift)
    detail = "passed: " + ", ".join(f"{v['metric']} {v['verdict']} {_pct(v)}" for v in gated)
    if kept and (slower := [v["metric"] for v in gated if _interval_worse(v)]):
        detail += (f"; {', '.join(slower)} slower within the threshold on one start per side (--keep-servers): "
                   "not called drift, two servers' sessions differ by as much")
    return Result(baseline, "pass", detail, path, rounds)


def one_start_per_side(report: dict[str, Any]) -> bool:
    """Rounds on kept servers (`--keep-servers`): one start of each side. Their interval holds no
    start-to-start spread, so two servers' sessions, which differ by a few percent here however they are
    pinned (an A/A nightly measured -3.1%, CI -4.6%..-1.7%; docs/regression.md), look significant."""
    run = report.get("run") or {}
    starts = [len(((run.get(side) or {}).get("samples") or {}).get("startup.ready_s") or []) for side in ("a", "b")]
    return int(run.get("rounds_done") or 0) >= 2 and all(0 < n <= 1 for n in starts)


def _pct(v: dict[str, Any]) -> str:
    lo, hi = v.get("ci_low"), v.get("ci_high")
    ci = (f" (CI {100 * (lo - 1):+.1f}%..{100 * (hi - 1):+.1f}%)"
          if isinstance(lo, float) and isinstance(hi, float) and math.isfinite(lo) and math.isfinite(hi) else "")
    ratio = v.get("ratio")
    return (f"{100 * (ratio - 1):+.1f}%" if isinstance(ratio, float) and math.isfinite(ratio) else "-") + ci


def _worse(direction: str, ratio: float) -> bool:
    return ratio < 1.0 if direction == "higher" else ratio > 1.0


def _interval_worse(v: dict[str, Any]) -> bool:
    direction, lo, hi = v.get("direction", "higher"), v.get("ci_low"), v.get("ci_high")
    return (isinstance(lo, float) and isinstance(hi, float) and math.isfinite(lo) and math.isfinite(hi)
            and _worse(direction, hi if direction == "higher" else lo))


# The chain's drift is called at this one-sided level each night: a chain of no change is called drifted on
# at most this share of its nights, however long (simulated: tests/search/test_nightly.py).
DRIFT_ALPHA = 0.01


def log_ratio_variance(v: dict[str, Any]) -> tuple[float, float] | None:
    """The variance of a verdict's log B/A ratio and its degrees of freedom: a paired one's round differences'
    spread squared over its rounds (rounds - 1 df), an unpaired one's per-sample spread squared over each
    side's samples, both sides (2 (n - 1) df). None: unknown."""
    cv, n = v.get("cv"), v.get("n_a")
    if not isinstance(cv, (int, float)) or not math.isfinite(cv) or not isinstance(n, int) or n < 2:
        return None
    paired = bool(v.get("paired"))
    return float(cv) ** 2 / n * (1 if paired else 2), float(n - 1 if paired else 2 * (n - 1))


def add_variance(chain: tuple[float, float] | None, night: tuple[float, float]) -> tuple[float, float]:
    """A chain's (summed variance, sum of variance^2 / df) with one more night's (variance, df): what the
    Satterthwaite degrees of freedom of the sum are made of."""
    total, spread = chain or (0.0, 0.0)
    return total + night[0], spread + night[0] ** 2 / night[1]


def drifted(gated: list[dict[str, Any]], chain: dict[str, float], kept: bool = False,
            chain_var: dict[str, tuple[float, float]] | None = None) -> list[str]:
    """Why a pass is drift: a gated metric significantly worse but within the threshold (its whole
    interval on the worse side; not judged on `kept` servers, one_start_per_side), or tonight's B/A
    times the chain's earlier B/A ratios worse than the threshold and significantly worse than no change
    (promotions that each lose a little would otherwise ratchet the baseline down; ratios measured within
    each night are free of the machine's own drift, unlike stored medians). Significance takes the
    chain's summed variance with tonight's (`chain_var`: per metric `add_variance`'s pair), a one-sided t
    test at the sum's Satterthwaite degrees of freedom at DRIFT_ALPHA (each night's spread comes from its
    own few rounds; a z test called short chains drifted several times too often). By the product of
    points alone most chains of no change were called drifted within 30 nights, their noise adding up like
    a random walk; now at most DRIFT_ALPHA of nights are (simulated: tests/search/test_nightly.py). A chain
    promoted before variances were kept is judged by its points, as then."""
    from scipy import stats  # lazily: scipy costs every CLI start ~0.25 s

    out = []
    for v in gated:
        direction = v.get("direction", "higher")
        if not kept and _interval_worse(v):
            out.append(f"{v['metric']} is slower within the threshold: {_pct(v)}")
        before, ratio = chain.get(v["metric"]), v.get("ratio")
        min_effect = float(v.get("min_effect") or 0.0)
        if not (before and isinstance(ratio, float) and math.isfinite(ratio) and ratio > 0):
            continue
        total = before * ratio
        if not (_worse(direction, total) and abs(total - 1.0) >= min_effect):
            continue
        earlier, tonight = (chain_var or {}).get(v["metric"]), log_ratio_variance(v)
        said = (f"{v['metric']} is {100 * (total - 1):+.1f}% over the promotion chain (earlier "
                f"promotions {100 * (before - 1):+.1f}%, tonight {100 * (ratio - 1):+.1f}%")
        if earlier is None or tonight is None:
            out.append(said + ")")
            continue
        var, spread = add_variance(earlier, tonight)
        t = abs(math.log(total)) / math.sqrt(var) if var > 0 else math.inf
        p = float(stats.t.sf(t, var ** 2 / spread)) if spread > 0 else 0.0
        if p < DRIFT_ALPHA:
            out.append(said + f"; one-sided p {p:.2g} on the chain's summed variance)")
    return out


def summarize(results: list[Result], allow: set[str] | frozenset[str] = frozenset()) -> tuple[int, list[str]]:
    """The job's exit code and one line per baseline. An allowed outcome is said, and does not fail."""
    bad = set(allow) - set(ALLOWABLE)
    if bad:
        raise ValueError(f"--allow {', '.join(sorted(bad))}: only {', '.join(ALLOWABLE)} can be allowed")
    if not results:
        return EXIT_CODES["error"], ["error: no baseline was checked"]
    lines, counted = [], []
    for r in results:
        allowed = r.outcome in allow
        lines.append(f"{r.baseline}: {r.outcome.upper()}{' (allowed by --allow)' if allowed else ''}: {r.detail}")
        counted.append("pass" if allowed else r.outcome)
    worst = min(counted, key=SEVERITY.index)
    return EXIT_CODES[worst], lines


# ---- the candidate against what was already measured ----------------------------------------------

def build_identity(fields: dict[str, Any] | None) -> str | None:
    """What makes two builds the same engine: an image digest, a wheel's hash, a git commit, a pinned
    requirement, a binary's hash with its arguments. None when a build cannot be told apart (python:)."""
    if not fields:
        return None
    kind = fields.get("kind")
    if kind == "image":
        return fields.get("image_digest") or fields.get("image_id")
    if kind == "pip":
        if fields.get("wheel_sha256"):
            return f"wheel sha256 {fields['wheel_sha256']}"
        if fields.get("git_commit"):
            return f"{fields.get('git_url')} commit {fields['git_commit']}"
        return fields.get("requirement")
    if kind == "command" and fields.get("executable_sha256"):
        args = shlex.split(str(fields.get("command") or ""))[1:]
        return f"binary sha256 {fields['executable_sha256']}" + (f" {shlex.join(args)}" if args else "")
    return None


def nothing_new(candidate: dict[str, Any], baseline_build: dict[str, Any] | None,
                history_rows: list[dict[str, Any]]) -> tuple[str | None, str]:
    """('why', '') when the candidate needs no measuring; (None, a line to say) otherwise.

    Same as the baseline's own build: an A/A that proves nothing. Same as the last nightly's candidate
    when that one passed: nothing changed since. After a failed or unsettled night the same build is
    measured again (a flaky start should not turn into a silent green)."""
    ident = build_identity(candidate)
    if ident is None:
        return None, "the candidate's identity is unknown (python: build): measured"
    if ident == build_identity(baseline_build):
        return f"the candidate is the build the baseline was measured with ({ident}): nothing new to test", ""
    last = [r for r in history_rows if r.get("source") == "nightly"]
    if not last:
        return None, f"candidate {ident}: first nightly for this baseline"
    row = last[-1]
    try:
        before = json.loads(row.get("build") or "{}")
    except ValueError:
        before = {}
    if build_identity(before) != ident:
        return None, f"candidate {ident}: new since the last nightly ({row.get('time')}: {build_identity(before)})"
    if row.get("outcome") == "pass":
        what = "image" if candidate.get("kind") == "image" else "build"
        return (f"no new {what} since the last nightly ({row.get('time')}, passed): {ident}", "")
    return None, (f"candidate {ident}: the same build as the last nightly ({row.get('time')}), whose outcome was "
                  f"{row.get('outcome')}: measured again")


# How to get out of a refused kind, for a stored baseline (regress, nightly) and for a config (ab).
_KIND_FIXES = {
    "baseline": ("record a baseline with a process launcher on this runner (`search baseline save SPACE --build SPEC`)",
                 "record a baseline whose engine runs from a venv",
                 "needs a baseline recorded with the docker launcher on this runner"),
    "config": ("compare configs whose engine runs as a local process (no `launcher: docker` in the space)",
               "use an engine command that starts with the venv's python (python -m vllm.entrypoints...)",
               "needs an engine with `launcher: docker` in the space"),
}


def on_engine(spec: BuildSpec, settings: EngineSettings) -> BuildSpec:
    """The build as it can drive this engine: a pip build (a wheel, a release, a PR) for an engine that
    runs in Docker becomes an overlay on the engine's own image ("my image on tonight's wheel"), so that
    the two sides differ by the wheel alone; anything else as given."""
    if spec.kind == "pip" and settings.launcher == "docker" and settings.image:
        return parse_build(f"overlay:{settings.image} -- {spec.value}", spec.label, spec.env, spec.flags)
    return spec


def refuse_kind(spec: BuildSpec, settings: EngineSettings, baseline: str, side: str = "candidate",
                what: str = "baseline") -> str | None:
    """A sentence when a build of this kind cannot drive the engine of a baseline (or, what="config", of
    an ab side's config): checked when the plan is made, before any build."""
    docker = settings.launcher == "docker"
    runs_python = bool(settings.python) and settings.command[:1] == (settings.python,)
    fix_process, fix_python, fix_docker = _KIND_FIXES[what]
    if spec.kind == "pip" and docker:  # on_engine makes it an overlay wherever the engine names its image
        return (f"{baseline}: the {what} runs in Docker but names no image to install the pip {side} "
                f"({spec.value}) into; give its `image:`, or {fix_process}")
    if spec.kind == "python" and docker:
        return (f"{baseline}: the {what} runs in Docker (image {settings.image}); a python {side} "
                f"({spec.value}) cannot drive it. Give a wheel or release instead (it is installed into "
                f"{settings.image} as an overlay), an image, or {fix_process}")
    if spec.kind == "overlay" and not docker:
        return (f"{baseline}: the {what} runs as a local process ({shlex.join(settings.command[:2])} ...); an "
                f"overlay {side} ({spec.value}) {fix_docker}")
    if spec.kind in ("pip", "python") and not runs_python:
        return (f"{baseline}: the engine command {shlex.join(settings.command)!r} does not start with a python "
                f"interpreter, so a {spec.kind} {side} ({spec.value}) has nothing to replace; give the whole "
                f"command (command:/path/engine ...) or {fix_python}")
    if spec.kind in ("image", "script") and not docker:  # a script build ends as an image too
        return (f"{baseline}: the {what} runs as a local process ({shlex.join(settings.command[:2])} ...); an "
                f"image {side} ({spec.value}) {fix_docker}")
    return None
