"""Confirmation before a verdict: the study's top configs and the default, re-measured with fresh
server starts, interleaved round-robin (each round starts every arm once, in a rotating order, so
drift and a noisy neighbour hit all arms alike), judged on within-round differences from the
default in the rounds where every arm was measured (search/verdicts/blocked.py: each arm by its own
differences' spread, the paired test every verb uses, since pooling the arms' noise made false winners
where one arm is noisier than the rest), with the false-alarm budget split over the claims (each top
config against the default; one study, one alpha; a positive control is tested at that same level
but is no claim: it is slower by construction and cannot make a false alarm), and stopped as soon as
every comparison is settled.

The positive control (the default behind a known slowdown) proves what the confirmation can see:
size it at the smallest effect the study claims to detect (spaces/smollm2-cpu.yaml: 10%), not at an effect so
large that any measurement finds it. The answer states the smallest change each comparison could
have seen at its measured noise.

The study's answer is the confirmed one: a ratio to the default with its interval, or "no config
is distinguishable from the default" when that is the truth, or a withheld verdict when programs
other than ours used a large share of the CPU while we measured.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.failure import TrialFailed
from harness.host.fingerprint import MATERIAL, material_differences
from harness.host.hostload import LoadMeter, LoadWindow, host_speed_note
from harness.measure.capacity import Slo
from harness.measure.natural_end import MARK as PAST_END
from harness.measure.stability import StabilityResult, run_stability
from harness.session import Session
from search.space.schema import CAPACITY
from search.space.space import Space
from search.store.results import TrialRecord, TrialState
from search.study.fresh_start import fixed_trial, measure_fresh
from search.study.scoring import measure_settings, slo_of
from search.verdicts import noise_store
from search.verdicts.blocked import compare_blocked
from search.verdicts.gate import DEFAULT_ALPHA, MetricVerdict
from search.verdicts.sequential import (
    MAX_PLANNED_ROUNDS,
    MIN_STARTS,
    family_alpha,
    paired_logs,
    quantisation_sd,
    rounds_needed,
    settled,
)

CONFIRM_ATTR = "confirmation"
STABILITY_ATTR = "stability"
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


@dataclass
class Arm:
    number: int  # the trial it confirms; a positive control has none (-1, -2, ...)
    label: str
    params: dict[str, Any]
    key: str = ""  # its verdict's key: the trial number, or "control1", ...
    control: dict[str, Any] = field(default_factory=dict)  # a positive control's overrides of the default
    runs: list[list[float]] = field(default_factory=list)  # per fresh start: the objective's run values
    failures: list[str] = field(default_factory=list)
    command: str = ""
    fingerprint: dict[str, Any] = field(default_factory=dict)  # material fields (MATERIAL) of its first start
    host: str = ""  # where it was measured (the noise store's setup: `record_noise`)


@dataclass
class Confirmation:
    metric: str
    direction: str
    default: int
    rounds: int
    wall_s: float
    arms: list[dict[str, Any]]  # Arm as dicts, the default first
    verdicts: dict[str, dict[str, Any]]  # Arm.key (trial number or "controlN") -> MetricVerdict.to_dict()
    load: list[dict[str, Any]]
    contended: bool
    answer: str
    winner: int | None  # the trial confirmed better than the default, if any
    controls: list[dict[str, Any]] = field(default_factory=list)  # per positive control: its overrides, detected
    continued_from: int = 0  # rounds of an earlier stored confirmation this one continued (0: none)
    stages: int = 1  # confirmations in the chain: each spent the study's alpha again
    # False while its plan is under way: stored after every finished round, so that a killed or
    # interrupted confirmation resumes from the rounds it measured (`resumable`).
    complete: bool = True
    plan: dict[str, Any] = field(default_factory=dict)  # min_rounds, max_rounds, looks: what a resume continues

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def candidates(records: list[TrialRecord], baseline: int | None, direction: str, top_k: int) -> list[TrialRecord]:
    """The top-k feasible completed configs by the first objective, the default excluded."""
    feasible = [r for r in records if r.state == TrialState.COMPLETE and r.objective_values is not None
                and all(c <= 0 for c in r.constraint_values) and r.number != baseline]
    sign = 1.0 if direction == "maximize" else -1.0
    return sorted(feasible, key=lambda r: sign * (r.objective_values or [0.0])[0], reverse=True)[:top_k]


def run_confirmation(space: Space, default: TrialRecord, tops: list[TrialRecord], work_dir: Path,
                     min_rounds: int = MIN_STARTS, max_rounds: int = 6, min_effect: float = 0.03,
                     progress: Progress = _quiet, earlier: dict[str, Any] | None = None,
                     save: Callable[[Confirmation], None] | None = None) -> Confirmation:
    """Re-measure `tops`, the space's positive controls and `default` with fresh starts,
    round-robin, until every comparison is settled or max_rounds. With `earlier` (a stored
    confirmation, `continuable`), continue its arms and rounds up to max_rounds in all instead.

    A continuation is a second sequential stage: the first stage's plan ended without crossing its
    boundary, so its false-alarm budget is spent (no threshold for later looks keeps the total at
    alpha). The new looks (rounds done + 1 .. max_rounds, on all rounds so far) get their own Pocock
    threshold at alpha, simulated for exactly that plan, and the answer says that over its stages the
    chance of a false call is at most stages x alpha. Continuing costs the same alpha as a new
    confirmation and saves its rounds.

    `save` gets the confirmation so far (`complete` False) after every finished round and, on
    Ctrl-C or SIGTERM, the rounds finished before it (the round under way is dropped: its arms
    cannot be paired), before the interrupt goes on. An `earlier` that is not `complete` is resumed
    instead of continued: the same stage and plan (its looks), from its stored rounds."""
    objective = space.m.objectives[0]
    if not tops and not space.m.confirm.controls and not earlier:  # no claim and no power check: all wasted
        answer, _ = confirmation_answer([], {}, False, objective.direction)
        return Confirmation(metric=objective.metric, direction=objective.direction, default=default.number,
                            rounds=0, wall_s=0.0, arms=[], verdicts={}, load=[], contended=False, answer=answer,
                            winner=None)
    arms = _arms(space, default, tops) if earlier is None else [Arm(**a) for a in earlier["arms"]]
    done = int(earlier["rounds"]) if earlier else 0
    resume = earlier is not None and not earlier.get("complete", True)
    if resume and earlier is not None:  # the interrupted stage goes on with its own plan
        plan = earlier["plan"]
        min_rounds, max_rounds, looks = int(plan["min_rounds"]), int(plan["max_rounds"]), tuple(plan["looks"])
        continued_from, stages = int(earlier.get("continued_from", 0)), int(earlier.get("stages", 1))
    else:
        looks = tuple(range(max(min_rounds, done + 1), max_rounds + 1))
        continued_from, stages = done, int(earlier.get("stages", 1)) + 1 if earlier else 1
    plan = {"min_rounds": min_rounds, "max_rounds": max_rounds, "looks": list(looks)}
    earlier_wall = float(earlier["wall_s"]) if earlier else 0.0
    earlier_load = list(earlier["load"]) if earlier else []
    loads: list[LoadWindow] = []
    verdicts: dict[str, MetricVerdict] = {}
    started = time.monotonic()
    rounds, kept_loads = done, 0
    steps = value_steps(space)

    def result(complete: bool) -> Confirmation:
        # A continuation judges the load and the host's speed over all its rounds, the stored ones too.
        windows = [*earlier_load, *(w.to_dict() for w in loads)]
        contended = _contended(windows)
        controls = [{"key": a.key, "overrides": a.control, "detected": _detected(verdicts.get(a.key))}
                    for a in arms if a.control]
        if complete:
            answer, winner = confirmation_answer(arms, verdicts, contended, objective.direction)
            answer += _past_end_caution(tops, winner, objective.metric)
            if continued_from:
                answer += (f" (continued from {continued_from} stored rounds: over its {stages} stages the chance "
                           f"of a false call is at most {100 * stages * DEFAULT_ALPHA:.0f}%, not "
                           f"{100 * DEFAULT_ALPHA:.0f}%)")
            if note := host_speed_note([float(w["probe_ms"]) for w in windows], windows):
                answer += f" ({note})"
        else:
            answer, winner = (f"not confirmed yet: {rounds} of at most {max_rounds} rounds measured and stored "
                              "(`search confirm STUDY` resumes them)"), None
        wall = round(time.monotonic() - started + earlier_wall, 1)
        return Confirmation(metric=objective.metric, direction=objective.direction, default=default.number,
                            rounds=rounds, wall_s=wall, arms=[asdict(a) for a in arms],
                            verdicts={k: v.to_dict() for k, v in verdicts.items()},
                            load=windows,
                            contended=contended, answer=answer, winner=winner, controls=controls,
                            continued_from=continued_from, stages=stages, complete=complete, plan=plan)

    with Session(progress, keep_server=False) as session:
        try:
            for rnd in range(done, max_rounds):
                order = arms[rnd % len(arms):] + arms[:rnd % len(arms)]
                failed = False
                # Rounds take alike (the same arms start each round): the mean so far times the rounds left.
                per_round = (time.monotonic() - started) / (rnd - done) if rnd > done else 0.0
                left = f" (at most about {per_round * (max_rounds - rnd) / 60:.0f} min left)" if per_round else ""
                for arm in (order if rnd % 2 == 0 else order[::-1]):
                    progress(f"confirmation round {rnd + 1}/{max_rounds}{left}: {arm.label}")
                    meter = LoadMeter().start()
                    arm.runs.append(_measure(session, space, arm, work_dir / f"r{rnd:02d}-{arm.label}"))
                    loads.append(meter.stop())
                    # An arm that failed to start or measure leaves nothing to compare this round: the other
                    # arms' starts (12 minutes each for a large model) would be wasted.
                    failed = not arm.runs[-1]
                    if failed:
                        break
                rounds, kept_loads = rnd + 1, len(loads)
                if failed:
                    break
                verdicts = judge(arms, objective.metric, objective.direction, min_effect, looks, steps)
                if save is not None:
                    save(result(complete=False))  # a kill from here on keeps this round
                if rounds >= min_rounds and all(settled(v) for v in verdicts.values()):
                    break
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (Terminated): keep the finished rounds, then go on
            # The round under way cannot be paired: the values of the arms it started are dropped.
            for a in arms:
                del a.runs[rounds:]  # runs hold the stored rounds too: `rounds` counts them
            del loads[kept_loads:]
            if save is not None:
                save(result(complete=False))
            raise
    final = result(complete=True)
    record_noise(arms, objective.metric, rounds - done if not resume else rounds - continued_from)
    return final


def record_noise(arms: list[Arm], metric: str, new_rounds: int) -> int:
    """Add each top config's round differences from the default to the noise store (search/verdicts/noise_store.py),
    under the setup a paired `search ab` or `regress` of it would use, so that a later study's stop rule prices its
    confirmation at this setup's start noise. Only the rounds this call measured (a continuation's stored rounds
    were added by the call that measured them), only where every arm was measured and none failed, and not the
    positive controls (a slowed default: the same noise, but it says nothing a top config does not). How many
    arms were added."""
    if new_rounds < 2 or any(a.failures for a in arms) or not arms or not arms[0].host:
        return 0
    rounds = min(len(a.runs) for a in arms)
    added = 0
    for arm in arms[1:]:
        if arm.control:
            continue
        pairs = paired_logs(arms[0].runs[rounds - new_rounds:rounds], arm.runs[rounds - new_rounds:rounds])
        key = noise_store.key_for({**arms[0].fingerprint, "host": arms[0].host}, metric)
        added += noise_store.add(key, [b - a for a, b in pairs], "confirm") is not None
    return added


def judge(arms: list[Arm], metric: str, direction: str, min_effect: float,
          looks: tuple[int, ...], steps: dict[str, tuple[float, float]] | None = None) -> dict[str, MetricVerdict]:
    """Each arm against the default (arms[0]) at the claims' level, on the rounds where every arm was
    measured (search/verdicts/blocked.py), for a plan of looks at these round counts. `steps`: the resolution
    (relative, in units) of metrics whose values move in coarse steps (`value_steps`)."""
    runs = [a.runs for a in arms]
    relative, unit = (steps or {}).get(metric, (0.0, 0.0))
    floor = quantisation_sd([v for arm in runs for start in arm for v in start], relative, unit)
    return {arm.key: compare_blocked(metric, runs, i, direction="higher" if direction == "maximize" else "lower",
                                     min_effect=min_effect, alpha=comparison_alpha(arms), looks=looks, floor_sd=floor)
            for i, arm in enumerate(arms) if i}


def value_steps(space: Space) -> dict[str, tuple[float, float]]:
    """Coarse metrics' steps (relative, in units): a capacity is whole streams, its search stopping at
    `Slo.finest_gap` (harness/measure/capacity.py: resolution x load, at least finest_gap(0) streams)."""
    slo = slo_of(space)
    return {CAPACITY: (slo.resolution, slo.finest_gap(0.0))} if slo is not None else {}


def _arms(space: Space, default: TrialRecord, tops: list[TrialRecord]) -> list[Arm]:
    """The default first, then the top configs, then the space's positive controls."""
    arms = [Arm(r.number, "default" if r.number == default.number else f"#{r.number}", dict(r.params),
                key=str(r.number)) for r in [default, *tops]]
    arms += [Arm(-(i + 1), f"control{i + 1}", {**default.params, **{k: v for k, v in overrides.items()
                                                                   if k != "slowdown"}},
                 key=f"control{i + 1}", control=dict(overrides))
             for i, overrides in enumerate(space.m.confirm.controls)]
    return arms


