"""`search confirm STUDY`: re-measure the study's top configs beside the default with fresh
starts, interleaved, and store the confirmed verdict in the study (shown by show/best/report).
`--more-rounds N` continues the stored confirmation instead (a second stage: search/confirm/confirm.py);
`--rounds N` measures exactly N rounds and judges once (no early stop: the narrowest interval for that time).
`--stability 30m` then holds the winner at its capacity load and stores the stability run."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from harness.launch.reaper import Terminated, stop_all
from search.confirm.confirm import (
    CONFIRM_ATTR,
    STABILITY_ATTR,
    Confirmation,
    Progress,
    candidates,
    continuable,
    resumable,
    run_confirmation,
    run_stability_check,
)
from search.exit_codes import Exit
from search.space.space import Space, load_space
from search.store.results import ResultsError, TrialRecord, TrialState
from search.store.storage import storage_for
from search.store.summary import StudyView, load_view
from search.terminal import err, safe
from search.terminal import out as console
from search.verdicts.sequential import MIN_STARTS


def confirm_study(study: optuna.Study, space: Space, results_dir: Path, top_k: int, max_rounds: int,
                  progress: Progress, more_rounds: int = 0, fixed_rounds: int = 0) -> Confirmation | None:
    """Confirm and store; None when the study has no default trial to compare with. `more_rounds`:
    continue the stored confirmation by up to that many rounds instead (its arms, not the top_k).
    `fixed_rounds`: measure exactly that many rounds and judge once, at the end (max_rounds ignored)."""
    view = load_view(study)
    default = view.baseline
    if default is None or default.state != TrialState.COMPLETE:
        return None
    objective = space.m.objectives[0]
    stored = stored_confirmation(study)
    earlier = stored if more_rounds else None
    if not more_rounds and resumable(stored) and stored is not None and stored.get("metric") == objective.metric:
        # A confirmation killed or interrupted after some rounds: those rounds are kept, its plan goes on.
        earlier = stored
        numbers = {int(a["number"]) for a in stored["arms"]}
        tops = [r for r in view.records if r.number in numbers and r.number != default.number]
        progress(f"resuming the interrupted confirmation: {stored['rounds']} of at most "
                 f"{stored['plan']['max_rounds']} rounds are stored")
    elif more_rounds:
        if why := continuable(earlier, objective.metric):
            raise ResultsError(f"cannot continue the confirmation: {why}")
        assert earlier is not None
        numbers = {int(a["number"]) for a in earlier["arms"]}
        tops = [r for r in view.records if r.number in numbers and r.number != default.number]
        max_rounds = int(earlier["rounds"]) + more_rounds
    else:
        tops = candidates(view.records, view.baseline_number, objective.direction, top_k)
    # A fixed plan is a single look: its threshold is the whole false-alarm budget, so its interval is
    # narrower than a sequential plan's after as many rounds (that plan pays for stopping early).
    min_rounds = fixed_rounds or MIN_STARTS

    def store(result: Confirmation) -> None:
        # The answer's suggested command names this study, ready to paste.
        result.answer = result.answer.replace("search confirm STUDY", f"search confirm {study.study_name}")
        study.set_user_attr(CONFIRM_ATTR, result.to_dict())

    # Stored after every round too (`save`): a confirmation killed after two rounds resumes from those two.
    result = run_confirmation(space, default, tops, results_dir / "confirm", min_rounds=min_rounds,
                              max_rounds=fixed_rounds or max_rounds, progress=progress, earlier=earlier, save=store)
    store(result)
    return result


def stored_confirmation(study: optuna.Study) -> dict[str, Any] | None:
    data = study.user_attrs.get(CONFIRM_ATTR)
    return data if isinstance(data, dict) else None


def interrupted_line(study: optuna.Study) -> str:
    """The one line a Ctrl-C (or SIGTERM) during a confirmation ends with."""
    stored = stored_confirmation(study) or {}
    rounds = int(stored.get("rounds", 0)) if resumable(stored) else 0
    return (f"[yellow]interrupted[/]: servers stopped; {rounds} finished confirmation round(s) are stored; "
            f"`search confirm {safe(study.study_name)}` resumes them")


def confirmed_line(view: StudyView, study: optuna.Study) -> str:
    """One line for show/best: the confirmed answer, or why there is none yet."""
    data = stored_confirmation(study)
    if data is None:
        return "unconfirmed: run `search confirm` to re-measure the top configs beside the default"
    return f"{data['answer']} ({data['rounds']} rounds, {data['wall_s']} s)"


def duration_s(text: str) -> float:
    """'30m', '90s', '1h', '45' (seconds) -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"a duration like 30m, 90s or 1h, got {text!r}")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def stability_target(view: StudyView, space: Space, winner: int | None) -> TrialRecord | None:
    """The confirmed winner, else the best feasible measured config (the default included)."""
    if winner is not None:
        return next((r for r in view.records if r.number == winner), None)
    objective = space.m.objectives[0]
    tops = candidates(view.records, None, objective.direction, 1)
    return tops[0] if tops else None


