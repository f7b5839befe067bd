"""The host speed probe: a fixed piece of CPU work timed between a comparison's starts, and the note
that says when it varied (another tenant of a VM's physical host, invisible to the load meter)."""

from __future__ import annotations

import math

from harness.host.hostload import HOST_SPEED_RATIO, host_speed_note, load_note, speed_probe


def test_the_probe_times_real_work_in_milliseconds() -> None:
    probes = [speed_probe() for _ in range(3)]
    assert all(0 < p < 1000 and math.isfinite(p) for p in probes), probes


def test_a_steady_host_gets_no_note_and_a_varying_one_gets_its_range() -> None:
    calm = [5.1, 5.3, 5.0, 5.2, 5.4, 5.1]  # within 8%: a host to itself
    assert host_speed_note(calm) == ""
    # Probes of a 2-core VM on 2026-11-28: mostly ~5.5-6.2 ms, at times 3.5 ms (the sibling idle).
    seen = [4.87, 5.72, 3.76, 5.92, 6.25, 3.57, 5.92, 3.52]
    note = host_speed_note(seen)
    assert "3.5-6.2 ms (1.78x)" in note and "another tenant" in note
    assert max(seen) / min(seen) >= HOST_SPEED_RATIO


def test_too_few_probes_or_broken_ones_say_nothing() -> None:
    assert host_speed_note([3.0, 6.0, 3.0]) == ""  # three starts cannot tell a trend from a tick
    assert host_speed_note([5.0, 5.1, 0.0, math.nan, 5.2, 5.0]) == ""


def test_a_comparison_whose_turns_were_contended_says_so() -> None:
    """`search ab`/`regress` keep each turn's load window; over a quarter contended gives the note
    (the confirmation's rule for withholding), a quarter or fewer none."""
    quiet = {"wall_s": 4.0, "foreign_cores": 0.05, "cores": 2, "contended": False, "gpu_foreign_pids": []}
    busy = {**quiet, "foreign_cores": 0.93, "contended": True}
    assert load_note([quiet] * 6) == "" and load_note([]) == ""
    assert load_note([busy, quiet, quiet, quiet]) == ""  # one in four
    note = load_note([busy, quiet, {**busy, "foreign_cores": 1.4}, quiet])
    assert "not quiet in 2 of 4 turns" in note and "up to 1.40 of the 2 cores" in note and "quiet machine" in note
    gpu = {**quiet, "contended": True, "gpu_foreign_pids": [4242]}
    assert "other processes were on the GPU (4242)" in load_note([gpu, gpu])


def test_a_busy_gpu_engine_gets_no_cpu_speed_note_and_a_waiting_one_does() -> None:
    """The GPU machine's bisect: every probe warned of the CPU's speed while the GPU decoded at 0.3-1.9%
    noise. A warning about a resource the engine does not use teaches users to ignore warnings."""
    seen = [4.87, 5.72, 3.76, 5.92, 6.25, 3.57, 5.92, 3.52]  # a host whose CPU speed varied 1.78x

    def windows(util: float | None) -> list[dict[str, object]]:
        return [{"gpu_util_pct": util, "contended": False} for _ in seen]

    assert host_speed_note(seen, windows(97.0)) == ""  # the device was the bottleneck
    waiting = host_speed_note(seen, windows(35.0))  # the device waited on the host: the CPU matters
    assert "1.78x" in waiting and "GPU was busy only 35%" in waiting
    assert host_speed_note(seen, windows(None)) == host_speed_note(seen)  # a CPU engine: as before