def resumable(earlier: dict[str, Any] | None) -> bool:
    """Whether a stored confirmation is one whose plan was cut short (killed, Ctrl-C): its finished
    rounds are stored and `run_confirmation` resumes them."""
    return bool(earlier) and earlier is not None and earlier.get("complete", True) is False \
        and isinstance(earlier.get("plan"), dict) and isinstance(earlier.get("arms"), list)


def continuable(earlier: dict[str, Any] | None, metric: str) -> str | None:
    """Why a stored confirmation cannot be continued, or None when it can: its arms must all have
    been measured in every round, for the metric the space now ranks by."""
    if not earlier or not earlier.get("arms"):
        return "the study has no stored confirmation to continue: run `search confirm` first"
    if resumable(earlier):
        return (f"the stored confirmation was interrupted after {earlier.get('rounds')} of its rounds: "
                "`search confirm` without --more-rounds resumes it first")
    if earlier.get("metric") != metric:
        return f"the stored confirmation measured {earlier.get('metric')}, the space now ranks by {metric}"
    rounds = int(earlier.get("rounds", 0))
    short = [a["label"] for a in earlier["arms"] if a.get("failures") or len(a.get("runs", [])) != rounds]
    if short:
        return (f"{', '.join(short)} failed or was not measured in every stored round: its rounds cannot be "
                "paired, so run a new confirmation")
    return None


