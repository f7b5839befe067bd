"""Which design an A/B uses, and the shared-server one: two sides that start the same server, measured on one.

With fresh starts (search/regress/ab.py, the default) every round's difference holds each side's start: a
server start's own level, a few percent on the CPU machines (docs/calibration.md), which pairing cannot remove
because the two starts are different servers. When A and B differ only in request-side parameters (`side:
request` in the space: concurrency, rate, max_tokens, requests_per_stream, applied to the workloads and never to
the engine), their servers would be the same server; then one start serves both, and A's and B's runs
alternate on it, A B, B A, A B ... (request by request for one stream: a run of a workload is its requests), so
that the two sides of a pair meet the host's speed of the same seconds. A side's `repeats` consecutive runs make
a block, what one start of the fresh design measures; block r of A is paired with block r of B by the same
paired test, so the verdict is judged the same way (only each side's first run warms up: the server stays up).
What is gone is the start-to-start term. What the shared design cannot see: a request-side change whose effect
depends on the start (it is judged on this one server's start), and the server's quality, which is the same
server's on both sides (not compared).

`choose_design` picks: shared when the sides differ in request-side parameters and in nothing that reaches the
engine; otherwise fresh starts (or the kept servers of --keep-servers). Two identical configs (an A/A) keep fresh
starts, whose intervals hold the start-to-start spread a real launch-side change meets; `--design shared` asks
for the shared server anyway (an A/A of the shared design itself). Side by side (search/regress/side_by_side.py) is
never picked: only `--design side-by-side` asks for it (on 2 cores it measured noisier than fresh starts).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from harness.measure.workloads import WorkloadSpec
from harness.session import MeasureSettings
from search.regress.ab import ABRun, Progress, SaveRun, StopRule, Subject, run_interleaved
from search.regress.sides import SideResult
from search.space.space import Resolved

DESIGNS = ("auto", "shared", "fresh", "side-by-side")  # `search ab --design` (side-by-side: regress/side_by_side.py)
UNSET = "unset (the workload's own)"  # a request-side value one side leaves to its workloads


@dataclass(frozen=True)
class Design:
    """The design a comparison uses: "shared" (one server for both sides), "fresh" (a start per side per round),
    "kept" (each side started once, --keep-servers) or "side-by-side" (both started at once on their own CPUs),
    and the reason, said in the report."""

    name: str
    why: str


def _quiet(_: str) -> None:
    return None


def _values(a: Any, b: Any, unset: str = "None") -> str:
    return f"A {unset if a is None else repr(a)}, B {unset if b is None else repr(b)}"


def launch_differences(a: Resolved, b: Resolved) -> list[str]:
    """What differs in how A's and B's servers start: engine settings (command, image, launcher, CPUs, ...),
    model, engine flags, environment. Empty: one server can serve both."""
    out = []
    for f in fields(a.settings):
        va, vb = getattr(a.settings, f.name), getattr(b.settings, f.name)
        if va != vb:
            out.append(f"engine {f.name}: {_values(va, vb)}")
    if a.model != b.model:
        out.append(f"model: {_values(a.model.name, b.model.name)}" if a.model.name != b.model.name
                   else f"model {a.model.name}'s description")
    for what, da, db in (("flag", a.flags, b.flags), ("env", a.env, b.env)):
        for key in sorted(set(da) | set(db), key=str):
            if da.get(key) != db.get(key):
                out.append(f"{what} {key}: {_values(da.get(key), db.get(key))}")
    return out


def request_differences(a: Resolved, b: Resolved) -> list[str]:
    """The request-side parameters whose values differ between A and B ("max_tokens: A 16, B 64")."""
    return [f"{key}: {_values(a.request.get(key), b.request.get(key), UNSET)}"
            for key in sorted(set(a.request) | set(b.request)) if a.request.get(key) != b.request.get(key)]


def choose_design(a: Resolved, b: Resolved, asked: str = "auto", keep_servers: bool = False) -> Design:
    """The design for A vs B: `asked` is one of DESIGNS; raises ValueError for a shared server the sides cannot
    share."""
    if asked not in DESIGNS:
        raise ValueError(f"design {asked!r}: one of {', '.join(DESIGNS)}")
    launch, request = launch_differences(a, b), request_differences(a, b)
    if asked == "side-by-side":  # never chosen by auto: on the 2-core machine it measured noisier (docs/regression.md)
        if keep_servers:
            raise ValueError("--design side-by-side starts both sides every round: it does not go with --keep-servers")
        return Design("side-by-side", "A and B started at once every round, each on its own CPUs, as asked "
                                      "(--design side-by-side)")
    if asked == "shared":
        if launch:
            raise ValueError("--design shared: A and B do not start the same server (" + "; ".join(launch) + ")")
        return Design("shared", "one shared server, as asked (--design shared)"
                      + (f": A and B differ only in request-side parameters ({'; '.join(request)})" if request
                         else ": A and B are the same config"))
    if asked == "auto" and request and not launch:
        return Design("shared", f"one shared server: A and B differ only in request-side parameters "
                                f"({'; '.join(request)}), which need no restart")
    name = "kept" if keep_servers else "fresh"
    start = "each side started once (--keep-servers)" if keep_servers else "fresh starts every round"
    if asked == "fresh":
        return Design(name, f"{start}, as asked (--design fresh)")
    if launch:
        return Design(name, f"{start}: A and B start differently ({'; '.join(launch)})")
    return Design(name, f"{start}: A and B are the same config (an A/A keeps the start-to-start spread a "
                        "launch-side change meets; --design shared measures on one server)")


def run_shared(a: Subject, b: Subject, workloads_a: list[WorkloadSpec], workloads_b: list[WorkloadSpec],
               measure: MeasureSettings, rounds: int, work_dir: Path, progress: Progress = _quiet,
               stop: StopRule | None = None, earlier: ABRun | None = None, save: SaveRun | None = None) -> ABRun:
    """A and B on one server, `rounds` blocks a side of `measure.repeats` runs each, the runs alternating A B,
    B A, A B ... (request by request for one stream: a run of a workload is its requests), each side at its own
    workloads; only each side's first run warms up. Returns the run by blocks (`blocks_of`: block r of A paired
    with block r of B; `stop` looks at whole blocks), ABRun.design "shared". Raises ValueError when the sides do
    not start the same server. `earlier`, `save`: as run_interleaved's, on the run by turns (one run a side each):
    every finished turn is stored, and a stored run by turns goes on from its turns."""
    if launch := launch_differences(a, b):
        raise ValueError("a shared server needs A and B to start the same server: " + "; ".join(launch))
    runs = max(1, measure.repeats)
    turns = run_interleaved(a, b, workloads_a, replace(measure, repeats=1), rounds * runs, work_dir, None,
                            restart=False, progress=progress, stop=by_blocks(stop, runs) if stop else None,
                            workloads_b=workloads_b, shared=True, warm_once=True, earlier=earlier,
                            save=save)
    run = blocks_of(turns, runs)
    share_server(run)
    return run


def by_blocks(stop: StopRule, runs: int) -> StopRule:
    """`stop` asked only after whole blocks of `runs` turns, about the run by blocks (the plan's looks are in
    blocks); the looks and boundary it sets are kept on the run of turns."""
    def rule(turns: ABRun) -> str | None:
        if turns.rounds_done % runs:
            return None
        run = blocks_of(turns, runs)
        reason = stop(run)
        turns.looks, turns.boundary = run.looks, run.boundary
        return reason
    return rule


def _grouped(side: SideResult, runs: int, blocks: int) -> SideResult:
    """One side's turns (one run each) as `blocks` blocks of `runs`: a block's runs together, its counts summed,
    its per-turn values by their median."""
    out = replace(side, samples={}, runs={})
    for metric, per_turn in side.runs.items():
        out.runs[metric] = [[v for turn in per_turn[k * runs:(k + 1) * runs] for v in turn] for k in range(blocks)]
    for metric, values in side.samples.items():
        if metric == "startup.ready_s":
            out.samples[metric] = list(values)
            continue
        summed = metric.endswith((".errors", ".requests"))
        out.samples[metric] = [float(sum(chunk) if summed else statistics.median(chunk))
                               for k in range(blocks) if (chunk := values[k * runs:(k + 1) * runs])]
    return out


def blocks_of(turns: ABRun, runs: int) -> ABRun:
    """The run of one-run turns as whole blocks of `runs` turns a side (a last, unfinished block left out); the
    turns' order, load windows and errors kept."""
    blocks = turns.rounds_done // runs
    return replace(turns, a=_grouped(turns.a, runs, blocks), b=_grouped(turns.b, runs, blocks), rounds_done=blocks)


