"""reap_orphans when another flagsearch process reaps the same orphan at the same time (fault
injection: a stand-in Docker client whose removals fail as the real daemon's do under that race)."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import docker
import requests

from harness.launch.docker import reap_orphans

DEAD_PID = "999999999"  # above any pid_max: no process has it


class _Container:
    def __init__(self, name: str, owner: str, error: Exception | None = None):
        self.name, self.labels, self.error = name, {"flagsearch": "1", "flagsearch.owner_pid": owner}, error
        self.removed = False

    def remove(self, force: bool = False) -> None:
        if self.error is not None:
            raise self.error
        self.removed = True


def _api_error(status: int, message: str) -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = status
    return docker.errors.APIError(message, response=response, explanation=message)


def _client(containers: list[_Container]) -> Any:
    return SimpleNamespace(containers=SimpleNamespace(list=lambda **_: containers))


def test_an_orphan_another_reaper_is_removing_counts_as_reaped_and_a_real_failure_does_not() -> None:
    mine = _Container("alive", str(os.getpid()))
    plain = _Container("plain", DEAD_PID)
    racing = _Container("racing", DEAD_PID, _api_error(409, "removal of container racing is already in progress"))
    vanished = _Container("vanished", DEAD_PID, docker.errors.NotFound("No such container: vanished"))
    refused = _Container("refused", DEAD_PID, _api_error(500, "driver failed to remove root filesystem"))
    removed = reap_orphans(_client([mine, plain, racing, vanished, refused]))
    assert removed == ["plain", "racing", "vanished"]
    assert plain.removed and not mine.removed