def _past_end_caution(tops: list[TrialRecord], winner: int | None, metric: str) -> str:
    """A confirmed winner whose trial found its speculative acceptance differ past the answers' own
    ends (harness/measure/natural_end.py): its speed on real traffic may differ from the window's. A note
    from another workload than the one the answer ranks by (`metric`'s) says so: it may come from the
    single stream while the answer ranks four streams."""
    notes = [w for r in tops if r.number == winner for w in r.warnings if PAST_END in w]
    if not notes:
        return ""
    workload = metric.split(".")[0]
    own = [w for w in notes if w.startswith(f"{workload}:")]
    if own:
        return f"; caution, from its trial: {own[0]}"
    return f"; caution, from its trial's other workload (the answer ranks {workload}): {notes[0]}"


def comparison_alpha(arms: list[Arm], alpha: float = DEFAULT_ALPHA) -> float:
    """Each comparison's level: the study's alpha split over its claims (each top config against
    the default, arms[0]). A positive control is slower by construction: its "no difference"
    hypothesis is false, so it cannot make a false alarm and takes no share; it is tested at the
    claims' level, the level whose power it has to show."""
    return family_alpha(alpha, sum(1 for arm in arms[1:] if not arm.control))


def _detected(verdict: MetricVerdict | None) -> bool:
    """A positive control is detected when the gate calls it worse than the default."""
    return verdict is not None and verdict.verdict == "regressed"