def share_server(run: ABRun) -> int:
    """Give B the one server's identity (command, fingerprint, startup log: A started it, B's turns reused it),
    and drop the startup time, which was measured once for both; how many servers were started (1 unless the
    server stopped between turns and a turn started another)."""
    started = run.a.log_paths + [p for p in run.b.log_paths if p not in run.a.log_paths]
    first = run.a if run.a.log_paths else run.b
    for side in (run.a, run.b):
        side.command, side.fingerprint = first.command, dict(first.fingerprint)
        side.startup, side.log_paths = dict(first.startup), list(started)
        side.samples.pop("startup.ready_s", None)
    return len(started)


def design_note(design: Design, run: ABRun) -> str:
    """The report's line on the design: which, why, and what its intervals hold."""
    if design.name == "shared":
        servers = len(run.a.log_paths)
        started = "1 server start" if servers == 1 else f"{servers} server starts (the server stopped between turns)"
        return (f"design: {design.why}; {started}, {run.rounds_done} blocks a side, their runs alternating A B, "
                "B A, ..., paired block by block: no start-to-start term in the intervals (they are about this "
                "server's start), quality not compared (the same server answers both)")
    if design.name == "side-by-side" and run.placement:
        first = run.placement[0]
        return (f"design: {design.why}; {run.rounds_done} rounds, the CPU lists swapped every round (round 1 A on "
                f"{first['A']} and B on {first['B']}, round 2 the other way, ...) so that a core's own speed cancels "
                "in the pairs; both sides of a pair measured in the same seconds (no turn-to-turn term), each beside "
                "the other's busy CPUs (what they share, caches, memory bandwidth and the client, is in the "
                "intervals)")
    return f"design: {design.why}"
