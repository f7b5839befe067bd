"""harness.launch.reaper.run_async: a SIGTERM that lands while a task group runs (anyio's, which httpx
uses to connect) reaches the caller as Terminated, so `search run` ends with exit 143 and its partial
state, never a traceback."""

from __future__ import annotations

import os
import signal

import anyio
import pytest

from harness.launch import reaper
from harness.launch.reaper import Terminated, run_async


async def _connecting_while_terminated() -> None:
    """SIGTERM handled in the body of a task group while a task of it runs: anyio's connect_tcp was
    there (its happy-eyeballs timer) when a CI run's SIGTERM came, and the group wrapped it."""
    async with anyio.create_task_group() as group:
        group.start_soon(anyio.sleep, 5)
        os.kill(os.getpid(), signal.SIGTERM)
        await anyio.sleep(5)


def test_a_sigterm_inside_a_task_group_is_raised_as_terminated() -> None:
    previous = signal.signal(signal.SIGTERM, reaper._on_terminate)
    try:
        with pytest.raises(Terminated):
            run_async(_connecting_while_terminated())
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_other_errors_of_a_task_group_are_left_as_they_are() -> None:
    async def failing() -> None:
        async def boom() -> None:
            raise ValueError("not a stop")

        async with anyio.create_task_group() as group:
            group.start_soon(boom)

    with pytest.raises(BaseExceptionGroup) as raised:
        run_async(failing())
    assert raised.group_contains(ValueError)
