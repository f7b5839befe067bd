"""The side-by-side A/B design: each round starts A and B at once, each pinned to its own CPU list and on its own
port, measures both with the same workloads in the same seconds, stops both, and swaps the two CPU lists for the
next round.

Why: with fresh starts (search/regress/ab.py) A and B take turns, so a round's difference holds whatever the host
did between the two turns (a neighbour's burst, a tenant on the physical host). Side by side, both sides meet the
same seconds, and swapping the CPU lists every round (round 1 A on the first list and B on the second, round 2 the
other way, ...) makes a core's own speed cancel over each two rounds of the paired test, as ABBA's order cancels a
linear drift. What it adds: each side runs beside the other's busy CPUs, sharing the caches, memory bandwidth and
the client's CPU time with it. Where that costs more than the turn-to-turn term it removes (few cores, a
memory-bound decode), it is the noisier design: docs/regression.md says which design `auto` uses where, by what
was measured. The paired test is unchanged: round r of A against round r of B.

What it does not do: split devices. A GPU engine side by side would need a device per side (CUDA_VISIBLE_DEVICES
or the Docker launcher's `gpus` per side), which is not built; such sides are refused, and so is an engine on a
host with GPUs that does not say it leaves them alone (both sides would share one). A start that fails in a round
is recorded as the fresh design records it (the side's failure, the run's error, the rounds before kept); the
other side of that round measures nothing.
"""

from __future__ import annotations

import glob
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.host.hostload import LoadMeter
from harness.launch.cpus import format_cpu_list, machine_cpus, parse_cpu_list, physical_cores
from harness.launch.reaper import Terminated, stop_all
from harness.measure.workloads import WorkloadSpec
from harness.session import MeasureSettings, Session
from search.regress.ab import ABRun, Progress, SaveRun, StopRule, Subject, finish_round, measure_side
from search.regress.sides import SideResult

DESIGN = "side-by-side"
DEVICE_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
ACCELERATORS = ("/dev/nvidia[0-9]*", "/dev/kfd")  # an NVIDIA GPU, AMD's compute device


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class Placement:
    """The two CPU lists a side-by-side A/B swaps between, and where they came from (said in the report)."""

    first: frozenset[int]
    second: frozenset[int]
    source: str  # "--cpus-a/--cpus-b", or how the default split them

    def for_round(self, rnd: int) -> dict[str, str]:
        """Each side's CPU list in round `rnd` (0-based): A on the first list in even rounds, on the second in
        odd ones (B the other), so that each list's speed is on both sides of the pairs equally often."""
        lists = (format_cpu_list(self.first), format_cpu_list(self.second))
        return {"A": lists[rnd % 2], "B": lists[1 - rnd % 2]}


def host_accelerators() -> list[str]:
    """The GPU devices this machine shows (/dev/nvidia0, /dev/kfd), which a server may use unless told not to."""
    return sorted(path for pattern in ACCELERATORS for path in glob.glob(pattern))


def gpu_use(side: Subject) -> list[str]:
    """What in a side's launch names a GPU: the Docker launcher's `gpus` or `devices`, a device-selecting
    variable with a value, llama.cpp's offloaded layers."""
    env = {**side.settings.env, **side.env}
    out = [f"engine gpus {side.settings.gpus!r}"] if side.settings.gpus else []
    out += [f"engine devices {list(side.settings.devices)!r}"] if side.settings.devices else []
    out += [f"env {name}={env[name]!r}" for name in DEVICE_ENV if env.get(name, "").strip()]
    layers = side.flags.get("n_gpu_layers")
    if layers not in (None, 0, "0"):
        out.append(f"flag n_gpu_layers {layers!r}")
    return out


def stays_off_gpus(side: Subject) -> bool:
    """Whether a side says it leaves the GPUs alone: an empty CUDA_VISIBLE_DEVICES (or HIP_/ROCR_), or llama.cpp
    with no layer offloaded."""
    env = {**side.settings.env, **side.env}
    hidden = any(name in env and not env[name].strip() for name in DEVICE_ENV)
    return hidden or side.flags.get("n_gpu_layers") in (0, "0")


def _daemon_info() -> dict[str, Any]:
    from harness.launch.docker import DockerLauncher

    info: dict[str, Any] = DockerLauncher().client.info()
    return info


def _split(cpus: frozenset[int], cores: list[frozenset[int]], where: str) -> Placement:
    """Two lists of whole physical cores, as many a side, the lower-numbered half to the first; an odd core is
    left to the client (the tool's own process, which drives both sides)."""
    if len(cores) < 2:
        raise ValueError(f"--design side-by-side: {where} offers {format_cpu_list(cpus)}, "
                         f"{len(cores)} physical core: each side needs a core of its own (give --cpus-a and --cpus-b "
                         "to split the threads of a core anyway, or use --design fresh)")
    half = len(cores) // 2
    first = frozenset(c for core in cores[:half] for c in core)
    second = frozenset(c for core in cores[half:2 * half] for c in core)
    left = "" if len(cores) % 2 == 0 else f", CPU(s) {format_cpu_list(cores[-1])} left to the client"
    return Placement(first, second, f"{where} ({format_cpu_list(cpus)}) split into two halves of whole cores{left}")