def _measure(session: Session, space: Space, arm: Arm, log_dir: Path) -> list[float]:
    """One fresh start of the arm; [] when it failed, or when its engine environment is not the one
    of its earlier starts (a continuation after an engine upgrade): such rounds cannot be paired."""
    try:
        fresh = measure_fresh(session, space, arm.params, log_dir, arm.control.get("slowdown"),
                              space.m.confirm.repeats)
    except TrialFailed as exc:
        arm.failures.append(str(exc))
        return []
    arm.command = fresh.command
    material = {k: fresh.fingerprint.get(k) for k in MATERIAL}
    if arm.fingerprint and (changed := material_differences(arm.fingerprint, material)):
        arm.failures.append("its engine environment is not the one of its earlier rounds (" + "; ".join(changed)
                            + "): they cannot be paired, run a new confirmation")
        return []
    arm.fingerprint = arm.fingerprint or material
    arm.host = arm.host or str(fresh.fingerprint.get("host", ""))
    return fresh.values


def _contended(windows: list[dict[str, Any]]) -> bool:
    """Contended when other programs' CPU exceeded the threshold in over a quarter of the windows
    (LoadWindow.to_dict() each)."""
    return bool(windows) and sum(bool(w.get("contended")) for w in windows) > len(windows) / 4


