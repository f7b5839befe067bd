"""Interleaved A/B measurement: A B, B A, A B ... so that drift and a noisy neighbour hit both sides.

One round measures each side once; with `restart` (the default) each side's server is started
fresh in every round, so a sample is one server session. That is the honest unit: on these
machines the spread across server starts is larger than within one, and two long-lived servers
can differ by a session effect that a per-request comparison would call a regression. Every run's
value is kept (`SideResult.runs`, grouped by start), and the verdicts pair round r of A with round r
of B (search/verdicts/sequential.py compare_paired: the shared drift of a round cancels). The order
alternates per round (ABBA...), which cancels a linear drift. With a `stop` rule (`sequential_stop`)
the run ends as soon as every gated metric is settled at the plan's error rates, `rounds` being the
cap. The gated metrics share one false-alarm budget (alpha split over those that can reject at their share:
`run_share`); `regress` asks one-sided (is B worse?), `ab` both ways (`SequentialPlan.sides`).
Quality is checked on the first QUALITY_STARTS starts of each side. A run stopped by Ctrl-C or
SIGTERM returns what it measured (`ABRun.interrupted`) so that its partial report is written. Every
finished round is handed to `save` as it ends (the callers store it: search/regress/rounds.py), and a
stored run (`earlier`) goes on from its rounds: a run killed at any moment loses only the round under way.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.failure import Cause, TrialFailed
from harness.host.fingerprint import material_differences
from harness.host.hostload import LoadMeter, host_speed_note, load_note
from harness.launch.reaper import Terminated
from harness.measure.workloads import WorkloadSpec
from harness.quality.quality import QualityModel
from harness.session import LaunchFailed, Measurement, MeasureSettings, QualityPlan, Session
from search.regress.gate_report import GateReport
from search.regress.log_diff import log_diff
from search.regress.sides import SideResult
from search.space.space import Config, Resolved, Space
from search.verdicts import noise_store
from search.verdicts.boundaries import looks_text
from search.verdicts.gate import DEFAULT_ALPHA, DEFAULT_CONFIDENCE, DEFAULT_MIN_EFFECT, MetricVerdict, compare
from search.verdicts.sequential import (
    MIN_STARTS,
    boundary_text,
    compare_errors,
    compare_paired,
    compare_quality,
    family_share,
    least_error_p,
    least_quality_p,
    paired_logs,
    settled,
)

Progress = Callable[[str], None]
QUALITY_STARTS = 2  # one start's answers cannot tell a lost check from a flaky one


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class Subject(Resolved):
    """One side of a comparison: its config resolved (engine settings, model, flags, env; `run_request`
    starts it), the engine build swapped where asked, and the side's label."""

    label: str = ""


def subject_from(space: Space, config: Config, label: str, command: str | None = None, python: str | None = None,
                 image: str | None = None, env: Mapping[str, str] | None = None,
                 flags: Mapping[str, Any] | None = None) -> Subject:
    """A side from a pinned config, with the engine build swapped where asked.

    python: another engine environment's interpreter (replaces the command's interpreter);
    command: a whole new engine command line (e.g. another llama-server binary);
    image: another container image (docker launcher).
    """
    base = space.resolve(config)
    settings = base.settings
    if python:
        cmd = list(settings.command)
        if not settings.python or cmd[0] != settings.python:
            raise ValueError(f"{label}: the engine command {' '.join(cmd)!r} does not start with a python "
                             "interpreter; use the command option instead")
        if not Path(python).exists():
            raise ValueError(f"{label}: no interpreter at {python}")
        settings = replace(settings, command=(python, *cmd[1:]), python=python)
    if command:
        argv = shlex.split(command)
        if not argv:
            raise ValueError(f"{label}: empty command")
        # An interpreter running an engine module (python -m vllm...) is the engine environment to
        # fingerprint; a python running a wrapper script is not.
        engine_python = argv[0] if Path(argv[0]).name.startswith("python") and "-m" in argv[1:2] else None
        settings = replace(settings, command=tuple(argv), python=engine_python)
    if image:
        if settings.launcher != "docker":
            raise ValueError(f"{label}: an image needs the docker launcher (the config uses {settings.launcher!r})")
        settings = replace(settings, image=image)
    return Subject(config=config, settings=settings, model=base.model, flags={**base.flags, **(flags or {})},
                   env={**base.env, **(env or {})}, request=base.request, label=label)