def plan_placement(a: Subject, b: Subject, cpus_a: str | None = None, cpus_b: str | None = None,
                   available: Iterable[int] | None = None, accelerators: list[str] | None = None,
                   daemon_info: Callable[[], Mapping[str, Any]] = _daemon_info,
                   cores_of: Callable[[frozenset[int]], list[frozenset[int]]] = physical_cores) -> Placement:
    """The CPU lists for a side-by-side A/B: `cpus_a` and `cpus_b` as given (--cpus-a/--cpus-b), else the sides'
    own `cpus` (when both name the same), else this machine's CPUs (`available`, default machine_cpus; a Docker
    side's daemon's), split into two halves of whole physical cores. Raises ValueError naming the option when the
    lists overlap, name CPUs that a side's machine lacks, a side's Docker daemon cannot pin (no cpuset support),
    or a side would use a GPU (device splitting is not built; `accelerators`: this host's, default
    host_accelerators). `cores_of`: this machine's CPUs grouped by physical core."""
    if (cpus_a is None) != (cpus_b is None):
        raise ValueError("--cpus-a and --cpus-b go together: give both lists, or neither (the CPUs are then split "
                         "in two)")
    given: Placement | None = None
    if cpus_a is not None and cpus_b is not None:
        lists = {}
        for option, text in (("--cpus-a", cpus_a), ("--cpus-b", cpus_b)):
            try:
                lists[option] = parse_cpu_list(text)
            except ValueError as exc:
                raise ValueError(f"{option}: {exc}") from None
        given = Placement(lists["--cpus-a"], lists["--cpus-b"], "--cpus-a/--cpus-b")
        if shared := given.first & given.second:
            raise ValueError(f"--cpus-a {cpus_a} and --cpus-b {cpus_b} overlap (CPU(s) {format_cpu_list(shared)}): "
                             "side by side, each side needs CPUs of its own")
    for key, side in (("A", a), ("B", b)):
        if gpus := gpu_use(side):
            raise ValueError(f"--design side-by-side: {key} uses a GPU ({'; '.join(gpus)}); side by side splits CPUs, "
                             "not devices (a device per side, e.g. CUDA_VISIBLE_DEVICES per side, is not built): use "
                             "--design fresh")
    found = host_accelerators() if accelerators is None else accelerators
    if found and not (stays_off_gpus(a) and stays_off_gpus(b)):
        raise ValueError(f"--design side-by-side: this host has GPUs ({', '.join(found)}) and a side does not say it "
                         "leaves them alone, so both could share one: side by side splits CPUs, not devices. For CPU "
                         "engines set CUDA_VISIBLE_DEVICES to empty in both sides' env (or n_gpu_layers 0); else use "
                         "--design fresh")
    machines: dict[str, frozenset[int]] = {}
    for key, side in (("A", a), ("B", b)):
        if side.settings.launcher == "docker":
            info = daemon_info()
            if not info.get("CpuSet"):
                raise ValueError(f"--design side-by-side: {key}'s Docker daemon has no cpuset support (docker info: "
                                 "CpuSet false), so its containers cannot be kept on their CPU lists: use --design "
                                 "fresh")
            machines[f"{key}'s Docker daemon"] = frozenset(range(int(info.get("NCPU") or 0)))
        else:
            machines["this machine"] = frozenset(available) if available is not None else machine_cpus()
    if given is not None:
        placement = given
    elif a.settings.cpus and a.settings.cpus == b.settings.cpus:
        own = parse_cpu_list(a.settings.cpus)
        placement = _split(own, cores_of(own), "the sides' own cpus")
    else:
        have = frozenset.intersection(*machines.values())
        # A Docker daemon's cores are another machine's, perhaps: its CPUs by number there.
        cores = cores_of(have) if "this machine" in machines else [frozenset({cpu}) for cpu in sorted(have)]
        placement = _split(have, cores, " and ".join(machines))
    names = ("--cpus-a", "--cpus-b") if given else ("the first list", "the second list")
    for where, have in machines.items():  # swapped every round: each list runs on both sides' machines
        for option, cpus in zip(names, (placement.first, placement.second), strict=True):
            if missing := cpus - have:
                raise ValueError(f"{option} {format_cpu_list(cpus)} names CPU(s) {format_cpu_list(missing)} that "
                                 f"{where} does not offer (it has {format_cpu_list(have) or 'none'})")
    return placement