def confirmation_answer(arms: list[Arm], verdicts: dict[str, MetricVerdict], contended: bool,
            direction: str) -> tuple[str, int | None]:
    failed = [a for a in arms if a.failures]
    if failed:
        return ("not confirmed: " + "; ".join(f"{a.label} failed ({a.failures[-1][:120]})" for a in failed)), None
    controls = {a.key: a for a in arms if a.control}
    tops = {k: v for k, v in verdicts.items() if k not in controls}
    checks = [_control_text(controls[k], verdicts.get(k)) for k in controls]
    missed = [k for k in controls if not _detected(verdicts.get(k))]
    suffix = ("; " + "; ".join(checks)) if checks else ""
    if not tops:
        return "nothing to confirm: no feasible config besides the default" + suffix, None
    lines = [f"#{k}: {_ratio_text(v)} the default ({v.verdict})" for k, v in tops.items()]
    if contended:
        return ("verdict withheld: other programs used much of the CPU while confirming, so the ranking may be "
                "the load's; measured: " + "; ".join(lines) + suffix), None
    better = [(k, v) for k, v in tops.items() if v.verdict == "improved"]
    if missed and not better:
        return ("verdict withheld: the positive control was not found worse, so this confirmation could not see "
                "a real difference; measured: " + "; ".join(lines) + suffix
                + _rounds_hint([(controls[k], verdicts[k]) for k in missed if k in verdicts],
                               comparison_alpha(arms))), None
    if better:
        sign = 1.0 if direction == "maximize" else -1.0
        key, best = max(better, key=lambda kv: sign * kv[1].ratio)
        answer = f"confirmed: #{key} is {_ratio_text(best)} the default" + suffix
        if missed:
            # A missed control says the power for its effect was lacking; a difference found at the
            # family's level stands (the false-alarm rate does not depend on power), only smaller
            # ones went unseen, so the answer says how large a difference it could see.
            answer += ("; the control's difference was not seen, so only a difference this large is confirmed"
                       + _unseen_size(best, [verdicts[k] for k in missed if k in verdicts])
                       + ": configs closer than that to each other are not ranked")
        return answer, int(key)
    if all(v.verdict in ("unchanged", "inconclusive") for v in tops.values()):
        seen = max((v.mde for v in tops.values() if math.isfinite(v.mde)), default=math.nan)
        could = f" (this confirmation could detect {100 * seen:.0f}% or more)" if math.isfinite(seen) else ""
        return ("no config is distinguishable from the default" + could + "; " + "; ".join(lines) + suffix
                + _narrow_hint([v for v in tops.values() if v.verdict == "inconclusive"], list(controls.values()),
                               comparison_alpha(arms))), None
    # Some configs were found worse and none better. "The default stays best" only where every one was found
    # worse: an inconclusive one was not shown worse (nor unchanged: within min_effect), so it is named as such.
    worse = [k for k, v in tops.items() if v.verdict == "regressed"]
    if len(worse) == len(tops):
        return "the default stays best: every config measured worse; " + "; ".join(lines) + suffix, None
    open_ = [v for v in tops.values() if v.verdict == "inconclusive"]
    rest = (f"; not distinguishable from the default: {', '.join('#' + k for k, v in tops.items() if v in open_)}"
            if open_ else "")
    return (f"no config is better than the default: {', '.join('#' + k for k in worse)} measured worse{rest}; "
            + "; ".join(lines) + suffix + _narrow_hint(open_, list(controls.values()), comparison_alpha(arms))), None