@dataclass
class ABRun:
    a: SideResult
    b: SideResult
    rounds_done: int
    order: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    looks: list[int] = field(default_factory=list)  # the sequential plan: starts per side at each look
    boundary: str = "pocock"  # its thresholds (search.verdicts.boundaries.BOUNDARY_KINDS)
    stopped: str = ""  # why a sequential run ended before its cap
    interrupted: str = ""  # "interrupted" (Ctrl-C) or "terminated" (SIGTERM): the report is partial
    # "fresh" (a start per side per round), "kept" (each side started once), "shared" (one server for both
    # sides, search/regress/shared_server.py) or "side-by-side" (A and B started at once on their own CPUs,
    # search/regress/side_by_side.py): what the rounds' differences hold of the start-to-start spread
    design: str = "fresh"
    load: list[dict[str, Any]] = field(default_factory=list)  # each turn's LoadWindow.to_dict()
    placement: list[dict[str, str]] = field(default_factory=list)  # side-by-side: each round's CPU list per side

    @property
    def host_probe_ms(self) -> list[float]:
        """harness.host.hostload.speed_probe before each turn (its load window opens with it)."""
        return [float(w["probe_ms"]) for w in self.load]

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a.to_dict(), "b": self.b.to_dict(), "rounds_done": self.rounds_done,
                "order": self.order, "errors": self.errors, "looks": self.looks, "boundary": self.boundary,
                "stopped": self.stopped, "interrupted": self.interrupted, "design": self.design,
                "host_probe_ms": self.host_probe_ms, "load": self.load, "placement": self.placement}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ABRun:
        """A run as `to_dict` wrote it (a stored run to go on from)."""
        return cls(a=SideResult.from_dict(data["a"]), b=SideResult.from_dict(data["b"]),
                   rounds_done=int(data["rounds_done"]), order=list(data.get("order", [])),
                   errors=list(data.get("errors", [])), looks=[int(n) for n in data.get("looks", [])],
                   boundary=str(data.get("boundary", "pocock")), stopped=str(data.get("stopped", "")),
                   interrupted=str(data.get("interrupted", "")), design=str(data.get("design", "fresh")),
                   load=list(data.get("load", [])), placement=[dict(p) for p in data.get("placement", [])])


StopRule = Callable[[ABRun], str | None]
SaveRun = Callable[[ABRun], None]


@dataclass(frozen=True)
class SequentialPlan:
    """Stop an interleaved run once every gated metric is settled; look after each round from
    `min_rounds` on (or only after `looks_at` and the cap), at most `max_rounds` rounds. The verdicts use
    the boundary of exactly this plan."""

    metrics: tuple[str, ...]
    max_rounds: int
    min_rounds: int = MIN_STARTS
    min_effect: float = DEFAULT_MIN_EFFECT
    alpha: float = DEFAULT_ALPHA  # for the whole family of gated metrics together
    looks_at: tuple[int, ...] = ()  # look only after these rounds (and the cap); empty: after every round
    boundary: str = "pocock"  # the looks' thresholds (search.verdicts.boundaries.BOUNDARY_KINDS)
    sides: int = 2  # 1: the question is "is B worse?" (regress, nightly), the whole alpha on "regressed"

    @property
    def looks(self) -> tuple[int, ...]:
        first = min(self.min_rounds, self.max_rounds)
        if self.looks_at:
            return tuple(sorted({n for n in self.looks_at if first <= n < self.max_rounds} | {self.max_rounds}))
        return tuple(range(first, self.max_rounds + 1))


