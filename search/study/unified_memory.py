"""Unified memory (DGX Spark / GB10): free memory is read before every start, and a start refused for
memory that something else holds is told apart from a config that does not fit.

On a unified-memory device the OS, the page cache, other programs and the GPU share one pool. After
a 76 GB checkpoint was read the page cache holds most of it, and on GB10 the memory the GPU reports
free drops below MemAvailable: the next start can fail vLLM's start check ("Free memory on device
... is less than desired GPU memory utilization") although the config fits an idle machine. So:

- before every start the free memory is measured again (`MemoryGuard.before_start`), and where the
  engine's share is larger than what is free while the page cache holds the difference, the page
  cache is dropped if the user allows it (`search run --drop-page-cache`, or the space's
  `device.drop_page_cache` command); the command it runs is said once;
- a start that fails for memory while less than the engine's share was free at start is a failure
  of the machine, not of the config (`MEMORY_HELD`): it is re-tried once after measuring again
  (and dropping the page cache where allowed); if it fails again it is recorded with that cause,
  kept out of the budget and hidden from the sampler, so the config is neither ranked as bad nor
  never tried again.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from typing import TypeVar

from harness.engines import get_engine
from harness.failure import Failure, TrialFailed
from search.space.space import Config, Resolved, Space
from search.study.memory_fit import LocalMemory, free_at_start

T = TypeVar("T")
MEMORY_HELD = "memory_held"  # a failure cause: memory another process or the page cache held at start
# What `--drop-page-cache` runs where the space names no command of its own (root, or sudo without a
# password): write back dirty pages, then drop the clean page cache, dentries and inodes.
DROP_PAGE_CACHE = ("sh", "-c", "sync && if [ \"$(id -u)\" = 0 ]; then echo 3 > /proc/sys/vm/drop_caches; "
                   "else echo 3 | sudo -n tee /proc/sys/vm/drop_caches >/dev/null; fi")
# Start failures that mean "not enough memory" in any engine's words.
_MEMORY_LINES = re.compile(r"Free memory on device .* is less than desired|out of memory|OutOfMemory|"
                           r"cannot allocate memory|less than requested memory|No available memory for the cache|"
                           r"insufficient memory|failed to allocate", re.I)


class MemoryGuard:
    def __init__(self, space: Space, say: Callable[[str], None], drop_page_cache: Sequence[str] | None = None):
        self.space = space
        self.say = say
        device = space.m.device
        command = drop_page_cache or (device.drop_page_cache if device else None)
        self.drop_command: tuple[str, ...] | None = tuple(command) if command else None
        self._said = False
        self.last: LocalMemory | None = None  # free memory at the latest start
        self.refused_in_a_row = 0  # trials whose start was refused twice for memory held elsewhere

    def share_gb(self, config: Config | Resolved) -> float | None:
        """The memory the engine asks for at start (device memory x its share), where known."""
        device = self.space.m.device
        if device is None or device.memory_gb is None:
            return None
        resolved = self.space.resolve(config)
        settings = resolved.settings
        util = get_engine(settings.dialect).memory_knobs(settings, resolved.flags).utilization
        return device.memory_gb * (util if util is not None else device.default_utilization)

    def before_start(self, config: Config | Resolved) -> LocalMemory | None:
        """Free memory now (None where the device is not this machine); the page cache dropped first
        where it holds memory the engine's share needs and the user allows it."""
        free = free_at_start(self.space)
        share = self.share_gb(config)
        if free is not None and share is not None and free.free_gb < share and free.page_cache_gb > 0 \
                and self.drop_command:
            self._drop()
            free = free_at_start(self.space)
        self.last = free
        return free

    def _drop(self) -> None:
        if not self._said:
            self.say("unified memory: the page cache holds memory an engine needs; dropping it before such "
                     f"starts with: {' '.join(self.drop_command or ())}")
            self._said = True
        try:
            subprocess.run(self.drop_command or (), check=True, capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as exc:
            self.say(f"unified memory: dropping the page cache failed ({exc}); starting anyway")

    def held(self, config: Config | Resolved, failure: Failure) -> str | None:
        """Why a failed start was the machine's memory, not the config's (None: it was the config):
        it failed for memory while less than the engine's share was free at start."""
        text = " ".join([failure.cause, failure.detail, *failure.log_tail])
        if failure.cause not in ("oom", "kv_too_small", MEMORY_HELD) and not _MEMORY_LINES.search(text):
            return None
        share, free = self.share_gb(config), self.last
        if share is None or free is None or free.free_gb >= share:
            return None
        held = free.total_gb - free.free_gb
        return (f"the engine asked for {share:.1f} GB; {free.free_gb:.1f} of {free.total_gb:.1f} GB were free at "
                f"start ({free.page_cache_gb:.1f} GB page cache, {held:.1f} GB held by other programs and "
                "the cache)")


def retry_if_memory_held(guard: MemoryGuard, config: Config | Resolved, start: Callable[[], T],
                         phase: Callable[[str], None]) -> T:
    """`start()`, re-tried once (after measuring again) when it was refused for memory held
    elsewhere; refused again, a TrialFailed with cause MEMORY_HELD."""
    try:
        out = start()
    except TrialFailed as exc:
        why = guard.held(config, exc.failure)
        if why is None:
            raise
        phase(f"start refused for memory held elsewhere ({why}): re-trying once")
        guard.before_start(config)
        try:
            out = start()
        except TrialFailed as again:
            why_again = guard.held(config, again.failure)
            if why_again is None:
                raise
            guard.refused_in_a_row += 1
            failure = Failure(MEMORY_HELD, f"start refused twice for memory held elsewhere: {why_again}; not this "
                              "config's fault (stop other programs, or allow --drop-page-cache)",
                              again.failure.log_tail)
            raise TrialFailed(failure, again.command, again.log_path) from None
    guard.refused_in_a_row = 0
    return out