def _narrow_hint(unsettled: list[MetricVerdict], controls: list[Arm], alpha: float) -> str:
    """For top configs left inconclusive: the rounds in all that would likely see a difference of
    the size the study claims to detect (its smallest slowdown control), and the command that
    continues this confirmation to them. Nothing when no slowdown control sizes the claim."""
    sizes = [size for a in controls if (size := _nominal_difference(a))]
    spread = max((v.cv for v in unsettled if math.isfinite(v.cv)), default=math.nan)
    if not sizes or not math.isfinite(spread):
        return ""
    effect, done = min(sizes), max(v.n_a for v in unsettled)
    need = rounds_needed(spread, effect, alpha, first=done + 1)
    if need is None:
        return (f"; to see a difference of {100 * effect:.0f}% (the control's nominal size) at this noise would "
                f"take more than {MAX_PLANNED_ROUNDS} rounds")
    return (f"; about {need} rounds in all would see a difference of {100 * effect:.0f}% (the control's nominal "
            f"size) at this noise ({_continue_command(need, done)})")


def _nominal_difference(arm: Arm) -> float:
    """How much faster the default is than a slowdown control of fraction F: F / (1 - F); 0 for a
    control that is no slowdown (its size is not known)."""
    fraction = float(arm.control.get("slowdown") or 0.0)
    return fraction / (1.0 - fraction) if fraction else 0.0


def _continue_command(need: int, done: int) -> str:
    return f"`search confirm STUDY --more-rounds {need - done}` continues these {done}"


def _rounds_hint(missed: list[tuple[Arm, MetricVerdict]], alpha: float) -> str:
    """How many rounds in all would likely find the missed slowdown controls' nominal difference at
    the spread of round differences just measured (the plan-aware count of every "about N rounds"),
    and the command that continues this confirmation to them (a second stage: `run_confirmation`);
    when the rounds done should already have found it, that instead."""
    hints: list[tuple[int, str]] = []
    for arm, verdict in missed:
        nominal, done = _nominal_difference(arm), verdict.n_a
        if not nominal or not math.isfinite(verdict.cv):
            continue
        need = rounds_needed(verdict.cv, nominal, alpha, first=done + 1)
        if need is None:
            hints.append((MAX_PLANNED_ROUNDS + 1, f"; at this noise even {MAX_PLANNED_ROUNDS} rounds would likely "
                          "not find the control's difference: this host is too noisy for a verdict now"))
            continue
        more = _continue_command(need, done)
        if (rounds_needed(verdict.cv, nominal, alpha) or need) > done:
            hints.append((need, f"; at this noise about {need} rounds in all would find the control's "
                                f"difference ({more})"))
        else:
            measured = 100 * (1.0 / verdict.ratio - 1.0) if verdict.ratio > 0 else math.nan
            hints.append((need, f"; at this noise {done} rounds should have found the control's nominal "
                                f"{100 * nominal:.0f}%, yet it measured {measured:.0f}%: a chance miss or a blind "
                                f"measurement, which more rounds tell apart ({more})"))
    return max(hints)[1] if hints else ""