def sequential_stop(plan: SequentialPlan) -> StopRule:
    """The stop rule for run_interleaved: a reason to stop, or None to go on."""
    def rule(run: ABRun) -> str | None:
        run.looks, run.boundary = list(plan.looks), plan.boundary
        if run.rounds_done not in plan.looks:
            return None
        each = run_share(run, list(plan.metrics), plan.alpha, plan.sides)
        verdicts = [verdict_for(run, m, plan.min_effect, each, plan.looks, sides=plan.sides) for m in plan.metrics]
        if all(settled(v) for v in verdicts):
            return (f"settled after {run.rounds_done} rounds: "
                    + ", ".join(f"{v.metric} {v.verdict}" for v in verdicts))
        return None
    return rule


def run_interleaved(a: Subject, b: Subject, workloads: list[WorkloadSpec], measure: MeasureSettings, rounds: int,
                    work_dir: Path, quality_suite: str | None = None, restart: bool = True,
                    progress: Progress = _quiet, stop: StopRule | None = None,
                    workloads_b: list[WorkloadSpec] | None = None, shared: bool = False,
                    warm_once: bool = False, earlier: ABRun | None = None, save: SaveRun | None = None) -> ABRun:
    """Measure A and B in alternating order for `rounds` rounds (or until `stop` gives a reason).
    Each side runs through its own harness.session.Session (so `restart=False` keeps both servers), or with
    `shared` both through one that keeps one server for both (sides whose launch is the same:
    search/regress/shared_server.py); no server outlives the call. `workloads_b`: B's own workloads where its
    request-side values differ from A's (default: `workloads`). `warm_once`: only each side's first turn warms
    up (a server that stays up is warm after it; a resumed run's first turn warms up again). `earlier`: a
    stored run of the same plan, continued from its rounds (the order goes on alternating where it stopped);
    `save` gets the run after every finished round, its stop rule applied, never with a round half done."""
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    run = earlier or ABRun(SideResult(a.label, dialect=a.settings.dialect),
                           SideResult(b.label, dialect=b.settings.dialect), 0,
                           design="shared" if shared else "fresh" if restart else "kept")
    sides = {"A": (a, run.a), "B": (b, run.b)}
    if shared:
        one = Session(progress, keep_server=True)
        sessions = {"A": one, "B": one}
    else:
        sessions = {key: Session(progress, keep_server=not restart) for key in sides}
    each = {"A": workloads, "B": workloads if workloads_b is None else workloads_b}
    try:
        _rounds(sides, run, each, measure, rounds, work_dir, quality_suite, restart and not shared, progress, stop,
                sessions, warm_once, save)
    except (KeyboardInterrupt, Terminated) as exc:
        run.interrupted = "terminated" if isinstance(exc, Terminated) else "interrupted"
        progress(f"{run.interrupted} after {run.rounds_done} complete rounds: writing the partial report")
    finally:
        for session in sessions.values():
            session.close()
    return run


def _rounds(sides: dict[str, tuple[Subject, SideResult]], run: ABRun, workloads: dict[str, list[WorkloadSpec]],
            measure: MeasureSettings, rounds: int, work_dir: Path, quality_suite: str | None, restart: bool,
            progress: Progress, stop: StopRule | None, sessions: dict[str, Session], warm_once: bool = False,
            save: SaveRun | None = None) -> None:
    if run.stopped or run.errors:  # a stored run that had ended: nothing more to measure
        return
    first = run.rounds_done  # a resumed run starts its servers again: their first turn warms up
    for rnd in range(first, rounds):
        settings = replace(measure, warmup=False) if warm_once and rnd > first else measure
        for key in (("A", "B") if rnd % 2 == 0 else ("B", "A")):
            subject, result = sides[key]
            progress(f"round {rnd + 1}/{rounds}: {key} ({subject.label})")
            meter = LoadMeter().start()  # probes the host's speed first: nothing of ours is busy yet
            try:
                error = measure_side(key, subject, result, rnd, workloads[key], settings, work_dir, quality_suite,
                                     sessions[key], restart)
            finally:
                run.load.append(meter.stop().to_dict())
            run.order.append(key)
            if error:
                run.errors.append(error)
                return
        if finish_round(run, rnd, stop, save, progress):
            break