def pinned(subject: Subject, cpus: str) -> Subject:
    """The side with its server pinned to `cpus` (replacing the config's own `cpus`)."""
    return replace(subject, settings=replace(subject.settings, cpus=cpus))


class _PartnerFailed(Exception):
    """The other side of the round ended before its server was ready: this side measures nothing this round."""


def run_side_by_side(a: Subject, b: Subject, workloads_a: list[WorkloadSpec], workloads_b: list[WorkloadSpec],
                     measure: MeasureSettings, rounds: int, work_dir: Path, placement: Placement,
                     quality_suite: str | None = None, progress: Progress = _quiet, stop: StopRule | None = None,
                     earlier: ABRun | None = None, save: SaveRun | None = None) -> ABRun:
    """`rounds` rounds (or until `stop` gives a reason), each starting A and B at once on the round's CPU lists
    (`placement.for_round`), measuring both once both are ready, then stopping both. Returns ABRun.design
    "side-by-side", `placement` each round's lists, one load window a round. `earlier`, `save`: as
    run_interleaved's (a stored run goes on from its rounds, its swap order continued)."""
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    run = earlier or ABRun(SideResult(a.label, dialect=a.settings.dialect),
                           SideResult(b.label, dialect=b.settings.dialect), 0, design=DESIGN)
    sides = {"A": (a, run.a), "B": (b, run.b)}
    workloads = {"A": workloads_a, "B": workloads_b}
    sessions = {key: Session(_tagged(progress, key), keep_server=False) for key in sides}
    try:
        if not (run.stopped or run.errors):  # a stored run that had ended: nothing more to measure
            for rnd in range(run.rounds_done, rounds):
                if not _round(run, sides, rnd, rounds, placement, workloads, measure, work_dir, quality_suite,
                              sessions, progress):
                    break
                if finish_round(run, rnd, stop, save, progress):
                    break
    except (KeyboardInterrupt, Terminated) as exc:
        run.interrupted = "terminated" if isinstance(exc, Terminated) else "interrupted"
        progress(f"{run.interrupted} after {run.rounds_done} complete rounds: writing the partial report")
    finally:
        for session in sessions.values():
            session.close()
    return run


def _tagged(progress: Progress, key: str) -> Progress:
    def tagged(line: str) -> None:
        progress(f"{key}: {line}")
    return tagged


def _round(run: ABRun, sides: dict[str, tuple[Subject, SideResult]], rnd: int, rounds: int, placement: Placement,
           workloads: dict[str, list[WorkloadSpec]], measure: MeasureSettings, work_dir: Path,
           quality_suite: str | None, sessions: dict[str, Session], progress: Progress) -> bool:
    """One round, both sides at once; whether it completed (else its errors are in run.errors)."""
    cpus = placement.for_round(rnd)
    progress(f"round {rnd + 1}/{rounds}: A and B at once, A on CPU(s) {cpus['A']}, B on CPU(s) {cpus['B']}")
    both_ready = threading.Barrier(2)
    failures = {key: result.failure for key, (_, result) in sides.items()}
    meter = LoadMeter().start()  # probes the host's speed first: nothing of ours is busy yet
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="side-by-side")
    futures = {key: pool.submit(_side, key, pinned(subject, cpus[key]), result, rnd, workloads[key], measure,
                                work_dir, quality_suite, sessions[key], both_ready)
               for key, (subject, result) in sides.items()}
    try:
        outcome = {key: future.result() for key, future in futures.items()}
    except BaseException:  # Ctrl-C, SIGTERM (raised in this thread), or a side's unexpected error
        both_ready.abort()
        stop_all()  # ends a start or a measurement under way: the threads return soon
        pool.shutdown(wait=True)
        for key, (_, result) in sides.items():  # what the stop made the sides see is not their failure
            result.failure = failures[key]
        raise
    finally:
        run.load.append(meter.stop().to_dict())
    pool.shutdown()
    run.order.append("A+B")
    run.placement.append(cpus)
    errors = [error for error, _ in outcome.values() if error]
    run.errors += errors
    return not errors and all(measured for _, measured in outcome.values())


def _side(key: str, subject: Subject, result: SideResult, rnd: int, workloads: list[WorkloadSpec],
          measure: MeasureSettings, work_dir: Path, quality_suite: str | None, session: Session,
          both_ready: threading.Barrier) -> tuple[str | None, bool]:
    """One side's part of a round, in its own thread: (the error line or None, whether it measured)."""
    def ready() -> None:
        try:
            both_ready.wait()
        except threading.BrokenBarrierError:
            raise _PartnerFailed() from None

    try:
        return measure_side(key, subject, result, rnd, workloads, measure, work_dir, quality_suite, session, True,
                         ready=ready), True
    except _PartnerFailed:
        return None, False
    finally:
        both_ready.abort()  # a side that ended before the barrier releases the other; after it, harmless