def rounds_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number of rounds, `low` or more."""
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < low:
            raise argparse.ArgumentTypeError(f"a whole number of rounds, {low} or more, got {text!r}")
        return int(text)
    return parse


def cmd_confirm(args: argparse.Namespace) -> int:
    storage, name = storage_for(args.study, args.storage)
    study = optuna.load_study(study_name=name, storage=storage)
    source = args.space or study.user_attrs.get("space_source")
    if not source or not Path(str(source)).exists():
        raise ResultsError("the study does not name a space file that exists here; give --space FILE")
    space = load_space(str(source))
    results_dir = Path(args.results) / name
    progress = lambda text: err.print(f"  {safe(text)}")  # noqa: E731  (progress on stderr)
    answer = (lambda text: None) if args.json else (lambda text: console.print(safe(text)))
    shown: dict[str, Any] = {"study": name}
    winner = (stored_confirmation(study) or {}).get("winner")
    code = Exit.PASS
    if not args.stability_only:
        confirm = space.m.confirm
        top = confirm.top_k if args.top is None else args.top
        max_rounds = confirm.max_rounds if args.max_rounds is None else args.max_rounds
        try:
            result = confirm_study(study, space, results_dir, top, max_rounds, progress, args.more_rounds,
                                   args.rounds)
        except KeyboardInterrupt as exc:
            stop_all()
            err.print(interrupted_line(study))
            return Exit.TERMINATED if isinstance(exc, Terminated) else Exit.INTERRUPTED
        if result is None:
            raise ResultsError("the study has no completed default trial to confirm against")
        answer(result.answer)
        shown["confirmation"] = result.to_dict()
        winner = result.winner
    if args.stability is not None:
        target = stability_target(load_view(study), space, winner if isinstance(winner, int) else None)
        if target is None:
            raise ResultsError("no measured config to hold under load")
        held = run_stability_check(space, target, results_dir / "stability" / f"{target.number:04d}",
                                   args.stability, progress)
        study.set_user_attr(STABILITY_ATTR, {"trial": target.number, **held.to_dict()})
        answer(f"#{target.number} {held.summary()}")
        shown["stability"] = {"trial": target.number, **held.to_dict()}
        code = Exit.PASS if held.failure is None and held.errors == 0 else Exit.REGRESSION
    if args.json:
        print(json.dumps(shown, default=str))
    return code


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("confirm", help="re-measure the top configs beside the default (fresh starts, "
                                              "interleaved) and store the confirmed verdict")
    p.add_argument("study", help="results folder (results/NAME) or study name")
    p.add_argument("--storage")
    p.add_argument("--space", help="the space file (default: the one the study was created from)")
    p.add_argument("-o", "--out", "--results", dest="results", default="results", metavar="DIR",
                   help="results folder (default: ./results; --results is the old name)")
    p.add_argument("--top", type=int, help="how many of the best configs to confirm (default: the space's "
                                           "confirm.top_k)")
    rounds = p.add_mutually_exclusive_group()
    rounds.add_argument("--max-rounds", type=rounds_at_least(MIN_STARTS),
                        help="fresh starts per config at most; it stops sooner once every comparison is settled "
                             "(default: the space's confirm.max_rounds)")
    rounds.add_argument("--rounds", type=rounds_at_least(MIN_STARTS), default=0, metavar="N",
                        help="exactly N rounds, judged once at the end: no early stop, and the narrowest interval "
                             "for that time (a sequential plan pays for the chance to stop early)")
    rounds.add_argument("--more-rounds", type=rounds_at_least(1), default=0, metavar="N",
                        help="continue the stored confirmation (same configs, its rounds kept) by up to N rounds; "
                             "a second stage with its own false-alarm budget, which the answer states")
    p.add_argument("--stability", type=duration_s, metavar="DURATION",
                   help="then hold the winner (the confirmed one, else the best) at its capacity load for "
                        "DURATION (30m, 90s, 1h): errors, server death, SLO misses, throughput drift")
    p.add_argument("--json", action="store_true", help="print the confirmation (and the stability run) as one "
                                                       "JSON object")
    p.add_argument("--stability-only", action="store_true",
                   help="skip the confirmation rounds: only the stability run (with --stability)")
    p.set_defaults(func=cmd_confirm)