def finish_round(run: ABRun, rnd: int, stop: StopRule | None, save: SaveRun | None, progress: Progress) -> bool:
    """A round measured on both sides: counted, the stop rule asked, the run saved (so a kill after this loses
    nothing), the reason said. True when the run stops here. Every design's round loop ends its rounds so."""
    run.rounds_done = rnd + 1
    reason = stop(run) if stop is not None else None
    if reason:
        run.stopped = reason
    if save is not None:
        save(run)
    if reason:
        progress(reason)
    return bool(reason)


def measure_side(key: str, subject: Subject, result: SideResult, rnd: int, workloads: list[WorkloadSpec],
                 measure: MeasureSettings, work_dir: Path, quality_suite: str | None, session: Session,
                 restart: bool, ready: Callable[[], None] | None = None) -> str | None:
    """One side's turn in a round: Session.run (`ready`: as its), then its values added to the side's samples;
    the error line when the side failed (its start's failure recorded in `result.failure`), else None."""
    log_dir = work_dir / f"{key}-round{rnd + 1:02d}"
    request = subject.run_request(log_dir, restart)
    quality = (QualityPlan(QualityModel(suite=quality_suite), None, measure.request_timeout_s)
               if quality_suite and len(result.quality_starts) < QUALITY_STARTS else None)
    try:
        measured = session.run(request, workloads, measure, quality, ready=ready)
    except LaunchFailed as exc:
        line = deciding_line(exc)
        result.command = result.command or exc.command
        result.failure = {"side": key, "round": rnd + 1, "command": exc.command, "cause": exc.cause,
                          "line": line, "log": exc.log_path or str(log_dir / "server.log")}
        return f"{key} did not start in round {rnd + 1}: {exc.cause}: {line}"
    except TrialFailed as exc:
        if exc.failure.cause != Cause.DEGENERATE_OUTPUT or not isinstance(exc.partial, Measurement):
            return f"{key} ({subject.label}) {exc.cause} in round {rnd + 1}: {exc.detail}"
        measured = exc.partial  # garbage answers are a quality result here, judged against the other side
    if not measured.reused_server:
        result.log_paths.append(measured.log_path)
        result.add("startup.ready_s", measured.ready_s)
        if not result.startup:
            result.startup = asdict(measured.startup)
            result.fingerprint = dict(measured.fingerprint)
            result.command = measured.command
    for wname, wm in measured.workloads.items():
        for metric, stat in wm.summary.items():
            if metric != "errors":  # per run; the round's count of failed requests is below
                result.add(f"{wname}.{metric}", stat.median)
        for metric in {k for s in wm.counted for k in s.metrics} - {"errors", "requests"}:
            values = [s.metrics[metric] for s in wm.counted if metric in s.metrics]
            result.runs.setdefault(f"{wname}.{metric}", []).append(values)
        result.add(f"{wname}.errors", float(wm.errors))
        if wm.steady is not None:
            result.steady.setdefault(wname, []).append(wm.steady.to_dict())
        result.add(f"{wname}.requests", float(sum(s.metrics.get("requests", 0.0) for s in wm.samples)))
        result.warnings.extend(f"{wname}: {w}" for w in wm.warnings if f"{wname}: {w}" not in result.warnings)
        result.placebo.extend(p for p in wm.placebo if p not in result.placebo)
    if measured.quality is not None:
        result.quality_starts.append(measured.quality.to_dict())
        result.quality = result.quality or result.quality_starts[0]
    return None


def measure_alone(subject: Subject, workloads: list[WorkloadSpec], measure: MeasureSettings, rounds: int,
                  work_dir: Path, quality_suite: str | None = None, progress: Progress = _quiet,
                  earlier: SideResult | None = None, done: int = 0,
                  save: Callable[[SideResult, int], None] | None = None) -> SideResult:
    """One config, `rounds` fresh server starts (the sample unit a baseline file stores). `earlier`: the
    `done` rounds of a stored run, continued; `save` gets the result and its rounds after every round."""
    result = earlier or SideResult(subject.label, dialect=subject.settings.dialect)
    with Session(progress, keep_server=False) as session:
        for rnd in range(done, rounds):
            progress(f"round {rnd + 1}/{rounds}")
            error = measure_side("A", subject, result, rnd, workloads, measure, work_dir, quality_suite, session, True)
            if error:
                raise LaunchFailed("measure", error, [], subject.label)
            if save is not None:
                save(result, rnd + 1)
    return result