def _unseen_size(best: MetricVerdict, missed: list[MetricVerdict]) -> str:
    """The difference the confirmation could see, when a control was missed: the larger of the
    winner's and the missed controls' detectable changes. A winner's comparison can be quiet by luck
    (one slow start that falls in the same round as the default's cancels) while the control's is
    not; the smaller number alone would claim to see what the control showed it did not."""
    mine = best.mde if math.isfinite(best.mde) else 0.0
    theirs = max((v.mde for v in missed if math.isfinite(v.mde)), default=0.0)
    if theirs <= mine:
        return f" (about {100 * mine:.0f}% or more at this noise)" if mine else ""
    alone = f"; the winner's comparison alone about {100 * mine:.0f}%" if mine else ""
    return f" (about {100 * theirs:.0f}% or more at the control's noise{alone})"


def _control_text(arm: Arm, verdict: MetricVerdict | None) -> str:
    what = ", ".join(f"{k}={v}" for k, v in arm.control.items())
    if verdict is None:
        return f"positive control ({what}) not compared"
    found = "found worse" if _detected(verdict) else f"NOT found worse ({verdict.verdict})"
    return f"positive control ({what}): {_ratio_text(verdict)} the default, {found}" + _beyond_nominal(arm, verdict)


def _beyond_nominal(arm: Arm, verdict: MetricVerdict) -> str:
    """A slowdown control measured clearly slower than its nominal (1 - F)x: the proxy that delays
    every byte costs the machine CPU too (on 2 cores at ~130 tok/s, 0.83x for a nominal 0.90x), so
    finding it shows the power for its measured difference, not for F."""
    fraction = float(arm.control.get("slowdown") or 0.0)
    if not fraction or not (math.isfinite(verdict.ci_low) and math.isfinite(verdict.ci_high)):
        return ""
    # Throughput x (1 - F); a time (latency) x 1 / (1 - F).
    nominal = 1.0 - fraction if verdict.direction == "higher" else 1.0 / (1.0 - fraction)
    beyond = verdict.ci_high < nominal if verdict.direction == "higher" else verdict.ci_low > nominal
    if not beyond:
        return ""
    size = abs(1.0 - verdict.ratio) if verdict.direction == "higher" else abs(1.0 - 1.0 / verdict.ratio)
    return (f" (more than its nominal {nominal:.2f}x: the server runs slower behind the delaying proxy on this "
            f"host; it shows the power for a "
            f"{100 * size:.0f}% difference, not {100 * fraction:.0f}%)")


def _ratio_text(v: MetricVerdict) -> str:
    if not math.isfinite(v.ratio):
        return "not comparable with"
    return f"{v.ratio:.2f}x ({v.level_text} {v.ci_low:.2f}-{v.ci_high:.2f}, {v.n_b} rounds)"


def stability_load(space: Space, record: TrialRecord) -> tuple[str, int]:
    """(workload, concurrency) a stability run holds: the SLO's workload at the config's measured
    capacity, else the first objective's (or the first) workload at its own concurrency."""
    names = [w.name for w in space.m.workloads]
    if space.m.slo is not None:
        name = space.m.slo.workload or names[0]
        capacity = int(record.metrics.get("capacity.concurrency") or 0)
        if capacity > 0:
            return name, capacity
    else:
        base = space.m.objectives[0].metric.partition(".")[0].partition("@")[0]
        name = base if base in names else names[0]
    spec = next(w for w in space.workload_specs() if w.name == name)
    return name, spec.concurrency


def run_stability_check(space: Space, record: TrialRecord, work_dir: Path, duration_s: float,
                        progress: Progress = _quiet) -> StabilityResult:
    """Hold `record`'s config at its capacity (stability_load) for `duration_s` on a fresh start:
    errors, the server's death and its cause, SLO misses, throughput drift (harness/measure/stability.py)."""
    config = space.sample(fixed_trial(record.params))
    req = space.request(config, work_dir, fresh=True)
    name, concurrency = stability_load(space, record)
    spec = next(w for w in space.workload_specs() if w.name == name)
    slo = slo_of(space) or Slo({})
    progress(f"stability: #{record.number} at concurrency {concurrency} on {name} for {duration_s / 60:.1f} min")
    with Session(progress) as session:
        try:
            return run_stability(session, req, spec, concurrency, duration_s, slo, measure_settings(space), progress)
        except TrialFailed as exc:
            return StabilityResult(concurrency, duration_s, 0.0, failure=f"did not start: {exc}")