def deciding_line(exc: LaunchFailed) -> str:
    """The log line that says why a start failed: the engine's classified line, else the last log line
    that reads like an error (the launcher's own detail, e.g. "exited with status 1", says nothing)."""
    if exc.cause not in ("exited", "timeout"):
        return exc.detail
    errors = [ln.strip() for ln in exc.log_tail if re.search(r"\berror\b|^\S+ E |fatal|failed", ln, re.I)]
    return f"{errors[0]} ({exc.detail})" if errors else exc.detail


# Reported next to the gated metrics (never decide the exit code unless asked for with --metric).
REPORTED = ("decode_tok_s", "output_tok_s", "stream_tok_s", "ttft_p50_s", "tpot_p50_s", "e2e_p50_s")


def report_from_run(run: ABRun, title: str, gated: list[str], min_effect: float = DEFAULT_MIN_EFFECT,
                    alpha: float = DEFAULT_ALPHA, confidence: float = DEFAULT_CONFIDENCE, sides: int = 2) -> GateReport:
    """Verdicts for every gated metric (plus errors) and the usual latency/throughput metrics; sides 1 where the
    question is "is B worse?" (regress, nightly), 2 both ways (ab)."""
    names = family(run, gated)
    workloads = sorted({m.split(".", 1)[0] for m in run.a.samples if "." in m} - {"startup"})
    shown = [f"{w}.{leaf}" for w in workloads for leaf in REPORTED] + ["startup.ready_s"]
    verdicts = []
    looks = tuple(run.looks) or None
    each = run_share(run, gated, alpha, sides)
    for metric in names + [m for m in shown if m not in names]:
        is_gated = metric in names
        if metric not in run.a.samples and metric not in run.b.samples:
            if is_gated and not metric.endswith(".errors"):
                verdicts.append(compare(metric, [], [], min_effect=min_effect, alpha=each, confidence=confidence))
            continue
        verdicts.append(verdict_for(run, metric, min_effect, each if is_gated else alpha, looks, gated=is_gated,
                                    confidence=confidence, sides=sides))
    # A side that never started has no startup log or fingerprint: comparing against its empty ones
    # would list every field as a difference.
    both_started = bool(run.a.fingerprint) and bool(run.b.fingerprint)
    allowed = ("cpus",) if run.design == "side-by-side" else ()  # side by side, the CPU lists differ by design
    report = GateReport(title=title, label_a=run.a.command or run.a.label, label_b=run.b.command or run.b.label,
                        verdicts=verdicts, errors=list(run.errors),
                        log_diff=log_diff(run.a, run.b, allowed) if both_started else [],
                        failed_sides=[s.failure for s in (run.a, run.b) if s.failure])
    if both_started:
        report.fingerprint_differences = material_differences(run.a.fingerprint, run.b.fingerprint, allowed)
    if run.a.quality_starts and run.b.quality_starts:
        report.quality = quality_report(run.a.quality_starts, run.b.quality_starts, each, sides)
    for side in (run.a, run.b):
        report.notes += [f"{side.label}: {p}" for p in side.placebo]
    how = (f"sequential: looks at {looks_text(looks)} rounds{boundary_text(run.boundary)}"
           if looks and len(looks) > 1 else "one look")
    rounds = (f"{run.rounds_done} side-by-side rounds (A and B at once, CPU lists swapped every round)"
              if run.design == "side-by-side"
              else f"{run.rounds_done} interleaved rounds (order {' '.join(run.order)})")
    report.notes.append(f"{rounds}; "
                        f"min effect {100 * min_effect:.1f}%, alpha {alpha} for all gated metrics together, "
                        + ("one-sided (the question is whether B is worse: the whole share on 'regressed')"
                           if sides == 1 else "two-sided") + f"; {share_text(run, gated, alpha, each)}"
                        + f"; paired t test over rounds, {how}"
                        + (f"; {run.stopped}" if run.stopped else ""))
    kept = run.rounds_done >= 2 and all(len(s.samples.get("startup.ready_s", [])) == 1 for s in (run.a, run.b))
    if kept:
        report.notes.append(ONE_START)
    if note := host_speed_note(run.host_probe_ms, run.load):
        report.notes.append(note)
        if unpinned := kept_unpinned_note(kept, (run.a.fingerprint, run.b.fingerprint)):
            report.notes.append(unpinned)
    if busy := load_note(run.load):
        report.notes.append(busy)
    if run.interrupted:
        report.errors.append(f"{run.interrupted} after {run.rounds_done} complete rounds: a partial report "
                             "(the verdicts are those of the rounds done); the same command resumes from them")
    return report


ONE_START = ("each side was started once (--keep-servers): the intervals are about these two servers; a start's own "
             "level, a few percent on these machines, is in none of them (a nightly's drift is not judged so)")
# docs/regression.md ("Interleaving"): an A/A bisect probe of kept, unpinned llama-servers read -22% so.
KEPT_UNPINNED = ("both servers were kept running, not pinned, while the host's speed varied: each may have sat on "
                 "a differently slowed CPU for the whole run, an offset that pairing by round cannot remove; give "
                 "both sides the same CPUs (engine option cpus) or start them fresh each round")


def kept_unpinned_note(kept: bool, fingerprints: Sequence[dict[str, Any]]) -> str:
    """KEPT_UNPINNED for kept servers (one start per side over several rounds) neither of which was pinned to
    CPUs (fingerprint `cpus`); '' otherwise. For a host whose speed varied (harness.host.hostload.host_speed_note)."""
    return KEPT_UNPINNED if kept and not any(fp.get("cpus") for fp in fingerprints) else ""


def family(run: ABRun, gated: list[str]) -> list[str]:
    """The gated metrics of a run: the ones asked for plus every workload's error rate."""
    names = list(dict.fromkeys(gated))
    workloads = sorted({m.split(".", 1)[0] for m in (*run.a.samples, *gated) if "." in m} - {"startup"})
    return names + [f"{w}.errors" for w in workloads if f"{w}.errors" not in names]


def family_size(run: ABRun, gated: list[str]) -> int:
    """How many verdicts share the run's false-alarm budget: the gated metrics, every workload's error
    rate, and quality where both sides were checked. The stop rule and the report count the same."""
    return len(family(run, gated)) + (1 if run.a.quality_starts and run.b.quality_starts else 0)


def run_share(run: ABRun, gated: list[str], alpha: float, sides: int = 2) -> float:
    """Each gated verdict's share of the run's alpha (search/verdicts/sequential.py `family_share`): only the
    verdicts that can reject at their share count, an error count at the requests and failures seen, quality at
    the checks whose result differs. The stop rule and the report count the same."""
    continuous, least = 0, []
    for metric in family(run, gated):
        req = metric[: -len("errors")] + "requests"
        if metric.endswith(".errors") and req in run.a.samples and req in run.b.samples:
            failed = int(sum(run.a.samples.get(metric, [])) + sum(run.b.samples.get(metric, [])))
            least.append(least_error_p(failed, int(sum(run.a.samples[req])), int(sum(run.b.samples[req])), sides))
        else:
            continuous += 1
    if run.a.quality_starts and run.b.quality_starts:
        differing = quality_report(run.a.quality_starts, run.b.quality_starts, alpha, sides)["test"]["discordant"]
        least.append(least_quality_p(differing))
    return family_share(alpha, continuous, least, sides)


def share_text(run: ABRun, gated: list[str], alpha: float, each: float) -> str:
    """What the report says of the split (`run_share`)."""
    total, shares = family_size(run, gated), max(1, round(alpha / each))
    return (f"{each:.3g} each ({alpha:g}/{shares}" + (f": of the {total} gated verdicts, error and quality counts that "
            "could not reject at such a share, at the requests, failures and differing checks seen, take none)"
            if shares < total else ")"))


def quality_report(starts_a: list[dict[str, Any]], starts_b: list[dict[str, Any]], alpha: float,
                   sides: int = 2) -> dict[str, Any]:
    """Quality of both sides over their checked starts, judged by the quality test (McNemar), not by a
    bare drop in score: a check counts as passed on a side where it passed in most of its starts."""
    def by_check(starts: list[dict[str, Any]]) -> dict[str, list[bool]]:
        out: dict[str, list[bool]] = {}
        for q in starts:
            for c in q.get("checks", []):
                out.setdefault(c["name"], []).append(bool(c.get("passed")))
        return out

    passed_a, passed_b = by_check(starts_a), by_check(starts_b)
    test = compare_quality(passed_a, passed_b, alpha, sides)
    scores = [[float(q["score"]) for q in starts if q.get("score") is not None] for starts in (starts_a, starts_b)]
    return {"suite": starts_a[0].get("suite"),
            "score_a": min(scores[0]) if scores[0] else None, "score_b": min(scores[1]) if scores[1] else None,
            "starts_a": len(starts_a), "starts_b": len(starts_b), "failed_b_only": test["lost"], "test": test}


def verdict_for(run: ABRun, metric: str, min_effect: float, alpha: float, looks: tuple[int, ...] | None,
                gated: bool = True, confidence: float = DEFAULT_CONFIDENCE, sides: int = 2) -> MetricVerdict:
    """One metric's verdict: runs grouped by start where they were kept, errors as rates, else the
    per-round values (e.g. startup.ready_s, or an ABRun read back from an older file)."""
    a, b = run.a, run.b
    if metric.endswith(".errors"):
        req = metric[: -len("errors")] + "requests"
        if req in a.samples and req in b.samples:
            return compare_errors(metric, int(sum(a.samples.get(metric, []))), int(sum(a.samples[req])),
                                  int(sum(b.samples.get(metric, []))), int(sum(b.samples[req])), alpha, gated,
                                  sides, looks)
    if metric in a.runs and metric in b.runs:
        prior = noise_store.prior(noise_key(run, metric)) if gated and noise_store.borrowing() else None
        return compare_paired(metric, a.runs[metric], b.runs[metric], min_effect=min_effect, alpha=alpha,
                              looks=looks, gated=gated, boundary=run.boundary, prior=prior, sides=sides)
    if metric == "startup.ready_s" and metric in a.samples and metric in b.samples:
        return compare_paired(metric, [[v] for v in a.samples[metric]], [[v] for v in b.samples[metric]],
                              min_effect=min_effect, alpha=alpha, looks=looks, gated=gated, boundary=run.boundary,
                              sides=sides)
    return compare(metric, a.samples.get(metric, []), b.samples.get(metric, []), min_effect=min_effect, alpha=alpha,
                   confidence=confidence, gated=gated)


def noise_key(run: ABRun, metric: str) -> str:
    """The noise store's setup of a metric in this run (search/verdicts/noise_store.py `key_for`): host, engine, model,
    workload (kept servers and one shared server apart: their rounds hold no start-to-start spread), metric."""
    if run.design in ("shared", "side-by-side"):  # no start-to-start term, or both sides' at once: keys of their own
        workload, _, leaf = metric.partition(".")
        return noise_store.key_for(run.a.fingerprint, f"{workload}+{run.design}.{leaf}")
    kept = 0 < len(run.a.samples.get("startup.ready_s", [])) < run.rounds_done
    return noise_store.key_for(run.a.fingerprint, metric, kept)


def record_noise(run: ABRun, gated: list[str], source: str) -> int:
    """Add a finished run's round differences of each gated metric to the noise store; how many were added. A run
    cut short or with a side that failed adds nothing (its rounds may not be a whole run's)."""
    if run.interrupted or run.a.failure or run.b.failure:
        return 0
    added = 0
    for metric in gated:
        if metric in run.a.runs and metric in run.b.runs:
            diffs = [b - a for a, b in paired_logs(run.a.runs[metric], run.b.runs[metric])]
            added += noise_store.add(noise_key(run, metric), diffs, source) is not None
    return added
